// Errors, atomic output files, output/input safety checks, small helpers shared by every command.
#pragma once
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace unet {

// A user-facing error: bad flag, missing/corrupt file. main() prints "unet: <msg>" and exits 1.
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Exit 1 without a message: another process already printed it (rank 0 of a data-parallel run
// reports what every rank ran into).
struct SilentError : UserError {
  SilentError() : UserError("") {}
};
// Prepended to main()'s error lines: "rank 3: " on the ranks other than 0 of a data-parallel run.
std::string& error_prefix();

// An error message as one printable line: control characters (a newline, an escape sequence, C1
// controls, U+2028/U+2029) and bytes that are not UTF-8 become \xNN, so text taken from a damaged
// file cannot break the one-line error nor the terminal; other UTF-8 (a file name in any script)
// is kept.
std::string one_line(const std::string& s);

// Writes all n bytes to fd (retrying short writes and EINTR); false with errno set on failure.
bool write_all(int fd, const void* p, size_t n);

// strerror(err) as a string ("No space left on device").
std::string errno_text(int err);

// Writes go to "<final>.tmp-<pid>" and are renamed into place by commit(); if the object is
// destroyed without commit() (error, exception, signal path) the temporary is removed, so a
// failed run never leaves a truncated file nor damages an existing one. The constructor refuses
// an existing final path that is not a regular file (a FIFO or device is never replaced by a
// file), writes through a symlink to its target (the link stays), and removes temporaries that a
// killed process left next to it. commit() fsyncs before the rename, so a late I/O error (EIO,
// a full disk on a filesystem with delayed allocation) is reported instead of lost.
class AtomicFile {
 public:
  explicit AtomicFile(std::string final_path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  const std::string& tmp_path() const { return tmp_; }
  const std::string& path() const { return final_; }  // as the user named it (for messages)
  void commit();                                      // throws UserError naming path() and the cause

 private:
  std::string final_, target_, tmp_;
  bool done_ = false;
};

// Checks that `path` can be written as a regular file: its directory exists and is writable, and
// when it exists it is a regular file (or a link to one), not a directory, FIFO, device or
// socket. Throws UserError naming the path.
void check_writable_dir_for(const std::string& path);

// What a file of this mode is, for messages: "a directory", "a FIFO", "a character device", ...
const char* file_kind(unsigned mode);

// stat() of an input: throws UserError unless `path` names something that exists: "<path>: no
// such file", "<path>: a broken symbolic link (to T, which does not exist)", or "<path>: cannot
// open (<cause>)" (a name too long, permission denied...). What it is (file, directory) is the
// reader's to check, from the stat returned.
struct stat check_input_exists(const std::string& path);

// True when both paths name the same existing file (same device and inode, so hard links and
// symlinks count as the same file).
bool same_file(const std::string& a, const std::string& b);
// Throws "<out>: is the same file as <what> <in>; refusing to overwrite an input" when writing
// `out` would replace the input `in`. Missing files never match.
void check_not_input(const std::string& out, const std::string& in, const std::string& what);

// A checkpoint argument: a run directory stands for its latest.h5 (what `unet train` and
// `train-classifier` write last); any other path is returned as given. A directory without
// latest.h5 is a UserError naming it and `what` (the flag or argument).
std::string checkpoint_arg(const std::string& path, const std::string& what);

// Removes "<name>.tmp-<pid>" files in `dir` whose process is gone (left by a killed run).
void remove_stale_temps(const std::string& dir);

// Copies src to dst through AtomicFile (dst is never half-written); errors name dst and the cause.
void copy_file_atomic(const std::string& src, const std::string& dst);

// An advisory lock on DIR/.lock (flock), held until destruction or process exit: a second process
// asking for the same directory gets UserError("<dir>: in use by <holder> (pid N)").
class DirLock {
 public:
  DirLock(const std::string& dir, const std::string& holder);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// Host memory this process can still allocate: the smallest of MemAvailable, the cgroup limit
// and ulimit -v / -d headroom. `limit` (optional) says which one bounds it. 0 when unknown.
uint64_t available_memory(std::string* limit = nullptr);
// "41 GB", "950 MB", "12 KB".
std::string format_bytes(double bytes);
// Throws UserError("<what> needs 41 GB of memory, 23 GB available") when `need` exceeds what is
// available. Estimates are lower bounds, so a run that fits is never refused.
void check_memory(double need, const std::string& what);

bool stdout_is_tty();
bool stderr_is_tty();

// A one-line progress display: on a terminal redraws "\r<label> i/n rate ETA"; off a terminal
// prints nothing (callers log plain lines themselves when they want them).
class Progress {
 public:
  Progress(std::string label, long total, std::string unit = "it");
  void update(long done, const std::string& extra = "");
  void finish();

 private:
  std::string label_, unit_;
  long total_;
  double t0_;
  double last_ = -1;
  bool tty_;
};

double now_seconds();  // monotonic clock

// A shared library loaded at run time (cuDNN, NCCL). When the environment variable `var` names one,
// only it is tried: one that does not load is reported (error: "VAR=path: the loader's message"),
// never replaced by another found elsewhere, since which build runs decides speed and numerics.
// Else the first of `search` that loads; handle nullptr and error empty when none does.
struct LoadedLibrary {
  void* handle = nullptr;
  std::string path, error;
};
LoadedLibrary load_library(const char* var, const std::vector<std::string>& search);

}  // namespace unet
