// Nearest 2x upsampling and 2x2 average pooling, NHWC (reference).
#pragma once
#include <algorithm>
#include <cstddef>

namespace unet::ref {

// x [B,H,W,C] -> y [B,2H,2W,C], y[b, 2i+di, 2j+dj] = x[b, i, j].
template <class T>
void upsample2x_fwd(const T* x, T* y, int B, int H, int W, int C) {
  const int Wo = 2 * W;
#pragma omp parallel for schedule(static) if ((size_t)B * H * W * C > 16384)
  for (int r = 0; r < B * 2 * H; ++r) {
    const int b = r / (2 * H), i = r % (2 * H) / 2;
    const T* xr = x + ((size_t)b * H + i) * W * C;
    T* yr = y + (size_t)r * Wo * C;
    for (int j = 0; j < Wo; ++j)
      std::copy(xr + (size_t)(j / 2) * C, xr + (size_t)(j / 2 + 1) * C, yr + (size_t)j * C);
  }
}

// dx[b,i,j] = dy[2i,2j] + dy[2i,2j+1] + dy[2i+1,2j] + dy[2i+1,2j+1]
template <class T>
void upsample2x_bwd(const T* dy, T* dx, int B, int H, int W, int C) {
  const size_t rs = (size_t)2 * W * C;  // row stride of dy
#pragma omp parallel for schedule(static) if ((size_t)B * H * W * C > 16384)
  for (int r = 0; r < B * H; ++r) {
    const int b = r / H, i = r % H;
    const T* d0 = dy + ((size_t)b * 2 * H + 2 * i) * rs;
    T* dxr = dx + (size_t)r * W * C;
    for (int j = 0; j < W; ++j)
      for (int c = 0; c < C; ++c) {
        const size_t o = (size_t)2 * j * C + c;
        dxr[(size_t)j * C + c] = d0[o] + d0[o + C] + d0[rs + o] + d0[rs + o + C];
      }
  }
}

// x [B,H,W,C] -> y [B,H/2,W/2,C], mean of each 2x2 window (odd trailing row/column dropped,
// as AvgPool2d(2) does). Summed in window order (0,0),(0,1),(1,0),(1,1), then * 1/4 (exact).
template <class T>
void avgpool2x2_fwd(const T* x, T* y, int B, int H, int W, int C) {
  const int Ho = H / 2, Wo = W / 2;
  const size_t rs = (size_t)W * C;
#pragma omp parallel for schedule(static) if ((size_t)B * H * W * C > 16384)
  for (int r = 0; r < B * Ho; ++r) {
    const int b = r / Ho, i = r % Ho;
    const T* x0 = x + ((size_t)b * H + 2 * i) * rs;
    T* yr = y + (size_t)r * Wo * C;
    for (int j = 0; j < Wo; ++j)
      for (int c = 0; c < C; ++c) {
        const size_t o = (size_t)2 * j * C + c;
        yr[(size_t)j * C + c] = (x0[o] + x0[o + C] + x0[rs + o] + x0[rs + o + C]) * T(0.25);
      }
  }
}

template <class T>
void avgpool2x2_bwd(const T* dy, T* dx, int B, int H, int W, int C) {
  const int Ho = H / 2, Wo = W / 2;
#pragma omp parallel for schedule(static) if ((size_t)B * H * W * C > 16384)
  for (int r = 0; r < B * H; ++r) {
    const int b = r / H, i = r % H;
    T* dxr = dx + (size_t)r * W * C;
    if (i / 2 >= Ho) {  // dropped odd row
      std::fill(dxr, dxr + (size_t)W * C, T(0));
      continue;
    }
    const T* dyr = dy + ((size_t)b * Ho + i / 2) * Wo * C;
    for (int j = 0; j < W; ++j)
      for (int c = 0; c < C; ++c)
        dxr[(size_t)j * C + c] = j / 2 < Wo ? dyr[(size_t)(j / 2) * C + c] * T(0.25) : T(0);
  }
}

}  // namespace unet::ref
