#include "objective.h"

#include <algorithm>
#include <cmath>

#include "op_defs.h"
#include "rng.h"
#include "util.h"

namespace unet {

Objective::Objective(const ModelConfig& c)
    : T(c.diffusion_steps),
      learn_sigma(c.learn_sigma),
      use_kl(c.use_kl),
      predict_xstart(c.predict_xstart),
      rescale_learned_sigmas(c.rescale_learned_sigmas),
      rescale_timesteps(c.rescale_timesteps) {}

double Objective::vb_scale() const {
  if (use_kl) return (double)T;                   // LossType.RESCALED_KL: loss *= num_timesteps
  if (rescale_learned_sigmas) return T / 1000.0;  // RESCALED_MSE: vb *= num_timesteps / 1000.0
  return 1.0;
}

float Objective::model_time(int t) const {
  if (!rescale_timesteps) return (float)t;
  return (float)t * (float)(1000.0 / T);  // t.float() * (1000.0 / num_timesteps), in float32
}

void loss_coef_row(const Diffusion& d, const Objective& o, int t, double w, int batch, size_t D, float* row) {
  const double ln2 = 0.69314718055994530942;
  row[kX0FromXt] = (float)d.sqrt_recip_alphas_cumprod.at(t);
  row[kX0FromEps] = (float)d.sqrt_recipm1_alphas_cumprod[t];
  row[kMeanX0] = (float)d.posterior_mean_coef1[t];
  row[kMeanXt] = (float)d.posterior_mean_coef2[t];
  row[kMinLog] = (float)d.posterior_log_variance_clipped[t];
  // Learned range: log(beta_t) is the high end. Fixed variance (use_kl without learn_sigma):
  // FIXED_LARGE, log([posterior_variance[1], betas[1:]])[t].
  row[kMaxLog] = (float)(o.learn_sigma ? std::log(d.betas[t]) : d.ddpm_coeffs(t).fixed_large_log_var);
  row[kDecoder] = t == 0 ? 1.0f : 0.0f;
  row[kVbScale] = (float)o.vb_scale();
  row[kGradMse] = (float)(2.0 * w / ((double)batch * (double)D));
  row[kGradVb] = (float)(w * o.vb_scale() / ((double)batch * (double)D * ln2));
  row[kWeight] = (float)w;
  row[kQuartile] = (float)quartile(t, d.num_timesteps());
}

// ---- LossSecondMomentResampler ----

LossSecondMomentResampler::LossSecondMomentResampler(int T, double uniform_prob)
    : T_(T), uniform_prob_(uniform_prob), hist_((size_t)T * kHistory, 0.0), counts_(T, 0) {}

bool LossSecondMomentResampler::warmed_up() const {
  for (int64_t c : counts_)
    if (c != kHistory) return false;
  return true;
}

std::vector<double> LossSecondMomentResampler::weights() const {
  std::vector<double> w(T_, 1.0);
  if (!warmed_up()) return w;
  double sum = 0;
  for (int t = 0; t < T_; ++t) {
    double s = 0;
    for (int j = 0; j < kHistory; ++j) s += hist_[(size_t)t * kHistory + j] * hist_[(size_t)t * kHistory + j];
    w[t] = std::sqrt(s / kHistory);
    sum += w[t];
  }
  for (double& x : w) {
    x /= sum;
    x *= 1 - uniform_prob_;
    x += uniform_prob_ / T_;
  }
  return w;
}

void LossSecondMomentResampler::update(const int* t, const float* loss, int n) {
  for (int i = 0; i < n; ++i) {
    const int ti = t[i];
    if (ti < 0 || ti >= T_) continue;
    double* h = hist_.data() + (size_t)ti * kHistory;
    if (counts_[ti] == kHistory) {  // shift out the oldest loss
      for (int j = 0; j + 1 < kHistory; ++j) h[j] = h[j + 1];
      h[kHistory - 1] = loss[i];
    } else {
      h[counts_[ti]++] = loss[i];
    }
  }
}

void LossSecondMomentResampler::sample(uint64_t seed, int64_t step, int B, const float* t_uniform, int* t,
                                       float* w, int first) const {
  if (!warmed_up()) {
    for (int b = 0; b < B; ++b) t[b] = (int)t_uniform[b], w[b] = 1.0f;
    return;
  }
  const std::vector<double> wt = weights();
  double total = 0;
  for (double x : wt) total += x;
  std::vector<double> cdf(T_);
  double acc = 0;
  for (int i = 0; i < T_; ++i) cdf[i] = acc += wt[i] / total;
  for (double& c : cdf) c /= cdf.back();
  const uint64_t key = rng_key(seed, Stream::TrainTimestepIS, (uint64_t)step);
  for (int b = 0; b < B; ++b) {
    const double u = uniform01_f64(key, Stream::TrainTimestepIS, (uint64_t)(first + b));
    const int i = (int)(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    t[b] = std::min(i, T_ - 1);
    w[b] = (float)(1.0 / (T_ * (wt[t[b]] / total)));
  }
}

void LossSecondMomentResampler::load(const std::vector<double>& history, const std::vector<int64_t>& counts,
                                     const std::string& what) {
  if (counts.size() != (size_t)T_)
    throw UserError(what + ": the loss-second-moment history has " + std::to_string(counts.size()) +
                    " timesteps, the model has " + std::to_string(T_));
  if (history.size() != (size_t)T_ * kHistory)
    throw UserError(what + ": state/loss_history holds " + std::to_string(history.size() / T_) +
                    " losses per timestep, the loss-second-moment sampler keeps " + std::to_string(kHistory));
  for (int64_t c : counts)
    if (c < 0 || c > kHistory)
      throw UserError(what + ": state/loss_counts holds " + std::to_string(c) + " (must be 0 to " +
                      std::to_string(kHistory) + ")");
  for (double h : history)
    if (!std::isfinite(h)) throw UserError(what + ": state/loss_history holds non-finite values");
  hist_ = history;
  counts_ = counts;
}

}  // namespace unet
