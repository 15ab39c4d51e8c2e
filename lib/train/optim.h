// AdamW with gradient-norm clipping, learning-rate warmup and an EMA of the weights, over the
// flat f32 parameter arena — one implementation for every engine, all of it device work:
// the per-step scalars (bias corrections, warmup) come from a step counter in device memory
// (op AdamWSchedule), so a step enqueues no host arithmetic and a captured graph replays it.
#pragma once
#include <cstdint>
#include <vector>

#include "engine.h"

namespace unet {

struct OptimizerOptions {
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double ema_rate = 0.9999;
  double grad_clip = 0.0;  // 0 = off
  int64_t warmup = 0;      // linear warmup steps, 0 = none
  int64_t anneal = 0;      // linear decay to 0 over this many steps (guided-diffusion's lr_anneal_steps), 0 = none
};

class Optimizer {
 public:
  // State for n parameters: moments zero, EMA unset (init_ema or load before the first step).
  Optimizer(Engine& eng, size_t n, const OptimizerOptions& o);
  const OptimizerOptions& options() const { return o_; }

  // Host state in (checkpoint load): moments and EMA of n floats each (m/v may be null: zeros),
  // and the number of steps already taken.
  void load(const float* m, const float* v, const float* ema, int64_t steps);
  void init_ema(const Tensor& params);              // EMA = a copy of the weights
  void save(float* m, float* v, float* ema) const;  // blocks

  // Enqueues one update of params from grads: norm, clip scale, AdamW, EMA; adds the gradient
  // norm to norm_sum(). No host synchronisation.
  void step(const Tensor& params, const Tensor& grads);

  // The same update in pieces, as the backward finalizes the gradients (only without clipping:
  // then AdamW needs no global norm, and every element gets bitwise the update step() gives it):
  // begin_early() enqueues the step's schedule; update_from(params, grads, first) AdamW and EMA
  // for [first, the previous first) (the backward finalizes the gradients from the arena's end
  // down); step() then updates what is left below and adds the norm.
  bool can_update_early() const { return o_.grad_clip <= 0; }
  void begin_early();
  void update_from(const Tensor& params, const Tensor& grads, size_t first);
  // Whether update_from(.., first) would enqueue work (a range of at least kEarlyMin not updated yet).
  bool update_due(size_t first) const { return early_ && first < done_ && done_ - first >= kEarlyMin; }

  Tensor ema() const { return ema_; }
  // Each update also writes the updated weights' bf16 copy here (the network's shadow arena, the
  // params' size; undefined: none).
  void keep_shadow(const Tensor& shadow) { shadow_ = shadow; }
  Tensor norm_sum() const { return norm_sum_; }  // f32 [1], reset with reset_norm_sum()
  void reset_norm_sum();
  // The learning rate of step index s (0-based) — the schedule's value, for logs.
  double lr_at(int64_t s) const;

 private:
  Engine& eng_;
  size_t n_;
  OptimizerOptions o_;
  Tensor m_, v_, ema_, count_, hyper_, sumsq_, norm_, scale_, norm_sum_;
  Tensor shadow_;
  bool early_ = false;  // begin_early() called; [done_, n_) updated
  size_t done_ = 0;
  // With early updates, each range's sum of squared gradients, in update order (ClipScale adds
  // them): one more slot than there can be ranges of kEarlyMin, for the rest at step().
  static constexpr size_t kEarlyMin = size_t(1) << 20;
  Tensor range_sq_;
  int64_t ranges_ = 0;
  void update(const Tensor& params, const Tensor& grads, size_t lo, size_t hi, bool scaled,
              const Tensor& gsq = {});
};

}  // namespace unet
