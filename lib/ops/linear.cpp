// CPU engine, linear family: the reference variant (lib/ops/linear.h in float).
#include "linear.h"

#include "cpu_engine.h"

namespace unet {
namespace {

float* opt(const Tensor& t) { return t.defined() ? t.f32() : nullptr; }

void linear_fwd(const LinearFwd& o) {
  ref::linear_fwd<float>(o.x.f32(), o.w.f32(), opt(o.b), o.y.f32(), (int)o.x.dim[0], (int)o.x.dim[1],
                         (int)o.w.dim[0]);
}
void linear_bwd(const LinearBwd& o) {
  ref::linear_bwd<float>(o.x.f32(), o.w.f32(), o.dy.f32(), opt(o.dx), opt(o.dw), opt(o.db), (int)o.x.dim[0],
                         (int)o.x.dim[1], (int)o.w.dim[0]);
}

}  // namespace

void register_linear_cpu(CpuOps& ops) {
  ops.variants<LinearFwd>().push_back(cpu_ref<LinearFwd, linear_fwd>());
  ops.variants<LinearBwd>().push_back(cpu_ref<LinearBwd, linear_bwd>());
}

}  // namespace unet
