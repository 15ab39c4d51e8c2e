// One training step on the device — q_sample, model forward, loss, backward, optimizer — with
// its buffers planned once. `unet train` enqueues it per batch (or captures it as a CUDA graph);
// `unet profile --layer model` times exactly this.
//
// The loss is guided-diffusion's training_losses for the model's objective (objective.h): the
// eps- (or x0-) MSE, plus the vb term with learned sigma (hybrid loss, stop-gradient on the mean),
// or the vb term alone with use_kl; per-sample importance weights scale it (schedule samplers).
// With micro-batches the step runs forward + backward per micro-batch of `microbatch` samples
// (the model is planned for that many) and sums the weight gradients in an f32 arena; every
// micro-batch's loss is scaled by 1/B, so the sum is the full batch's mean loss.
#pragma once
#include <cstdint>
#include <memory>

#include "comm.h"
#include "diffusion.h"
#include "model.h"
#include "objective.h"
#include "optim.h"

namespace unet {

class TrainStep {
 public:
  // Plans the model for training at micro-batches of `microbatch` samples (0 = the whole batch B;
  // it must divide B) and allocates the step's inputs.
  TrainStep(Engine& eng, Model& model, Optimizer& opt, int B, int microbatch = 0);

  // Inputs of a step, uploaded by the caller: x0, noise [B,H,W,C] f32, t [B] f32 the model's
  // timestep input, coef [2B] = sqrt(abar_t) | sqrt(1 - abar_t), loss_coef [B, kLossCoefRows]
  // (objective.h loss_coef_row), labels [B] i32 (class-conditional models). set_timesteps()
  // fills t, coef and loss_coef from integer timesteps. (Until it is called they hold the
  // timesteps (b * 7919) % T with weight 1, so a caller that uploads only t and coef, like the
  // profiler, still runs a well-defined loss.)
  Tensor x0, noise, t, coef, loss_coef, labels;
  Tensor terms;  // f32 [B, kLossTerms]: each sample's unweighted terms of the last step (DiffusionLoss)
  Tensor stats;  // f32 [7]: sum_b w_b (loss, mse, vb), per-quartile sums of w_b loss_b since reset_stats()

  // Computes t, coef and loss_coef on the host for timesteps ti[b] (indices into d) with importance
  // weights w[b] (null: all 1) and uploads them from pinned memory: asynchronous, so the caller
  // fences (as for the batch) before calling again.
  void set_timesteps(const Diffusion& d, const int* ti, const float* w);
  void reset_stats();
  int microbatch() const { return m_; }
  int micro_batches() const { return B_ / m_; }
  const Objective& objective() const { return obj_; }
  // The gradient the optimizer steps on: the model's, or the micro-batches' sum.
  Tensor gradients() const { return acc_.defined() ? acc_ : model_.grads(); }

  void forward(uint64_t dropout_seed, int micro = 0);  // q_sample (at micro 0), model forward
  void backward(int micro = 0);                        // loss, model backward, gradient sum
  void update();                                       // gradient average, optimizer (clip, AdamW, EMA)
  void enqueue(uint64_t dropout_seed);                 // every micro-batch, then update

  // Data-parallel training: the gradients are averaged over the ranks between backward and the
  // optimizer (in buckets during backward where the communicator can and there is one
  // micro-batch). nullptr: one process.
  void set_communicator(Communicator* comm);

 private:
  Engine& eng_;
  Model& model_;
  Optimizer& opt_;
  const ModelConfig& cfg_;
  Communicator* comm_ = nullptr;
  Objective obj_;
  int B_, m_;
  Tensor xt_, out_, dout_, acc_;
  float *h_t_ = nullptr, *h_coef_ = nullptr, *h_loss_coef_ = nullptr;
};

}  // namespace unet
