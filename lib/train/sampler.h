// DDPM (ancestral) and DDIM sampling, batched on the model's backend (SPEC §1 sample, §4).
//
// Randomness is counter-based (rng.h) and indexed by the GLOBAL sample number, so the images do
// not depend on --batch-size: x_T[i] = normal(seed, SampleInit, i*numel + j) (j = NHWC element),
// the step noise of timestep t is normal(rng_key(seed, SampleStep, t), SampleStep, i*numel + j),
// and a class-conditional model sampled without labels gets randint(seed, SampleLabel, i, K)
// (guided-diffusion's image_sample.py likewise draws random classes).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "diffusion.h"
#include "engine.h"
#include "model.h"
#include "rng.h"

namespace unet {

struct SampleOptions {
  std::string sampler = "ddpm";  // ddpm | ddim
  int steps = 0;                 // 0 = all T; else respaced (ddpm) / DDIM step count
  // guided-diffusion's timestep_respacing ("250", "10,15,20", "ddim25"; space_timesteps): the kept
  // timesteps whichever the sampler; when set, steps is not read.
  std::string respacing;
  float eta = 0;                 // DDIM only, in [0, 1]
  bool clip = true;              // clip predicted x0 to [-1, 1]
  uint64_t seed = 0;
  int batch_size = 0;  // 0 = n
  // Replay the network's forward as a CUDA graph (one launch per step instead of hundreds) where
  // the engine has graphs and no classifier guides the steps. `unet sample` sets it; a trainer's
  // previews leave it off (the device holds one graph: the training step's).
  bool cuda_graph = false;
};

// What the sampler needs to know about the network, and the network itself as a function:
// denoise(x, t, labels, out) with tensors in engine memory: x [B,H,W,C] f32, t [B] f32 original
// timesteps (times 1000/T with rescale_timesteps), labels i32 [B] (absent when unconditional), out [B,H,W,C
// or 2C] f32.
struct SamplerNet {
  int image_size = 0, channels = 0;
  bool learn_sigma = false;
  bool class_cond = false;
  int num_classes = 0;
  int diffusion_steps = 0;
  std::string noise_schedule = "linear";
  bool predict_xstart = false;     // the mean channels are x0, not eps
  bool rescale_timesteps = false;  // denoise gets t * 1000/T (float32), not t
  std::function<void(const Tensor& x, const Tensor& t, const Tensor& labels, const Tensor& out)> denoise;
  // Optional: hold_weights(true) when a sample() begins, (false) when it ends: the weights do not
  // change in between, so the network may derive what it reads from them (the bf16 copy of the
  // weights) in the first step only. Measured on the H100: casting imagenet256's 554 M weights
  // to bf16 took 1.1 ms of each 81 ms step.
  std::function<void(bool)> hold_weights;
  // Classifier guidance (guided-diffusion's cond_fn; guidance.h), optional: grad(x, t, labels, g)
  // writes g [B,H,W,C] f32 = s * d log p(labels | x) / dx at the timesteps `t` the model sees. The
  // sampler then conditions each step's mean (DDPM: condition_mean) or score (DDIM:
  // condition_score). guide_classes: the labels it reads are 0..guide_classes-1; an
  // unconditional net then still gets labels (random unless given).
  std::function<void(const Tensor& x, const Tensor& t, const Tensor& labels, const Tensor& grad)> cond_fn;
  int guide_classes = 0;
};

// Sampler state: device and host buffers for batches of up to max_batch, allocated once
// (engine memory is never freed before the engine, so a trainer that samples every N steps
// keeps one Sampler instead of allocating per call).
class Sampler {
 public:
  Sampler(Engine& eng, SamplerNet net, int max_batch);
  int max_batch() const { return bmax_; }
  // Generates n images into out_nhwc (host, n*H*W*C floats): the value after the last step (in
  // [-1, 1] when clipping). noise_nhwc (host, n*H*W*C, NHWC) gives x_T, else it is drawn from the
  // rng. labels (host, n) are used by class-conditional nets, else ignored. Batches hold
  // min(opt.batch_size or n, max_batch()) images. progress(done, total) counts sampler steps over
  // all batches (total = batches * steps). Throws UserError on bad options.
  void run(const SampleOptions& opt, int n, const float* noise_nhwc, const int32_t* labels, float* out_nhwc,
           const std::function<void(int, int)>& progress);

 private:
  Engine& eng_;
  SamplerNet net_;
  int bmax_;
  Tensor x_, out_, eps_, var_, x0_, z_, noise_, step_, t_, y_, grad_, vgrad_;
  // Host staging (pinned on CUDA, so uploads run asynchronously) of step_ (the timesteps, t_, then
  // SampleStep's numbers); the fence says when it may be written again.
  float* ht_ = nullptr;
  uint64_t tfence_ = 0;
  // Draws the noise of the batch starting at sample `first` into z, on the device.
  void draw_noise(uint64_t key, Stream s, int64_t first, const Tensor& z);
  std::vector<int32_t> hy_;
};

// One-shot: a Sampler for min(opt.batch_size or n, n) images per batch, run once.
void sample(Engine& eng, const SamplerNet& net, const SampleOptions& opt, int n, const float* noise_nhwc,
            const int32_t* labels, float* out_nhwc, const std::function<void(int, int)>& progress);

// SamplerNet for a Model: Model::forward(train=false). The model must be planned for the batch.
// (Inline so that code using only the function-based sampler does not link the model.)
inline SamplerNet sampler_net(Model& model) {
  const ModelConfig& c = model.config();
  SamplerNet net;
  net.image_size = c.image_size;
  net.channels = c.in_channels;
  net.learn_sigma = c.learn_sigma;
  net.class_cond = c.class_cond;
  net.num_classes = c.num_classes;
  net.diffusion_steps = c.diffusion_steps;
  net.noise_schedule = c.noise_schedule;
  net.predict_xstart = c.predict_xstart;
  net.rescale_timesteps = c.rescale_timesteps;
  net.denoise = [&model](const Tensor& x, const Tensor& t, const Tensor& y, const Tensor& out) {
    model.forward(x, t, y, out, /*train=*/false);
  };
  net.hold_weights = [&model](bool on) { model.hold_weights(on); };
  return net;
}

// The one-shot sampler with a Model: plans its activations for the batch first.
inline void sample(Model& model, const SampleOptions& opt, int n, const float* noise_nhwc,
                   const int32_t* labels, float* out_nhwc, const std::function<void(int, int)>& progress) {
  if (n >= 1 && !model.planned_batch())
    model.plan(opt.batch_size > 0 ? std::min(opt.batch_size, n) : n, Mode::Sample);
  sample(model.engine(), sampler_net(model), opt, n, noise_nhwc, labels, out_nhwc, progress);
}

}  // namespace unet
