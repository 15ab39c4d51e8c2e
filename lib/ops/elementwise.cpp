// CPU engine, elementwise family (silu, add, cast, copy, fill): reference variants.
#include "elementwise.h"

#include <cstring>

#include "cpu_engine.h"

namespace unet {
namespace {

void silu_fwd(const SiluFwd& o) { ref::silu_fwd<float>(o.x.f32(), o.y.f32(), o.x.numel()); }
void silu_bwd(const SiluBwd& o) { ref::silu_bwd<float>(o.x.f32(), o.dy.f32(), o.dx.f32(), o.x.numel()); }
void add(const Add& o) { ref::add<float>(o.a.f32(), o.b.f32(), o.y.f32(), o.y.numel()); }
// After bf16 emulation both sides are float: the rounding happens when y is stored back.
void cast(const Cast& o) {
  if (o.x.data != o.y.data) std::memmove(o.y.data, o.x.data, o.x.numel() * 4);
}
void copy(const Copy& o) {
  if (o.x.data != o.y.data) std::memmove(o.y.data, o.x.data, o.x.bytes());
}
// Fill writes the raw pattern of its dtype (no emulation: a bf16 fill is exact).
void fill(const Fill& o) {
  const size_t n = o.y.numel();
  if (o.y.dtype == DType::BF16) {
    const uint16_t v = float_to_bf16_bits(o.value);
    uint16_t* p = static_cast<uint16_t*>(o.y.data);
    for (size_t i = 0; i < n; ++i) p[i] = v;
  } else if (o.y.dtype == DType::I32) {
    int32_t* p = static_cast<int32_t*>(o.y.data);
    for (size_t i = 0; i < n; ++i) p[i] = (int32_t)o.value;
  } else {
    float* p = o.y.f32();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; ++i) p[i] = o.value;
  }
}

}  // namespace

void register_elementwise_cpu(CpuOps& ops) {
  ops.variants<SiluFwd>().push_back(cpu_ref<SiluFwd, silu_fwd>());
  ops.variants<SiluBwd>().push_back(cpu_ref<SiluBwd, silu_bwd>());
  ops.variants<Add>().push_back(cpu_ref<Add, add>());
  ops.variants<Cast>().push_back(cpu_ref<Cast, cast>());
  ops.variants<Copy>().push_back({"ref", nullptr, [](const Copy& o, CpuCtx&) { copy(o); }, nullptr});
  ops.variants<Fill>().push_back({"ref", nullptr, [](const Fill& o, CpuCtx&) { fill(o); }, nullptr});
}

}  // namespace unet
