// Gaussian diffusion (SPEC §4), mirroring guided-diffusion's GaussianDiffusion / SpacedDiffusion:
// beta schedules, every coefficient array in float64, timestep respacing, and the per-step math
// of the DDPM (ancestral) and DDIM samplers applied to batches through the op table.
//
// Conventions: k is an index into THIS process (0..num_timesteps()-1); timestep_map[k] is the
// original timestep the model is called with. The base process has the identity map.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ops.h"

namespace unet {

// ---- schedules (float64) ----
// linear: numpy.linspace(1e-4*s, 0.02*s, T) with s = 1000/T, bit for bit.
std::vector<double> linear_betas(int T);
// cosine: beta_i = min(1 - abar((i+1)/T)/abar(i/T), 0.999), abar(s) = cos^2((s+0.008)/1.008*pi/2).
std::vector<double> cosine_betas(int T);
// "linear" | "cosine"; throws UserError otherwise (or when T < 1).
std::vector<double> named_betas(const std::string& schedule, int T);

// ---- respacing (guided-diffusion space_timesteps), sorted ascending ----
// DDIM: {0, s, 2s, ...} for the smallest integer stride s >= 1 with exactly N elements.
// Throws UserError when no stride gives N (e.g. T=1000, N=999) or N is out of [1, T].
// (guided-diffusion only tries s <= T-1, so it rejects N=1; s = T is allowed here and gives {0}.)
std::vector<int> space_timesteps_ddim(int T, int N);
// DDPM: round(x_i), x_0 = 0, x_{i+1} = x_i + (T-1)/(N-1) accumulated in float64, rounding half to
// even like Python's round(); N = 1 gives {0}. Throws UserError unless 1 <= N <= T.
std::vector<int> space_timesteps_ddpm(int T, int N);
// The kept timesteps of a sampler run: steps == 0 means all T; sampler is "ddpm" or "ddim".
std::vector<int> sampler_timesteps(const std::string& sampler, int T, int steps);
// guided-diffusion's space_timesteps(T, timestep_respacing): "ddimN" (space_timesteps_ddim), or
// section counts "N1,N2,..." (one count: space_timesteps_ddpm): T cut into as many sections as
// counts, as equal as possible (the first T % k one step longer), section i keeping N_i of its
// steps spaced as space_timesteps_ddpm spaces them (0 keeps none of it). Throws UserError naming
// the spec when it does not parse, a section is shorter than its count or nothing is kept.
std::vector<int> space_timesteps(int T, const std::string& spec);

class Diffusion {
 public:
  // The base process of a model: T steps of the named schedule.
  Diffusion(int T, const std::string& schedule, bool learn_sigma);
  // Any process from its betas (each in (0, 1]); map[k] = original timestep of step k.
  Diffusion(std::vector<double> betas, std::vector<int> timestep_map, bool learn_sigma);

  // The process that keeps only the steps `keep` (indices into this process, any order, no
  // duplicates): beta'_k = 1 - abar[keep_k]/abar[keep_{k-1}] (abar before the first = 1), all
  // coefficients recomputed, timestep_map composed. guided-diffusion's SpacedDiffusion.
  Diffusion respaced(const std::vector<int>& keep) const;

  int num_timesteps() const { return static_cast<int>(betas.size()); }
  bool learn_sigma() const { return learn_sigma_; }

  // ---- coefficient arrays (float64, length num_timesteps()), as in GaussianDiffusion ----
  std::vector<double> betas;
  std::vector<double> alphas_cumprod;
  std::vector<double> alphas_cumprod_prev;  // [1, abar_0, ..., abar_{T-2}]
  std::vector<double> alphas_cumprod_next;  // [abar_1, ..., abar_{T-1}, 0]
  std::vector<double> sqrt_alphas_cumprod;
  std::vector<double> sqrt_one_minus_alphas_cumprod;
  std::vector<double> log_one_minus_alphas_cumprod;
  std::vector<double> sqrt_recip_alphas_cumprod;
  std::vector<double> sqrt_recipm1_alphas_cumprod;
  std::vector<double> posterior_variance;
  // log([posterior_variance[1], posterior_variance[1:]]); with one step, log(betas[0]) (unused:
  // the last step adds no noise, but guided-diffusion would fail on it).
  std::vector<double> posterior_log_variance_clipped;
  std::vector<double> posterior_mean_coef1;
  std::vector<double> posterior_mean_coef2;
  std::vector<int> timestep_map;
  // The model's mean channels are x0 (guided-diffusion's START_X) instead of eps: predict_x0 takes
  // them as they are. Carried over by respaced().
  bool predict_xstart = false;

  // ---- training ----
  // Per-sample float32 coefficients of q_sample for timesteps t[b] (integers stored as float,
  // indices into this process): sqrt_ab[b] = sqrt(abar_t), sqrt_1mab[b] = sqrt(1 - abar_t).
  void q_sample_coeffs(const float* t, int B, float* sqrt_ab, float* sqrt_1mab) const;

  // ---- scalars of one sampler step k (double; rounded to float once, where used) ----
  struct DdpmCoeffs {
    double x0_from_xt, x0_from_eps;  // x0 = x0_from_xt*x_t - x0_from_eps*eps
    double mean_x0, mean_xt;         // posterior mean = mean_x0*x0 + mean_xt*x_t
    double fixed_large_log_var;      // log([posterior_variance[1], betas[1:]])[k]
    double min_log, max_log;         // learned range: posterior_log_variance_clipped[k], log(beta_k)
    bool noise;                      // false at k == 0
  };
  DdpmCoeffs ddpm_coeffs(int k) const;

  struct DdimCoeffs {
    double x0_from_xt, x0_from_eps;
    double abar, abar_prev, sigma;  // sigma = eta*sqrt((1-abar_prev)/(1-abar))*sqrt(1-abar/abar_prev)
    double eps_coef;                // sqrt(max(0, 1 - abar_prev - sigma^2))
    // x_prev = out_x0*x0 + out_xt*x_t + sigma*z, which is sqrt(abar_prev)*x0 + eps_coef*eps with
    // eps re-derived from the (clipped) x0: eps = (x0_from_xt*x_t - x0)/x0_from_eps.
    double out_x0, out_xt;
    bool noise;  // false at k == 0 or when sigma == 0
  };
  DdimCoeffs ddim_coeffs(int k, double eta) const;

  // ---- one step on a batch through the op table; all samples at the same step k ----
  // Tensors f32 of one size (the whole batch) in engine memory. x0 is scratch (written).
  // x0 = x0_from_xt*x - x0_from_eps*eps (with predict_xstart: x0 = eps, the model's x0), clamped to
  // [-1, 1] when clip.
  void predict_x0(Ops& ops, int k, const Tensor& x, const Tensor& eps, const Tensor& x0, bool clip) const;
  // x <- posterior mean(x0, x) + noise_scale*noise; noise is ignored at k == 0 (may be absent).
  // Fixed-large variance: noise = z, noise_scale = fixed_large_std(k). Learned range: noise =
  // LearnedRangeNoise{v, z} (learned_range_bounds), noise_scale = 1.
  // Classifier guidance (guided-diffusion's condition_mean): the mean gains guide_scale * guide,
  // where guide * guide_scale = variance * grad (guided_mean_term()).
  void ddpm_step(Ops& ops, int k, const Tensor& x, const Tensor& eps, const Tensor& x0, const Tensor& noise,
                 float noise_scale, bool clip, const Tensor& guide = {}, float guide_scale = 0) const;
  // x <- DDIM update with eta; z is used only when ddim_coeffs(k, eta).noise (may be absent else).
  // Classifier guidance (guided-diffusion's condition_score): with grad = s * d log p(y|x_t)/dx_t,
  // eps <- eps(x0) - sqrt(1 - abar) grad, i.e. the (clipped) predicted x0 moves by
  // sqrt(1/abar - 1) sqrt(1 - abar) grad, unclipped, before the update.
  void ddim_step(Ops& ops, int k, double eta, const Tensor& x, const Tensor& eps, const Tensor& x0,
                 const Tensor& z, bool clip, const Tensor& guide_grad = {}) const;
  // The numbers of the op SampleStep (op_defs.h) at k, c[0..6]: the same floats ddpm_step
  // (learned sigma: its LearnedRangeNoise bounds, noise scale 1) or ddim_step passes its ops.
  void sample_step_coefs(int k, bool ddim, double eta, float* c) const;
  // The DDPM guidance term variance * grad for the fixed-large variance: the scalar variance
  // (guide = grad, guide_scale = this). With learned sigma the variance is per element:
  // LearnedRangeNoise{v, grad, guide, 2 min_log, 2 max_log} gives exp(logvar) * grad (scale 1).
  double fixed_large_variance(int k) const;

  // exp(0.5 * fixed-large log variance at k).
  double fixed_large_std(int k) const;
  // guided-diffusion's LEARNED_RANGE at k: the op LearnedRangeNoise with these bounds gives
  // exp(0.5*logvar)*z, logvar = frac*max_log + (1-frac)*min_log, frac = (v+1)/2, in float32.
  struct LogRange {
    float min_log, max_log;
  };
  LogRange learned_range_bounds(int k) const;

 private:
  void compute_coefficients();
  bool learn_sigma_ = false;
};

}  // namespace unet
