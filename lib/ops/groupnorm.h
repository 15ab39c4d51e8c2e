// GroupNorm over [B, HW, C] with G groups of C/G consecutive channels, eps 1e-5, optional fused
// SiLU (reference). Statistics accumulate in double and are stored (mean, rstd [B, G]) in T, and
// the normalisation uses the stored values, so forward and backward agree exactly.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "elementwise.h"

namespace unet::ref {

constexpr double kGroupNormEps = 1e-5;

template <class T>
void groupnorm_fwd(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int B, int HW, int C,
                   int G, bool silu_after) {
  const int cg = C / G;
  const double n = (double)HW * cg;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * HW * C > 32768)
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < G; ++g) {
      const T* xb = x + (size_t)b * HW * C + (size_t)g * cg;
      double s = 0;
      for (int hw = 0; hw < HW; ++hw)
        for (int c = 0; c < cg; ++c) s += xb[(size_t)hw * C + c];
      const double m = s / n;
      double v = 0;  // two-pass variance: no cancellation
      for (int hw = 0; hw < HW; ++hw)
        for (int c = 0; c < cg; ++c) {
          const double d = xb[(size_t)hw * C + c] - m;
          v += d * d;
        }
      const T mu = (T)m, rs = (T)(1.0 / std::sqrt(v / n + kGroupNormEps));
      mean[b * G + g] = mu;
      rstd[b * G + g] = rs;
      T* yb = y + (size_t)b * HW * C + (size_t)g * cg;
      const T* ga = gamma + g * cg;
      const T* be = beta + g * cg;
      for (int hw = 0; hw < HW; ++hw)
        for (int c = 0; c < cg; ++c) {
          const T z = (xb[(size_t)hw * C + c] - mu) * rs * ga[c] + be[c];
          yb[(size_t)hw * C + c] = silu_after ? silu(z) : z;
        }
    }
}

// With z = xhat*gamma + beta and dz = dy (times SiLU'(z) when fused):
// dgamma = sum dz*xhat, dbeta = sum dz, dx = rstd (dz*gamma - mean_g(dz*gamma) - xhat mean_g(dz*gamma*xhat)).
template <class T>
void groupnorm_bwd(const T* x, const T* gamma, const T* beta, const T* mean, const T* rstd, const T* dy,
                   T* dx, T* dgamma, T* dbeta, int B, int HW, int C, int G, bool silu_after) {
  const int cg = C / G;
  const double n = (double)HW * cg;
  // Per-sample, per-channel sums (double), combined over b in order afterwards.
  std::vector<double> sdz((size_t)B * C), sdzx((size_t)B * C);
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 32768)
  for (int b = 0; b < B; ++b) {
    const T* xb = x + (size_t)b * HW * C;
    const T* dyb = dy + (size_t)b * HW * C;
    double* pz = &sdz[(size_t)b * C];
    double* pzx = &sdzx[(size_t)b * C];
    std::fill(pz, pz + C, 0.0);
    std::fill(pzx, pzx + C, 0.0);
    auto dz_at = [&](size_t i, int c, T xh) {
      if (!silu_after) return dyb[i];
      return dyb[i] * silu_grad(xh * gamma[c] + beta[c]);
    };
    for (int hw = 0; hw < HW; ++hw)
      for (int c = 0; c < C; ++c) {
        const size_t i = (size_t)hw * C + c;
        const int g = c / cg;
        const T xh = (xb[i] - mean[b * G + g]) * rstd[b * G + g];
        const T dz = dz_at(i, c, xh);
        pz[c] += dz;
        pzx[c] += (double)dz * xh;
      }
    if (dx) {
      for (int g = 0; g < G; ++g) {
        double a = 0, bb = 0;  // mean over the group of dz*gamma and dz*gamma*xhat
        for (int c = g * cg; c < (g + 1) * cg; ++c) {
          a += gamma[c] * pz[c];
          bb += gamma[c] * pzx[c];
        }
        const T ma = (T)(a / n), mb = (T)(bb / n), mu = mean[b * G + g], rs = rstd[b * G + g];
        T* dxb = dx + (size_t)b * HW * C;
        for (int hw = 0; hw < HW; ++hw)
          for (int c = g * cg; c < (g + 1) * cg; ++c) {
            const size_t i = (size_t)hw * C + c;
            const T xh = (xb[i] - mu) * rs;
            dxb[i] = rs * (dz_at(i, c, xh) * gamma[c] - ma - xh * mb);
          }
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    double sg = 0, sb = 0;
    for (int b = 0; b < B; ++b) {
      sg += sdzx[(size_t)b * C + c];
      sb += sdz[(size_t)b * C + c];
    }
    if (dgamma) dgamma[c] = (T)sg;
    if (dbeta) dbeta[c] = (T)sb;
  }
}

}  // namespace unet::ref
