#include "testutil.h"

#include "params.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace unet::test {

uint64_t test_seed() {
  static uint64_t seed = [] {
    const char* e = std::getenv("UNET_TEST_SEED");
    uint64_t s = e ? std::strtoull(e, nullptr, 10) : std::random_device{}();
    std::fprintf(stderr, "[testutil] UNET_TEST_SEED=%llu\n", (unsigned long long)s);
    return s;
  }();
  return seed;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<float> randu(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  return rel_l2(a.data(), b.data(), a.size());
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double d = std::fabs((double)a[i] - b[i]);
    if (!(d <= m)) m = d;  // NaN propagates as max
  }
  return m;
}

std::vector<float> random_params(const ParamTable& t, uint64_t seed) {
  std::vector<float> w = randu(t.total, seed);
  for (const auto& p : t.params) {
    const float bound = p.fan_in > 0 ? 1.0f / std::sqrt((float)p.fan_in) : 0.3f;
    for (size_t i = 0; i < p.numel; ++i) {
      const float u = w[p.offset + i] * bound;
      w[p.offset + i] = p.init == InitRule::Ones ? 1.0f + u : u;
    }
  }
  return w;
}

std::string temp_dir(const std::string& tag) {
  namespace fs = std::filesystem;
  // One directory per test process, removed when the process exits (by the process that made it,
  // not by a forked child that exits).
  struct Root {
    std::string path;
    pid_t owner = getpid();
    Root() {
      std::string tmpl = (fs::temp_directory_path() / "unet-test-XXXXXX").string();
      if (!mkdtemp(tmpl.data())) throw std::runtime_error("temp_dir: mkdtemp failed in " + tmpl);
      path = tmpl;
    }
    ~Root() {
      std::error_code ec;
      if (getpid() == owner) fs::remove_all(path, ec);
    }
  };
  static Root root;
  static int counter = 0;
  fs::path p = fs::path(root.path) / (tag + "-" + std::to_string(counter++));
  fs::create_directories(p);
  return p.string();
}

// The build bakes in its paths; UNET_SOURCE_DIR / UNET_BINARY override them (binaries built here
// and run from a copy of the tree elsewhere, e.g. on the GPU machine).
std::string source_dir() {
  const char* e = std::getenv("UNET_SOURCE_DIR");
  return e && *e ? e : UNET_SOURCE_DIR;
}
static std::string unet_binary() {
  const char* e = std::getenv("UNET_BINARY");
  return e && *e ? e : UNET_BINARY;
}

RunResult run_unet(const std::string& args) {
  std::string dir = temp_dir("run");
  std::string out = dir + "/out.txt", err = dir + "/err.txt";
  std::string cmd = unet_binary() + " " + args + " >" + out + " 2>" + err + " </dev/null";
  int st = std::system(cmd.c_str());
  RunResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

bool file_exists(const std::string& p) { return std::filesystem::exists(p); }

std::string torch_python() {
  static const std::string found = [] {
    const char* env = std::getenv("UNET_PYTHON");
    const std::vector<std::string> candidates =
        env && *env ? std::vector<std::string>{env} : std::vector<std::string>{"/usr/bin/python3", "python3"};
    for (const std::string& p : candidates)
      if (std::system((p + " -c 'import torch, h5py, numpy' >/dev/null 2>&1").c_str()) == 0) return p;
    return std::string();
  }();
  return found;
}

bool have_torch() { return !torch_python().empty(); }

int run_python(const std::string& args) {
  const int rc = std::system((torch_python() + " " + args).c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::vector<std::string> list_dir(const std::string& d) {
  std::vector<std::string> v;
  for (auto& e : std::filesystem::directory_iterator(d)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace unet::test
