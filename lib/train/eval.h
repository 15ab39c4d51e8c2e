// `unet eval`: guided-diffusion's calc_bpd_loop — the full variational bound of a model on
// images, in bits per dimension. Per image and timestep t (all T): x_t = q_sample(x0, t, noise),
// the vb term (KL(q(x_{t-1}|x_t,x_0) || p(x_{t-1}|x_t)) for t > 0, the discretized-Gaussian decoder
// NLL at t = 0; the predicted x0 clipped to [-1, 1] unless clip is off), the x0 MSE and the eps MSE
// (eps re-derived from the predicted x0); then the prior term KL(q(x_T|x_0) || N(0, I)) and
// total = sum_t vb + prior. The per-term arithmetic is the DiffusionLoss op's (op_defs.h).
//
// The noise is counter-based (rng.h): normal(rng_key(seed, EvalNoise, t), EvalNoise,
// i*numel + j) for image i of the dataset and NHWC element j, so results do not depend on the
// batch size.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine.h"
#include "model.h"

namespace unet {

struct EvalOptions {
  int64_t n = 0;       // images 0..n-1 of the dataset (0 = all)
  int batch_size = 0;  // images per model call (0 = min(n, 32))
  bool clip = true;    // calc_bpd_loop's clip_denoised
  uint64_t seed = 0;
};

struct EvalResult {
  int64_t n = 0;
  // Means over the images, per timestep t = 0..T-1: vb (bits/dim), x0 MSE, eps MSE.
  std::vector<double> vb, x0_mse, mse;
  double prior_bpd = 0, total_bpd = 0;  // means over the images
  std::vector<double> total_per_image;  // total bits/dim of each image
};

// Evaluates `model` (weights uploaded, not yet planned) on images [0, n) of the dataset at
// dataset_path (uint8 images as `unet prepare` writes them, labels for class-conditional models).
// progress(done, total) counts model calls (batches x T). UserError on a bad dataset or options.
EvalResult evaluate(Engine& eng, Model& model, const std::string& dataset_path, const EvalOptions& opt,
                    const std::function<void(int64_t, int64_t)>& progress);

}  // namespace unet
