// CPU engine, resample family: reference variants (lib/ops/resample.h in float).
#include "resample.h"

#include "cpu_engine.h"

namespace unet {
namespace {

// dims of the smaller tensor
#define DIMS(t) (int)t.dim[0], (int)t.dim[1], (int)t.dim[2], (int)t.dim[3]
void up_fwd(const UpsampleFwd& o) { ref::upsample2x_fwd<float>(o.x.f32(), o.y.f32(), DIMS(o.x)); }
void up_bwd(const UpsampleBwd& o) { ref::upsample2x_bwd<float>(o.dy.f32(), o.dx.f32(), DIMS(o.dx)); }
void pool_fwd(const AvgPoolFwd& o) { ref::avgpool2x2_fwd<float>(o.x.f32(), o.y.f32(), DIMS(o.x)); }
void pool_bwd(const AvgPoolBwd& o) { ref::avgpool2x2_bwd<float>(o.dy.f32(), o.dx.f32(), DIMS(o.dx)); }
#undef DIMS

}  // namespace

void register_resample_cpu(CpuOps& ops) {
  ops.variants<UpsampleFwd>().push_back(cpu_ref<UpsampleFwd, up_fwd>());
  ops.variants<UpsampleBwd>().push_back(cpu_ref<UpsampleBwd, up_bwd>());
  ops.variants<AvgPoolFwd>().push_back(cpu_ref<AvgPoolFwd, pool_fwd>());
  ops.variants<AvgPoolBwd>().push_back(cpu_ref<AvgPoolBwd, pool_bwd>());
}

}  // namespace unet
