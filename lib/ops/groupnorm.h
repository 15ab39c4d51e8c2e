// GroupNorm over [B, HW, C] with G groups of C/G consecutive channels, eps 1e-5, optional fused
// SiLU (reference). Statistics accumulate in double and are stored (mean, rstd [B, G]) in T, and
// the normalisation uses the stored values, so forward and backward agree exactly.
// Loops run over (hw, all channels) with per-channel accumulators, reduced to groups afterwards
// in channel order: contiguous, vectorisable, and the same order whatever the thread count.
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
#pragma omp parallel if ((size_t)B * HW * C > 32768)
  {
    std::vector<double> acc(C);
    std::vector<T> mu_c(C), rs_c(C);  // the group's stored statistics, per channel
#pragma omp for schedule(static)
    for (int b = 0; b < B; ++b) {
      const T* xb = x + (size_t)b * HW * C;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int hw = 0; hw < HW; ++hw)
        for (int c = 0; c < C; ++c) acc[c] += xb[(size_t)hw * C + c];
      std::vector<double> m(G, 0.0), v(G, 0.0);
      for (int c = 0; c < C; ++c) m[c / cg] += acc[c];
      for (int g = 0; g < G; ++g) m[g] /= n;
      std::fill(acc.begin(), acc.end(), 0.0);  // second pass: sum of squared deviations
      for (int hw = 0; hw < HW; ++hw)
        for (int c = 0; c < C; ++c) {
          const double d = xb[(size_t)hw * C + c] - m[c / cg];
          acc[c] += d * d;
        }
      for (int c = 0; c < C; ++c) v[c / cg] += acc[c];
      for (int g = 0; g < G; ++g) {
        mean[b * G + g] = (T)m[g];
        rstd[b * G + g] = (T)(1.0 / std::sqrt(v[g] / n + kGroupNormEps));
      }
      for (int c = 0; c < C; ++c) {
        mu_c[c] = mean[b * G + c / cg];
        rs_c[c] = rstd[b * G + c / cg];
      }
      T* yb = y + (size_t)b * HW * C;
      for (int hw = 0; hw < HW; ++hw) {
        const T* xr = xb + (size_t)hw * C;
        T* yr = yb + (size_t)hw * C;
        for (int c = 0; c < C; ++c) yr[c] = (xr[c] - mu_c[c]) * rs_c[c] * gamma[c] + beta[c];
        if (silu_after)
          for (int c = 0; c < C; ++c) yr[c] = silu(yr[c]);
      }
    }
  }
}

// With z = xhat*gamma + beta and dz = dy (times SiLU'(z) when fused):
// dgamma = sum dz*xhat, dbeta = sum dz,
// dx = rstd (dz*gamma - mean_g(dz*gamma) - xhat mean_g(dz*gamma*xhat)).
template <class T>
void groupnorm_bwd(const T* x, const T* gamma, const T* beta, const T* mean, const T* rstd, const T* dy,
                   T* dx, T* dgamma, T* dbeta, int B, int HW, int C, int G, bool silu_after) {
  const int cg = C / G;
  const double n = (double)HW * cg;
  // Per-sample, per-channel sums (double), combined over b in order afterwards.
  std::vector<double> sdz((size_t)B * C), sdzx((size_t)B * C);
#pragma omp parallel if ((size_t)B * HW * C > 32768)
  {
    std::vector<T> mu_c(C), rs_c(C), dz(C), xh(C), ma_c(C), mb_c(C);
    // xhat and dz of one pixel row, recomputed in both passes instead of stored
    auto row = [&](const T* xr, const T* dyr) {
      for (int c = 0; c < C; ++c) xh[c] = (xr[c] - mu_c[c]) * rs_c[c];
      if (silu_after)
        for (int c = 0; c < C; ++c) dz[c] = dyr[c] * silu_grad(xh[c] * gamma[c] + beta[c]);
      else
        for (int c = 0; c < C; ++c) dz[c] = dyr[c];
    };
#pragma omp for schedule(static)
    for (int b = 0; b < B; ++b) {
      const T* xb = x + (size_t)b * HW * C;
      const T* dyb = dy + (size_t)b * HW * C;
      double* pz = &sdz[(size_t)b * C];
      double* pzx = &sdzx[(size_t)b * C];
      std::fill(pz, pz + C, 0.0);
      std::fill(pzx, pzx + C, 0.0);
      for (int c = 0; c < C; ++c) {
        mu_c[c] = mean[b * G + c / cg];
        rs_c[c] = rstd[b * G + c / cg];
      }
      for (int hw = 0; hw < HW; ++hw) {
        row(xb + (size_t)hw * C, dyb + (size_t)hw * C);
        for (int c = 0; c < C; ++c) {
          pz[c] += dz[c];
          pzx[c] += (double)dz[c] * xh[c];
        }
      }
      if (!dx) continue;
      for (int g = 0; g < G; ++g) {
        double a = 0, bb = 0;  // group sums of dz*gamma and dz*gamma*xhat
        for (int c = g * cg; c < (g + 1) * cg; ++c) {
          a += gamma[c] * pz[c];
          bb += gamma[c] * pzx[c];
        }
        for (int c = g * cg; c < (g + 1) * cg; ++c) {
          ma_c[c] = (T)(a / n);
          mb_c[c] = (T)(bb / n);
        }
      }
      T* dxb = dx + (size_t)b * HW * C;
      for (int hw = 0; hw < HW; ++hw) {
        row(xb + (size_t)hw * C, dyb + (size_t)hw * C);
        T* dxr = dxb + (size_t)hw * C;
        for (int c = 0; c < C; ++c) dxr[c] = rs_c[c] * (dz[c] * gamma[c] - ma_c[c] - xh[c] * mb_c[c]);
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
