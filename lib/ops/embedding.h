// Sinusoidal timestep embedding and the class-label embedding table (reference).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace unet::ref {

// guided-diffusion timestep_embedding: half = dim/2, f_i = exp(-ln(10000) * i / half),
// y = [cos(t f), sin(t f)], and a zero column last when dim is odd. The arithmetic follows
// PyTorch's float32 order (-ln(1e4) rounded to T, times i, divided by half, exp; then t * f).
template <class T>
void timestep_embedding(const T* t, T* y, int B, int dim) {
  const int half = dim / 2;
  const T c = (T)(-std::log(10000.0));
  for (int b = 0; b < B; ++b) {
    T* yb = y + (size_t)b * dim;
    for (int i = 0; i < half; ++i) {
      const T f = std::exp(c * (T)i / (T)half);
      const T a = t[b] * f;
      yb[i] = std::cos(a);
      yb[half + i] = std::sin(a);
    }
    if (dim % 2) yb[dim - 1] = T(0);
  }
}

// y[b, :] += table[labels[b], :]
template <class T>
void embedding_add_fwd(const int32_t* labels, const T* table, T* y, int B, int D) {
  for (int b = 0; b < B; ++b) {
    const T* e = table + (size_t)labels[b] * D;
    for (int d = 0; d < D; ++d) y[(size_t)b * D + d] += e[d];
  }
}

// dtable [K, D] = scatter-sum of dy rows by label, in batch order (overwrites dtable).
template <class T>
void embedding_bwd(const int32_t* labels, const T* dy, T* dtable, int B, int K, int D) {
  std::fill(dtable, dtable + (size_t)K * D, T(0));
  for (int b = 0; b < B; ++b) {
    if (labels[b] < 0 || labels[b] >= K)
      throw std::out_of_range("embedding_bwd: label " + std::to_string(labels[b]) + " not in [0, " +
                              std::to_string(K) + ")");
    T* e = dtable + (size_t)labels[b] * D;
    for (int d = 0; d < D; ++d) e[d] += dy[(size_t)b * D + d];
  }
}

}  // namespace unet::ref
