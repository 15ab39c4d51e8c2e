// CPU engine, groupnorm family: the fast variants "avx512" and "avx2" (registered ahead of "ref" by
// register_groupnorm_cpu). The reference's algorithm, vectorised over channels, with scale-shift
// and SiLU fused into one pass; statistics from float sums over blocks of 32 rows added in double
// (two passes: mean, then squared deviations); f32 (bf16 through the emulation). Each sample is
// one task; dgamma/dbeta are summed over samples in order afterwards: results do not depend on the
// thread count.
#include <vector>

#include "cpu_fast_variants.h"
#include "groupnorm.h"

namespace unet {
namespace {

using cpufast::GnArgs;
using cpufast::Kernels;

template <class Op>
bool any_shape(const Op&) {
  return true;
}

bool with_y(const GroupNormFwd& o) { return o.y.defined(); }

// Sample b's arguments of a GroupNormFwd or GroupNormApply (the same fields; x with the op's input
// offset added, in the thread's buffer, when it has one).
template <class Op>
GnArgs sample_args(const Op& o, int b) {
  const int HW = (int)(o.x.dim[1] * o.x.dim[2]), C = (int)o.x.dim[3], G = (int)o.mean.dim[1];
  GnArgs a{};
  a.HW = HW, a.C = C, a.G = G, a.silu = o.silu;
  a.x = gn_read_x(o.x, o.xbias, o.xemb, b, cpufast::thread_buffer(4, (size_t)HW * C));
  a.y = o.y.f32() + (size_t)b * HW * C;
  a.gamma = o.gamma.f32(), a.beta = o.beta.f32();
  a.ss = o.ss.defined() ? o.ss.f32() + (size_t)b * 2 * C : nullptr;
  a.mean = o.mean.f32() + (size_t)b * G, a.rstd = o.rstd.f32() + (size_t)b * G;
  return a;
}

template <int I>
void gn_run(const GroupNormFwd& in) {
  std::vector<float> whole;
  const GroupNormFwd o = gn_fwd_joined(in, whole);
  const Kernels& K = *cpufast::kernels<I>();
  const int B = (int)o.x.dim[0], HW = (int)(o.x.dim[1] * o.x.dim[2]), C = (int)o.x.dim[3];
  const size_t n = cpufast::gn_scratch_floats(HW, C);
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 32768)
  for (int b = 0; b < B; ++b) K.gn_fwd(sample_args(o, b), cpufast::thread_buffer(3, n));
}

// GroupNormFwd's output from given statistics: the forward's own pass, so with the statistics the
// forward wrote it reproduces the forward's output bit for bit.
template <int I>
void gn_apply_run(const GroupNormApply& o) {
  const Kernels& K = *cpufast::kernels<I>();
  const int B = (int)o.x.dim[0], HW = (int)(o.x.dim[1] * o.x.dim[2]), C = (int)o.x.dim[3];
  const size_t n = cpufast::gn_scratch_floats(HW, C);
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 32768)
  for (int b = 0; b < B; ++b) K.gn_apply(sample_args(o, b), cpufast::thread_buffer(3, n));
}

template <int I>
void gn_bwd_full(const GroupNormBwd& o) {
  const Kernels& K = *cpufast::kernels<I>();
  const int B = (int)o.x.dim[0], HW = (int)(o.x.dim[1] * o.x.dim[2]), C = (int)o.x.dim[3];
  const int G = (int)o.mean.dim[1];
  const size_t n = cpufast::gn_scratch_floats(HW, C);
  std::vector<double> pg((size_t)B * C), pb((size_t)B * C);
#pragma omp parallel for schedule(static) if ((size_t)B * HW * C > 32768)
  for (int b = 0; b < B; ++b) {
    GnArgs a{};
    a.HW = HW, a.C = C, a.G = G, a.silu = o.silu;
    a.x = gn_read_x(o.x, o.xbias, o.xemb, b, cpufast::thread_buffer(4, (size_t)HW * C)), a.dy = o.dy.f32() + (size_t)b * HW * C;
    a.dx = o.dx.defined() ? o.dx.f32() + (size_t)b * HW * C : nullptr;
    a.gamma = o.gamma.f32(), a.beta = o.beta.f32();
    a.ss = o.ss.defined() ? o.ss.f32() + (size_t)b * 2 * C : nullptr;
    a.dss = o.ss.defined() && o.dss.defined() ? o.dss.f32() + (size_t)b * 2 * C : nullptr;
    a.mean = o.mean.f32() + (size_t)b * G, a.rstd = o.rstd.f32() + (size_t)b * G;
    a.dgamma_part = pg.data() + (size_t)b * C, a.dbeta_part = pb.data() + (size_t)b * C;
    K.gn_bwd(a, cpufast::thread_buffer(3, n));
    for (const Tensor* t : {&o.add, &o.add2})  // (in this order)
      if (a.dx && t->defined()) {
        const float* ad = t->f32() + (size_t)b * HW * C;
        for (size_t i = 0; i < (size_t)HW * C; ++i) a.dx[i] += ad[i];
      }
  }
  for (int c = 0; c < C; ++c) {
    double sg = 0, sb = 0;
    for (int b = 0; b < B; ++b) sg += pg[(size_t)b * C + c], sb += pb[(size_t)b * C + c];
    if (o.dgamma.defined()) o.dgamma.f32()[c] = (float)sg;
    if (o.dbeta.defined()) o.dbeta.f32()[c] = (float)sb;
  }
  gn_bwd_column_sums(o);
}
template <int I>
void gn_bwd_run(const GroupNormBwd& o) {
  gn_bwd_split(o, gn_bwd_full<I>);
}

}  // namespace

void register_groupnorm_fast_cpu(CpuOps& ops) {
  // (the statistics alone, without y: the reference)
  cpufast::add_fast_variants<GroupNormFwd, with_y, gn_run<0>, gn_run<1>>(ops);
  cpufast::add_fast_variants<GroupNormApply, any_shape<GroupNormApply>, gn_apply_run<0>, gn_apply_run<1>>(
      ops);
  cpufast::add_fast_variants<GroupNormBwd, any_shape<GroupNormBwd>, gn_bwd_run<0>, gn_bwd_run<1>>(ops);
}

}  // namespace unet
