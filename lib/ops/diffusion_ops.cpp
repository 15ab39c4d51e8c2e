// CPU engine, diffusion family (q_sample, sampler arithmetic): reference variants.
#include "diffusion_ops.h"

#include "cpu_engine.h"

namespace unet {
namespace {

void qsample(const QSample& o) {
  const int B = (int)o.x0.dim[0];
  ref::q_sample<float>(o.x0.f32(), o.noise.f32(), o.coef.f32(), o.coef.f32() + B, o.xt.f32(), B,
                       o.x0.per_sample());
}
void axpby(const Axpbypcz& o) {
  ref::axpbypcz<float>(o.a, o.x.defined() ? o.x.f32() : nullptr, o.b, o.y.f32(), o.c,
                       o.z.defined() ? o.z.f32() : nullptr, o.y.numel());
}
void clamp(const Clamp& o) { ref::clamp<float>(o.x.f32(), o.lo, o.hi, o.x.numel()); }
void lrn(const LearnedRangeNoise& o) {
  ref::learned_range_noise<float>(o.v.f32(), o.z.f32(), o.y.f32(), o.min_log, o.max_log, o.y.numel());
}

}  // namespace

void register_diffusion_cpu(CpuOps& ops) {
  ops.variants<QSample>().push_back(cpu_ref<QSample, qsample>());
  ops.variants<Axpbypcz>().push_back(cpu_ref<Axpbypcz, axpby>());
  ops.variants<Clamp>().push_back(cpu_ref<Clamp, clamp>());
  ops.variants<LearnedRangeNoise>().push_back(cpu_ref<LearnedRangeNoise, lrn>());
}

}  // namespace unet
