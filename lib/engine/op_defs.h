// The op list: every operation the engines implement, written once.
//
// Each op is a struct of typed tensor views and scalar parameters, with
//  * kName / kFamily: its name ("conv_fwd") and op family ("conv"; variants and UNET_KERNELS
//    are named per family);
//  * fields(self, v): visits every tensor with its role (in, out, inout) and every scalar
//    parameter. From it alone come the CPU engine's bf16 emulation, the planner's buffer
//    lifetimes, the minimum-bytes count of the profiler, the variant chooser's signature and the
//    generic op tests;
//  * flops(): its arithmetic (GEMM-shaped work: 2 per multiply-add; memory-bound ops a few per
//    element), and check(): shape/dtype consistency (throws std::logic_error).
// UNET_OP_LIST names them all; the Ops interface (ops.h), the engines and the counting wrapper
// are generated from it.
//
// Conventions: activations NHWC; optional tensors may be left absent (rank 0); backward ops
// OVERWRITE their outputs, never accumulate. Reductions are deterministic in every engine.
// dtypes: activations f32 or bf16 (the engine's activation type), weights of convs/linears the
// same as their input, everything else (biases, norms' affine, statistics, embeddings, losses,
// optimizer state, weight gradients) f32.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "tensor.h"

namespace unet {

#define UNET_OP(name, family)                    \
  static constexpr const char* kName = name;     \
  static constexpr const char* kFamily = family; \
  double flops() const;                          \
  void check() const;

// ---------------------------------------------------------------- conv (kernel from w: 1 or 3)
// Optional GroupNorm (+ scale-shift) (+ SiLU) of a convolution's input, applied as the conv reads
// it: the conv's input is then GroupNormApply{x, gamma, beta, ss, mean, rstd, ., silu, xbias,
// xemb}'s y (the padding zeros come after it), which is never stored. On when mean is defined.
// The model's ResBlocks use it where a variant fuses it (their normalised activations are then
// neither written in the forward nor kept for the filter gradients); variants that do not,
// decline such ops.
struct NormIn {
  Tensor gamma, beta, ss, mean, rstd, xbias, xemb;
  bool silu = false;
  bool on() const { return mean.defined(); }
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("n_gamma", s.gamma), v.in("n_beta", s.beta), v.in("n_ss", s.ss), v.in("n_mean", s.mean);
    v.in("n_rstd", s.rstd), v.in("n_xbias", s.xbias), v.in("n_xemb", s.xemb);
    if (s.on()) v.param("n_silu", s.silu);  // (op descriptions name it only with a norm)
  }
};
// y = conv(x, w) + bias[co] + emb[b, co] + res   (padding k/2; each addend optional).
// The epilogue terms are the fusions the model uses: a ResBlock's timestep-embedding add (emb)
// and residual add (res). y may be f32 while x/w are bf16 (the model's output layer).
struct ConvFwd {
  UNET_OP("conv_fwd", "conv")
  Tensor x, w, bias, emb, res, y;
  int stride = 1;
  // Optional f32 [B, G]: the GroupNorm statistics of y as stored (G groups of its channels; what
  // GroupNormFwd would write), so that the norm which follows runs as GroupNormApply and does
  // not read y once more for them.
  Tensor mean{}, rstd{};
  NormIn norm{};  // (3x3 stride 1 only)
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("w", s.w), v.in("bias", s.bias), v.in("emb", s.emb), v.in("res", s.res);
    v.out("y", s.y), v.param("stride", s.stride), v.out("mean", s.mean), v.out("rstd", s.rstd);
    NormIn::fields(s.norm, v);
  }
};
// dx = conv_transpose(dy, w).
struct ConvBwdData {
  UNET_OP("conv_bwd_data", "conv")
  Tensor dy, w, dx;
  int stride = 1;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("dy", s.dy), v.in("w", s.w), v.out("dx", s.dx), v.param("stride", s.stride);
  }
};
// dw = dy^T * patches(x) (f32), db[co] = sum dy, demb[b, co] = sum_hw dy (each optional); with
// norm, patches of the normalised x (as ConvFwd's).
struct ConvBwdFilter {
  UNET_OP("conv_bwd_filter", "conv")
  Tensor x, dy, dw, db, demb;
  int stride = 1;
  NormIn norm{};  // (3x3 stride 1 only)
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("dy", s.dy), v.out("dw", s.dw), v.out("db", s.db), v.out("demb", s.demb);
    v.param("stride", s.stride);
    NormIn::fields(s.norm, v);
  }
};

// ---------------------------------------------------------------- linear: x [N, I], w [O, I]
struct LinearFwd {
  UNET_OP("linear_fwd", "linear")
  Tensor x, w, b, y;  // y [N, O] = x w^T + b
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("w", s.w), v.in("b", s.b), v.out("y", s.y);
  }
};
struct LinearBwd {
  UNET_OP("linear_bwd", "linear")
  Tensor x, w, dy, dx, dw, db;  // dx = dy w, dw = dy^T x (f32), db = sum_n dy (f32)
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("w", s.w), v.in("dy", s.dy), v.out("dx", s.dx), v.out("dw", s.dw), v.out("db", s.db);
  }
};

// ---------------------------------------------------------------- linear groups
// Up to kLinearGroup linears sharing one input x [N, I], as one op (the ResBlocks' timestep-
// embedding projections: one launch for all of them instead of a GEMM, a bias pass and, in the
// backward, two GEMMs, a bias reduction and an add each). The group is the leading present w[k];
// everything is f32. Forward: y[k] [N, O_k] = x w[k]^T + b[k] (w[k] [O_k, I], b[k] optional).
// Backward: dx = (dx_in +) sum over k, last to first, of dy[k] w[k] (dx_in optional, may be dx:
// the running sum over several groups); dw[k] = dy[k]^T x, db[k] = column sums of dy[k] (each
// optional).
constexpr int kLinearGroup = 64;
const char* linear_group_field(const char* base, int k);  // "w7", ...: names for fields()
struct LinearGroupFwd {
  UNET_OP("linear_group_fwd", "linear")
  Tensor x;
  Tensor w[kLinearGroup], b[kLinearGroup], y[kLinearGroup];
  int count() const;  // the leading present w
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x);
    for (int k = 0; k < kLinearGroup; ++k)
      v.in(linear_group_field("w", k), s.w[k]), v.in(linear_group_field("b", k), s.b[k]),
          v.out(linear_group_field("y", k), s.y[k]);
  }
};
struct LinearGroupBwd {
  UNET_OP("linear_group_bwd", "linear")
  Tensor x, dx_in, dx;
  Tensor w[kLinearGroup], dy[kLinearGroup], dw[kLinearGroup], db[kLinearGroup];
  int count() const;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("dx_in", s.dx_in), v.out("dx", s.dx);
    for (int k = 0; k < kLinearGroup; ++k)
      v.in(linear_group_field("w", k), s.w[k]), v.in(linear_group_field("dy", k), s.dy[k]),
          v.out(linear_group_field("dw", k), s.dw[k]), v.out(linear_group_field("db", k), s.db[k]);
  }
};

// ---------------------------------------------------------------- groupnorm, eps 1e-5
// n = GN(x) (groups of C/G consecutive channels, G = mean.dim[1]), z = n*gamma + beta,
// then optionally z = z*(1 + scale[b]) + shift[b] with ss [B, 2C] = (scale | shift), then
// optionally y = SiLU(z). Saves mean/rstd [B, G] (f32); without y, only them (the statistics of a
// norm that a conv applies as it reads its input: ConvFwd's norm).
// The three GroupNorm ops also take an optional offset of their input, xbias f32 [C] and xemb f32
// [B, C]: the norm reads x + xbias[c] + xemb[b, c] (added in that order, in f32) wherever it reads
// x. A ResBlock's first convolution leaves its bias and timestep embedding to the norm after it
// this way instead of a pass over its output that adds them (the output is read by that norm only).
struct GroupNormFwd {
  UNET_OP("groupnorm_fwd", "groupnorm")
  Tensor x, gamma, beta, ss, y, mean, rstd;
  bool silu = false;
  Tensor xbias{}, xemb{};
  // The input as two parts, x's channels then x2's (a skip concatenation read where its parts
  // lie), and xcat (optional): that concatenation, written as read. No xbias / xemb then.
  Tensor x2{}, xcat{};
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("gamma", s.gamma), v.in("beta", s.beta), v.in("ss", s.ss), v.out("y", s.y);
    v.out("mean", s.mean), v.out("rstd", s.rstd), v.param("silu", s.silu);
    v.in("xbias", s.xbias), v.in("xemb", s.xemb), v.in("x2", s.x2), v.out("xcat", s.xcat);
  }
  // The input's shape: x's, with x2's channels added.
  Tensor whole() const {
    Tensor w = x;
    if (x2.defined() && w.rank == 4) w.dim[3] += x2.dim[3];
    return w;
  }
};
// GroupNormFwd's output from statistics already computed (the backward pass's recompute of a
// normalised input it did not keep): no reduction, one pass.
struct GroupNormApply {
  UNET_OP("groupnorm_apply", "groupnorm")
  Tensor x, gamma, beta, ss, mean, rstd, y;
  bool silu = false;
  Tensor xbias{}, xemb{};
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("gamma", s.gamma), v.in("beta", s.beta), v.in("ss", s.ss), v.in("mean", s.mean);
    v.in("rstd", s.rstd), v.out("y", s.y), v.param("silu", s.silu);
    v.in("xbias", s.xbias), v.in("xemb", s.xemb);
  }
};
// The GroupNormApply that a NormIn stands for (y = the normalised x), and the GroupNormFwd that
// computes its statistics (and y, if given).
inline GroupNormApply norm_apply(const NormIn& n, const Tensor& x, const Tensor& y) {
  return GroupNormApply{x, n.gamma, n.beta, n.ss, n.mean, n.rstd, y, n.silu, n.xbias, n.xemb};
}
inline GroupNormFwd norm_fwd(const NormIn& n, const Tensor& x, const Tensor& y) {
  return GroupNormFwd{x, n.gamma, n.beta, n.ss, y, n.mean, n.rstd, n.silu, n.xbias, n.xemb};
}
// Backward of GroupNormFwd from the saved statistics (recomputes n and z from x).
struct GroupNormBwd {
  UNET_OP("groupnorm_bwd", "groupnorm")
  Tensor x, gamma, beta, ss, mean, rstd, dy, dx, dgamma, dbeta, dss;
  bool silu = false;
  // Optional, dx's dtype and shape: added to dx before its one rounding (the gradient of a
  // parallel path into the same input, e.g. a residual block's skip connection).
  Tensor add;
  // Optional f32 column sums, the bias (and embedding) gradients of the convolutions on either
  // side, so that no separate pass reads dx or add again: dx_sums [B, C] = dx (as stored, add
  // included) summed over each sample's positions, dx_total [C] = those summed over the batch;
  // add_total [C] = add summed over samples and positions.
  Tensor dx_sums, dx_total, add_total;
  Tensor xbias{}, xemb{};  // as GroupNormFwd's (x as the forward read it)
  // Optional, with dx: the input gradient in two tensors, dx the first dx.dim[3] channels and dx2
  // the rest (x a skip concatenation: its backward's split done here, no pass of its own). The
  // column sums stay over all C channels.
  Tensor dx2{};
  // Optional, dx's dtype and x's shape: a second gradient added to dx with add (e.g. a skip
  // concatenation's part for this input, arriving from the decoder); not in add_total.
  Tensor add2{};
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("gamma", s.gamma), v.in("beta", s.beta), v.in("ss", s.ss), v.in("mean", s.mean);
    v.in("rstd", s.rstd), v.in("dy", s.dy), v.out("dx", s.dx), v.out("dgamma", s.dgamma);
    v.out("dbeta", s.dbeta), v.out("dss", s.dss), v.param("silu", s.silu), v.in("add", s.add);
    v.out("dx_sums", s.dx_sums), v.out("dx_total", s.dx_total), v.out("add_total", s.add_total);
    v.in("xbias", s.xbias), v.in("xemb", s.xemb), v.out("dx2", s.dx2), v.in("add2", s.add2);
  }
};
// Whether a GroupNorm op (Fwd, Apply, Bwd) reads its input with an offset (xbias or xemb).
template <class Op>
bool gn_has_offset(const Op& o) {
  return o.xbias.defined() || o.xemb.defined();
}

// ---------------------------------------------------------------- elementwise
struct SiluFwd {
  UNET_OP("silu_fwd", "elementwise")
  Tensor x, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.out("y", s.y);
  }
};
struct SiluBwd {
  UNET_OP("silu_bwd", "elementwise")
  Tensor x, dy, dx;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("dy", s.dy), v.out("dx", s.dx);
  }
};
// y = a + b (y may alias a or b).
struct Add {
  UNET_OP("add", "elementwise")
  Tensor a, b, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("a", s.a), v.in("b", s.b), v.out("y", s.y);
  }
};
// y = x converted to y's dtype (f32 <-> bf16, round to nearest even).
struct Cast {
  UNET_OP("cast", "elementwise")
  Tensor x, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.out("y", s.y);
  }
};
struct Copy {
  UNET_OP("copy", "elementwise")
  Tensor x, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.out("y", s.y);
  }
};
struct Fill {
  UNET_OP("fill", "elementwise")
  Tensor y;
  float value = 0;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.out("y", s.y), v.param("value", s.value);
  }
};

// ---------------------------------------------------------------- resampling (NHWC)
struct UpsampleFwd {  // nearest 2x: y [B, 2H, 2W, C]
  UNET_OP("upsample_fwd", "resample")
  Tensor x, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.out("y", s.y);
  }
};
struct UpsampleBwd {
  UNET_OP("upsample_bwd", "resample")
  Tensor dy, dx;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("dy", s.dy), v.out("dx", s.dx);
  }
};
struct AvgPoolFwd {  // 2x2 mean: y [B, H/2, W/2, C]
  UNET_OP("avgpool_fwd", "resample")
  Tensor x, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.out("y", s.y);
  }
};
struct AvgPoolBwd {
  UNET_OP("avgpool_bwd", "resample")
  Tensor dy, dx;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("dy", s.dy), v.out("dx", s.dx);
  }
};

// ---------------------------------------------------------------- channel concat (a first)
struct ConcatFwd {
  UNET_OP("concat_fwd", "concat")
  Tensor a, b, y;  // [.., Ca] ++ [.., Cb] -> [.., Ca + Cb]
  // Optional f32 [B, G], y NHWC: the GroupNorm statistics of y, as ConvFwd's mean/rstd.
  Tensor mean{}, rstd{};
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("a", s.a), v.in("b", s.b), v.out("y", s.y), v.out("mean", s.mean), v.out("rstd", s.rstd);
  }
};
struct ConcatBwd {  // splits dy's channels; also the model output's eps | variance split
  UNET_OP("concat_bwd", "concat")
  Tensor dy, da, db;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("dy", s.dy), v.out("da", s.da), v.out("db", s.db);
  }
};

// ---------------------------------------------------------------- embeddings (f32)
// y [B, dim] = [cos(t f_i), sin(t f_i)], f_i = exp(-ln(1e4) i / half); t [B] as floats.
struct TimestepEmbedding {
  UNET_OP("timestep_embedding", "embedding")
  Tensor t, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("t", s.t), v.out("y", s.y);
  }
};
// y [B, D] += table[labels[b]] (labels i32 [B], table [K, D]).
struct EmbeddingAdd {
  UNET_OP("embedding_add", "embedding")
  Tensor labels, table, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("labels", s.labels), v.in("table", s.table), v.inout("y", s.y);
  }
};
// dtable [K, D] = scatter-sum of dy rows by label (deterministic order).
struct EmbeddingBwd {
  UNET_OP("embedding_bwd", "embedding")
  Tensor labels, dy, dtable;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("labels", s.labels), v.in("dy", s.dy), v.out("dtable", s.dtable);
  }
};

// ---------------------------------------------------------------- attention
// guided-diffusion's QKVAttention (legacy = QKVAttentionLegacy). qkv [B, T, 3C] (any 4-D NHWC
// view with T = H*W), out [B, T, C], lse [B, heads, T] (f32): the log-sum-exp of each query's
// scaled logits, saved instead of the [T, T] weights; backward recomputes the weights from it.
struct AttentionFwd {
  UNET_OP("attention_fwd", "attention")
  Tensor qkv, out, lse;
  bool legacy = false;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("qkv", s.qkv), v.out("out", s.out), v.out("lse", s.lse), v.param("legacy", s.legacy);
  }
};
struct AttentionBwd {
  UNET_OP("attention_bwd", "attention")
  Tensor qkv, out, lse, dout, dqkv;
  bool legacy = false;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("qkv", s.qkv), v.in("out", s.out), v.in("lse", s.lse), v.in("dout", s.dout), v.out("dqkv", s.dqkv);
    v.param("legacy", s.legacy);
  }
};

// ---------------------------------------------------------------- attention pooling (classifier head)
// guided-diffusion's AttentionPool2d around the attention op (EncoderUNetModel, pool="attention").
// Tokens y [B,1,T,C], T = H*W + 1, from x [B,H,W,C] and the positional embedding pos f32 [C,T]
// (PyTorch's layout of `positional_embedding`):
//   y[b,0,c] = mean_hw x[b,hw,c] + pos[c,0],   y[b,1+hw,c] = x[b,hw,c] + pos[c,1+hw].
// The mean is summed in hw order in f32.
struct PoolTokensFwd {
  UNET_OP("pool_tokens_fwd", "pool")
  Tensor x, pos, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.in("pos", s.pos), v.out("y", s.y);
  }
};
// dx[b,hw,c] = dy[b,1+hw,c] + dy[b,0,c] / (H*W);  dpos[c,t] = sum_b dy[b,t,c] (f32, optional).
struct PoolTokensBwd {
  UNET_OP("pool_tokens_bwd", "pool")
  Tensor dy, dx, dpos;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("dy", s.dy), v.out("dx", s.dx), v.out("dpos", s.dpos);
  }
};
// The pooled token: y f32 [B,C] = x[b,0,:] of tokens x [B,1,T,C] (the head's c_proj reads only
// token 0, as AttentionPool2d's `x[:, :, 0]`).
struct PoolSelectFwd {
  UNET_OP("pool_select_fwd", "pool")
  Tensor x, y;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.out("y", s.y);
  }
};
// dx [B,1,T,C]: dx[b,0,c] = dy[b,c], every other token 0.
struct PoolSelectBwd {
  UNET_OP("pool_select_bwd", "pool")
  Tensor dy, dx;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("dy", s.dy), v.out("dx", s.dx);
  }
};

// ---------------------------------------------------------------- dropout
// keep element i iff uniform01(seed, Dropout, i) >= p; kept values scaled by 1/(1-p).
struct DropoutFwd {
  UNET_OP("dropout_fwd", "dropout")
  Tensor x, y;
  float p = 0;
  uint64_t seed = 0;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.out("y", s.y), v.param("p", s.p), v.param("seed", s.seed);
  }
};
struct DropoutBwd {
  UNET_OP("dropout_bwd", "dropout")
  Tensor dy, dx;
  float p = 0;
  uint64_t seed = 0;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("dy", s.dy), v.out("dx", s.dx), v.param("p", s.p), v.param("seed", s.seed);
  }
};

// ---------------------------------------------------------------- loss and diffusion (f32)
// loss[0] = mean((pred - target)^2), dpred = 2 (pred - target) / n.
struct MseLoss {
  UNET_OP("mse_loss", "loss")
  Tensor pred, target, loss, dpred;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("pred", s.pred), v.in("target", s.target), v.out("loss", s.loss), v.out("dpred", s.dpred);
  }
};
// guided-diffusion's training objective and variational bound (GaussianDiffusion.training_losses,
// _vb_terms_bpd) for a batch, per sample b over the D = H*W*C elements of its mean channels.
//  out [B,H,W,Co]: the model output, Co = C (mean channels only: eps, or x0 with predict_xstart)
//     or 2C (mean | variance value v in [-1, 1] of the learned range, as guided-diffusion's split);
//  x0, xt, noise [B,H,W,C]: the image, its q_sample and the noise that made it;
//  coef [B, kLossCoefRows]: per-sample scalars the host computes from the schedule at t_b (rows
//     below; float64 arrays cast to float32, as guided-diffusion's _extract_into_tensor does);
//  terms [B, kLossTerms]: mse (mean-channel MSE vs noise or x0), vb (bits, scaled by
//     coef kVbScale: KL(q(x_{t-1}|x_t,x_0) || p(x_{t-1}|x_t)), or the discretized-Gaussian decoder
//     NLL where coef kDecoder is 1), loss (mse + vb, or vb alone with use_kl), x0_mse and eps_mse
//     (predicted x0 vs x0, and eps re-derived from it vs noise: calc_bpd_loop's terms);
//  dout [B,H,W,Co] (optional): the gradient of the batch's loss, elementwise from coef: mean
//     channels kGradMse * (out - target) (none with use_kl) plus, with use_kl only, kGradVb times the
//     vb element's (KL or NLL, nats) derivative through the predicted mean; variance channels kGradVb
//     times its derivative in v. Without use_kl the predicted mean is held fixed for vb
//     (guided-diffusion's frozen_out): only the variance channels get vb's gradient.
// The vb term is computed when the variance is learned (Co = 2C) or use_kl; with a fixed variance
// the model's log variance is coef kMaxLog. clip clamps the predicted x0 to [-1, 1] (evaluation:
// calc_bpd_loop's clip_denoised; no dout then).
enum LossCoefRow : int {
  kX0FromXt,   // sqrt(1/abar_t): x0 = kX0FromXt * x_t - kX0FromEps * eps
  kX0FromEps,  // sqrt(1/abar_t - 1)
  kMeanX0,     // posterior_mean_coef1: mean = kMeanX0 * x0 + kMeanXt * x_t
  kMeanXt,     // posterior_mean_coef2
  kMinLog,     // posterior_log_variance_clipped: the posterior's and the learned range's low end
  kMaxLog,     // log(beta_t): the learned range's high end; with a fixed variance, the model's
  kDecoder,    // 1 at t = 0 (vb is the decoder NLL), else 0
  kVbScale,    // vb multiplier: 1, T/1000 (rescale_learned_sigmas) or T (use_kl)
  kGradMse,    // dout of the mean channels: kGradMse * (out - target) (2 w_b / (B D))
  kGradVb,     // dout through vb: kGradVb * d(vb element)/d(out) (w_b vb_scale / (B D ln 2))
  kWeight,     // importance weight w_b of the sample (LossStats)
  kQuartile,   // int(4 t / T) as a float (LossStats)
  kLossCoefRows
};
enum LossTerm : int { kTermMse, kTermVb, kTermLoss, kTermX0Mse, kTermEpsMse, kLossTerms };
struct DiffusionLoss {
  UNET_OP("diffusion_loss", "loss")
  Tensor out, x0, xt, noise, coef, terms, dout;
  bool predict_xstart = false, use_kl = false, clip = false;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("out", s.out), v.in("x0", s.x0), v.in("xt", s.xt), v.in("noise", s.noise), v.in("coef", s.coef);
    v.out("terms", s.terms), v.out("dout", s.dout), v.param("predict_xstart", s.predict_xstart);
    v.param("use_kl", s.use_kl), v.param("clip", s.clip);
  }
};
// The log's running sums of a batch's weighted terms (guided-diffusion's log_loss_dict):
// stats[0..2] += sum_b w_b * (loss_b, mse_b, vb_b), stats[3 + q_b] += w_b * loss_b, with w_b and
// q_b the rows kWeight and kQuartile of coef [B, kLossCoefRows]; stats f32 [7]. Fixed order.
struct LossStats {
  UNET_OP("loss_stats", "loss")
  Tensor terms, coef, stats;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("terms", s.terms), v.in("coef", s.coef), v.inout("stats", s.stats);
  }
};
// Classification (f32): per-sample cross-entropy of logits [B,K] against labels i32 [B] in [0,K):
//   terms [B, kClassTerms] (optional): loss = logsumexp(logits) - logits[y], top-1 and top-5
//     correct (1 or 0: fewer than k logits exceed logits[y]; k clamped to K);
//   dlogits [B,K] (optional) = scale * (softmax(logits) - onehot(y)): scale 1/B for the mean loss
//     of training, -S for classifier guidance's S * d log p(y|x) / d logits.
enum ClassTerm : int { kClassLoss, kClassTop1, kClassTop5, kClassTerms };
struct CrossEntropy {
  UNET_OP("cross_entropy", "loss")
  Tensor logits, labels, terms, dlogits;
  float scale = 1;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("logits", s.logits), v.in("labels", s.labels), v.out("terms", s.terms), v.out("dlogits", s.dlogits);
    v.param("scale", s.scale);
  }
};
// The classifier log's running sums (guided-diffusion's log_loss_dict): stats f32 [kClassStats]
// += sum_b terms[b][j] at j, and sum over the samples of quartile q (quartile i32 [B] in 0..3)
// at 3 + 3q + j. Fixed order (sample order, in double).
constexpr int kClassStats = 3 + 4 * kClassTerms;
struct ClassifierStats {
  UNET_OP("classifier_stats", "loss")
  Tensor terms, quartile, stats;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("terms", s.terms), v.in("quartile", s.quartile), v.inout("stats", s.stats);
  }
};
// xt = coef[b] x0 + coef[B + b] noise (coef [2B] = sqrt(abar_t) | sqrt(1 - abar_t)).
struct QSample {
  UNET_OP("q_sample", "diffusion")
  Tensor x0, noise, coef, xt;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x0", s.x0), v.in("noise", s.noise), v.in("coef", s.coef), v.out("xt", s.xt);
  }
};
// y = a x + b y + c z (z optional).
struct Axpbypcz {
  UNET_OP("axpbypcz", "diffusion")
  Tensor x, y, z;
  float a = 0, b = 0, c = 0;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.inout("y", s.y), v.in("z", s.z), v.param("a", s.a), v.param("b", s.b);
    v.param("c", s.c);
  }
};
struct Clamp {
  UNET_OP("clamp", "diffusion")
  Tensor x;
  float lo = -1, hi = 1;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.inout("x", s.x), v.param("lo", s.lo), v.param("hi", s.hi);
  }
};
// Learned-range DDPM noise: y = z * exp(0.5 (f max_log + (1 - f) min_log)), f = (v + 1) / 2.
struct LearnedRangeNoise {
  UNET_OP("learned_range_noise", "diffusion")
  Tensor v, z, y;
  float min_log = 0, max_log = 0;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("v", s.v), v.in("z", s.z), v.out("y", s.y), v.param("min_log", s.min_log);
    v.param("max_log", s.max_log);
  }
};

// Gaussian noise drawn where it is used: z[i] = normal(seed, stream, index0 + i) (lib/rng.h), so the
// samplers' noise needs no host draw and upload; the same values on every device up to libm's last
// bit (the transform is computed in double and rounded once).
struct NormalFill {
  UNET_OP("normal_fill", "diffusion")
  Tensor z;
  uint64_t seed = 0, stream = 0, index0 = 0;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.out("z", s.z), v.param("seed", s.seed), v.param("stream", s.stream), v.param("index0", s.index0);
  }
};

// One sampler step after the model's output (DDPM or DDIM, no guidance) as one op, its per-step
// numbers read from the device (coef), so a CUDA graph holds the step with the forward and the
// host writes them with the timesteps before each replay. The arithmetic of the op sequence it
// replaces (Copy, Axpbypcz, Clamp, NormalFill, LearnedRangeNoise, Axpbypcz), in their order:
//   x0 = eps (xstart), else coef[0] x + coef[1] eps; clamped to [-1, 1] when clip;
//   z = normal(key, stream, index0 + i), times exp(0.5 (f coef[6] + (1 - f) coef[5])), f = (v + 1) / 2,
//     with v (learned sigma);
//   x = coef[2] x0 + coef[3] x (+ coef[4] z unless coef[4] is 0).
// coef [kSampleStepCoefs] f32: those 7, then the 64-bit key and index0 as 32-bit halves, low first
// (bit patterns in f32 slots: only this op reads them).
constexpr int kSampleStepCoefs = 11;
// coef's 64-bit values at slots i and i + 1.
UNET_HD inline uint64_t sample_step_u64(const float* c, int i) {
  uint32_t lo, hi;
  std::memcpy(&lo, c + i, 4), std::memcpy(&hi, c + i + 1, 4);
  return lo | (uint64_t)hi << 32;
}
inline void sample_step_put_u64(float* c, int i, uint64_t v) {
  const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
  std::memcpy(c + i, &lo, 4), std::memcpy(c + i + 1, &hi, 4);
}
struct SampleStep {
  UNET_OP("sample_step", "diffusion")
  Tensor x, eps, v, x0, z, coef;
  uint64_t stream = 0;
  bool xstart = false, clip = true;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.inout("x", s.x), v.in("eps", s.eps), v.in("v", s.v), v.out("x0", s.x0), v.out("z", s.z);
    v.in("coef", s.coef), v.param("stream", s.stream), v.param("xstart", s.xstart), v.param("clip", s.clip);
  }
};

// ---------------------------------------------------------------- optimizer (flat f32 arenas)
struct SumSquares {  // out[0] = sum x^2 (fixed order)
  UNET_OP("sum_squares", "optimizer")
  Tensor x, out;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("x", s.x), v.out("out", s.out);
  }
};
// norm[0] = sqrt(s), s = the sum of sumsq's entries (in order, in double: one entry a range's
// SumSquares, so that the optimizer can sum the gradient by ranges); scale[0] = min(1, clip /
// (norm + 1e-6)) if clip > 0 else 1.
struct ClipScale {
  UNET_OP("clip_scale", "optimizer")
  Tensor sumsq, norm, scale;
  float clip = 0;
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.in("sumsq", s.sumsq), v.out("norm", s.norm), v.out("scale", s.scale), v.param("clip", s.clip);
  }
};
// The per-step scalars of AdamW, computed where the optimizer runs (no host copy of this
// arithmetic): step i32 [1] is the number of steps taken so far and is incremented;
// hyper f32 [4] = {1 - lr_t wd, lr_t / (1 - beta1^t), sqrt(1 - beta2^t), lr_t} with t = step + 1
// and lr_t = lr * min(1, t / warmup) (warmup 0 = none).
struct AdamWSchedule {
  UNET_OP("adamw_schedule", "optimizer")
  Tensor step, hyper;
  double lr = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.999;
  int64_t warmup = 0;
  int64_t anneal = 0;  // the learning rate's linear decay to 0 over this many steps (0: none)
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.inout("step", s.step), v.out("hyper", s.hyper), v.param("lr", s.lr),
        v.param("weight_decay", s.weight_decay);
    v.param("beta1", s.beta1), v.param("beta2", s.beta2), v.param("warmup", s.warmup),
        v.param("anneal", s.anneal);
  }
};
// PyTorch AdamW (single-tensor path) with g = grad * scale[0]:
//   p *= hyper[0]; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= hyper[1] m / (sqrt(v)/hyper[2] + eps).
// ema (optional): the weights' EMA from the updated p in the same pass, ema = ema_rate ema + (1 - ema_rate) p.
// shadow (optional, bf16, p's size): the updated p rounded to bf16 (Cast's rounding), the copy the
// bf16 GEMMs read, so that the next forward needs no cast pass.
struct AdamW {
  UNET_OP("adamw", "optimizer")
  Tensor p, g, m, v, hyper, scale;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  Tensor ema;
  float ema_rate = 0;
  Tensor shadow{};
  Tensor gsq{};  // (optional, f32 [1]) the sum of g^2 over the range (g as given, unscaled)
  template <class S, class V>
  static void fields(S& s, V& v) {
    v.inout("p", s.p), v.in("g", s.g), v.inout("m", s.m), v.inout("v", s.v), v.in("hyper", s.hyper);
    v.in("scale", s.scale), v.param("beta1", s.beta1), v.param("beta2", s.beta2);
    v.param("eps", s.eps), v.inout("ema", s.ema), v.param("ema_rate", s.ema_rate), v.out("shadow", s.shadow);
    v.out("gsq", s.gsq);
  }
};

#undef UNET_OP

#define UNET_OP_LIST(X)                                                                                     \
  X(ConvFwd)                                                                                                \
  X(ConvBwdData)                                                                                            \
  X(ConvBwdFilter)                                                                                          \
  X(LinearFwd)                                                                                              \
  X(LinearBwd)                                                                                              \
  X(LinearGroupFwd) X(LinearGroupBwd) X(GroupNormFwd) X(GroupNormApply) X(GroupNormBwd) X(SiluFwd)          \
      X(SiluBwd) X(Add) X(Cast) X(Copy) X(Fill) X(UpsampleFwd) X(UpsampleBwd) X(AvgPoolFwd) X(AvgPoolBwd)   \
          X(ConcatFwd) X(ConcatBwd) X(TimestepEmbedding) X(EmbeddingAdd) X(EmbeddingBwd) X(AttentionFwd)    \
              X(AttentionBwd) X(PoolTokensFwd) X(PoolTokensBwd) X(PoolSelectFwd) X(PoolSelectBwd)           \
                  X(DropoutFwd) X(DropoutBwd) X(MseLoss) X(DiffusionLoss) X(LossStats) X(CrossEntropy)      \
                      X(ClassifierStats) X(QSample) X(Axpbypcz) X(Clamp) X(LearnedRangeNoise) X(NormalFill) \
                          X(SampleStep) X(SumSquares) X(ClipScale) X(AdamWSchedule) X(AdamW)

// ---- generic views of an op, from fields() ----
enum class Role { In, Out, InOut };

namespace detail {
template <class TRef, class F>
struct TensorVisitor {
  F& f;
  void in(const char* n, TRef t) {
    if (t.defined()) f(n, t, Role::In);
  }
  void out(const char* n, TRef t) {
    if (t.defined()) f(n, t, Role::Out);
  }
  void inout(const char* n, TRef t) {
    if (t.defined()) f(n, t, Role::InOut);
  }
  template <class P>
  void param(const char*, P&) {}
};
template <class F>
struct ParamVisitor {
  F& f;
  template <class T>
  void in(const char*, T&) {}
  template <class T>
  void out(const char*, T&) {}
  template <class T>
  void inout(const char*, T&) {}
  template <class P>
  void param(const char* n, P& p) {
    f(n, p);
  }
};
}  // namespace detail

// f(name, tensor, role) for every PRESENT tensor of the op; the tensor is mutable when op is.
template <class OpT, class F>
void for_each_tensor(OpT& op, F&& f) {
  using TRef = std::conditional_t<std::is_const_v<OpT>, const Tensor&, Tensor&>;
  detail::TensorVisitor<TRef, F> v{f};
  std::remove_const_t<OpT>::fields(op, v);
}
// f(name, value) for every scalar parameter (int, int64_t, bool, float, uint64_t).
template <class OpT, class F>
void for_each_param(OpT& op, F&& f) {
  detail::ParamVisitor<F> v{f};
  std::remove_const_t<OpT>::fields(op, v);
}

// "conv_fwd x=bf16[32,64,64,64] w=... stride=1", for messages. With key_only, the parts a
// kernel variant's choice may depend on (tensor shapes and dtypes, integer and boolean
// parameters), which key the chooser's cache.
template <class Op>
std::string describe(const Op& op, bool key_only = false) {
  std::string s = Op::kName;
  for_each_tensor(op,
                  [&](const char* n, const Tensor& t, Role) { s += std::string(" ") + n + "=" + t.str(); });
  for_each_param(op, [&](const char* n, const auto& p) {
    using P = std::decay_t<decltype(p)>;
    if constexpr (std::is_same_v<P, float> || std::is_same_v<P, double>) {
      if (!key_only) s += std::string(" ") + n + "=" + std::to_string(p);
    } else if constexpr (std::is_same_v<P, uint64_t>) {
      if (!key_only) s += std::string(" ") + n + "=" + std::to_string(p);
    } else {
      s += std::string(" ") + n + "=" + std::to_string((long long)p);
    }
  });
  return s;
}

// A 64-bit hash of what describe(op, true) shows (shapes, dtypes, integer and boolean
// parameters): the chooser's cache key, cheap enough to compute on every op call.
template <class Op>
uint64_t op_key(const Op& op) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  };
  for_each_tensor(op, [&](const char* name, const Tensor& t, Role r) {
    mix((uint64_t)(uintptr_t)name);  // which field (absent ones are not visited)
    mix(((uint64_t)t.dtype << 8) | ((uint64_t)t.rank << 4) | (uint64_t)r);
    for (int i = 0; i < t.rank; ++i) mix((uint64_t)t.dim[i]);
  });
  for_each_param(op, [&](const char*, const auto& p) {
    using P = std::decay_t<decltype(p)>;
    if constexpr (!std::is_floating_point_v<P> && !std::is_same_v<P, uint64_t>) mix((uint64_t)(int64_t)p);
  });
  return h;
}

}  // namespace unet
