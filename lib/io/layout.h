// PyTorch's NCHW <-> the engine's NHWC, for tensors crossing the file boundary (--noise, --h5,
// golden files). Weights convert in lib/params (torch_to_engine / engine_to_torch).
#pragma once
#include <cstddef>
#include <vector>

namespace unet {

template <class T>
std::vector<T> nchw_to_nhwc(const T* x, int N, int C, int H, int W) {
  std::vector<T> y((size_t)N * C * H * W);
  const size_t hw = (size_t)H * W;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (size_t p = 0; p < hw; ++p) y[((size_t)n * hw + p) * C + c] = x[((size_t)n * C + c) * hw + p];
  return y;
}

template <class T>
std::vector<T> nhwc_to_nchw(const T* x, int N, int C, int H, int W) {
  std::vector<T> y((size_t)N * C * H * W);
  const size_t hw = (size_t)H * W;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (size_t p = 0; p < hw; ++p) y[((size_t)n * C + c) * hw + p] = x[((size_t)n * hw + p) * C + c];
  return y;
}

}  // namespace unet
