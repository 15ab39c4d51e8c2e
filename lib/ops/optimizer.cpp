// CPU engine, optimizer family: reference variants (lib/ops/optimizer.h in float).
#include "optimizer.h"

#include <algorithm>

#include "cpu_engine.h"

namespace unet {
namespace {

void sumsq(const SumSquares& o) { ref::sum_squares<float>(o.x.f32(), o.out.f32(), o.x.numel()); }
void clip(const ClipScale& o) {
  ref::clip_scale<float>(o.sumsq.f32(), o.sumsq.numel(), o.clip, o.norm.defined() ? o.norm.f32() : nullptr,
                         o.scale.f32());
}
void schedule(const AdamWSchedule& o) {
  int32_t* step = o.step.i32();
  ++*step;
  ref::adamw_hyper(*step, o.lr, o.weight_decay, o.beta1, o.beta2, o.warmup, o.anneal, o.hyper.f32());
}
void adamw(const AdamW& o) {
  ref::adamw<float>(o.p.f32(), o.g.f32(), o.m.f32(), o.v.f32(), o.p.numel(), o.hyper.f32(), o.beta1, o.beta2,
                    o.eps, o.scale.defined() ? o.scale.f32() : nullptr);
  if (o.ema.defined()) ref::ema<float>(o.ema.f32(), o.p.f32(), o.ema_rate, o.p.numel());
  // (widened to f32 by the emulation, which rounds it to bf16 as Cast does)
  if (o.shadow.defined()) std::copy(o.p.f32(), o.p.f32() + o.p.numel(), o.shadow.f32());
  if (o.gsq.defined()) ref::sum_squares<float>(o.g.f32(), o.gsq.f32(), o.g.numel());
}

}  // namespace

void register_optimizer_cpu(CpuOps& ops) {
  ops.variants<SumSquares>().push_back(cpu_ref<SumSquares, sumsq>());
  ops.variants<ClipScale>().push_back(cpu_ref<ClipScale, clip>());
  ops.variants<AdamWSchedule>().push_back(cpu_ref<AdamWSchedule, schedule>());
  ops.variants<AdamW>().push_back(cpu_ref<AdamW, adamw>());
}

}  // namespace unet
