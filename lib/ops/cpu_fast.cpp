// Which fast CPU kernels this machine runs (checked here, in baseline code, before any of them
// runs), and the per-thread buffers of the fast variants.
#include "cpu_fast.h"

#include <vector>

#include "cpu_fast_variants.h"

namespace unet::cpufast {

extern const Kernels kAvx512Kernels;
extern const Kernels kAvx2Kernels;

#if defined(__x86_64__)
// (__builtin_cpu_supports checks the OS's support too: AVX state enabled in XCR0.)
static bool cpu_has(bool avx512) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!avx512) return avx2;
  return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
}
#endif

const Kernels* avx512_kernels() {
#if defined(__x86_64__)
  static const bool ok = kAvx512Kernels.built && cpu_has(true);
  return ok ? &kAvx512Kernels : nullptr;
#else
  return nullptr;
#endif
}

const Kernels* avx2_kernels() {
#if defined(__x86_64__)
  static const bool ok = kAvx2Kernels.built && cpu_has(false);
  return ok ? &kAvx2Kernels : nullptr;
#else
  return nullptr;
#endif
}

float* thread_buffer(int slot, size_t n) {
  thread_local std::vector<float> bufs[8];
  std::vector<float>& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace unet::cpufast
