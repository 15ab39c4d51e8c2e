// GroupNorm's per-(sample, channel) coefficients and SiLU as unet's CUDA kernels compute them:
// the GroupNorm kernels (fused.cu) and the convolutions that apply a norm to their input as they
// read it (wgmma.cu) share them, so that both write the same bits.
#pragma once
#include <cuda_runtime.h>

namespace unet {

// SiLU and its derivative with the fast exponential and division (two MUFU instructions where
// expf and '/' take about twenty): at seed64's sizes the element kernels issue as many
// instructions as their bytes take to move. Relative error ~1e-7.
__device__ __forceinline__ float silu_fast(float z) { return __fdividef(z, 1.f + __expf(-z)); }
__device__ __forceinline__ float silu_grad_fast(float z) {
  const float sg = __fdividef(1.f, 1.f + __expf(-z));
  return sg * (1.f + z * (1.f - sg));
}
// z = (x - m) a + bb (before SiLU) for channel c of sample b: a = rstd gamma (1 + scale),
// bb = beta (1 + scale) + shift.
struct Coef {
  float m, r, a, bb;
};
// The op's input offset for channel c of sample b (xbias[c] + xemb[b, c]; 0 without): the norm
// reads x + offset. The kernels fold it into the mean they subtract (x - (mean - offset)).
__device__ __forceinline__ float xoff(const float* xbias, const float* xemb, int b, int c, int C) {
  float o = 0.f;
  if (xbias) o = xbias[c];
  if (xemb) o += xemb[(size_t)b * C + c];
  return o;
}
__device__ __forceinline__ Coef coef_from(float m, float r, const float* gamma, const float* beta, const float* ss,
                                          int b, int c, int C, float off) {
  Coef k;
  k.m = m - off, k.r = r;
  k.a = r * gamma[c], k.bb = beta[c];
  if (ss) {
    const float f = 1.f + ss[(size_t)b * 2 * C + c];
    k.a *= f;
    k.bb = k.bb * f + ss[(size_t)b * 2 * C + C + c];
  }
  return k;
}
__device__ __forceinline__ Coef coef_of(const float* gamma, const float* beta, const float* ss, const float* mean,
                                        const float* rstd, const float* xbias, const float* xemb, int b, int c,
                                        int C, int G) {
  const int bg = b * G + c / (C / G);
  return coef_from(mean[bg], rstd[bg], gamma, beta, ss, b, c, C, xoff(xbias, xemb, b, c, C));
}

}  // namespace unet
