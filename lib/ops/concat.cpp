// CPU engine, concat family: reference variants (lib/ops/concat.h in float).
#include "concat.h"

#include "cpu_engine.h"

namespace unet {
namespace {

void concat_fwd(const ConcatFwd& o) {
  ref::concat_fwd<float>(o.a.f32(), o.b.f32(), o.y.f32(), (int)o.y.rows(), 1, (int)o.a.last(),
                         (int)o.b.last());
}
void concat_bwd(const ConcatBwd& o) {
  const int C = (int)o.dy.last();
  const int Ca = o.da.defined() ? (int)o.da.last() : C - (int)o.db.last();
  ref::concat_bwd<float>(o.dy.f32(), o.da.defined() ? o.da.f32() : nullptr,
                         o.db.defined() ? o.db.f32() : nullptr, (int)o.dy.rows(), 1, Ca, C - Ca);
}

}  // namespace

void register_concat_cpu(CpuOps& ops) {
  // The statistics of y as stored, after the emulation (ConcatFwd's mean/rstd).
  ops.variants<ConcatFwd>().push_back({"ref", nullptr,
                                       [](const ConcatFwd& o, CpuCtx&) {
                                         cpu_run_emulated(o, concat_fwd);
                                         gn_stats_of(o.y, o.mean, o.rstd);
                                       },
                                       nullptr});
  ops.variants<ConcatBwd>().push_back(cpu_ref<ConcatBwd, concat_bwd>());
}

}  // namespace unet
