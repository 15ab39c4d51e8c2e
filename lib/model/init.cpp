#include "init.h"

#include <cmath>
#include <cstring>

namespace unet {

namespace {
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Uniform in [0, 1) from the top 53 bits: exact in double, so identical everywhere.
inline double unit(uint64_t key, uint64_t i) {
  return (double)(splitmix64(key ^ splitmix64(i)) >> 11) * 0x1p-53;
}

void fill_torch_order(const ParamInfo& p, uint64_t seed, float* dst) {
  const int64_t n = (int64_t)p.numel;
  const uint64_t key = splitmix64(seed ^ splitmix64(fnv1a(p.name)));
  switch (p.init) {
    case InitRule::Zeros:
      for (int64_t i = 0; i < n; ++i) dst[i] = 0.0f;
      break;
    case InitRule::Ones:
      for (int64_t i = 0; i < n; ++i) dst[i] = 1.0f;
      break;
    case InitRule::Uniform: {
      // PyTorch's kaiming_uniform_(a=sqrt(5)) for the weight and its bias rule both give this bound.
      const double bound = 1.0 / std::sqrt((double)p.fan_in);
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) dst[i] = (float)(bound * (2.0 * unit(key, (uint64_t)i) - 1.0));
      break;
    }
    case InitRule::Normal: {
      // Box-Muller on pairs (2k, 2k+1); u1 in (0, 1] keeps the log finite.
      const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t k = 0; k < pairs; ++k) {
        const double u1 = 1.0 - unit(key, 2 * (uint64_t)k), u2 = unit(key, 2 * (uint64_t)k + 1);
        const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
        dst[2 * k] = (float)(r * std::cos(a) * p.std);
        if (2 * k + 1 < n) dst[2 * k + 1] = (float)(r * std::sin(a) * p.std);
      }
      break;
    }
  }
}
}  // namespace

void init_params(const ParamTable& t, uint64_t seed, float* arena) {
  std::memset(arena, 0, t.total * sizeof(float));
  std::vector<float> tmp;
  for (const ParamInfo& p : t.params) {
    tmp.resize(p.numel);
    fill_torch_order(p, seed, tmp.data());
    torch_to_engine(p, tmp.data(), arena + p.offset);
  }
}

void init_tensor(const ParamInfo& p, uint64_t seed, float* torch_order) {
  fill_torch_order(p, seed, torch_order);
}

std::vector<float> init_params(const ParamTable& t, uint64_t seed) {
  std::vector<float> a(t.total);
  init_params(t, seed, a.data());
  return a;
}

}  // namespace unet
