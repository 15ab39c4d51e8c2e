// Errors, atomic output files, small helpers shared by every command.
#pragma once
#include <cstdio>
#include <stdexcept>
#include <string>

namespace unet {

// A user-facing error: bad flag, missing/corrupt file. main() prints "unet: <msg>" and exits 1.
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes go to "<final>.tmp-<pid>" and are renamed into place by commit(); if the object is
// destroyed without commit() (error, exception, signal path) the temporary is removed, so a
// failed run never leaves a truncated file nor damages an existing one.
class AtomicFile {
 public:
  explicit AtomicFile(std::string final_path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  const std::string& tmp_path() const { return tmp_; }
  const std::string& path() const { return final_; }
  void commit();  // throws UserError if the rename fails

 private:
  std::string final_, tmp_;
  bool done_ = false;
};

// Checks that the directory of `path` exists and is writable; throws UserError naming it.
void check_writable_dir_for(const std::string& path);

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

}  // namespace unet
