// The loss family (reference): the MSE and its gradient; guided-diffusion's training objective
// and variational-bound terms per sample (DiffusionLoss, math in loss_math.h) and the log's
// running sums (LossStats); the classifier's cross-entropy with top-k hits (CrossEntropy) and its
// log sums (ClassifierStats).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

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

// CrossEntropy on logits [B,K] and labels [B]: terms [B,kClassTerms] (nullable) = (logsumexp -
// logit[y], top-1 hit, top-5 hit), dlogits (nullable) = scale (softmax - onehot(y)). Per row: the
// max, then sum_k exp(l_k - max) serially in double.
template <class T>
void cross_entropy(const T* logits, const int32_t* labels, T* terms, T* dlogits, T scale, int B, int K) {
#pragma omp parallel for schedule(static) if ((size_t)B * K > 65536)
  for (int b = 0; b < B; ++b) {
    const T* l = logits + (size_t)b * K;
    const int y = labels[b];
    T mx = l[0];
    for (int k = 1; k < K; ++k) mx = l[k] > mx ? l[k] : mx;
    double z = 0;
    int above = 0;  // logits strictly greater than the label's: its rank
    for (int k = 0; k < K; ++k) {
      z += std::exp((double)(l[k] - mx));
      above += l[k] > l[y];
    }
    if (terms) {
      T* t = terms + (size_t)b * kClassTerms;
      t[kClassLoss] = (T)((double)mx + std::log(z) - (double)l[y]);
      t[kClassTop1] = above < 1 ? T(1) : T(0);
      t[kClassTop5] = above < 5 ? T(1) : T(0);
    }
    if (dlogits) {
      T* d = dlogits + (size_t)b * K;
      for (int k = 0; k < K; ++k)
        d[k] = scale * ((T)(std::exp((double)(l[k] - mx)) / z) - (k == y ? T(1) : T(0)));
    }
  }
}

// ClassifierStats: stats[j] += sum_b terms[b][j]; stats[3 + 3 q_b + j] += terms[b][j] (q_b in 0..3).
template <class T>
void classifier_stats(const T* terms, const int32_t* quartile, T* stats, int B) {
  double s[kClassStats] = {};
  for (int b = 0; b < B; ++b) {
    const int q = quartile[b];
    for (int j = 0; j < kClassTerms; ++j) {
      const double v = (double)terms[(size_t)b * kClassTerms + j];
      s[j] += v;
      if (q >= 0 && q < 4) s[kClassTerms + kClassTerms * q + j] += v;
    }
  }
  for (int k = 0; k < kClassStats; ++k) stats[k] = (T)((double)stats[k] + s[k]);
}

}  // namespace unet::ref
