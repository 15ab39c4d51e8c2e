#include "optim.h"

#include <stdexcept>

#include "adamw_schedule.h"

namespace unet {

Optimizer::Optimizer(Engine& eng, size_t n, const OptimizerOptions& o) : eng_(eng), n_(n), o_(o) {
  const int64_t N = (int64_t)n;
  m_ = eng.alloc(DType::F32, {N});
  v_ = eng.alloc(DType::F32, {N});
  ema_ = eng.alloc(DType::F32, {N});
  count_ = eng.alloc(DType::I32, {1});
  hyper_ = eng.alloc(DType::F32, {4});
  sumsq_ = eng.alloc(DType::F32, {1});
  norm_ = eng.alloc(DType::F32, {1});
  scale_ = eng.alloc(DType::F32, {1});
  norm_sum_ = eng.alloc(DType::F32, {1});
  range_sq_ = eng.alloc(DType::F32, {(int64_t)(n / kEarlyMin + 2)});
  Ops& ops = eng.ops();
  ops.run(Fill{m_, 0.f});
  ops.run(Fill{v_, 0.f});
  ops.run(Fill{count_, 0.f});
  ops.run(Fill{norm_sum_, 0.f});
}

void Optimizer::load(const float* m, const float* v, const float* ema, int64_t steps) {
  if (m) eng_.upload(m_, m);
  if (v) eng_.upload(v_, v);
  if (ema) eng_.upload(ema_, ema);
  const int32_t c = (int32_t)steps;
  eng_.upload(count_, &c);
}

void Optimizer::init_ema(const Tensor& params) { eng_.ops().run(Copy{params, ema_}); }

void Optimizer::save(float* m, float* v, float* ema) const {
  eng_.download(m, m_);
  eng_.download(v, v_);
  eng_.download(ema, ema_);
}

// AdamW and the EMA (one pass) over [lo, hi); scaled: by the clip scale (else by nothing: the
// same bits as a scale of 1); gsq: where the range's sum of squared gradients goes (or nowhere).
void Optimizer::update(const Tensor& params, const Tensor& grads, size_t lo, size_t hi, bool scaled,
                       const Tensor& gsq) {
  if (hi <= lo) return;
  const size_t n = hi - lo;
  eng_.ops().run(AdamW{params.flat(lo, n), grads.flat(lo, n), m_.flat(lo, n), v_.flat(lo, n), hyper_,
                       scaled ? scale_ : Tensor{}, (float)o_.beta1, (float)o_.beta2, (float)o_.eps,
                       ema_.flat(lo, n), (float)o_.ema_rate,
                       shadow_.defined() ? shadow_.flat(lo, n) : Tensor{}, gsq});
}

void Optimizer::step(const Tensor& params, const Tensor& grads) {
  Ops& ops = eng_.ops();
  if (early_) {
    // The norm (for the logs: no clipping here) from the ranges' sums of squares, which their
    // updates add as they read the gradients (a pass over all 88 MB of seed64's here took 45 us
    // at the end of the step, H100).
    ops.join_aside();  // (the schedule and the ranges' sums)
    if (done_ > 0) update(params, grads, 0, done_, false, range_sq_.flat(ranges_++, 1));
    if (ranges_ == 0) ops.run(Fill{range_sq_.flat(ranges_++, 1), 0.f});
    ops.run(ClipScale{range_sq_.flat(0, ranges_), norm_, scale_, (float)o_.grad_clip});
    early_ = false;
  } else {
    ops.run(SumSquares{grads, sumsq_});
    ops.run(ClipScale{sumsq_, norm_, scale_, (float)o_.grad_clip});
    ops.run(AdamWSchedule{count_, hyper_, o_.lr, o_.weight_decay, o_.beta1, o_.beta2, o_.warmup, o_.anneal});
    update(params, grads, 0, n_, true);
  }
  ops.run(Add{norm_sum_, norm_, norm_sum_});
}

void Optimizer::begin_early() {
  if (!can_update_early()) throw std::logic_error("early updates need clipping off");
  // on the optimizer's stream, which the first range's update follows (off the backward's start)
  Ops& ops = eng_.ops();
  ops.aside(true);
  ops.run(AdamWSchedule{count_, hyper_, o_.lr, o_.weight_decay, o_.beta1, o_.beta2, o_.warmup, o_.anneal});
  ops.aside(false);
  early_ = true, done_ = n_, ranges_ = 0;
}

// Called on the optimizer's stream (StepBase's grad-ready hook).
void Optimizer::update_from(const Tensor& params, const Tensor& grads, size_t first) {
  // ranges of at least kEarlyMin parameters (16 MB of state and gradient): smaller ones wait for
  // the next (measured: one launch per layer made the updates slower than the single pass)
  if (!update_due(first)) return;
  update(params, grads, first, done_, false, range_sq_.flat(ranges_++, 1));
  done_ = first;
}

void Optimizer::reset_norm_sum() { eng_.ops().run(Fill{norm_sum_, 0.f}); }

double Optimizer::lr_at(int64_t s) const { return (float)ref::adamw_lr(o_.lr, o_.warmup, o_.anneal, s + 1); }

}  // namespace unet
