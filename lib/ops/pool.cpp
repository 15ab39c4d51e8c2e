// CPU engine, pool family: reference variants (lib/ops/pool.h in float).
#include "pool.h"

#include "cpu_engine.h"

namespace unet {
namespace {

void tokens_fwd(const PoolTokensFwd& o) {
  ref::pool_tokens_fwd<float>(o.x.f32(), o.pos.f32(), o.y.f32(), (int)o.x.dim[0],
                              (int)(o.x.dim[1] * o.x.dim[2]), (int)o.x.dim[3]);
}
void tokens_bwd(const PoolTokensBwd& o) {
  ref::pool_tokens_bwd<float>(o.dy.f32(), o.dx.f32(), o.dpos.defined() ? o.dpos.f32() : nullptr,
                              (int)o.dx.dim[0], (int)(o.dx.dim[1] * o.dx.dim[2]), (int)o.dx.dim[3]);
}
void select_fwd(const PoolSelectFwd& o) {
  ref::pool_select_fwd<float>(o.x.f32(), o.y.f32(), (int)o.x.dim[0], (int)o.x.dim[2], (int)o.x.dim[3]);
}
void select_bwd(const PoolSelectBwd& o) {
  ref::pool_select_bwd<float>(o.dy.f32(), o.dx.f32(), (int)o.dx.dim[0], (int)o.dx.dim[2], (int)o.dx.dim[3]);
}

}  // namespace

void register_pool_cpu(CpuOps& ops) {
  ops.variants<PoolTokensFwd>().push_back(cpu_ref<PoolTokensFwd, tokens_fwd>());
  ops.variants<PoolTokensBwd>().push_back(cpu_ref<PoolTokensBwd, tokens_bwd>());
  ops.variants<PoolSelectFwd>().push_back(cpu_ref<PoolSelectFwd, select_fwd>());
  ops.variants<PoolSelectBwd>().push_back(cpu_ref<PoolSelectBwd, select_bwd>());
}

}  // namespace unet
