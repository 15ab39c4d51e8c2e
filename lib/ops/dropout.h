// Dropout with a counter-based mask: element i is kept iff dropout_uniform(seed, i) >= p and then
// scaled by 1/(1-p), so the mask needs no storage and CPU and CUDA draw the same one (reference).
#pragma once
#include <cstddef>
#include <cstdint>

#include "rng.h"

namespace unet {
// Uniform in [0,1) for the dropout mask, shared by the CPU and CUDA kernels: the project's
// counter-based RNG (lib/rng.h) on its Dropout stream, so the mask of element i is a pure
// function of (seed, i).
UNET_RNG_HD inline float dropout_uniform(uint64_t seed, uint64_t i) {
  return uniform01(seed, Stream::Dropout, i);
}
}  // namespace unet

namespace unet::ref {

template <class T>
void dropout_fwd(const T* x, T* y, size_t n, float p, uint64_t seed) {
  const T s = p < 1.0f ? T(1) / (T(1) - (T)p) : T(0);
#pragma omp parallel for schedule(static) if (n > 32768)
  for (size_t i = 0; i < n; ++i) y[i] = (p < 1.0f && dropout_uniform(seed, i) >= p) ? x[i] * s : T(0);
}

// Same mask: dx = dy * s where kept, 0 elsewhere.
template <class T>
void dropout_bwd(const T* dy, T* dx, size_t n, float p, uint64_t seed) {
  dropout_fwd(dy, dx, n, p, seed);
}

}  // namespace unet::ref
