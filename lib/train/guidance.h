// Classifier guidance (Dhariwal & Nichol; guided-diffusion's classifier_sample.py): the sampler's
// cond_fn from a noisy-image classifier,
//   grad = s * d/dx sum_b log softmax(classifier(x, t))[b, y_b],
// computed with the classifier planned in Mode::InputGrad (forward, the cross-entropy's gradient
// at scale -s, backward to the image only: no parameter gradients). The sampler applies it as
// guided-diffusion's condition_mean (DDPM) or condition_score (DDIM): see Diffusion::ddpm_step /
// ddim_step. The classifier sees the timesteps the model sees (the original ones of a respaced
// run, times 1000/T with rescale_timesteps), as SpacedDiffusion wraps cond_fn.
#pragma once
#include <memory>

#include "classifier.h"
#include "engine.h"
#include "sampler.h"

namespace unet {

class ClassifierGuide {
 public:
  // Plans the classifier for batches of up to max_batch (Mode::InputGrad) and allocates the
  // logits and their gradient. The classifier's weights are the caller's (uploaded before use).
  ClassifierGuide(Engine& eng, Classifier& classifier, float scale, int max_batch);
  // grad [B,H,W,C] f32 = scale * d log p(y | x, t) / dx for x [B,H,W,C] f32, t [B] f32, y i32 [B].
  void grad(const Tensor& x, const Tensor& t, const Tensor& y, const Tensor& grad);
  // Adds the guidance to a sampler net (net.cond_fn, net.guide_classes); this object must outlive it.
  void attach(SamplerNet& net);

 private:
  Engine& eng_;
  Classifier& cls_;
  float scale_;
  Tensor logits_, dlogits_;
};

}  // namespace unet
