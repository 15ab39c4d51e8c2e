// The loss family (reference): the MSE and its gradient; guided-diffusion's training objective
// and variational-bound terms per sample (DiffusionLoss, math in loss_math.h) and the log's
// running sums (LossStats).
#pragma once
#include <cstddef>

#include "loss_math.h"
#include "reduce.h"

namespace unet::ref {

// *loss = mean((pred - target)^2), dpred = 2 (pred - target) / n (dpred nullable).
template <class T>
void mse_fwd_bwd(const T* pred, const T* target, T* loss, T* dpred, size_t n) {
  const double s = det_sum(n, [&](size_t i) {
    const double d = (double)pred[i] - (double)target[i];
    return d * d;
  });
  if (loss) *loss = (T)(s / (double)n);
  if (dpred) {
    const T k = T(2) / (T)n;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (size_t i = 0; i < n; ++i) dpred[i] = k * (pred[i] - target[i]);
  }
}

// DiffusionLoss (op_defs.h) on B samples of P pixels: out [B,P,Co] (Co = C or 2C), x0/xt/noise
// [B,P,C], coef [B,kLossCoefRows], terms [B,kLossTerms], dout [B,P,Co] (nullable). Each sample's
// sums run serially in double, so the result does not depend on the thread count.
template <class T>
void diffusion_loss(const T* out, const T* x0, const T* xt, const T* noise, const T* coef, T* terms, T* dout,
                    int B, size_t P, int C, int Co, bool predict_xstart, bool use_kl, bool clip) {
  lossmath::Flags f;
  f.learned = Co == 2 * C;
  f.predict_xstart = predict_xstart, f.use_kl = use_kl, f.clip = clip;
  f.vb = f.learned || use_kl;
  f.grad = dout != nullptr;
  const size_t D = P * (size_t)C;
#pragma omp parallel for schedule(static) if (B > 1 && (size_t)B * D > 32768)
  for (int b = 0; b < B; ++b) {
    const T* c = coef + (size_t)b * kLossCoefRows;
    double s_mse = 0, s_vb = 0, s_x0 = 0, s_eps = 0;
    for (size_t p = 0; p < P; ++p)
      for (int ch = 0; ch < C; ++ch) {
        const size_t i = ((size_t)b * P + p) * C + ch, o = ((size_t)b * P + p) * Co + ch;
        const lossmath::Elem<T> e =
            lossmath::element<T>(out[o], f.learned ? out[o + C] : T(0), x0[i], xt[i], noise[i], c, f);
        s_mse += (double)e.mse, s_vb += (double)e.vb, s_x0 += (double)e.x0_mse, s_eps += (double)e.eps_mse;
        if (dout) {
          dout[o] = e.dmean;
          if (f.learned) dout[o + C] = e.dvar;
        }
      }
    lossmath::finish<T>(s_mse, s_vb, s_x0, s_eps, (double)D, c, f, terms + (size_t)b * kLossTerms);
  }
}

// LossStats: stats[0..2] += sum_b w_b (loss, mse, vb)_b; stats[3 + q_b] += w_b loss_b. Each sum in
// double in sample order, added to the stored float once.
template <class T>
void loss_stats(const T* terms, const T* coef, T* stats, int B) {
  double s[7] = {0, 0, 0, 0, 0, 0, 0};
  for (int b = 0; b < B; ++b) {
    const T* c = coef + (size_t)b * kLossCoefRows;
    const T* t = terms + (size_t)b * kLossTerms;
    const double w = (double)c[kWeight];
    s[0] += w * (double)t[kTermLoss];
    s[1] += w * (double)t[kTermMse];
    s[2] += w * (double)t[kTermVb];
    const int q = (int)c[kQuartile];
    if (q >= 0 && q < 4) s[3 + q] += w * (double)t[kTermLoss];
  }
  for (int k = 0; k < 7; ++k) stats[k] = (T)((double)stats[k] + s[k]);
}

}  // namespace unet::ref
