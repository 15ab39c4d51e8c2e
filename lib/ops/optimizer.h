// Gradient-norm clipping, AdamW and EMA over the flat parameter arena (reference).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "adamw_schedule.h"
#include "reduce.h"

namespace unet::ref {

// out[0] = sum x^2 (double accumulation, fixed order).
template <class T>
void sum_squares(const T* x, T* out, size_t n) {
  out[0] = (T)det_sum(n, [&](size_t i) { return (double)x[i] * (double)x[i]; });
}

// norm = sqrt(sum of sumsq[0 .. k)) (added in order in double); grad_scale = min(1, clip /
// (norm + 1e-6)) if clip > 0, else 1.
template <class T>
void clip_scale(const T* sumsq, size_t k, T clip, T* norm, T* grad_scale) {
  double s = 0;
  for (size_t i = 0; i < k; ++i) s += (double)sumsq[i];
  const T nrm = std::sqrt((T)s);
  if (norm) *norm = nrm;
  *grad_scale = clip > T(0) ? std::min(T(1), clip / (nrm + T(1e-6))) : T(1);
}

// PyTorch AdamW (torch.optim.AdamW, single-tensor path), with g = grad * (*grad_scale):
//   p *= hyper[0];  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= hyper[1] * m / (sqrt(v) / hyper[2] + eps).
template <class T>
void adamw(T* p, const T* g, T* m, T* v, size_t n, const T* hyper, T beta1, T beta2, T eps,
           const T* grad_scale) {
  const T gs = grad_scale ? *grad_scale : T(1);
  const T decay = hyper[0], step = hyper[1], sbc2 = hyper[2];
#pragma omp parallel for schedule(static) if (n > 32768)
  for (size_t i = 0; i < n; ++i) {
    const T gi = g[i] * gs;
    const T mi = beta1 * m[i] + (T(1) - beta1) * gi;
    const T vi = beta2 * v[i] + (T(1) - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * mi / (std::sqrt(vi) / sbc2 + eps);
  }
}

// ema = rate * ema + (1 - rate) * p
template <class T>
void ema(T* e, const T* p, T rate, size_t n) {
  const T r1 = T(1) - rate;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (size_t i = 0; i < n; ++i) e[i] = rate * e[i] + r1 * p[i];
}

}  // namespace unet::ref
