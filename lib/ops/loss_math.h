// The per-element arithmetic of guided-diffusion's training objective and variational bound
// (gaussian_diffusion.py training_losses / _vb_terms_bpd, losses.py normal_kl /
// discretized_gaussian_log_likelihood / approx_standard_normal_cdf) and its derivatives, written
// once for the CPU reference (lib/ops/loss.h, instantiated in float and double) and the CUDA
// variant (kernels/loss/diffusion_loss.cu, float). The op's layout, reductions and scaling live
// with each engine; this header is only the math of one element and of one sample's totals.
//
// Operation order follows guided-diffusion's float32 expressions, so float results agree with
// PyTorch's to rounding; the derivatives are those of the same expressions (torch.clamp passes
// the gradient where its input >= the bound).
#pragma once
#include <cmath>

#include "op_defs.h"

#ifdef __CUDACC__
#define UNET_LOSS_HD __host__ __device__ __forceinline__
#else
#define UNET_LOSS_HD inline
#endif

namespace unet::lossmath {

// exp, log and tanh for float and double in host and device code.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }
__device__ __forceinline__ float ln(float x) { return logf(x); }
__device__ __forceinline__ double ln(double x) { return log(x); }
__device__ __forceinline__ float th(float x) { return tanhf(x); }
__device__ __forceinline__ double th(double x) { return tanh(x); }
#else
inline float ex(float x) { return std::exp(x); }
inline double ex(double x) { return std::exp(x); }
inline float ln(float x) { return std::log(x); }
inline double ln(double x) { return std::log(x); }
inline float th(float x) { return std::tanh(x); }
inline double th(double x) { return std::tanh(x); }
#endif

// What one call computes: the variance channel exists (learned range), the mean channels are x0
// (else eps), loss = vb alone with the KL's gradient reaching the mean, x0 is clipped, the vb term
// is wanted, gradients are wanted.
struct Flags {
  bool learned = false, predict_xstart = false, use_kl = false, clip = false, vb = false, grad = false;
};

template <class T>
struct Elem {
  T mse = 0, vb = 0, x0_mse = 0, eps_mse = 0;  // squared errors; vb in nats (KL or decoder NLL)
  T dmean = 0, dvar = 0;                       // dout of the mean and variance channel
};

// guided-diffusion's approx_standard_normal_cdf: 0.5 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// and its derivative.
template <class T>
UNET_LOSS_HD void approx_cdf(T x, T* cdf, T* dcdf) {
  const T k = T(0.79788456080286535588);  // np.sqrt(2.0 / np.pi)
  const T a = T(0.044715);
  const T t = th(k * (x + a * (x * x * x)));
  *cdf = T(0.5) * (T(1) + t);
  *dcdf = T(0.5) * (T(1) - t * t) * k * (T(1) + T(3) * a * (x * x));
}

// One element: mo the mean-channel output (eps or x0), v the variance value (learned range),
// x0 / xt / noise the data, c the sample's coef row (LossCoefRow).
template <class T>
UNET_LOSS_HD Elem<T> element(T mo, T v, T x0, T xt, T noise, const T* c, const Flags& f) {
  Elem<T> e;
  // _predict_xstart_from_eps (or the output itself), clipped for evaluation.
  T px0 = f.predict_xstart ? mo : c[kX0FromXt] * xt - c[kX0FromEps] * mo;
  if (f.clip) px0 = px0 < T(-1) ? T(-1) : (px0 > T(1) ? T(1) : px0);
  const T target = f.predict_xstart ? x0 : noise;
  const T dt = target - mo;
  e.mse = dt * dt;
  const T dx = px0 - x0;
  e.x0_mse = dx * dx;
  const T eps = (c[kX0FromXt] * xt - px0) / c[kX0FromEps];  // _predict_eps_from_xstart
  const T de = eps - noise;
  e.eps_mse = de * de;

  T dvb_dmean = 0, dvb_dlv = 0;  // derivatives of the vb element in the model's mean / log variance
  if (f.vb) {
    // p_mean_variance with LEARNED_RANGE (or a fixed variance) and q_posterior_mean_variance.
    const T mean = c[kMeanX0] * px0 + c[kMeanXt] * xt;
    T lv = c[kMaxLog];
    if (f.learned) {
      const T frac = (v + T(1)) / T(2);
      lv = frac * c[kMaxLog] + (T(1) - frac) * c[kMinLog];
    }
    if (c[kDecoder] != T(0)) {
      // -discretized_gaussian_log_likelihood(x0, means=mean, log_scales=0.5*lv)
      const T log_scale = T(0.5) * lv;
      const T centered = x0 - mean;
      const T inv_stdv = ex(-log_scale);
      const T plus_in = inv_stdv * (centered + T(1.0 / 255.0));
      const T min_in = inv_stdv * (centered - T(1.0 / 255.0));
      T cdf_plus, dcdf_plus, cdf_min, dcdf_min;
      approx_cdf(plus_in, &cdf_plus, &dcdf_plus);
      approx_cdf(min_in, &cdf_min, &dcdf_min);
      const T tiny = T(1e-12);
      T lp, dlp_plus = 0, dlp_min = 0;  // log prob and its derivatives in plus_in, min_in
      if (x0 < T(-0.999)) {
        lp = ln(cdf_plus < tiny ? tiny : cdf_plus);
        if (cdf_plus >= tiny) dlp_plus = dcdf_plus / cdf_plus;
      } else if (x0 > T(0.999)) {
        const T one_minus = T(1) - cdf_min;
        lp = ln(one_minus < tiny ? tiny : one_minus);
        if (one_minus >= tiny) dlp_min = -dcdf_min / one_minus;
      } else {
        const T delta = cdf_plus - cdf_min;
        lp = ln(delta < tiny ? tiny : delta);
        if (delta >= tiny) dlp_plus = dcdf_plus / delta, dlp_min = -dcdf_min / delta;
      }
      e.vb = -lp;
      if (f.grad) {
        dvb_dmean = inv_stdv * (dlp_plus + dlp_min);
        dvb_dlv = T(0.5) * (dlp_plus * plus_in + dlp_min * min_in);
      }
    } else {
      // normal_kl(true_mean, true_log_variance_clipped, mean, lv)
      const T true_mean = c[kMeanX0] * x0 + c[kMeanXt] * xt;
      const T true_lv = c[kMinLog];
      const T d = true_mean - mean;
      const T e_lv = ex(true_lv - lv), e_neg = ex(-lv);
      e.vb = T(0.5) * (T(-1) + lv - true_lv + e_lv + (d * d) * e_neg);
      if (f.grad) {
        dvb_dmean = -d * e_neg;
        dvb_dlv = T(0.5) * (T(1) - e_lv - (d * d) * e_neg);
      }
    }
  }
  if (f.grad) {
    if (f.use_kl) {
      // No stop-gradient: vb reaches the mean channels through the predicted x0.
      const T dmean_dmo = f.predict_xstart ? c[kMeanX0] : -c[kMeanX0] * c[kX0FromEps];
      e.dmean = c[kGradVb] * dvb_dmean * dmean_dmo;
    } else {
      e.dmean = c[kGradMse] * (mo - target);  // frozen_out: vb does not reach the mean
    }
    if (f.learned && f.vb) e.dvar = c[kGradVb] * dvb_dlv * ((c[kMaxLog] - c[kMinLog]) / T(2));
  }
  return e;
}

// A sample's terms from its sums (double) over its D mean-channel elements: mse_flat, vb in bits
// (mean_flat / ln 2, times kVbScale), loss, x0 and eps MSE (calc_bpd_loop's xstart_mse, mse).
template <class T>
UNET_LOSS_HD void finish(double s_mse, double s_vb, double s_x0, double s_eps, double D, const T* c,
                         const Flags& f, T* terms) {
  const double mse = s_mse / D;
  const double vb = f.vb ? s_vb / D / 0.69314718055994530942 * (double)c[kVbScale] : 0.0;
  terms[kTermMse] = (T)mse;
  terms[kTermVb] = (T)vb;
  terms[kTermLoss] = (T)(f.use_kl ? vb : mse + vb);
  terms[kTermX0Mse] = (T)(s_x0 / D);
  terms[kTermEpsMse] = (T)(s_eps / D);
}

}  // namespace unet::lossmath
