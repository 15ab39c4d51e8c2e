// MSE loss and its gradient in one pass (reference).
#pragma once
#include <cstddef>

#include "reduce.h"

namespace unet::ref {

// *loss = mean((pred - target)^2), dpred = 2 (pred - target) / n (dpred nullable).
template <class T>
void mse_fwd_bwd(const T* pred, const T* target, T* loss, T* dpred, size_t n) {
  const double s = det_sum(n, [&](size_t i) {
    const double d = (double)pred[i] - (double)target[i];
    return d * d;
  });
  if (loss) *loss = (T)(s / (double)n);
  if (dpred) {
    const T k = T(2) / (T)n;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (size_t i = 0; i < n; ++i) dpred[i] = k * (pred[i] - target[i]);
  }
}

}  // namespace unet::ref
