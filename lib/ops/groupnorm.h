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

// The statistics alone: mean and rstd [B, G] of x (two passes: the mean, then the squared
// deviations from it).
template <class T>
void groupnorm_stats(const T* x, T* mean, T* rstd, int B, int HW, int C, int G) {
  const int cg = C / G;
  const double n = (double)HW * cg;
#pragma omp parallel if ((size_t)B * HW * C > 32768)
  {
    std::vector<double> acc(C);
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
    }
  }
}

template <class T>
void groupnorm_ss_apply(const T* x, const T* gamma, const T* beta, const T* ss, const T* mean, const T* rstd, T* y,
                        int B, int HW, int C, int G, bool silu_after);

// The statistics, then the output from them (as stored).
template <class T>
void groupnorm_fwd(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int B, int HW, int C,
                   int G, bool silu_after) {
  groupnorm_stats(x, mean, rstd, B, HW, C, G);
  groupnorm_ss_apply<T>(x, gamma, beta, nullptr, mean, rstd, y, B, HW, C, G, silu_after);
}

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

// GroupNormFwd with optional scale-shift (ss [B, 2C] = scale | shift) between the affine and the
// SiLU: y = SiLU((GN(x) gamma + beta) (1 + scale) + shift). Composed from the plain ops.
template <class T>
void groupnorm_ss_fwd(const T* x, const T* gamma, const T* beta, const T* ss, T* y, T* mean, T* rstd, int B,
                      int HW, int C, int G, bool silu_after) {
  if (!ss) return groupnorm_fwd(x, gamma, beta, y, mean, rstd, B, HW, C, G, silu_after);
  groupnorm_fwd(x, gamma, beta, y, mean, rstd, B, HW, C, G, false);
  scale_shift_fwd(y, ss, y, B, HW, C);
  if (silu_after) silu_fwd(y, y, (size_t)B * HW * C);
}

// The forward's output from given statistics (mean, rstd [B, G]): no reduction.
template <class T>
void groupnorm_ss_apply(const T* x, const T* gamma, const T* beta, const T* ss, const T* mean, const T* rstd, T* y, int B,
                        int HW, int C, int G, bool silu_after) {
  const int cg = C / G;
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 65536)
  for (int r = 0; r < B * HW; ++r) {
    const int b = r / HW;
    const T* xr = x + (size_t)r * C;
    T* yr = y + (size_t)r * C;
    for (int c = 0; c < C; ++c) {
      T z = (xr[c] - mean[b * G + c / cg]) * rstd[b * G + c / cg] * gamma[c] + beta[c];
      if (ss) z = z * (T(1) + ss[(size_t)b * 2 * C + c]) + ss[(size_t)b * 2 * C + C + c];
      yr[c] = silu_after ? silu(z) : z;
    }
  }
}

// Its backward from the saved statistics: recomputes n = GN(x) gamma + beta and z, then
// dz = dy SiLU'(z), dss and dn from the scale-shift, dx/dgamma/dbeta from the norm.
template <class T>
void groupnorm_ss_bwd(const T* x, const T* gamma, const T* beta, const T* ss, const T* mean, const T* rstd,
                      const T* dy, T* dx, T* dgamma, T* dbeta, T* dss, int B, int HW, int C, int G,
                      bool silu_after) {
  if (!ss) return groupnorm_bwd(x, gamma, beta, mean, rstd, dy, dx, dgamma, dbeta, B, HW, C, G, silu_after);
  const size_t N = (size_t)B * HW * C;
  const int cg = C / G;
  std::vector<T> n(N), dz(N), dn(N);
#pragma omp parallel for schedule(static) if (N > 65536)
  for (size_t i = 0; i < N; ++i) {
    const int c = (int)(i % C), b = (int)(i / ((size_t)HW * C)), g = c / cg;
    n[i] = (x[i] - mean[b * G + g]) * rstd[b * G + g] * gamma[c] + beta[c];
    const T z = n[i] * (T(1) + ss[(size_t)b * 2 * C + c]) + ss[(size_t)b * 2 * C + C + c];
    dz[i] = silu_after ? dy[i] * silu_grad(z) : dy[i];
  }
  std::vector<T> dss_local(dss ? 0 : (size_t)B * 2 * C);
  scale_shift_bwd(n.data(), ss, dz.data(), dn.data(), dss ? dss : dss_local.data(), B, HW, C);
  groupnorm_bwd(x, gamma, beta, mean, rstd, dn.data(), dx, dgamma, dbeta, B, HW, C, G, false);
}

// Column sums of y [B, HW, C] in double, in row order: per_sample [B, C] (the per-sample sums)
// and total [C] (their sum over the batch, in batch order); each optional. GroupNormBwd's dx_sums,
// dx_total and add_total.
template <class T>
void column_sums(const T* y, int B, int HW, int C, T* per_sample, T* total) {
  if (!per_sample && !total) return;
  std::vector<double> all((size_t)B * C, 0.0);
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 32768)
  for (int b = 0; b < B; ++b) {
    double* a = all.data() + (size_t)b * C;
    for (int hw = 0; hw < HW; ++hw) {
      const T* r = y + ((size_t)b * HW + hw) * C;
      for (int c = 0; c < C; ++c) a[c] += (double)r[c];
    }
  }
  if (per_sample)
    for (size_t i = 0; i < all.size(); ++i) per_sample[i] = (T)all[i];
  if (total)
    for (int c = 0; c < C; ++c) {
      double t = 0;
      for (int b = 0; b < B; ++b) t += all[(size_t)b * C + c];
      total[c] = (T)t;
    }
}

}  // namespace unet::ref
