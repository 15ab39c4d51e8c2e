// One training step on the device — q_sample, model forward, loss, backward, optimizer — with
// its buffers planned once. `unet train` enqueues it per batch (or captures it as a CUDA graph);
// `unet profile --layer model` times exactly this. (The classifier's step, classifier_train.h,
// shares StepBase.)
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

// What every training step shares, whatever the network and the loss: micro-batches (the network
// planned for `microbatch` samples, weight gradients summed in an f32 arena), the gradient
// all-reduce of data-parallel training, and the optimizer (clip, AdamW, EMA). A step is
// forward + backward per micro-batch, then update(); derived steps supply forward and backward.
class StepBase {
 public:
  // `microbatch` 0 = the whole batch B; it must divide B (UserError). The derived step plans the
  // network for microbatch() samples.
  StepBase(Engine& eng, Network& net, Optimizer& opt, int B, int microbatch);
  virtual ~StepBase();  // takes its grad-ready hook off the network (which outlives the step)
  StepBase(const StepBase&) = delete;
  StepBase& operator=(const StepBase&) = delete;

  int batch() const { return B_; }
  int microbatch() const { return m_; }
  int micro_batches() const { return B_ / m_; }
  // The gradient the optimizer steps on: the network's, or the micro-batches' sum.
  Tensor gradients() const { return acc_.defined() ? acc_ : net_.grads(); }

  virtual void forward(uint64_t dropout_seed, int micro = 0) = 0;  // inputs, network forward
  virtual void backward(int micro = 0) = 0;                        // loss, network backward, sum
  void update();                        // gradient average, optimizer (clip, AdamW, EMA)
  void enqueue(uint64_t dropout_seed);  // every micro-batch, then update

  // Whether the optimizer updates each range of weights as the backward finalizes its gradients
  // (on the engine's optimizer stream; see set_hooks).
  bool updates_early() const { return early_; }
  void allow_early_updates(bool on) {  // (on by default where it applies)
    allow_early_ = on;
    set_hooks();
  }

  // Data-parallel training: the gradients are averaged over the ranks between backward and the
  // optimizer (in buckets during backward where the communicator can and there is one
  // micro-batch). nullptr: one process.
  void set_communicator(Communicator* comm);

 protected:
  // Around the network's backward of micro-batch `micro`: the all-reduce's start (one
  // micro-batch), the gradient sum (several).
  void grads_begin();
  void grads_end(int micro);
  // Samples [off, off + n) of a per-sample buffer (dimension 0 is the batch).
  static Tensor rows(const Tensor& t, int64_t off, int64_t n);

  Engine& eng_;
  Network& net_;
  Optimizer& opt_;
  Communicator* comm_ = nullptr;
  int B_, m_;
  Tensor acc_;

 private:
  // The network's grad-ready hook: the all-reduce's buckets, or (one process, one micro-batch,
  // no clipping, a CUDA engine with lanes) the optimizer's update of each finalized range on the
  // engine's optimizer stream (Ops::aside) while the backward goes on, so the step does not end
  // with a whole AdamW + EMA pass over the weights. armed_: between grads_begin() and update().
  void set_hooks();
  bool early_ = false, armed_ = false, allow_early_ = true;
};

// The diffusion model's step: q_sample, model forward, guided-diffusion's loss, backward. With bf16
// activations the optimizer keeps the model's bf16 weight copy (Optimizer::keep_shadow, Model::
// weights_kept_by_optimizer): whoever changes the weights otherwise calls Model::refresh_weights().
class TrainStep : public StepBase {
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
  const Objective& objective() const { return obj_; }

  void forward(uint64_t dropout_seed, int micro = 0) override;  // q_sample (at micro 0), model forward
  void backward(int micro = 0) override;                        // loss, model backward, gradient sum

 private:
  Model& model_;
  const ModelConfig& cfg_;
  Objective obj_;
  Tensor xt_, out_, dout_;
  float *h_t_ = nullptr, *h_coef_ = nullptr, *h_loss_coef_ = nullptr;
};

}  // namespace unet
