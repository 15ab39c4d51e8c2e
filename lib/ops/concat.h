// Channel concatenation [B,HW,Ca] ++ [B,HW,Cb] -> [B,HW,Ca+Cb], a first (reference).
#pragma once
#include <algorithm>
#include <cstddef>

namespace unet::ref {

template <class T>
void concat_fwd(const T* a, const T* b, T* y, int B, int HW, int Ca, int Cb) {
  const int C = Ca + Cb;
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 65536)
  for (int r = 0; r < B * HW; ++r) {
    std::copy(a + (size_t)r * Ca, a + (size_t)(r + 1) * Ca, y + (size_t)r * C);
    std::copy(b + (size_t)r * Cb, b + (size_t)(r + 1) * Cb, y + (size_t)r * C + Ca);
  }
}

template <class T>
void concat_bwd(const T* dy, T* da, T* db, int B, int HW, int Ca, int Cb) {
  const int C = Ca + Cb;
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 65536)
  for (int r = 0; r < B * HW; ++r) {
    const T* d = dy + (size_t)r * C;
    if (da) std::copy(d, d + Ca, da + (size_t)r * Ca);
    if (db) std::copy(d + Ca, d + C, db + (size_t)r * Cb);
  }
}

}  // namespace unet::ref
