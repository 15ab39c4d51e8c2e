#include "util.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace unet {

std::string one_line(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [&](unsigned char c) {
    const char* d = "0123456789abcdef";
    out += "\\x";
    out += d[c >> 4];
    out += d[c & 15];
  };
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f)
        hex(c);
      else
        out += (char)c;
      ++i;
      continue;
    }
    // c leads a UTF-8 sequence whose length it gives; the sequence is kept only when it is whole
    // (each continuation byte's top two bits are 10) and canonical (not overlong, no surrogate, at
    // most U+10FFFF).
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && len == 3) ok = !(c == 0xe0 && p[i + 1] < 0xa0) && !(c == 0xed && p[i + 1] >= 0xa0);
    if (ok && len == 4) ok = !(c == 0xf0 && p[i + 1] < 0x90) && !(c == 0xf4 && p[i + 1] >= 0x90);
    if (!ok) {
      hex(c);
      ++i;
      continue;
    }
    // C1 controls (U+0080-U+009F) and the line and paragraph separators (U+2028, U+2029) end a
    // line for some readers (Python's splitlines): escaped like the ASCII controls.
    const bool breaks = (len == 2 && c == 0xc2 && p[i + 1] < 0xa0) ||
                        (len == 3 && c == 0xe2 && p[i + 1] == 0x80 && (p[i + 2] == 0xa8 || p[i + 2] == 0xa9));
    if (breaks)
      for (size_t k = 0; k < len; ++k) hex(p[i + k]);
    else
      out.append(s, i, len);
    i += len;
  }
  return out;
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    if (w == 0) {
      errno = EIO;
      return false;
    }
    c += w, n -= (size_t)w;
  }
  return true;
}

std::string& error_prefix() {
  static std::string p;
  return p;
}

namespace fs = std::filesystem;

std::string errno_text(int err) { return std::strerror(err); }

namespace {
std::string dir_of(const std::string& path) {
  fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

// Closes fd, keeping the first error.
int close_keep(int fd, int err) {
  if (::close(fd) != 0 && err == 0) err = errno;
  return err;
}
}  // namespace

const char* file_kind(unsigned m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// ---- AtomicFile --------------------------------------------------------------------------------
AtomicFile::AtomicFile(std::string final_path) : final_(std::move(final_path)), target_(final_) {
  check_writable_dir_for(final_);
  struct stat lst;
  if (lstat(final_.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
    // A link to a file: replace the file it points to and keep the link, as `cp` and shell
    // redirection do. A dangling link is replaced like a missing file.
    std::error_code ec;
    fs::path c = fs::canonical(final_, ec);
    if (!ec) {
      target_ = c.string();
      check_writable_dir_for(target_);
    }
  }
  remove_stale_temps(dir_of(target_));
  tmp_ = target_ + ".tmp-" + std::to_string(getpid());
}

AtomicFile::~AtomicFile() {
  if (!done_) std::remove(tmp_.c_str());
}

void AtomicFile::commit() {
  if (done_) return;
  auto fail = [&](const std::string& why) {
    std::remove(tmp_.c_str());
    done_ = true;
    throw UserError(final_ + ": cannot write (" + why + ")");
  };
  // fsync surfaces write-back errors (EIO, ENOSPC with delayed allocation) while the old file is
  // still in place, and makes the rename durable: after a crash the name holds old or new data.
  int fd = ::open(tmp_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(errno_text(errno));
  int err = fsync(fd) == 0 || errno == EINVAL ? 0 : errno;  // EINVAL: the filesystem cannot sync
  err = close_keep(fd, err);
  if (err) fail(errno_text(err));
  if (std::rename(tmp_.c_str(), target_.c_str()) != 0) fail("rename failed: " + errno_text(errno));
  done_ = true;
  int dfd = ::open(dir_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)fsync(dfd);  // best effort: the data is already safe under its new name
    ::close(dfd);
  }
}

// ---- output checks -------------------------------------------------------------------------------
void check_writable_dir_for(const std::string& path) {
  const std::string dir = dir_of(path);
  struct stat st;
  const bool found = stat(dir.c_str(), &st) == 0;
  if (!found && errno != ENOENT && errno != ENOTDIR)
    throw UserError(path + ": cannot write (" + errno_text(errno) + ")");  // e.g. a name too long
  if (!found || !S_ISDIR(st.st_mode)) throw UserError(path + ": directory " + dir + " does not exist");
  if (access(dir.c_str(), W_OK) != 0) throw UserError(path + ": directory " + dir + " is not writable");
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw UserError(path + ": is a directory");
    if (!S_ISREG(st.st_mode))
      throw UserError(path + ": is " + file_kind(st.st_mode) +
                      ", not a regular file; refusing to replace it with an output");
  } else if (errno != ENOENT) {
    throw UserError(path + ": cannot write (" + errno_text(errno) + ")");
  }
  // AtomicFile writes "<name>.tmp-<pid>" first: a name that fits but leaves no room for that
  // suffix failed only at the end, after the work (10 digits: any pid).
  const long name_max = pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t len = fs::path(path).filename().string().size(), suffix = 5 + 10;
  if (name_max > 0 && len + suffix > static_cast<size_t>(name_max))
    throw UserError(path + ": file name too long (" + std::to_string(len) + " bytes; an output's name may have " +
                    std::to_string(name_max - static_cast<long>(suffix)) +
                    ", as it is written under a temporary name first)");
}

struct stat check_input_exists(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return st;
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR) {
    struct stat lst;
    if (err == ENOENT && lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
      std::error_code ec;
      const fs::path to = fs::read_symlink(path, ec);
      throw UserError(path + ": a broken symbolic link" +
                      (ec ? std::string() : " (to " + to.string() + ", which does not exist)"));
    }
    throw UserError(path + ": no such file");
  }
  if (err == EACCES) throw UserError(path + ": cannot open (permission denied)");
  throw UserError(path + ": cannot open (" + errno_text(err) + ")");
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (a.empty() || b.empty() || stat(a.c_str(), &sa) != 0 || stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void check_not_input(const std::string& out, const std::string& in, const std::string& what) {
  if (same_file(out, in))
    throw UserError(out + ": is the same file as the " + what + " " + in +
                    "; refusing to overwrite an input");
}

std::string checkpoint_arg(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (path.empty() || !fs::is_directory(path, ec)) return path;
  const std::string latest = (fs::path(path) / "latest.h5").string();
  struct stat lst;  // (lstat: a link to nowhere is the reader's to name, "a broken symbolic link")
  if (lstat(latest.c_str(), &lst) != 0)
    throw UserError(path + ": a directory without latest.h5 (" + what +
                    " takes a checkpoint, or a run directory holding latest.h5)");
  return latest;
}

void remove_stale_temps(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t k = name.rfind(".tmp-");
    if (k == std::string::npos || k == 0 || k + 5 >= name.size()) continue;
    const std::string digits = name.substr(k + 5);
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::stol(digits);
    if (pid <= 0 || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    struct stat st;
    if (lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(it->path().c_str());
  }
}

void copy_file_atomic(const std::string& src, const std::string& dst) {
  AtomicFile out(dst);
  int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw UserError(src + ": cannot read (" + errno_text(errno) + ")");
  int fd = ::open(out.tmp_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    ::close(in);
    throw UserError(dst + ": cannot write (" + errno_text(e) + ")");
  }
  std::vector<char> buf(1 << 20);
  int rerr = 0, werr = 0;
  for (;;) {
    ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) rerr = errno;
    if (n <= 0) break;
    if (!write_all(fd, buf.data(), (size_t)n)) {
      werr = errno;
      break;
    }
  }
  ::close(in);
  werr = close_keep(fd, werr);
  if (rerr) throw UserError(src + ": cannot read (" + errno_text(rerr) + ")");
  if (werr) throw UserError(dst + ": cannot write (" + errno_text(werr) + ")");
  out.commit();
}

// ---- DirLock -------------------------------------------------------------------------------------
DirLock::DirLock(const std::string& dir, const std::string& holder) {
  const std::string path = dir + "/.lock";
  // O_NONBLOCK: a FIFO planted as .lock must not hang us; O_NOFOLLOW: never lock through a link.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UserError(path + ": cannot create the lock file (" + errno_text(errno) + ")");
  struct stat st;
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw UserError(path + ": is not a regular file");
  }
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK) {
      char b[32] = {0};
      ssize_t n = pread(fd_, b, sizeof b - 1, 0);
      std::string pid = n > 0 ? std::string(b, b + n) : "";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      ::close(fd_);
      fd_ = -1;
      throw UserError(dir + ": in use by another " + holder + (pid.empty() ? "" : " (pid " + pid + ")") +
                      "; wait for it to finish or choose another directory");
    }
    // No lock support on this filesystem (ENOLCK): run unlocked rather than not at all.
    return;
  }
  const std::string me = std::to_string(getpid()) + "\n";
  if (ftruncate(fd_, 0) == 0) (void)!pwrite(fd_, me.data(), me.size(), 0);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

// ---- memory --------------------------------------------------------------------------------------
namespace {
bool read_u64_file(const std::string& path, uint64_t* v) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *v = std::stoull(s);
  return true;
}

// "<key> <value>" lines (cgroup memory.stat); 0 when absent.
uint64_t stat_field(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string k;
  uint64_t v;
  while (f >> k >> v)
    if (k == key) return v;
  return 0;
}

uint64_t proc_statm_bytes(int field) {
  std::ifstream f("/proc/self/statm");
  uint64_t v[7] = {0};
  for (int i = 0; i < 7 && (f >> v[i]); ++i) {
  }
  return v[field] * (uint64_t)sysconf(_SC_PAGESIZE);
}
}  // namespace

uint64_t available_memory(std::string* limit) {
  uint64_t best = 0;
  std::string which;
  auto consider = [&](uint64_t v, const char* name) {
    if (best == 0 || v < best) best = v, which = name;
  };
  {
    std::ifstream f("/proc/meminfo");
    std::string key;
    uint64_t kb;
    std::string unit;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        consider(kb * 1024, "");
        break;
      }
    }
  }
  // cgroup v2 (the process's own group), then v1.
  {
    std::ifstream f("/proc/self/cgroup");
    std::string line, rel;
    while (std::getline(f, line))
      if (line.rfind("0::", 0) == 0) rel = line.substr(3);
    // Usage counts the page cache, which the kernel reclaims under the limit: subtract the
    // inactive file pages (the usual "working set"), or big runs would be refused after any
    // large read.
    uint64_t max = 0, cur = 0;
    for (const std::string& d : {"/sys/fs/cgroup" + rel, std::string("/sys/fs/cgroup")})
      if (read_u64_file(d + "/memory.max", &max) && read_u64_file(d + "/memory.current", &cur)) {
        cur -= std::min(cur, stat_field(d + "/memory.stat", "inactive_file"));
        consider(max > cur ? max - cur : 0, "under the cgroup memory limit");
        break;
      }
    const std::string v1 = "/sys/fs/cgroup/memory/";
    if (read_u64_file(v1 + "memory.limit_in_bytes", &max) && max < (1ull << 60) &&
        read_u64_file(v1 + "memory.usage_in_bytes", &cur)) {
      cur -= std::min(cur, stat_field(v1 + "memory.stat", "total_inactive_file"));
      consider(max > cur ? max - cur : 0, "under the cgroup memory limit");
    }
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const uint64_t used = proc_statm_bytes(0);
    consider(rl.rlim_cur > used ? rl.rlim_cur - used : 0, "under ulimit -v");
  }
  if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const uint64_t used = proc_statm_bytes(5);
    consider(rl.rlim_cur > used ? rl.rlim_cur - used : 0, "under ulimit -d");
  }
  if (limit) *limit = which;
  return best;
}

std::string format_bytes(double b) {
  char s[32];
  const char* unit[] = {"bytes", "KB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  while (b >= 1000 && u < 6) b /= 1000, ++u;
  if (u == 0)
    std::snprintf(s, sizeof s, "%.0f bytes", b);
  else
    std::snprintf(s, sizeof s, b < 10 ? "%.1f %s" : "%.0f %s", b, unit[u]);
  return s;
}

void check_memory(double need, const std::string& what) {
  std::string which;
  const uint64_t avail = available_memory(&which);
  if (avail == 0 || need <= (double)avail) return;
  throw UserError(what + " needs " + format_bytes(need) + " of memory, " + format_bytes((double)avail) +
                  " available" + (which.empty() ? "" : " " + which));
}

// ---- terminal and time ---------------------------------------------------------------------------
bool stdout_is_tty() { return isatty(1); }
bool stderr_is_tty() { return isatty(2); }

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

Progress::Progress(std::string label, long total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      t0_(now_seconds()),
      tty_(stderr_is_tty()) {}

static std::string fmt_dur(double s) {
  char b[32];
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(b, sizeof b, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(b, sizeof b, "%ld:%02ld", t / 60, t % 60);
  return b;
}

void Progress::update(long done, const std::string& extra) {
  if (!tty_) return;
  double t = now_seconds();
  if (done < total_ && t - last_ < 0.1) return;  // redraw at most 10x a second
  last_ = t;
  double el = t - t0_, rate = el > 0 ? done / el : 0;
  double eta = rate > 0 ? (total_ - done) / rate : 0;
  fprintf(stderr, "\r\033[K%s %ld/%ld [%s<%s, %.1f %s/s]%s%s", label_.c_str(), done, total_,
          fmt_dur(el).c_str(), fmt_dur(eta).c_str(), rate, unit_.c_str(), extra.empty() ? "" : " ",
          extra.c_str());
  fflush(stderr);
}

void Progress::finish() {
  if (tty_) {
    fprintf(stderr, "\n");
    fflush(stderr);
  }
}

LoadedLibrary load_library(const char* var, const std::vector<std::string>& search) {
  LoadedLibrary l;
  const char* asked = std::getenv(var);
  if (asked && *asked) {
    if ((l.handle = dlopen(asked, RTLD_NOW | RTLD_LOCAL))) {
      l.path = asked;
    } else {
      const char* err = dlerror();
      l.error = std::string(var) + "=" + asked + ": " + (err ? err : "cannot be loaded");
    }
    return l;
  }
  for (const std::string& name : search)
    if ((l.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      l.path = name;
      break;
    }
  return l;
}

}  // namespace unet
