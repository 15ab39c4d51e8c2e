// Elementwise ops, broadcast adds and scale-shift (reference). Activations are [B, HW, C].
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>

namespace unet::ref {

template <class T>
inline T silu(T z) {
  return z / (T(1) + std::exp(-z));
}
// d/dz z*sigmoid(z) = s (1 + z (1 - s)), s = sigmoid(z).
template <class T>
inline T silu_grad(T z) {
  const T s = T(1) / (T(1) + std::exp(-z));
  return s * (T(1) + z * (T(1) - s));
}

template <class T>
void silu_fwd(const T* x, T* y, size_t n) {
#pragma omp parallel for schedule(static) if (n > 32768)
  for (size_t i = 0; i < n; ++i) y[i] = silu(x[i]);
}

template <class T>
void silu_bwd(const T* x, const T* dy, T* dx, size_t n) {
#pragma omp parallel for schedule(static) if (n > 32768)
  for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * silu_grad(x[i]);
}

template <class T>
void add(const T* a, const T* b, T* y, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <class T>
void scale(T* x, T s, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

// h[b, hw, c] += e[b, c]
template <class T>
void add_bcast_fwd(T* h, const T* e, int B, int HW, int C) {
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 65536)
  for (int r = 0; r < B * HW; ++r) {
    const T* eb = e + (size_t)(r / HW) * C;
    T* hr = h + (size_t)r * C;
    for (int c = 0; c < C; ++c) hr[c] += eb[c];
  }
}

// de[b, c] = sum_hw dh[b, hw, c], summed in hw order.
template <class T>
void add_bcast_bwd(const T* dh, T* de, int B, int HW, int C) {
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 65536)
  for (int b = 0; b < B; ++b) {
    T* d = de + (size_t)b * C;
    std::fill(d, d + C, T(0));
    for (int hw = 0; hw < HW; ++hw) {
      const T* g = dh + ((size_t)b * HW + hw) * C;
      for (int c = 0; c < C; ++c) d[c] += g[c];
    }
  }
}

// y = x * (1 + scale) + shift, ss [B, 2C] = (scale | shift). x and y may alias.
template <class T>
void scale_shift_fwd(const T* x, const T* ss, T* y, int B, int HW, int C) {
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 65536)
  for (int r = 0; r < B * HW; ++r) {
    const T* s = ss + (size_t)(r / HW) * 2 * C;
    const T* xr = x + (size_t)r * C;
    T* yr = y + (size_t)r * C;
    for (int c = 0; c < C; ++c) yr[c] = xr[c] * (T(1) + s[c]) + s[C + c];
  }
}

// dx = dy * (1 + scale); dss[b, :C] = sum_hw dy * x, dss[b, C:] = sum_hw dy.
template <class T>
void scale_shift_bwd(const T* x, const T* ss, const T* dy, T* dx, T* dss, int B, int HW, int C) {
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 65536)
  for (int b = 0; b < B; ++b) {
    const T* s = ss + (size_t)b * 2 * C;
    T* ds = dss ? dss + (size_t)b * 2 * C : nullptr;
    if (ds) std::fill(ds, ds + 2 * C, T(0));
    for (int hw = 0; hw < HW; ++hw) {
      const size_t o = ((size_t)b * HW + hw) * C;
      if (dx)
        for (int c = 0; c < C; ++c) dx[o + c] = dy[o + c] * (T(1) + s[c]);
      if (ds)
        for (int c = 0; c < C; ++c) {
          ds[c] += dy[o + c] * x[o + c];
          ds[C + c] += dy[o + c];
        }
    }
  }
}

}  // namespace unet::ref
