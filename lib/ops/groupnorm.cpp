// CPU engine, groupnorm family: the reference variant (lib/ops/groupnorm.h in float).
#include "groupnorm.h"

#include <cstdint>
#include <vector>

#include "concat.h"
#include "cpu_engine.h"

namespace unet {
namespace {

float* opt(const Tensor& t) { return t.defined() ? t.f32() : nullptr; }

// x as the op reads it (gn_read_x over every sample): x itself, or a copy with the offset added.
template <class Op>
const float* read_x(const Op& o, std::vector<float>& buf) {
  if (!gn_has_offset(o)) return o.x.f32();
  const size_t per = o.x.numel() / (size_t)o.x.dim[0];
  buf.resize(o.x.numel());
  for (int b = 0; b < (int)o.x.dim[0]; ++b) gn_read_x(o.x, o.xbias, o.xemb, b, buf.data() + b * per);
  return buf.data();
}

void gn_fwd(const GroupNormFwd& in) {
  std::vector<float> whole;
  const GroupNormFwd o = gn_fwd_joined(in, whole);
  const Tensor& x = o.x;
  std::vector<float> buf;
  if (!o.y.defined())  // the statistics only (as groupnorm_fwd computes them)
    return ref::groupnorm_stats<float>(read_x(o, buf), o.mean.f32(), o.rstd.f32(), (int)x.dim[0],
                                       (int)(x.dim[1] * x.dim[2]), (int)x.dim[3], (int)o.mean.dim[1]);
  ref::groupnorm_ss_fwd<float>(read_x(o, buf), o.gamma.f32(), o.beta.f32(), opt(o.ss), o.y.f32(), o.mean.f32(),
                               o.rstd.f32(), (int)x.dim[0], (int)(x.dim[1] * x.dim[2]), (int)x.dim[3],
                               (int)o.mean.dim[1], o.silu);
}
void gn_apply(const GroupNormApply& o) {
  const Tensor& x = o.x;
  std::vector<float> buf;
  ref::groupnorm_ss_apply<float>(read_x(o, buf), o.gamma.f32(), o.beta.f32(), opt(o.ss), o.mean.f32(), o.rstd.f32(), o.y.f32(),
                                 (int)x.dim[0], (int)(x.dim[1] * x.dim[2]), (int)x.dim[3], (int)o.mean.dim[1], o.silu);
}
void gn_bwd_full(const GroupNormBwd& o) {
  const Tensor& x = o.x;
  std::vector<float> buf;
  ref::groupnorm_ss_bwd<float>(read_x(o, buf), o.gamma.f32(), o.beta.f32(), opt(o.ss), o.mean.f32(), o.rstd.f32(),
                               o.dy.f32(), opt(o.dx), opt(o.dgamma), opt(o.dbeta), opt(o.dss), (int)x.dim[0],
                               (int)(x.dim[1] * x.dim[2]), (int)x.dim[3], (int)o.mean.dim[1], o.silu);
  for (const Tensor* t : {&o.add, &o.add2})  // (in this order)
    if (t->defined() && o.dx.defined()) {
      float* dx = o.dx.f32();
      const float* a = t->f32();
      for (size_t i = 0, n = o.dx.numel(); i < n; ++i) dx[i] += a[i];
    }
  gn_bwd_column_sums(o);
}
void gn_bwd(const GroupNormBwd& o) { gn_bwd_split(o, gn_bwd_full); }

}  // namespace

void gn_apply_ref(const GroupNormApply& o) { cpu_run_emulated(o, gn_apply); }

void gn_bwd_split(const GroupNormBwd& o, void (*full)(const GroupNormBwd&)) {
  if (!o.dx2.defined()) return full(o);
  std::vector<float> buf(o.x.numel());
  GroupNormBwd w = o;
  w.dx = Tensor(buf.data(), DType::F32, {o.x.dim[0], o.x.dim[1], o.x.dim[2], o.x.dim[3]});
  w.dx2 = Tensor{};
  full(w);
  const int C = (int)o.x.dim[3], C1 = (int)o.dx.dim[3];
  ref::concat_bwd<float>(buf.data(), o.dx.f32(), o.dx2.f32(), (int)o.x.rows(), 1, C1, C - C1);
}

GroupNormFwd gn_fwd_joined(const GroupNormFwd& o, std::vector<float>& buf) {
  if (!o.x2.defined()) return o;
  const Tensor w = o.whole();
  float* y = o.xcat.defined() ? o.xcat.f32() : (buf.resize(w.numel()), buf.data());
  ref::concat_fwd<float>(o.x.f32(), o.x2.f32(), y, (int)o.x.rows(), 1, (int)o.x.dim[3], (int)o.x2.dim[3]);
  GroupNormFwd j = o;
  j.x = Tensor(y, DType::F32, {w.dim[0], w.dim[1], w.dim[2], w.dim[3]});
  j.x2 = j.xcat = Tensor{};
  return j;
}

const float* gn_read_x(const Tensor& x, const Tensor& xbias, const Tensor& xemb, int b, float* out) {
  const size_t HW = (size_t)x.dim[1] * x.dim[2], C = (size_t)x.dim[3];
  const float* xb = x.f32() + (size_t)b * HW * C;
  if (!xbias.defined() && !xemb.defined()) return xb;
  const float* bias = xbias.defined() ? xbias.f32() : nullptr;
  const float* emb = xemb.defined() ? xemb.f32() + (size_t)b * C : nullptr;
  for (size_t r = 0; r < HW; ++r)
    for (size_t c = 0; c < C; ++c) {
      float v = xb[r * C + c];
      if (bias) v += bias[c];
      if (emb) v += emb[c];
      out[r * C + c] = v;
    }
  return out;
}

void gn_bwd_column_sums(const GroupNormBwd& o) {
  const int B = (int)o.x.dim[0], HW = (int)(o.x.dim[1] * o.x.dim[2]), C = (int)o.x.dim[3];
  if (o.dx.defined()) ref::column_sums<float>(o.dx.f32(), B, HW, C, opt(o.dx_sums), opt(o.dx_total));
  if (o.add.defined()) ref::column_sums<float>(o.add.f32(), B, HW, C, nullptr, opt(o.add_total));
}

void conv_gn_stats(const ConvFwd& o) { gn_stats_of(o.y, o.mean, o.rstd); }

void gn_stats_of(const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (!mean.defined()) return;
  std::vector<float> wide;  // a bf16 y (the emulation's stored values), widened
  const float* v = nullptr;
  if (y.dtype == DType::BF16) {
    wide.resize(y.numel());
    const uint16_t* b = static_cast<const uint16_t*>(y.data);
    for (size_t i = 0; i < wide.size(); ++i) wide[i] = bf16_bits_to_float(b[i]);
    v = wide.data();
  } else {
    v = y.f32();
  }
  ref::groupnorm_stats<float>(v, mean.f32(), rstd.f32(), (int)y.dim[0], (int)(y.dim[1] * y.dim[2]), (int)y.dim[3],
                              (int)mean.dim[1]);
}

void register_groupnorm_cpu(CpuOps& ops) {
  ops.variants<GroupNormFwd>().push_back(cpu_ref<GroupNormFwd, gn_fwd>());
  ops.variants<GroupNormApply>().push_back(cpu_ref<GroupNormApply, gn_apply>());
  ops.variants<GroupNormBwd>().push_back(cpu_ref<GroupNormBwd, gn_bwd>());
  register_groupnorm_fast_cpu(ops);  // avx512, avx2 ahead of ref: the default where they run
}

}  // namespace unet
