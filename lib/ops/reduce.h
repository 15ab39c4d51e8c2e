// Deterministic parallel sum: fixed-size chunks summed serially in double, chunk sums combined
// in chunk order, so the result is bitwise independent of the thread count.
#pragma once
#include <cstddef>
#include <vector>

namespace unet::ref {

template <class F>
double det_sum(size_t n, F term) {
  constexpr size_t kChunk = 16384;
  const size_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(nchunks, 0.0);
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
    double s = 0;
    for (size_t i = c * kChunk; i < end; ++i) s += term(i);
    part[c] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

}  // namespace unet::ref
