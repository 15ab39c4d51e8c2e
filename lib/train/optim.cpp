#include "optim.h"

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

void Optimizer::step(const Tensor& params, const Tensor& grads) {
  Ops& ops = eng_.ops();
  ops.run(SumSquares{grads, sumsq_});
  ops.run(ClipScale{sumsq_, norm_, scale_, (float)o_.grad_clip});
  ops.run(AdamWSchedule{count_, hyper_, o_.lr, o_.weight_decay, o_.beta1, o_.beta2, o_.warmup});
  ops.run(AdamW{params, grads, m_, v_, hyper_, scale_, (float)o_.beta1, (float)o_.beta2, (float)o_.eps});
  ops.run(Ema{ema_, params, (float)o_.ema_rate});
  ops.run(Add{norm_sum_, norm_, norm_sum_});
}

void Optimizer::reset_norm_sum() { eng_.ops().run(Fill{norm_sum_, 0.f}); }

double Optimizer::lr_at(int64_t s) const { return (float)ref::adamw_lr(o_.lr, o_.warmup, s + 1); }

}  // namespace unet
