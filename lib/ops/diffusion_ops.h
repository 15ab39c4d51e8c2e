// Small elementwise helpers of the diffusion process and samplers (reference).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>

namespace unet::ref {

// xt = sqrt_ab[b] * x0 + sqrt_1mab[b] * noise, per sample of n_per elements.
template <class T>
void q_sample(const T* x0, const T* noise, const T* sqrt_ab, const T* sqrt_1mab, T* xt, int B, size_t n_per) {
#pragma omp parallel for schedule(static) if ((size_t)B * n_per > 65536)
  for (int b = 0; b < B; ++b)
    for (size_t i = (size_t)b * n_per; i < (size_t)(b + 1) * n_per; ++i)
      xt[i] = sqrt_ab[b] * x0[i] + sqrt_1mab[b] * noise[i];
}

// y = a*x + b*y + c*z; a null x or z counts as zero (with its coefficient).
template <class T>
void axpbypcz(T a, const T* x, T b, T* y, T c, const T* z, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    T s = b * y[i];
    if (x) s = a * x[i] + s;
    if (z) s = s + c * z[i];
    y[i] = s;
  }
}

template <class T>
void clamp(T* x, T lo, T hi, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) x[i] = std::min(std::max(x[i], lo), hi);
}

// Learned-range DDPM noise: y = z * exp(0.5 (f max_log + (1 - f) min_log)), f = (v + 1) / 2.
template <class T>
void learned_range_noise(const T* v, const T* z, T* y, T min_log, T max_log, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    const T frac = (v[i] + T(1)) / T(2);
    const T log_var = frac * max_log + (T(1) - frac) * min_log;
    y[i] = std::exp(T(0.5) * log_var) * z[i];
  }
}

}  // namespace unet::ref
