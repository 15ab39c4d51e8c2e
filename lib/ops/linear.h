// Linear layer, x [N,I], w [O,I] (PyTorch layout), b [O] (nullable), y [N,O] (reference).
#pragma once
#include <algorithm>
#include <vector>

#include "gemm.h"

namespace unet::ref {

template <class T>
void linear_fwd(const T* x, const T* w, const T* b, T* y, int N, int I, int O) {
  std::vector<T> wt((size_t)I * O);  // [I, O]: the GEMM's inner loop runs over outputs
  for (int o = 0; o < O; ++o)
    for (int i = 0; i < I; ++i) wt[(size_t)i * O + o] = w[(size_t)o * I + i];
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < O; ++o) y[(size_t)n * O + o] = b ? b[o] : T(0);
  gemm_acc_par<T>(N, O, I, x, I, 1, wt.data(), O, y, O);
}

template <class T>
void linear_bwd(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int N, int I, int O) {
  if (dx) {  // dx = dy w
    std::fill(dx, dx + (size_t)N * I, T(0));
    gemm_acc_par<T>(N, I, O, dy, O, 1, w, I, dx, I);
  }
  if (dw) {  // dw = dy^T x
    std::fill(dw, dw + (size_t)O * I, T(0));
    gemm_acc_par<T>(O, I, N, dy, 1, O, x, I, dw, I);
  }
  if (db) {
    std::fill(db, db + O, T(0));
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < O; ++o) db[o] += dy[(size_t)n * O + o];
  }
}

}  // namespace unet::ref
