// CPU engine, diffusion family (q_sample, sampler arithmetic): reference variants.
#include "diffusion_ops.h"

#include <algorithm>

#include "cpu_engine.h"
#include "rng.h"

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

// In chunks across threads: every value is a pure function of its index, so the split does not
// change them.
void normal_noise(const NormalFill& o) {
  const size_t n = o.z.numel(), chunk = 65536;
  const int64_t chunks = (int64_t)((n + chunk - 1) / chunk);
  float* z = o.z.f32();
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t at = (size_t)c * chunk;
    normal_fill(o.seed, (Stream)o.stream, o.index0 + at, std::min(chunk, n - at), z + at);
  }
}

// The op sequence SampleStep stands for, on the reference helpers (so the same bits).
void sample_step(const SampleStep& o) {
  const float* c = o.coef.f32();
  const size_t n = o.x.numel();
  float *x = o.x.f32(), *x0 = o.x0.f32(), *z = o.z.f32();
  const float* eps = o.eps.f32();
  if (o.xstart) {
    std::copy(eps, eps + n, x0);
  } else {
    std::copy(x, x + n, x0);
    ref::axpbypcz<float>(c[1], eps, c[0], x0, 0.0f, nullptr, n);
  }
  if (o.clip) ref::clamp<float>(x0, -1.0f, 1.0f, n);
  normal_noise(NormalFill{o.z, sample_step_u64(c, 7), o.stream, sample_step_u64(c, 9)});
  if (o.v.defined()) ref::learned_range_noise<float>(o.v.f32(), z, z, c[5], c[6], n);
  ref::axpbypcz<float>(c[2], x0, c[3], x, c[4], c[4] != 0.0f ? z : nullptr, n);
}

}  // namespace

void register_diffusion_cpu(CpuOps& ops) {
  ops.variants<QSample>().push_back(cpu_ref<QSample, qsample>());
  ops.variants<Axpbypcz>().push_back(cpu_ref<Axpbypcz, axpby>());
  ops.variants<Clamp>().push_back(cpu_ref<Clamp, clamp>());
  ops.variants<LearnedRangeNoise>().push_back(cpu_ref<LearnedRangeNoise, lrn>());
  ops.variants<NormalFill>().push_back(cpu_ref<NormalFill, normal_noise>());
  ops.variants<SampleStep>().push_back(cpu_ref<SampleStep, sample_step>());
}

}  // namespace unet
