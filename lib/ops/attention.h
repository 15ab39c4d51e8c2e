// Multi-head self-attention on a fused qkv tensor: guided-diffusion's QKVAttention (new order) and
// QKVAttentionLegacy (reference).
//
// qkv [B, T, 3C]; head h of width d = C/heads reads
//   new order: q = qkv[..., h*d + i], k = qkv[..., C + h*d + i], v = qkv[..., 2C + h*d + i]
//   legacy:    q = qkv[..., 3hd + i], k = qkv[..., 3hd + d + i], v = qkv[..., 3hd + 2d + i]
// and writes out[..., h*d + i]. With s = d^-1/4 applied to q and k each (as guided-diffusion does,
// for fp16 headroom): attn[t, u] = softmax_u(sum_i (s q[t,i]) (s k[u,i])), out[t] = sum_u attn[t,u] v[u].
// Each (b, h) gathers its q, k, v into contiguous [T, d] buffers and runs three small GEMMs.
// (In the code T is the scalar type and T_ the number of positions.)
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "gemm.h"

namespace unet::ref {

struct AttnLayout {
  int q, k, v;  // channel offsets of head h's q, k, v inside a qkv row
};
inline AttnLayout attn_layout(int h, int C, int d, bool legacy) {
  if (legacy) return {3 * h * d, 3 * h * d + d, 3 * h * d + 2 * d};
  return {h * d, C + h * d, 2 * C + h * d};
}

// Forward: out, and lse[b, h, t] = log(sum_u exp(logit[t, u])) of the scaled logits (saved for
// backward instead of the [T, T] weights).
template <class T>
void attention_fwd(const T* qkv, T* out, T* lse, int B, int T_, int C, int heads, bool legacy) {
  const int d = C / heads;
  const T s = (T)(1.0 / std::sqrt(std::sqrt((double)d)));
  const size_t row = (size_t)3 * C;
#pragma omp parallel if ((double)B * T_ * T_ * C > 1e5)
  {
    std::vector<T> q((size_t)T_ * d), kt((size_t)d * T_), v((size_t)T_ * d), o((size_t)T_ * d),
        w((size_t)T_ * T_);
#pragma omp for schedule(dynamic)
    for (int bh = 0; bh < B * heads; ++bh) {
      const int b = bh / heads, h = bh % heads;
      const AttnLayout L = attn_layout(h, C, d, legacy);
      const T* base = qkv + (size_t)b * T_ * row;
      for (int t = 0; t < T_; ++t)
        for (int i = 0; i < d; ++i) {
          q[(size_t)t * d + i] = base[t * row + L.q + i] * s;
          kt[(size_t)i * T_ + t] = base[t * row + L.k + i] * s;  // k^T so u runs contiguous
          v[(size_t)t * d + i] = base[t * row + L.v + i];
        }
      std::fill(w.begin(), w.end(), T(0));
      gemm_acc<T>(T_, T_, d, q.data(), d, 1, kt.data(), T_, w.data(), T_);  // logits
      for (int t = 0; t < T_; ++t) {                                        // softmax over keys, in place
        T* wr = w.data() + (size_t)t * T_;
        const T mx = *std::max_element(wr, wr + T_);
        double z = 0;
        for (int u = 0; u < T_; ++u) {
          wr[u] = std::exp(wr[u] - mx);
          z += wr[u];
        }
        const T inv = (T)(1.0 / z);
        for (int u = 0; u < T_; ++u) wr[u] *= inv;
        lse[(size_t)bh * T_ + t] = (T)(mx + std::log(z));
      }
      std::fill(o.begin(), o.end(), T(0));
      gemm_acc<T>(T_, d, T_, w.data(), T_, 1, v.data(), d, o.data(), d);
      for (int t = 0; t < T_; ++t)
        std::copy(&o[(size_t)t * d], &o[(size_t)(t + 1) * d], out + ((size_t)b * T_ + t) * C + h * d);
    }
  }
}

// Backward: the weights are recomputed as w = exp(logit - lse); then dv = w^T dout,
// dw = dout v^T, dlogit[t,u] = w[t,u] (dw[t,u] - sum_u' w dw), dq = s dlogit (s k),
// dk = s dlogit^T (s q). Every channel of dqkv is written. (out is not needed here; fused
// kernels use rowsum(dout * out), which equals sum_u' w dw.)
template <class T>
void attention_bwd(const T* qkv, const T* lse, const T* dout, T* dqkv, int B, int T_, int C, int heads,
                   bool legacy) {
  const int d = C / heads;
  const T s = (T)(1.0 / std::sqrt(std::sqrt((double)d)));
  const size_t row = (size_t)3 * C;
#pragma omp parallel if ((double)B * T_ * T_ * C > 1e5)
  {
    const size_t td = (size_t)T_ * d;
    std::vector<T> q(td), k(td), kt(td), vt(td), go(td), dq(td), dk(td), dv(td), dl((size_t)T_ * T_),
        w((size_t)T_ * T_);
#pragma omp for schedule(dynamic)
    for (int bh = 0; bh < B * heads; ++bh) {
      const int b = bh / heads, h = bh % heads;
      const AttnLayout L = attn_layout(h, C, d, legacy);
      const T* base = qkv + (size_t)b * T_ * row;
      for (int t = 0; t < T_; ++t)
        for (int i = 0; i < d; ++i) {
          q[(size_t)t * d + i] = base[t * row + L.q + i] * s;
          k[(size_t)t * d + i] = base[t * row + L.k + i] * s;
          kt[(size_t)i * T_ + t] = base[t * row + L.k + i] * s;
          vt[(size_t)i * T_ + t] = base[t * row + L.v + i];
          go[(size_t)t * d + i] = dout[((size_t)b * T_ + t) * C + h * d + i];
        }
      std::fill(w.begin(), w.end(), T(0));
      gemm_acc<T>(T_, T_, d, q.data(), d, 1, kt.data(), T_, w.data(), T_);
      for (int t = 0; t < T_; ++t) {
        const T l = lse[(size_t)bh * T_ + t];
        for (int u = 0; u < T_; ++u) w[(size_t)t * T_ + u] = std::exp(w[(size_t)t * T_ + u] - l);
      }
      // dv[u, i] = sum_t w[t, u] go[t, i]   (A = w^T)
      std::fill(dv.begin(), dv.end(), T(0));
      gemm_acc<T>(T_, d, T_, w.data(), 1, T_, go.data(), d, dv.data(), d);
      // dw[t, u] = sum_i go[t, i] v[u, i]
      std::fill(dl.begin(), dl.end(), T(0));
      gemm_acc<T>(T_, T_, d, go.data(), d, 1, vt.data(), T_, dl.data(), T_);
      for (int t = 0; t < T_; ++t) {  // softmax backward, row by row
        const T* wr = w.data() + (size_t)t * T_;
        T* g = dl.data() + (size_t)t * T_;
        double dot = 0;
        for (int u = 0; u < T_; ++u) dot += (double)wr[u] * g[u];
        const T dt = (T)dot;
        for (int u = 0; u < T_; ++u) g[u] = wr[u] * (g[u] - dt) * s;  // s: chain rule of q*s, k*s
      }
      std::fill(dq.begin(), dq.end(), T(0));
      gemm_acc<T>(T_, d, T_, dl.data(), T_, 1, k.data(), d, dq.data(), d);
      std::fill(dk.begin(), dk.end(), T(0));
      gemm_acc<T>(T_, d, T_, dl.data(), 1, T_, q.data(), d, dk.data(), d);
      T* gb = dqkv + (size_t)b * T_ * row;
      for (int t = 0; t < T_; ++t)
        for (int i = 0; i < d; ++i) {
          gb[t * row + L.q + i] = dq[(size_t)t * d + i];
          gb[t * row + L.k + i] = dk[(size_t)t * d + i];
          gb[t * row + L.v + i] = dv[(size_t)t * d + i];
        }
    }
  }
}

}  // namespace unet::ref
