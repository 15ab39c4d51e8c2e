// CPU engine, dropout family: reference variants (lib/ops/dropout.h in float).
#include "dropout.h"

#include "cpu_engine.h"

namespace unet {
namespace {

void drop_fwd(const DropoutFwd& o) {
  ref::dropout_fwd<float>(o.x.f32(), o.y.f32(), o.x.numel(), o.p, o.seed);
}
void drop_bwd(const DropoutBwd& o) {
  ref::dropout_bwd<float>(o.dy.f32(), o.dx.f32(), o.dy.numel(), o.p, o.seed);
}

}  // namespace

void register_dropout_cpu(CpuOps& ops) {
  ops.variants<DropoutFwd>().push_back(cpu_ref<DropoutFwd, drop_fwd>());
  ops.variants<DropoutBwd>().push_back(cpu_ref<DropoutBwd, drop_bwd>());
}

}  // namespace unet
