// The attention-pooling head of guided-diffusion's classifier (AttentionPool2d), reference: the
// tokens the attention reads (the spatial mean prepended, the positional embedding added) and the
// pooled token the output projection reads. NHWC, pos in PyTorch's [C, T] layout.
#pragma once
#include <cstddef>

namespace unet::ref {

// x [B,P,C] (P = H*W), pos [C,P+1] -> y [B,P+1,C]: y[b,0] = mean_p x[b,p] + pos[:,0],
// y[b,1+p] = x[b,p] + pos[:,1+p]. The mean is a sum in p order divided by P.
template <class T>
void pool_tokens_fwd(const T* x, const T* pos, T* y, int B, int P, int C) {
  const int Tn = P + 1;
#pragma omp parallel for schedule(static) if ((size_t)B * P * C > 16384)
  for (int b = 0; b < B; ++b) {
    const T* xb = x + (size_t)b * P * C;
    T* yb = y + (size_t)b * Tn * C;
    for (int c = 0; c < C; ++c) {
      T s = 0;
      for (int p = 0; p < P; ++p) s += xb[(size_t)p * C + c];
      yb[c] = s / (T)P + pos[(size_t)c * Tn];
    }
    for (int p = 0; p < P; ++p)
      for (int c = 0; c < C; ++c)
        yb[(size_t)(1 + p) * C + c] = xb[(size_t)p * C + c] + pos[(size_t)c * Tn + 1 + p];
  }
}

// dx[b,p] = dy[b,1+p] + dy[b,0] / P;  dpos[c,t] = sum_b dy[b,t,c] (nullable; b order).
template <class T>
void pool_tokens_bwd(const T* dy, T* dx, T* dpos, int B, int P, int C) {
  const int Tn = P + 1;
#pragma omp parallel for schedule(static) if ((size_t)B * P * C > 16384)
  for (int b = 0; b < B; ++b) {
    const T* gb = dy + (size_t)b * Tn * C;
    for (int p = 0; p < P; ++p)
      for (int c = 0; c < C; ++c)
        dx[((size_t)b * P + p) * C + c] = gb[(size_t)(1 + p) * C + c] + gb[c] / (T)P;
  }
  if (!dpos) return;
  for (int c = 0; c < C; ++c)
    for (int t = 0; t < Tn; ++t) {
      T s = 0;
      for (int b = 0; b < B; ++b) s += dy[((size_t)b * Tn + t) * C + c];
      dpos[(size_t)c * Tn + t] = s;
    }
}

// x [B,T,C] -> y [B,C] = x[b,0]; and back: dx[b,0] = dy[b], other tokens 0.
template <class T>
void pool_select_fwd(const T* x, T* y, int B, int Tn, int C) {
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) y[(size_t)b * C + c] = x[(size_t)b * Tn * C + c];
}
template <class T>
void pool_select_bwd(const T* dy, T* dx, int B, int Tn, int C) {
  for (int b = 0; b < B; ++b)
    for (size_t i = 0; i < (size_t)Tn * C; ++i)
      dx[(size_t)b * Tn * C + i] = i < (size_t)C ? dy[(size_t)b * C + i] : T(0);
}

}  // namespace unet::ref
