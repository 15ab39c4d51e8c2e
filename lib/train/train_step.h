// One training step on the device — q_sample, model forward, loss, backward, optimizer — with
// its buffers planned once. `unet train` enqueues it per batch (or captures it as a CUDA graph);
// `unet profile --layer model` times exactly this.
#pragma once
#include <cstdint>
#include <memory>

#include "comm.h"
#include "model.h"
#include "optim.h"

namespace unet {

class TrainStep {
 public:
  // Plans the model for training at batch B and allocates the step's inputs.
  TrainStep(Engine& eng, Model& model, Optimizer& opt, int B);

  // Inputs of a step, uploaded by the caller: x0, noise [B,H,W,C] f32, t [B] f32 timesteps,
  // coef [2B] = sqrt(abar_t) | sqrt(1 - abar_t), labels [B] i32 (class-conditional models).
  Tensor x0, noise, t, coef, labels;
  Tensor loss_sum;  // f32 [1]: the losses of the steps since the last reset

  // Data-parallel training: the gradients are averaged over the ranks between backward and the
  // optimizer (in buckets during backward where the communicator can). nullptr: one process.
  void set_communicator(Communicator* comm);

  void forward(uint64_t dropout_seed);  // q_sample, model forward
  void backward();                      // loss, model backward
  void update();                        // gradient average, optimizer (clip, AdamW, EMA), loss sum
  void enqueue(uint64_t dropout_seed) {
    forward(dropout_seed);
    backward();
    update();
  }

 private:
  Engine& eng_;
  Model& model_;
  Optimizer& opt_;
  const ModelConfig& cfg_;
  Communicator* comm_ = nullptr;
  Tensor xt_, out_, dout_, eps_, var_, deps_, zeros_, loss_;
};

}  // namespace unet
