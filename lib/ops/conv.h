// 2-D convolution, NHWC, weights [Co, k, k, Ci], padding k/2, stride 1 or 2 (reference).
//
// Forward: one output row at a time, im2col the row into [Wo, k*k*Ci] (K contiguous, the same
// order as the weight) and multiply by the weight transposed to [K, Co].
// dx: gathered per input row (no scatter, so rows are independent across threads): input pixel
// (iy, ix) receives dy at every output position whose window covers it with tap (ky, kx), i.e.
// oy = (iy + pad - ky) / stride when that divides exactly; the row of such dy vectors (zeros for
// missing taps) times the weight rearranged to [(ky, kx, co), ci] is dx's row.
// dw: each thread owns tiles of dw (one tap x a block of co x a block of ci) and sums over every
// output pixel in order, so no partial sums need combining.
#pragma once
#include <algorithm>
#include <cstring>
#include <vector>

#include "gemm.h"

namespace unet::ref {

inline int conv_out_size(int n, int k, int stride) { return (n + 2 * (k / 2) - k) / stride + 1; }

// col [Wo, k*k*Ci] for output row (b, oy); zeros where the window leaves the image.
template <class T>
void conv_im2col_row(const T* x, T* col, int b, int oy, int H, int W, int Ci, int k, int stride, int Wo) {
  const int pad = k / 2;
  const size_t K = (size_t)k * k * Ci;
  for (int ox = 0; ox < Wo; ++ox) {
    T* dst = col + ox * K;
    for (int ky = 0; ky < k; ++ky) {
      const int iy = oy * stride - pad + ky;
      for (int kx = 0; kx < k; ++kx, dst += Ci) {
        const int ix = ox * stride - pad + kx;
        if (iy < 0 || iy >= H || ix < 0 || ix >= W)
          std::fill(dst, dst + Ci, T(0));
        else
          std::memcpy(dst, x + (((size_t)b * H + iy) * W + ix) * Ci, sizeof(T) * Ci);
      }
    }
  }
}

template <class T>
void conv2d_fwd(const T* x, const T* w, const T* bias, T* y, int B, int H, int W, int Ci, int Co, int k,
                int stride) {
  const int Ho = conv_out_size(H, k, stride), Wo = conv_out_size(W, k, stride);
  const int K = k * k * Ci;
  std::vector<T> wt((size_t)K * Co);  // [K, Co]: the GEMM's inner loop runs over co
  for (int co = 0; co < Co; ++co)
    for (int kk = 0; kk < K; ++kk) wt[(size_t)kk * Co + co] = w[(size_t)co * K + kk];
  const bool direct = (k == 1 && stride == 1);          // a 1x1 conv reads x rows as they are
  const bool par = (double)B * Ho * Wo * Co * K > 2e5;  // small convs are not worth a thread team
#pragma omp parallel if (par)
  {
    std::vector<T> col(direct ? 0 : (size_t)Wo * K);
#pragma omp for schedule(static)
    for (int r = 0; r < B * Ho; ++r) {
      const int b = r / Ho, oy = r % Ho;
      T* yr = y + (size_t)r * Wo * Co;
      for (int ox = 0; ox < Wo; ++ox)
        for (int co = 0; co < Co; ++co) yr[(size_t)ox * Co + co] = bias ? bias[co] : T(0);
      const T* a;
      if (direct) {
        a = x + (size_t)r * W * Ci;
      } else {
        conv_im2col_row(x, col.data(), b, oy, H, W, Ci, k, stride, Wo);
        a = col.data();
      }
      gemm_acc<T>(Wo, Co, K, a, K, 1, wt.data(), Co, yr, Co);
    }
  }
}

// The fused epilogue of ConvFwd: y[b, p, c] += emb[b, c], then += res[b, p, c] (each nullable).
template <class T>
void conv_epilogue(T* y, const T* emb, const T* res, int B, size_t HW, int C) {
  if (!emb && !res) return;
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 65536)
  for (int b = 0; b < B; ++b)
    for (size_t p = 0; p < HW; ++p) {
      const size_t o = ((size_t)b * HW + p) * C;
      if (emb)
        for (int c = 0; c < C; ++c) y[o + c] += emb[(size_t)b * C + c];
      if (res)
        for (int c = 0; c < C; ++c) y[o + c] += res[o + c];
    }
}

template <class T>
void conv2d_bwd(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int B, int H, int W, int Ci, int Co,
                int k, int stride) {
  const int pad = k / 2, taps = k * k;
  const int Ho = conv_out_size(H, k, stride), Wo = conv_out_size(W, k, stride);
  const size_t K = (size_t)taps * Ci, P = (size_t)B * Ho * Wo;
  const bool par = (double)P * Co * K > 2e5;

  if (db) {  // serial over pixels, vectorised over channels
    std::fill(db, db + Co, T(0));
    for (size_t p = 0; p < P; ++p)
      for (int co = 0; co < Co; ++co) db[co] += dy[p * Co + co];
  }

  if (dx) {
    const int KD = taps * Co;
    std::vector<T> wr((size_t)KD * Ci);  // [(tap, co), ci]
    for (int co = 0; co < Co; ++co)
      for (int t = 0; t < taps; ++t)
        std::memcpy(&wr[((size_t)t * Co + co) * Ci], w + ((size_t)co * taps + t) * Ci, sizeof(T) * Ci);
#pragma omp parallel if (par)
    {
      std::vector<T> rows((size_t)W * KD);
#pragma omp for schedule(static)
      for (int r = 0; r < B * H; ++r) {
        const int b = r / H, iy = r % H;
        for (int ix = 0; ix < W; ++ix) {
          T* dst = rows.data() + (size_t)ix * KD;
          for (int ky = 0; ky < k; ++ky) {
            const int ny = iy + pad - ky;  // = oy * stride when tap ky of row oy covers iy
            const int oy = ny / stride;
            const bool yok = ny >= 0 && ny % stride == 0 && oy < Ho;
            for (int kx = 0; kx < k; ++kx, dst += Co) {
              const int nx = ix + pad - kx, ox = nx / stride;
              if (yok && nx >= 0 && nx % stride == 0 && ox < Wo)
                std::memcpy(dst, dy + (((size_t)b * Ho + oy) * Wo + ox) * Co, sizeof(T) * Co);
              else
                std::fill(dst, dst + Co, T(0));
            }
          }
        }
        T* dxr = dx + (size_t)r * W * Ci;
        std::fill(dxr, dxr + (size_t)W * Ci, T(0));
        gemm_acc<T>(W, Ci, KD, rows.data(), KD, 1, wr.data(), Ci, dxr, Ci);
      }
    }
  }

  if (dw) {
    constexpr int CO_B = 64, CI_B = 32;
    const int nco = (Co + CO_B - 1) / CO_B, nci = (Ci + CI_B - 1) / CI_B;
    const int ntiles = taps * nco * nci;
#pragma omp parallel if (par)
    {
      std::vector<T> xs((size_t)Wo * CI_B);
#pragma omp for schedule(dynamic)
      for (int tile = 0; tile < ntiles; ++tile) {
        const int t = tile / (nco * nci), ky = t / k, kx = t % k;
        const int co0 = (tile / nci % nco) * CO_B, ci0 = tile % nci * CI_B;
        const int cob = std::min(CO_B, Co - co0), cib = std::min(CI_B, Ci - ci0);
        T* dwt = dw + (size_t)co0 * K + (size_t)t * Ci + ci0;
        for (int co = 0; co < cob; ++co) std::fill(dwt + co * K, dwt + co * K + cib, T(0));
        for (int r = 0; r < B * Ho; ++r) {
          const int b = r / Ho, oy = r % Ho, iy = oy * stride - pad + ky;
          if (iy < 0 || iy >= H) continue;  // this tap reads only padding for the whole row
          for (int ox = 0; ox < Wo; ++ox) {
            const int ix = ox * stride - pad + kx;
            T* dst = xs.data() + (size_t)ox * cib;
            if (ix < 0 || ix >= W)
              std::fill(dst, dst + cib, T(0));
            else
              std::memcpy(dst, x + (((size_t)b * H + iy) * W + ix) * Ci + ci0, sizeof(T) * cib);
          }
          // dw[co, t, ci] += sum_ox dy[r, ox, co] * x[.., ci]: A = dy^T (rows co, stride 1).
          gemm_acc<T>(cob, cib, Wo, dy + (size_t)r * Wo * Co + co0, 1, Co, xs.data(), cib, dwt, K);
        }
      }
    }
  }
}

}  // namespace unet::ref
