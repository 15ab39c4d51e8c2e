// check() and flops() of every op (op_defs.h).
//
// FLOP conventions (the profiler's compute axis): GEMM-shaped work counts 2 per multiply-add,
// including the taps of a 3x3 convolution that fall on zero padding (an implicit GEMM does that
// work too); memory-bound ops count a few FLOP per element (transcendentals as 1), which never
// matter for the compute axis but keep totals honest.
#include "op_defs.h"

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace unet {

namespace {

template <class Op>
void req(const Op& op, bool ok, const char* what) {
  if (!ok) throw std::logic_error(describe(op) + ": " + what);
}
bool act(const Tensor& t) { return t.dtype == DType::F32 || t.dtype == DType::BF16; }
bool f32(const Tensor& t) { return !t.defined() || t.dtype == DType::F32; }
bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i)
    if (a.dim[i] != b.dim[i]) return false;
  return true;
}
bool nhwc(const Tensor& t) { return t.rank == 4 && act(t); }
int64_t conv_out(int64_t n, int64_t k, int stride) { return (n + 2 * (k / 2) - k) / stride + 1; }

// Shared by the three conv ops: x [B,H,W,Ci], w [Co,k,k,Ci], y [B,Ho,Wo,Co].
template <class Op>
void check_conv(const Op& op, const Tensor& x, const Tensor& w, const Tensor& y, int stride) {
  req(op, nhwc(x) && nhwc(y), "x and y must be 4-D NHWC activations");
  req(op, w.rank == 4 && w.dim[1] == w.dim[2] && (w.dim[1] == 1 || w.dim[1] == 3),
      "w must be [Co,k,k,Ci], k 1 or 3");
  req(op, stride == 1 || stride == 2, "stride must be 1 or 2");
  req(op, w.dim[3] == x.dim[3] && w.dim[0] == y.dim[3], "channel counts differ");
  req(op, x.dim[0] == y.dim[0], "batch differs");
  req(op,
      y.dim[1] == conv_out(x.dim[1], w.dim[1], stride) && y.dim[2] == conv_out(x.dim[2], w.dim[1], stride),
      "output size does not match the convolution");
}
// Optional GroupNorm statistics of an op's NHWC output y: mean and rstd f32 [B, G], G dividing C.
template <class Op>
void check_stats(const Op& op, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  req(op, mean.defined() == rstd.defined(), "mean and rstd come together");
  if (!mean.defined()) return;
  req(op, nhwc(y), "statistics need a 4-D NHWC y");
  req(op,
      mean.dtype == DType::F32 && rstd.dtype == DType::F32 && mean.rank == 2 && mean.dim[0] == y.dim[0] &&
          mean.dim[1] >= 1 && y.dim[3] % mean.dim[1] == 0 && same_shape(mean, rstd),
      "mean and rstd must be f32 [B,G], G dividing y's channels");
}
// A conv's optional norm of its input: GroupNormApply's conditions (x normalised, same shape), on 3x3
// stride-1 convolutions (the model's ResBlock convs).
template <class Op>
void check_norm(const Op& op, const Tensor& x, const Tensor& w, const NormIn& n) {
  if (!n.on()) return;
  req(op, op.stride == 1 && w.rank == 4 && w.dim[1] == 3 && w.dim[2] == 3, "a norm of x needs a 3x3 stride-1 conv");
  norm_apply(n, x, x).check();
}
double norm_flops(const Tensor& x, const NormIn& n) {
  return n.on() ? (double)x.numel() * (4 + (n.ss.defined() ? 2 : 0) + (n.silu ? 4 : 0)) : 0.0;
}
double conv_macs(const Tensor& x, const Tensor& w, const Tensor& y) {
  (void)x;
  return (double)y.numel() * (double)(w.dim[1] * w.dim[2] * w.dim[3]);
}

}  // namespace

// ---- conv ----
void ConvFwd::check() const {
  check_conv(*this, x, w, y, stride);
  req(*this, w.dtype == x.dtype, "w must have x's dtype");
  req(*this, f32(bias) && f32(emb), "bias and emb are f32");
  req(*this, !bias.defined() || bias.numel() == (size_t)y.dim[3], "bias must be [Co]");
  req(*this, !emb.defined() || (emb.rank == 2 && emb.dim[0] == y.dim[0] && emb.dim[1] == y.dim[3]),
      "emb must be [B,Co]");
  req(*this, !res.defined() || (same_shape(res, y) && res.dtype == y.dtype), "res must match y");
  check_stats(*this, y, mean, rstd);
  check_norm(*this, x, w, norm);
}
double ConvFwd::flops() const {
  const double n = (double)y.numel();
  return 2.0 * conv_macs(x, w, y) + n * (bias.defined() + emb.defined() + res.defined() + 3 * mean.defined()) +
         norm_flops(x, norm);
}
void ConvBwdData::check() const {
  check_conv(*this, dx, w, dy, stride);
  req(*this, w.dtype == dy.dtype && dx.dtype == dy.dtype, "dy, w and dx must share a dtype");
}
double ConvBwdData::flops() const { return 2.0 * conv_macs(dx, w, dy); }
void ConvBwdFilter::check() const {
  req(*this, dw.defined() || db.defined() || demb.defined(), "nothing to compute");
  req(*this, x.dtype == dy.dtype, "x and dy must share a dtype");
  req(*this, f32(dw) && f32(db) && f32(demb), "dw, db and demb are f32");
  if (dw.defined()) check_conv(*this, x, dw, dy, stride);
  req(*this, !db.defined() || db.numel() == (size_t)dy.dim[3], "db must be [Co]");
  req(*this, !demb.defined() || (demb.rank == 2 && demb.dim[0] == dy.dim[0] && demb.dim[1] == dy.dim[3]),
      "demb must be [B,Co]");
  if (norm.on()) req(*this, dw.defined(), "a norm of x needs dw");
  check_norm(*this, x, dw, norm);
}
double ConvBwdFilter::flops() const {
  return (dw.defined() ? 2.0 * conv_macs(x, dw, dy) : 0.0) +
         (double)dy.numel() * (db.defined() + demb.defined()) + norm_flops(x, norm);
}

// ---- linear ----
void LinearFwd::check() const {
  req(*this, x.rank == 2 && w.rank == 2 && y.rank == 2, "x, w, y must be 2-D");
  req(*this, x.dim[1] == w.dim[1] && y.dim[1] == w.dim[0] && x.dim[0] == y.dim[0], "shapes differ");
  req(*this, act(x) && w.dtype == x.dtype && y.dtype == x.dtype && f32(b), "dtypes: x, w, y alike; b f32");
  req(*this, !b.defined() || b.numel() == (size_t)w.dim[0], "b must be [O]");
}
double LinearFwd::flops() const {
  return 2.0 * x.dim[0] * w.dim[0] * w.dim[1] + (b.defined() ? y.numel() : 0.0);
}
void LinearBwd::check() const {
  req(*this, x.rank == 2 && w.rank == 2 && dy.rank == 2, "x, w, dy must be 2-D");
  req(*this, x.dim[1] == w.dim[1] && dy.dim[1] == w.dim[0] && x.dim[0] == dy.dim[0], "shapes differ");
  req(*this, !dx.defined() || (same_shape(dx, x) && dx.dtype == x.dtype), "dx must match x");
  req(*this, !dw.defined() || (same_shape(dw, w) && f32(dw)), "dw must be f32 shaped like w");
  req(*this, f32(db) && (!db.defined() || db.numel() == (size_t)w.dim[0]), "db must be f32 [O]");
}
double LinearBwd::flops() const {
  const double mac = (double)x.dim[0] * w.dim[0] * w.dim[1];
  return 2.0 * mac * (dx.defined() + dw.defined()) + (db.defined() ? (double)dy.numel() : 0.0);
}

// ---- linear groups ----
const char* linear_group_field(const char* base, int k) {
  static const auto names = [] {
    std::map<std::string, std::vector<std::string>> m;
    for (const char* b : {"w", "b", "y", "dy", "dw", "db"})
      for (int i = 0; i < kLinearGroup; ++i) m[b].push_back(b + std::to_string(i));
    return m;
  }();
  return names.at(base).at((size_t)k).c_str();
}
namespace {
template <class Op>
int leading(const Op& op) {
  int n = 0;
  while (n < kLinearGroup && op.w[n].defined()) ++n;
  for (int k = n; k < kLinearGroup; ++k) req(op, !op.w[k].defined(), "the group's w must be leading");
  return n;
}
// w[k] [O_k, I] f32 for x [N, I] f32.
template <class Op>
void check_group_w(const Op& op, int k) {
  req(op, op.w[k].rank == 2 && op.w[k].dtype == DType::F32 && op.w[k].dim[1] == op.x.dim[1],
      "w[k] must be f32 [O_k, I]");
}
}  // namespace
int LinearGroupFwd::count() const { return leading(*this); }
void LinearGroupFwd::check() const {
  req(*this, x.rank == 2 && x.dtype == DType::F32, "x must be f32 [N, I]");
  const int n = count();
  req(*this, n >= 1, "no linear in the group");
  for (int k = 0; k < kLinearGroup; ++k) {
    if (k >= n) {
      req(*this, !b[k].defined() && !y[k].defined(), "b/y beyond the group");
      continue;
    }
    check_group_w(*this, k);
    const int64_t O = w[k].dim[0];
    req(*this, !b[k].defined() || (f32(b[k]) && b[k].numel() == (size_t)O), "b[k] must be f32 [O_k]");
    req(*this, y[k].rank == 2 && f32(y[k]) && y[k].dim[0] == x.dim[0] && y[k].dim[1] == O,
        "y[k] must be f32 [N, O_k]");
  }
}
double LinearGroupFwd::flops() const {
  double f = 0;
  for (int k = 0; k < count(); ++k) f += 2.0 * x.dim[0] * w[k].dim[0] * w[k].dim[1];
  return f;
}
int LinearGroupBwd::count() const { return leading(*this); }
void LinearGroupBwd::check() const {
  req(*this, x.rank == 2 && x.dtype == DType::F32, "x must be f32 [N, I]");
  const int n = count();
  req(*this, n >= 1, "no linear in the group");
  req(*this, !dx.defined() || (same_shape(dx, x) && f32(dx)), "dx must match x");
  req(*this, !dx_in.defined() || (same_shape(dx_in, x) && f32(dx_in) && dx.defined()), "dx_in must match dx");
  for (int k = 0; k < kLinearGroup; ++k) {
    if (k >= n) {
      req(*this, !dy[k].defined() && !dw[k].defined() && !db[k].defined(), "dy/dw/db beyond the group");
      continue;
    }
    check_group_w(*this, k);
    const int64_t O = w[k].dim[0];
    req(*this, dy[k].rank == 2 && f32(dy[k]) && dy[k].dim[0] == x.dim[0] && dy[k].dim[1] == O,
        "dy[k] must be f32 [N, O_k]");
    req(*this, !dw[k].defined() || (same_shape(dw[k], w[k]) && f32(dw[k])), "dw[k] must be f32 like w[k]");
    req(*this, !db[k].defined() || (f32(db[k]) && db[k].numel() == (size_t)O), "db[k] must be f32 [O_k]");
  }
}
double LinearGroupBwd::flops() const {
  double f = 0;
  for (int k = 0; k < count(); ++k) {
    const double mac = (double)x.dim[0] * w[k].dim[0] * w[k].dim[1];
    f += 2.0 * mac * (dx.defined() + dw[k].defined()) + (db[k].defined() ? (double)dy[k].numel() : 0.0);
  }
  return f;
}

// ---- groupnorm ----
namespace {
template <class Op>
void check_gn(const Op& op, const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& ss,
              const Tensor& mean, const Tensor& rstd) {
  req(op, nhwc(x), "x must be 4-D NHWC");
  req(op, f32(op.xbias) && (!op.xbias.defined() || op.xbias.numel() == (size_t)x.dim[3]), "xbias must be f32 [C]");
  req(op,
      f32(op.xemb) &&
          (!op.xemb.defined() || (op.xemb.rank == 2 && op.xemb.dim[0] == x.dim[0] && op.xemb.dim[1] == x.dim[3])),
      "xemb must be f32 [B,C]");
  const int64_t C = x.dim[3];
  req(op, f32(gamma) && f32(beta) && gamma.numel() == (size_t)C && beta.numel() == (size_t)C,
      "gamma/beta f32 [C]");
  req(op, mean.rank == 2 && mean.dim[0] == x.dim[0] && mean.dim[1] > 0 && C % mean.dim[1] == 0 && f32(mean),
      "mean must be f32 [B,G] with G dividing C");
  req(op, same_shape(mean, rstd) && f32(rstd), "rstd must match mean");
  req(op, !ss.defined() || (f32(ss) && ss.rank == 2 && ss.dim[0] == x.dim[0] && ss.dim[1] == 2 * C),
      "ss must be f32 [B,2C]");
}
}  // namespace
void GroupNormFwd::check() const {
  const Tensor w = whole();
  check_gn(*this, w, gamma, beta, ss, mean, rstd);
  req(*this, !y.defined() || (same_shape(w, y) && act(y)), "y must match x's shape");
  if (x2.defined()) {
    req(*this,
        x.rank == 4 && x2.rank == 4 && x2.dtype == x.dtype && x2.dim[0] == x.dim[0] &&
            x2.dim[1] == x.dim[1] && x2.dim[2] == x.dim[2] && x2.dim[3] >= 1,
        "x2 must be [B,H,W,C2] beside x, of x's type");
    req(*this, !xbias.defined() && !xemb.defined(), "x2 takes no input offset");
  }
  req(*this, !xcat.defined() || (x2.defined() && same_shape(w, xcat) && xcat.dtype == x.dtype),
      "xcat needs x2 and must be [B,H,W,C1+C2] of x's type");
}
double GroupNormFwd::flops() const {
  return (double)whole().numel() * (3 + (y.defined() ? 4 + (ss.defined() ? 2 : 0) + (silu ? 4 : 0) : 0));
}
void GroupNormApply::check() const {
  check_gn(*this, x, gamma, beta, ss, mean, rstd);
  req(*this, same_shape(x, y) && act(y), "y must match x's shape");
}
double GroupNormApply::flops() const {
  return (double)x.numel() * (4 + (ss.defined() ? 2 : 0) + (silu ? 4 : 0));
}
void GroupNormBwd::check() const {
  check_gn(*this, x, gamma, beta, ss, mean, rstd);
  req(*this, same_shape(dy, x) && act(dy), "dy must match x");
  if (dx2.defined()) {
    req(*this, dx.defined(), "dx2 needs dx");
    auto rows_of_x = [&](const Tensor& t) {
      return t.rank == 4 && t.dim[0] == x.dim[0] && t.dim[1] == x.dim[1] && t.dim[2] == x.dim[2] && t.dim[3] >= 1;
    };
    req(*this, rows_of_x(dx) && rows_of_x(dx2) && dx.dim[3] + dx2.dim[3] == x.dim[3] && act(dx) &&
                   dx2.dtype == dx.dtype,
        "dx and dx2 must split x's channels");
  } else {
    req(*this, !dx.defined() || (same_shape(dx, x) && act(dx)), "dx must match x");
  }
  req(*this, f32(dgamma) && f32(dbeta) && f32(dss), "parameter gradients are f32");
  req(*this, !dss.defined() || ss.defined(), "dss needs ss");
  req(*this, !add.defined() || (same_shape(add, x) && (!dx.defined() || add.dtype == dx.dtype)), "add must match dx");
  req(*this, !add2.defined() || (dx.defined() && same_shape(add2, x) && add2.dtype == dx.dtype), "add2 must match dx");
  const size_t C = (size_t)x.dim[3];
  req(*this, (!dx_sums.defined() && !dx_total.defined() && !add_total.defined()) || dx.defined(),
      "dx_sums, dx_total and add_total need dx");
  req(*this, !add_total.defined() || add.defined(), "add_total needs add");
  req(*this, f32(dx_sums) && f32(dx_total) && f32(add_total), "column sums are f32");
  req(*this, !dx_sums.defined() || dx_sums.numel() == (size_t)x.dim[0] * C, "dx_sums must be [B, C]");
  req(*this, (!dx_total.defined() || dx_total.numel() == C) && (!add_total.defined() || add_total.numel() == C),
      "dx_total and add_total must be [C]");
}
double GroupNormBwd::flops() const {
  return (double)x.numel() * (8 + (ss.defined() ? 4 : 0) + (silu ? 6 : 0));
}

// ---- elementwise ----
void SiluFwd::check() const { req(*this, x.numel() == y.numel() && act(x) && act(y), "x and y must match"); }
double SiluFwd::flops() const { return 4.0 * x.numel(); }
void SiluBwd::check() const {
  req(*this, x.numel() == dy.numel() && dx.numel() == x.numel() && act(x), "x, dy, dx must match");
}
double SiluBwd::flops() const { return 6.0 * x.numel(); }
void Add::check() const {
  req(*this, a.numel() == b.numel() && y.numel() == a.numel(), "a, b, y must have one size");
  req(*this, a.dtype == b.dtype && y.dtype == a.dtype && act(a), "a, b, y must share an activation dtype");
}
double Add::flops() const { return (double)y.numel(); }
void Cast::check() const {
  req(*this, x.numel() == y.numel() && act(x) && act(y), "x and y must have one size");
}
double Cast::flops() const { return 0; }
void Copy::check() const { req(*this, x.bytes() == y.bytes() && x.dtype == y.dtype, "x and y must match"); }
double Copy::flops() const { return 0; }
void Fill::check() const { req(*this, y.defined(), "y required"); }
double Fill::flops() const { return 0; }

// ---- resample ----
void UpsampleFwd::check() const {
  req(*this,
      nhwc(x) && nhwc(y) && y.dim[0] == x.dim[0] && y.dim[1] == 2 * x.dim[1] && y.dim[2] == 2 * x.dim[2] &&
          y.dim[3] == x.dim[3] && x.dtype == y.dtype,
      "y must be x upsampled 2x");
}
double UpsampleFwd::flops() const { return 0; }
void UpsampleBwd::check() const {
  req(*this,
      nhwc(dx) && nhwc(dy) && dy.dim[0] == dx.dim[0] && dy.dim[1] == 2 * dx.dim[1] &&
          dy.dim[2] == 2 * dx.dim[2] && dy.dim[3] == dx.dim[3] && dx.dtype == dy.dtype,
      "dy must be dx's size upsampled 2x");
}
double UpsampleBwd::flops() const { return (double)dy.numel(); }
void AvgPoolFwd::check() const {
  req(*this,
      nhwc(x) && nhwc(y) && y.dim[0] == x.dim[0] && x.dim[1] == 2 * y.dim[1] && x.dim[2] == 2 * y.dim[2] &&
          y.dim[3] == x.dim[3] && x.dtype == y.dtype,
      "y must be x pooled 2x2");
}
double AvgPoolFwd::flops() const { return (double)x.numel(); }
void AvgPoolBwd::check() const {
  req(*this,
      nhwc(dx) && nhwc(dy) && dy.dim[0] == dx.dim[0] && dx.dim[1] == 2 * dy.dim[1] &&
          dx.dim[2] == 2 * dy.dim[2] && dy.dim[3] == dx.dim[3] && dx.dtype == dy.dtype,
      "dx must be dy's size upsampled 2x");
}
double AvgPoolBwd::flops() const { return (double)dx.numel(); }

// ---- concat ----
void ConcatFwd::check() const {
  req(*this, a.rows() == b.rows() && y.rows() == a.rows() && y.last() == a.last() + b.last(),
      "shapes differ");
  req(*this, a.dtype == b.dtype && y.dtype == a.dtype, "dtypes differ");
  check_stats(*this, y, mean, rstd);
}
double ConcatFwd::flops() const { return mean.defined() ? 3.0 * (double)y.numel() : 0; }
void ConcatBwd::check() const {
  req(*this, da.defined() || db.defined(), "nothing to compute");
  const Tensor& o = da.defined() ? da : db;
  req(*this, o.rows() == dy.rows() && o.dtype == dy.dtype, "shapes differ");
  if (da.defined() && db.defined()) req(*this, dy.last() == da.last() + db.last(), "channels differ");
}
double ConcatBwd::flops() const { return 0; }

// ---- embedding ----
void TimestepEmbedding::check() const {
  req(*this, f32(t) && f32(y) && y.rank == 2 && t.numel() == (size_t)y.dim[0] && y.dim[1] % 2 == 0,
      "t [B] and y [B,dim] (dim even), f32");
}
double TimestepEmbedding::flops() const { return 3.0 * y.numel(); }
void EmbeddingAdd::check() const {
  req(*this, labels.dtype == DType::I32 && f32(table) && f32(y) && table.rank == 2 && y.rank == 2, "dtypes");
  req(*this, labels.numel() == (size_t)y.dim[0] && table.dim[1] == y.dim[1], "shapes differ");
}
double EmbeddingAdd::flops() const { return (double)y.numel(); }
void EmbeddingBwd::check() const {
  req(*this, labels.dtype == DType::I32 && f32(dy) && f32(dtable) && dtable.rank == 2 && dy.rank == 2,
      "dtypes");
  req(*this, labels.numel() == (size_t)dy.dim[0] && dtable.dim[1] == dy.dim[1], "shapes differ");
}
double EmbeddingBwd::flops() const { return (double)dy.numel(); }

// ---- attention ----
namespace {
template <class Op>
void check_attn(const Op& op, const Tensor& qkv, const Tensor& out, const Tensor& lse) {
  req(op, nhwc(qkv) && nhwc(out) && qkv.dtype == out.dtype, "qkv and out must be NHWC activations");
  const int64_t T = qkv.dim[1] * qkv.dim[2], C = out.dim[3];
  req(op, qkv.dim[3] == 3 * C && out.dim[0] == qkv.dim[0] && out.dim[1] * out.dim[2] == T, "shapes differ");
  req(op,
      f32(lse) && lse.rank == 3 && lse.dim[0] == qkv.dim[0] && lse.dim[2] == T && lse.dim[1] > 0 &&
          C % lse.dim[1] == 0,
      "lse must be f32 [B,heads,T]");
}
double attn_flops(const Tensor& qkv, const Tensor& lse, double gemms) {
  const double T = (double)qkv.dim[1] * qkv.dim[2], B = (double)qkv.dim[0], C = qkv.dim[3] / 3.0;
  return B * (gemms * T * T * C + 5.0 * lse.dim[1] * T * T);
}
}  // namespace
void AttentionFwd::check() const { check_attn(*this, qkv, out, lse); }
double AttentionFwd::flops() const { return attn_flops(qkv, lse, 4.0); }  // qk^T and wv: 2 T^2 d each
void AttentionBwd::check() const {
  check_attn(*this, qkv, out, lse);
  req(*this, same_shape(dout, out) && dout.dtype == out.dtype, "dout must match out");
  req(*this, same_shape(dqkv, qkv) && dqkv.dtype == qkv.dtype, "dqkv must match qkv");
}
// recomputed qk^T, then dV, dP, dQ, dK
double AttentionBwd::flops() const { return attn_flops(qkv, lse, 10.0); }

// ---- pool ----
namespace {
bool tokens_of(const Tensor& tok, const Tensor& x) {  // tok [B,1,H*W+1,C] for x [B,H,W,C]
  return nhwc(tok) && nhwc(x) && tok.dim[0] == x.dim[0] && tok.dim[1] == 1 &&
         tok.dim[2] == x.dim[1] * x.dim[2] + 1 && tok.dim[3] == x.dim[3] && tok.dtype == x.dtype;
}
}  // namespace
void PoolTokensFwd::check() const {
  req(*this, tokens_of(y, x), "y must be [B,1,H*W+1,C] of x's dtype");
  req(*this, f32(pos) && pos.rank == 2 && pos.dim[0] == x.dim[3] && pos.dim[1] == y.dim[2],
      "pos must be f32 [C,T]");
}
double PoolTokensFwd::flops() const { return 2.0 * (double)y.numel(); }
void PoolTokensBwd::check() const {
  req(*this, tokens_of(dy, dx), "dy must be [B,1,H*W+1,C] of dx's dtype");
  req(*this,
      !dpos.defined() ||
          (f32(dpos) && dpos.rank == 2 && dpos.dim[0] == dx.dim[3] && dpos.dim[1] == dy.dim[2]),
      "dpos must be f32 [C,T]");
}
double PoolTokensBwd::flops() const { return 3.0 * (double)dy.numel(); }
void PoolSelectFwd::check() const {
  req(*this,
      nhwc(x) && x.dim[1] == 1 && f32(y) && y.rank == 2 && y.dim[0] == x.dim[0] && y.dim[1] == x.dim[3],
      "x [B,1,T,C], y f32 [B,C]");
}
double PoolSelectFwd::flops() const { return 0; }
void PoolSelectBwd::check() const {
  req(*this,
      nhwc(dx) && dx.dim[1] == 1 && f32(dy) && dy.rank == 2 && dy.dim[0] == dx.dim[0] &&
          dy.dim[1] == dx.dim[3],
      "dx [B,1,T,C], dy f32 [B,C]");
}
double PoolSelectBwd::flops() const { return 0; }

// ---- dropout ----
void DropoutFwd::check() const {
  req(*this, x.numel() == y.numel() && x.dtype == y.dtype && p >= 0 && p < 1, "x, y alike; 0 <= p < 1");
}
double DropoutFwd::flops() const { return 3.0 * x.numel(); }
void DropoutBwd::check() const {
  req(*this, dx.numel() == dy.numel() && dx.dtype == dy.dtype && p >= 0 && p < 1, "dx, dy alike; 0 <= p < 1");
}
double DropoutBwd::flops() const { return 3.0 * dy.numel(); }

// ---- loss, diffusion ----
void MseLoss::check() const {
  req(*this, f32(pred) && f32(target) && pred.numel() == target.numel(), "pred and target f32 of one size");
  req(*this, f32(loss) && f32(dpred) && (!dpred.defined() || dpred.numel() == pred.numel()),
      "loss/dpred f32");
}
double MseLoss::flops() const { return 4.0 * pred.numel(); }
void DiffusionLoss::check() const {
  req(*this,
      out.rank == 4 && f32(out) && f32(x0) && f32(xt) && f32(noise) && f32(coef) && f32(terms) && f32(dout),
      "f32 only; out 4-D NHWC");
  req(*this, same_shape(x0, xt) && same_shape(x0, noise) && x0.rank == 4,
      "x0, xt and noise must be [B,H,W,C]");
  const int64_t B = x0.dim[0], C = x0.dim[3];
  req(*this,
      out.dim[0] == B && out.dim[1] == x0.dim[1] && out.dim[2] == x0.dim[2] &&
          (out.dim[3] == C || out.dim[3] == 2 * C),
      "out must be [B,H,W,C] or [B,H,W,2C]");
  req(*this, coef.numel() == (size_t)(B * kLossCoefRows), "coef must be [B, kLossCoefRows]");
  req(*this, terms.numel() == (size_t)(B * kLossTerms), "terms must be [B, kLossTerms]");
  req(*this, !dout.defined() || same_shape(dout, out), "dout must match out");
  req(*this, !(clip && dout.defined()), "clip is for evaluation (no dout)");
}
double DiffusionLoss::flops() const { return 60.0 * x0.numel(); }
void LossStats::check() const {
  req(*this, f32(terms) && f32(coef) && f32(stats) && stats.numel() == 7, "f32; stats [7]");
  req(*this,
      terms.rank >= 1 && terms.numel() == (size_t)terms.dim[0] * kLossTerms &&
          coef.numel() == (size_t)terms.dim[0] * kLossCoefRows,
      "terms [B, kLossTerms], coef [B, kLossCoefRows]");
}
double LossStats::flops() const { return 8.0 * terms.dim[0]; }
void CrossEntropy::check() const {
  req(*this, f32(logits) && logits.rank == 2 && logits.dim[1] >= 1, "logits must be f32 [B,K]");
  req(*this, labels.dtype == DType::I32 && labels.numel() == (size_t)logits.dim[0], "labels must be i32 [B]");
  req(*this, terms.defined() || dlogits.defined(), "nothing to compute");
  req(*this, f32(terms) && (!terms.defined() || terms.numel() == (size_t)logits.dim[0] * kClassTerms),
      "terms must be f32 [B, kClassTerms]");
  req(*this, f32(dlogits) && (!dlogits.defined() || same_shape(dlogits, logits)),
      "dlogits must match logits");
}
double CrossEntropy::flops() const { return 6.0 * (double)logits.numel(); }
void ClassifierStats::check() const {
  req(*this, f32(terms) && f32(stats) && stats.numel() == (size_t)kClassStats, "f32; stats [kClassStats]");
  req(*this,
      terms.rank >= 1 && terms.numel() == (size_t)terms.dim[0] * kClassTerms &&
          quartile.dtype == DType::I32 && quartile.numel() == (size_t)terms.dim[0],
      "terms [B, kClassTerms], quartile i32 [B]");
}
double ClassifierStats::flops() const { return 6.0 * (double)terms.dim[0]; }
void QSample::check() const {
  req(*this, f32(x0) && f32(noise) && f32(xt) && f32(coef), "f32 only");
  req(*this, x0.numel() == noise.numel() && xt.numel() == x0.numel() && coef.numel() == 2 * (size_t)x0.dim[0],
      "coef must be [2B]");
}
double QSample::flops() const { return 3.0 * xt.numel(); }
void Axpbypcz::check() const {
  req(*this,
      f32(x) && f32(y) && f32(z) && (!x.defined() || x.numel() == y.numel()) &&
          (!z.defined() || z.numel() == y.numel()),
      "f32 of one size");
}
double Axpbypcz::flops() const { return 5.0 * y.numel(); }
void Clamp::check() const { req(*this, f32(x), "f32 only"); }
double Clamp::flops() const { return 2.0 * x.numel(); }
void LearnedRangeNoise::check() const {
  req(*this, f32(v) && f32(z) && f32(y) && v.numel() == z.numel() && y.numel() == v.numel(),
      "f32 of one size");
}
double LearnedRangeNoise::flops() const { return 8.0 * y.numel(); }
void NormalFill::check() const { req(*this, f32(z) && z.defined(), "f32 output"); }
double NormalFill::flops() const { return 0; }
void SampleStep::check() const {
  const size_t n = x.numel();
  req(*this,
      f32(x) && f32(eps) && f32(v) && f32(x0) && f32(z) && f32(coef) && x.defined() && eps.numel() == n &&
          x0.numel() == n && z.numel() == n && (!v.defined() || v.numel() == n) &&
          coef.numel() >= (size_t)kSampleStepCoefs,
      "f32 of one size; coef [11]");
}
double SampleStep::flops() const { return 12.0 * x.numel(); }

// ---- optimizer ----
void SumSquares::check() const { req(*this, f32(x) && f32(out) && out.numel() >= 1, "f32; out [1]"); }
double SumSquares::flops() const { return 2.0 * x.numel(); }
void ClipScale::check() const {
  req(*this, f32(sumsq) && sumsq.numel() >= 1 && f32(norm) && f32(scale) && scale.defined(), "f32 scalars");
}
double ClipScale::flops() const { return 4; }
void AdamWSchedule::check() const {
  req(*this, step.dtype == DType::I32 && step.numel() == 1 && f32(hyper) && hyper.numel() >= 4,
      "step i32 [1], hyper f32 [4]");
  req(*this, warmup >= 0 && anneal >= 0, "warmup, anneal >= 0");
}
double AdamWSchedule::flops() const { return 16; }
void AdamW::check() const {
  req(*this, f32(p) && f32(g) && f32(m) && f32(v) && f32(hyper) && f32(scale) && f32(ema), "f32 only");
  req(*this, g.numel() == p.numel() && m.numel() == p.numel() && v.numel() == p.numel() && hyper.numel() >= 3,
      "p, g, m, v of one size; hyper [3]");
  req(*this, !ema.defined() || ema.numel() == p.numel(), "ema of p's size");
  req(*this, !shadow.defined() || (shadow.dtype == DType::BF16 && shadow.numel() == p.numel()),
      "shadow bf16 of p's size");
  req(*this, f32(gsq) && (!gsq.defined() || gsq.numel() == 1), "gsq f32 [1]");
}
double AdamW::flops() const { return (ema.defined() ? 19.0 : 16.0) * p.numel(); }

}  // namespace unet
