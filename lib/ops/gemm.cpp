// The float GEMM register tile in AVX2+FMA, chosen at run time when the CPU has it (the build
// targets baseline x86-64, where the portable tile gets only 4-wide SSE). Same per-element order
// as the portable tile: start from C, add the products in ascending p (fused multiply-adds).
#include "gemm.h"

#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace unet::ref::detail {

#if defined(__x86_64__)

bool use_avx2_fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

__attribute__((target("avx2,fma"))) void sgemm_tile_4x16_avx2(int k0, int k1, const float* A, ptrdiff_t a_rs,
                                                              ptrdiff_t a_cs, const float* B, ptrdiff_t ldb,
                                                              float* C, ptrdiff_t ldc) {
  __m256 c00 = _mm256_loadu_ps(C), c01 = _mm256_loadu_ps(C + 8);
  __m256 c10 = _mm256_loadu_ps(C + ldc), c11 = _mm256_loadu_ps(C + ldc + 8);
  __m256 c20 = _mm256_loadu_ps(C + 2 * ldc), c21 = _mm256_loadu_ps(C + 2 * ldc + 8);
  __m256 c30 = _mm256_loadu_ps(C + 3 * ldc), c31 = _mm256_loadu_ps(C + 3 * ldc + 8);
  const float* a = A + k0 * a_cs;
  const float* b = B + k0 * ldb;
  for (int p = k0; p < k1; ++p, a += a_cs, b += ldb) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 av = _mm256_broadcast_ss(a);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a + a_rs);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a + 2 * a_rs);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a + 3 * a_rs);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
  }
  _mm256_storeu_ps(C, c00);
  _mm256_storeu_ps(C + 8, c01);
  _mm256_storeu_ps(C + ldc, c10);
  _mm256_storeu_ps(C + ldc + 8, c11);
  _mm256_storeu_ps(C + 2 * ldc, c20);
  _mm256_storeu_ps(C + 2 * ldc + 8, c21);
  _mm256_storeu_ps(C + 3 * ldc, c30);
  _mm256_storeu_ps(C + 3 * ldc + 8, c31);
}

#else  // not x86-64: the portable tile only

bool use_avx2_fma() { return false; }
void sgemm_tile_4x16_avx2(int, int, const float*, ptrdiff_t, ptrdiff_t, const float*, ptrdiff_t, float*,
                          ptrdiff_t) {
  std::abort();  // unreachable: use_avx2_fma() is false
}

#endif

}  // namespace unet::ref::detail
