// guided-diffusion's training objective, the host's part: the per-sample coefficient rows the
// DiffusionLoss op reads (schedule data at each sample's t, plus the loss's scaling), the
// timestep the model is called with, the log's quartiles, and the schedule samplers
// (resample.py's UniformSampler and LossSecondMomentResampler).
//
// The flags (ModelConfig; guided-diffusion's create_gaussian_diffusion):
//   learn_sigma             LEARNED_RANGE variance; the loss is the hybrid mse + vb, with the
//                           predicted mean held fixed for vb (only the variance channels learn it)
//   use_kl                  RESCALED_KL: loss = vb * T alone, its gradient reaching the mean too
//   rescale_learned_sigmas  RESCALED_MSE: the hybrid's vb * T/1000
//   predict_xstart          START_X: the mean channels predict x0 (MSE target x0)
//   rescale_timesteps       the model is called with t * 1000/T
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "diffusion.h"

namespace unet {

struct Objective {
  int T = 1000;
  bool learn_sigma = false, use_kl = false, predict_xstart = false, rescale_learned_sigmas = false,
       rescale_timesteps = false;
  Objective() = default;
  explicit Objective(const ModelConfig& c);

  bool has_vb() const { return learn_sigma || use_kl; }
  // The vb term's multiplier: T (use_kl), T/1000 (rescale_learned_sigmas), else 1.
  double vb_scale() const;
  // The timestep input of the model for timestep t: t, or float32(t) * float32(1000/T) with
  // rescale_timesteps (guided-diffusion's _scale_timesteps, computed in float32).
  float model_time(int t) const;
};

// guided-diffusion's log quartile of a timestep: int(4 t / T).
inline int quartile(int t, int T) { return (int)((4 * (int64_t)t) / T); }

// The DiffusionLoss coefficient row (op_defs.h LossCoefRow, kLossCoefRows floats) of a sample at
// timestep t of process d, with importance weight w, in a loss that is the mean over `batch`
// samples of D mean-channel elements each (the gradient rows carry w / batch).
void loss_coef_row(const Diffusion& d, const Objective& o, int t, double w, int batch, size_t D, float* row);

// guided-diffusion's LossSecondMomentResampler: the last `history` losses of every timestep;
// uniform until each timestep has them all, then p_t ∝ sqrt(mean(loss_t^2)), mixed with
// `uniform_prob` of the uniform distribution; the losses are scaled by 1 / (T p_t).
class LossSecondMomentResampler {
 public:
  static constexpr int kHistory = 10;
  explicit LossSecondMomentResampler(int T, double uniform_prob = 0.001);

  int T() const { return T_; }
  bool warmed_up() const;
  std::vector<double> weights() const;  // unnormalised; all ones before warm-up
  // update_with_all_losses: (t[i], loss[i]) in order.
  void update(const int* t, const float* loss, int n);

  // Timesteps and importance weights of the B samples of training step `step`, a pure function of
  // (seed, step, state): before warm-up t = t_uniform (the data loader's uniform draws) with
  // weight 1; after it, t_b = the first index whose normalised cumulative weight exceeds
  // u_b = uniform01_f64(rng_key(seed, TrainTimestepIS, step), TrainTimestepIS, b) (numpy's
  // choice: searchsorted(cdf, u, 'right')), weight float32(1 / (T p_t)). `first`: the index of
  // sample 0 in the global batch (a rank's slice of a data-parallel step draws u_{first + b}).
  void sample(uint64_t seed, int64_t step, int B, const float* t_uniform, int* t, float* w, int first = 0) const;

  // Checkpoint state: history [T, kHistory] (float64, oldest first) and counts [T].
  const std::vector<double>& history() const { return hist_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  // Restores a saved state; UserError naming `what` when it does not fit this T.
  void load(const std::vector<double>& history, const std::vector<int64_t>& counts, const std::string& what);

 private:
  int T_;
  double uniform_prob_;
  std::vector<double> hist_;
  std::vector<int64_t> counts_;
};

}  // namespace unet
