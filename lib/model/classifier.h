// guided-diffusion's noisy-image classifier (EncoderUNetModel with pool="attention", as
// create_classifier builds it) on the op table: the UNet's blocks (blocks.h) for the time
// embedding, input blocks and middle block, then the head out = GroupNorm, SiLU, AttentionPool2d
// (tokens = [spatial mean, positions] + positional_embedding, qkv_proj, QKVAttention, c_proj of
// the first token) -> logits [B, num_classes].
//
// Backward yields the parameter gradients (Mode::Train) and the gradient of the input image
// (Train and InputGrad): classifier guidance needs d log p(y | x_t) / d x_t and nothing else, so
// Mode::InputGrad plans no parameter gradients and skips their work.
#pragma once
#include <cstdint>
#include <memory>

#include "arch.h"
#include "config.h"
#include "engine.h"
#include "network.h"

namespace unet {

class Classifier : public Network {
 public:
  Classifier(const ClassifierConfig& cfg, Engine& eng);
  ~Classifier() override;

  const ClassifierConfig& config() const { return cfg_; }
  const Arch& arch() const { return arch_; }

  // x [B,H,W,Cin] f32, t [B] f32 (the timesteps the diffusion model sees) -> logits [B,K] f32.
  // No dropout (the classifier has none); plans for B in Sample mode when nothing is planned.
  void forward(const Tensor& x, const Tensor& t, const Tensor& logits);
  // From dlogits = dL/dlogits [B,K] f32, after a forward of the same batch (planned Train or
  // InputGrad): the parameter gradients (Train; overwrites grads()) and input_grad().
  void backward(const Tensor& dlogits);
  // dL/dx [B,H,W,Cin] f32 of the last backward (a view into planned memory).
  Tensor input_grad() const;

  struct Impl;

 protected:
  void declare(Planner& pl, int B, Mode m) override;
  void trace(Ops& tracer, int B, Mode m) override;
  Blocks* blocks() override;

 private:
  ClassifierConfig cfg_;
  ModelConfig body_;
  Arch arch_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace unet
