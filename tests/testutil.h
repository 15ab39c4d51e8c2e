// Shared test helpers: fresh random inputs, relative errors, temp dirs, running the CLI.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace unet {
struct ParamTable;
}

namespace unet::test {

// Fresh seed per process run unless UNET_TEST_SEED is set (printed so a failure can be replayed).
uint64_t test_seed();
std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f);
std::vector<float> randu(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
// ||a-b|| / ||b|| (L2); returns inf on NaN.
double rel_l2(const float* a, const float* b, size_t n);
double rel_l2(const std::vector<float>& a, const std::vector<float>& b);
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

// Random weights for every tensor of a table, none zero (zero-init modules too, so every gradient
// path is exercised): U(-1, 1) / sqrt(fan_in) (0.3 without a fan-in), around 1 for Ones tensors.
std::vector<float> random_params(const ParamTable& t, uint64_t seed);

// A fresh empty directory under the test temp dir, removed at process exit.
std::string temp_dir(const std::string& tag);

// Sets (value != nullptr) or unsets an environment variable for the scope; restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

struct RunResult {
  int code;
  std::string out, err;
};
// Runs the built unet binary with the given argument string (shell-quoted by the caller).
RunResult run_unet(const std::string& args);
std::string source_dir();  // repository root
bool file_exists(const std::string& p);
// A python with torch, h5py and numpy for the PyTorch comparisons: UNET_PYTHON when set, else
// /usr/bin/python3 (Debian's, what CI has), else the python3 on PATH (the GPU machine's PyTorch is
// a venv's); empty when none has them (the tests skip). Looked up once a process.
std::string torch_python();
bool have_torch();  // torch_python() found one
// Runs torch_python() with the given argument string; its exit status, -1 when it did not exit.
int run_python(const std::string& args);
std::vector<std::string> list_dir(const std::string& d);

}  // namespace unet::test
