#include "util.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

namespace unet {

AtomicFile::AtomicFile(std::string final_path) : final_(std::move(final_path)) {
  check_writable_dir_for(final_);
  tmp_ = final_ + ".tmp-" + std::to_string(getpid());
}

AtomicFile::~AtomicFile() {
  if (!done_) std::remove(tmp_.c_str());
}

void AtomicFile::commit() {
  if (std::rename(tmp_.c_str(), final_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    done_ = true;
    throw UserError(final_ + ": cannot write (rename failed)");
  }
  done_ = true;
}

void check_writable_dir_for(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UserError(path + ": directory " + dir.string() + " does not exist");
  if (access(dir.c_str(), W_OK) != 0)
    throw UserError(path + ": directory " + dir.string() + " is not writable");
  if (fs::is_directory(p, ec)) throw UserError(path + ": is a directory");
}

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

}  // namespace unet
