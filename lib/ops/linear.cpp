// CPU engine, linear family: the reference variant (lib/ops/linear.h in float).
#include "linear.h"

#include <algorithm>
#include <vector>

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

// Each linear of the group as LinearFwd / LinearBwd; dx summed over the group last to first (the
// order in which the ResBlocks' backward passes used to add their parts).
void linear_group_fwd(const LinearGroupFwd& o) {
  const int N = (int)o.x.dim[0], I = (int)o.x.dim[1];
  for (int k = 0, n = o.count(); k < n; ++k)
    ref::linear_fwd<float>(o.x.f32(), o.w[k].f32(), opt(o.b[k]), o.y[k].f32(), N, I, (int)o.w[k].dim[0]);
}
void linear_group_bwd(const LinearGroupBwd& o) {
  const int N = (int)o.x.dim[0], I = (int)o.x.dim[1];
  std::vector<float> acc, part;
  if (o.dx.defined()) {
    acc.assign((size_t)N * I, 0.f);
    if (o.dx_in.defined()) acc.assign(o.dx_in.f32(), o.dx_in.f32() + acc.size());
    part.resize(acc.size());
  }
  for (int k = o.count(); k-- > 0;) {
    const int O = (int)o.w[k].dim[0];
    ref::linear_bwd<float>(o.x.f32(), o.w[k].f32(), o.dy[k].f32(), o.dx.defined() ? part.data() : nullptr,
                           opt(o.dw[k]), opt(o.db[k]), N, I, O);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += part[i];
  }
  if (o.dx.defined()) std::copy(acc.begin(), acc.end(), o.dx.f32());
}

}  // namespace

void register_linear_cpu(CpuOps& ops) {
  ops.variants<LinearFwd>().push_back(cpu_ref<LinearFwd, linear_fwd>());
  ops.variants<LinearBwd>().push_back(cpu_ref<LinearBwd, linear_bwd>());
  ops.variants<LinearGroupFwd>().push_back(cpu_ref<LinearGroupFwd, linear_group_fwd>());
  ops.variants<LinearGroupBwd>().push_back(cpu_ref<LinearGroupBwd, linear_group_bwd>());
}

}  // namespace unet
