// The blocks guided-diffusion's networks are made of — the timestep-embedding MLP, the first
// conv, ResBlock (plain, down, up), AttentionBlock, Downsample, Upsample — written once on the op
// table, forward and explicit backward, with the buffers each declares to the planner. The UNet
// (model.cpp) and the classifier (classifier.cpp) hold a Blocks and walk its layers in their own
// order; neither has block code of its own.
//
// Buffers per layer (packed by the planner by lifetime):
//  * saved for backward: the layer's output, a ResBlock's first conv output h1 (its bias and
//    timestep embedding added by the norm that reads it), its embedding projection e, GroupNorm statistics, resampled skip inputs,
//    attention qkv / output / log-sum-exp;
//  * recomputed in backward instead of saved: GroupNorm(+scale-shift)+SiLU outputs, resampled
//    and dropped-out copies (memory-bound work, about half the activation memory);
//  * forward scratch and backward scratch are separate buffers, so neither keeps the other alive.
// Fusions every engine is asked for: the residual add in the conv epilogue (ConvFwd res), conv1's
// bias and embedding add in the GroupNorm after it (xbias/xemb), scale-shift and SiLU in GroupNorm, the embedding gradient from the conv's
// filter gradient (ConvBwdFilter demb).
//
// Precision follows the engine: activations (and the GEMMs' weights, a bf16 copy of the master
// weights) in the engine's activation dtype; the timestep-embedding MLP, the embedding
// projections, GroupNorm statistics, biases and every gradient of a parameter in f32.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "arch.h"
#include "config.h"
#include "engine.h"
#include "network.h"
#include "params.h"

namespace unet {

class Planner;

struct Blocks {
  static constexpr int kGroups = 32;

  // One layer of the network: its place, parameter offsets and buffers.
  struct L {
    Layer l;
    int index = 0;  // position in the network (dropout seed)
    int ro = 0;     // output resolution
    std::string fwd_name, bwd_name;
    // parameters (SIZE_MAX = absent)
    size_t w0 = SIZE_MAX, b0 = SIZE_MAX;    // Conv/Down/Up conv, Attn qkv, Res in_layers.2
    size_t n1w = SIZE_MAX, n1b = SIZE_MAX;  // Res in_layers.0, Attn norm
    size_t ew = SIZE_MAX, eb = SIZE_MAX;    // Res emb_layers.1
    size_t n2w = SIZE_MAX, n2b = SIZE_MAX;  // Res out_layers.0
    size_t w2 = SIZE_MAX, b2 = SIZE_MAX;    // Res out_layers.3, Attn proj_out
    size_t sw = SIZE_MAX, sb = SIZE_MAX;    // Res skip_connection
    Tensor in;                              // input of the last forward (owned elsewhere)
    // A ResBlock after a skip concatenation whose GN1 reads the concatenation's two parts where
    // they lie and writes `in` (the concatenation itself, which the backward and the skip conv
    // read) as it goes: those parts, set per forward by the network (its cat_by_norm, only where
    // gn1_writes_cat: GN1 a pass of its own that computes its statistics).
    Tensor cat_a, cat_b;
    // saved
    Tensor out, h1, e, xu, mean1, rstd1, mean2, rstd2, qkv, att, lse;
    // forward scratch
    Tensor f_n1, f_n1r, f_n2, f_sk, f_up;
    // backward scratch
    Tensor b_n1, b_n1r, b_n2, b_dn2, b_dh1, b_de, b_dpart, b_dn1r, b_dn1, b_dxs, b_dxs2, b_up, b_dup, b_datt,
        b_dqkv, b_n, b_dn;
    Tensor dx;                    // gradient of the input (absent for a first conv that needs none)
    // A ResBlock after a skip concatenation: with dx2, dx holds the first dx.dim[3] channels of the
    // input gradient and dx2 the rest (the concatenation's backward split, written by GN1's
    // backward directly); set by the network after declare_layer (declared there without dx).
    Tensor dx2;
    // A ResBlock whose input also feeds a skip concatenation: that path's gradient, which GN1's
    // backward adds into dx (no Add pass; set by the network after declare_layer).
    Tensor dx_add;
    // The column totals of the input gradient this layer writes, wanted as the previous layer's
    // bias gradient (that layer's out_bias()): its norm backward writes them there (dx_total), and
    // the previous layer (db_given) skips its own column-sum pass over the same gradient. Set by the
    // network (link_bias_grads); SIZE_MAX: none.
    size_t dx_total_param = SIZE_MAX;
    bool db_given = false;
    // The bias whose gradient is the column sums of the layer's output gradient, read by no other
    // pass of its own backward (Conv/Down/Up: the conv's; a ResBlock whose skip path is not dout
    // itself: conv2's); SIZE_MAX where there is none or the layer sums it anyway.
    size_t out_bias() const;
    // UNET_CONV_STATS: the GroupNorm statistics of `out` that the layer's last conv also writes (the
    // next layer's mean1/rstd1, or the UNet's out norm's), and whether this layer's first norm finds
    // its own written so (chain_stats).
    Tensor out_mean, out_rstd;
    bool stats_in = false;
    // A ResBlock whose conv1 (fuse1) / conv2 (fuse2) applies the norm in front of it as it reads
    // its input (fuse_norm): that norm's output is neither written nor kept (no f_n1 / f_n2).
    bool fuse1 = false, fuse2 = false;
    // the lowest arena offset of the layer's parameters whose gradients its backward computes
    // (emb_layers' come from the group at the end: embedding_bwd)
    size_t lowest_param() const;
  };

  // cfg: the network's UNet configuration (the classifier's body()); table: its parameters;
  // net: the arenas (params/shadow/grads, read at each call).
  Blocks(Engine& eng, const ModelConfig& cfg, const ParamTable& table, const Tensor& params,
         const Tensor& shadow, const Tensor& grads);

  L make(const Layer& l);  // indices in call order

  // ---- per call ----
  Engine& eng;
  const ModelConfig& cfg;
  const ParamTable& table;
  const DType A;           // activation dtype
  int B = 0;               // batch of the current call (<= planned)
  bool train = false;      // dropout on
  bool wgrad = true;       // backward computes parameter gradients (false: input gradients only)
  // Training keeps the forward's normalized conv inputs (SiLU(GroupNorm(x)), after dropout; the
  // upsampled input) for the filter gradients; false recomputes them in backward instead (less
  // memory, one GroupNorm apply per conv more). Network::plan falls back to false when the kept
  // buffers do not fit; UNET_RECOMPUTE=1 forces it.
  bool keep = true;
  uint64_t seed = 0;       // dropout
  // The convolution in front of a GroupNorm also gives the norm's statistics (ConvFwd's mean,
  // rstd; computed in its epilogue's pass on the GPU), and the norm runs as GroupNormApply: through
  // chain_stats, from one layer's last conv to the next layer's first norm (the UNet also has its
  // skip concatenations give them). Not within a ResBlock: conv1 has no epilogue pass (below).
  // UNET_CONV_STATS=1 (opt-in until measured).
  bool conv_stats = false;
  // A ResBlock's 3x3 convs apply the GroupNorm + SiLU in front of them as they read their input
  // (ConvFwd / ConvBwdFilter norm): decided per conv when its buffers are declared, where the
  // engine has a variant that does so for the forward and (training) the filter gradient and no
  // resampling or dropout comes between. UNET_FUSE_NORM=1 (opt-in): on the H100 the seed64 tf32
  // step took 15.96 ms with it against 13.00 without (same run, 2026-11-25): the wgmma kernels
  // apply the norm to every tile they load, the forward's input tiles with their halo rows, the
  // filter gradient's 3 rows for each 1 (at width 64) and for each 64 output channels, which costs
  // them more (halo forward 0.06 -> 0.25 ms a launch, filter gradient 0.14 -> 0.33) than the
  // apply passes they replace (0.31 ms of 0.68 per step).
  bool fuse_norm = false;
  // Training: a skip concatenation followed by a ResBlock is written by that block's GN1, which
  // reads the two parts where they lie (GroupNormFwd's x2 / xcat, L::cat_a / cat_b), instead of
  // by a copy pass of its own in front of it: one read of the concatenation fewer (~0.38 GB a
  // seed64 step) and 12 launches fewer on the forward's one lane. H200, same run, CUDA events of
  // graph replays: tf32 step 10.974 / 10.968 / 10.962 -> 10.895 / 10.891 / 10.892 ms, bf16 6.978 /
  // 6.955 -> 6.921 / 6.935. UNET_CAT_NORM=0 turns it off; used where the engine has a variant for
  // it. (Sampling keeps the copy pass, which gives GN1 its statistics: the same bytes either way.)
  bool cat_norm = true;
  int fused_norms = 0;  // how many convs the last declaration fused (reset by declare_embedding)
  int cat_norms = 0;    // concatenations GN1 writes (counted by the network, reset by declare_embedding)
  // Filter gradients (wgrad, bias and embedding sums) run on the side lane (Ops::lane), beside the
  // data gradient and what follows it on the main lane, joined at the end of each layer's
  // backward, and the forward's skip-connection convs beside in_layers: small levels'
  // convolutions leave most of the GPU idle one at a time. UNET_LANES=0 runs everything on one
  // stream.
  bool lanes = true;
  // With lanes, in the backward a ResBlock's skip connection (its 1x1 data gradient, its
  // resampling) runs on a third stream (Ops::branch) beside the main lane's data gradients and
  // norms, which it joins at GN1's backward. In bf16 only (UNET_SKIP_BRANCH): H100, seed64, same
  // runs: bf16 step 7.700 / 7.714 / 7.695 -> 7.662 / 7.669 / 7.671 ms, tf32 12.621 / 12.607 /
  // 12.620 -> 12.710 / 12.693 / 12.692; again (UNET_SKIP_BRANCH 0 vs 1): bf16 7.707 / 7.705 /
  // 7.703 -> 7.675 / 7.676 / 7.681, tf32 12.611 / 12.607 / 12.573 -> 12.615 / 12.652 / 12.655
  // (tf32's 1x1 data gradients run on cuBLAS's sm80 kernels, which slow the main lane's beside
  // them more than they save it). Memory: + the third lane's 60 MB of cuBLAS workspace and
  // reduction scratch.
  bool skip_branch = false;
  Ops* tracing = nullptr;  // the planner's tracer while planning

  // The timestep embedding (f32): temb = sinusoids of t, emb = MLP(temb) (+ label_emb), and the
  // SiLU'd semb every ResBlock's emb_layers read; their gradients.
  Tensor temb, a1, a1s, emb, semb, d_semb, d_emb, d_a1s, d_a1;

  // ---- buffer declarations (the same sequence in both planner phases) ----
  // The embedding buffers: with mlp, the MLP's (else semb is an input the caller fills).
  void declare_embedding(Planner& pl, int Bp, Mode mode, bool mlp);
  // A layer's buffers; with_dx: backward writes the gradient of the layer's input.
  void declare_layer(Planner& pl, L& s, int Bp, Mode mode, bool with_dx);

  // With conv_stats, where `to` normalizes `from`'s output first (a ResBlock's or attention's
  // norm), from's last conv writes to's statistics. Called after the buffers are declared.
  void chain_stats(L& from, L& to) const;

  // ---- forward ----
  void refresh_shadow();  // the bf16 weights the GEMMs read, from the f32 masters
  // Model::hold_weights: while held, refresh_shadow casts once (the first forward after holding).
  void hold_shadow(bool on) { shadow_held_ = on, shadow_fresh_ = false; }
  // Model::weights_kept_by_optimizer: the optimizer rewrites the copy; refresh_shadow casts only
  // while it is stale. recast_shadow(): cast now (fresh again where held or kept).
  void keep_shadow(bool on) { shadow_kept_ = on, shadow_fresh_ = false; }
  void recast_shadow() {
    shadow_fresh_ = false;
    refresh_shadow();
  }
  void embedding_fwd(const Tensor& t, const Tensor& labels);  // labels: read when class_cond
  void layer_fwd(L& s, const Tensor& in);
  // ---- backward ----  (d_semb: from the ResBlocks' embedding projections in embedding_bwd, or,
  // for a single layer, zeroed by embedding_bwd_begin and added to by its backward)
  void embedding_bwd_begin();
  void embedding_bwd(const Tensor& labels);
  // The gradient of the layer's input (s.dx). join: join the side lane at the end (its gradients
  // final); without, the caller joins later.
  Tensor layer_bwd(L& s, const Tensor& dout, bool join = true);

  // ---- access ----
  Ops& ops() { return tracing ? *tracing : eng.ops(); }
  template <class Op>
  void run(const Op& op) {
    ops().run(op);
  }
  Tensor at(const Tensor& t) const { return t.defined() ? t.batch(B) : t; }
  // Parameters: f32 master views, the views a GEMM reads (bf16 copy in the bf16 engine), gradient
  // views (absent without parameter gradients).
  Tensor P(size_t off, std::initializer_list<int64_t> d) const;
  Tensor W(size_t off, std::initializer_list<int64_t> d) const;
  Tensor G(size_t off, std::initializer_list<int64_t> d) const;
  Tensor Wc(size_t off, int co, int k, int ci) const { return W(off, {co, k, k, ci}); }
  Tensor Gc(size_t off, int co, int k, int ci) const { return G(off, {co, k, k, ci}); }
  Tensor vec(size_t off, int n) const { return P(off, {n}); }
  Tensor gvec(size_t off, int n) const { return G(off, {n}); }
  // ConvBwdFilter when it has anything to compute, on the side lane (with lanes): the caller
  // calls join_lanes() before anything reads its gradients or overwrites x or dy.
  void conv_filter_grad(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db,
                        const Tensor& demb, int stride, const NormIn& norm = {});
  // Runs `op` on the side lane (with lanes), after what conv_filter_grad put there.
  template <class Op>
  void run_side(const Op& op) {
    if (lanes) ops().lane(true);
    run(op);
    if (lanes) ops().lane(false);
  }
  // `to` (whose input is `from`'s output, all of its gradient) writes from's out_bias() gradient
  // where it can (L::dx_total_param, L::db_given).
  // Only with bf16 activations (H100, seed64, same run: bf16 step 8.601 -> 8.563 ms, tf32 14.860 ->
  // 14.914 ms: with f32 the column sums in the norm's dx pass, on the main lane, cost more than the
  // side lane's own pass; again at 12.84 ms, 2026-11-25, same runs: 12.812 / 12.855 / 12.843 ->
  // 12.871 / 12.875 / 12.864 ms, though the step's kernels summed 0.24 ms less: the backward's
  // main lane is its critical path; at 12.59 ms, with tf32's filter gradients summing dy's columns
  // in their own pass over it, 12.590 -> 12.573 ms, 5 of 6 alternated pairs lower: noise-level,
  // left off). bias_links: how many the last plan made (its report says so).
  void link_bias_grad(L& from, L& to);
  bool link_bias = false;
  // A ResBlock's conv bias gradients (conv1's, and conv2's where the skip path is dout itself) and
  // its embedding gradient (added, not scale-shifted, and summed by the grouped embedding backward,
  // which the backward then runs after a join) from its filter gradients on the side lane instead
  // of from the norms' dx passes on the main lane, where the filter gradient runs on "wgmma" in
  // tf32: its transposes of dy give the column sums at little cost (filter_finish_kernel adds them
  // beside its split sums). H100, seed64 tf32 step, same run, orders alternated, means of 6:
  // 12.626 -> 12.490 ms (the bias gradients only: 12.577). With the column sums' partials in 16
  // slots and a launch of their own after the split sums, it had cost 12.71 -> 12.89 ms.
  // bias_in_filter: -1 there (the default), 0 never, 1 always (tests; Model::set_bias_from_filter_grads).
  // filter_sums: how many ResBlocks took them so in the planning pass.
  int bias_in_filter = -1;
  int filter_sums = 0;
  bool emb_from_filter = false;  // this backward's side lane writes embedding gradients (b_de)
  bool sums_in_filter(const ConvBwdFilter& op) {
    if (bias_in_filter >= 0) return bias_in_filter == 1;
    return eng.precision() == Precision::TF32 && ops().variant(op) == "wgmma";
  }
  int bias_links = 0;
  void join_lanes() {
    if (lanes) ops().join();
    emb_pending = false;
  }
  // With lanes, the forward's embedding (the timestep MLP and the ResBlocks' projections, ~45 us of
  // small launches) runs on the side lane beside the input conv and the first norm
  // (embedding_fwd_side); the first op that reads it joins the lanes (join_emb: a ResBlock's first
  // linear or second norm). H100, seed64, same run, alternated: tf32 12.452 -> 12.437 ms, bf16
  // 7.723 -> 7.699.
  void embedding_fwd_side(const Tensor& t_in, const Tensor& labels) {
    if (lanes) ops().lane(true);
    embedding_fwd(t_in, labels);
    if (lanes) ops().lane(false), emb_pending = true;
  }
  void join_emb() {
    if (emb_pending) join_lanes();
  }
  bool emb_pending = false;
  // Whether GN1 of ResBlock s (training, batch b) can write the skip concatenation in front of it
  // from its two parts, the first of ca channels (cat_norm, and an engine variant for it).
  bool gn1_writes_cat(const L& s, int64_t b, int64_t ca);

 private:
  const Tensor& params_;
  const Tensor& shadow_;
  bool shadow_held_ = false, shadow_kept_ = false, shadow_fresh_ = false;
  const Tensor& grads_;
  int next_index_ = 0;
  // With the embedding MLP (a whole network), the ResBlocks' embedding projections run as
  // LinearGroupFwd/Bwd ops (forward after the MLP, backward before it) instead of one linear
  // per block; emb_users_ are those blocks in forward order (set by declare_layer).
  bool group_emb_ = false;
  std::vector<L*> emb_users_;

  float dropout_p() const { return train ? cfg.dropout : 0.0f; }
  uint64_t dseed(const L& s) const;
  void resample(int updown, const Tensor& x, const Tensor& y);
  void resample_bwd(int updown, const Tensor& dy, const Tensor& dx);
  Tensor res_conv1_input(L& s, const Tensor& n1, const Tensor& n1r, bool recompute = false);
  // A ResBlock's conv1 writes h1 without its bias and timestep embedding; GN2 (forward, recompute
  // and backward) reads h1 + b0 + e through its input offset (GroupNorm ops' xbias/xemb). h1 has
  // no other reader, so the pass that would add them is not needed.
  void h1_offsets(const L& s, Tensor& xbias, Tensor& xemb) const;
  void res_conv2_input(L& s, const Tensor& n2, bool have_stats = false);
  // The norms in front of a ResBlock's conv1 (GN1 + SiLU of in) and conv2 (GN2 (+ scale-shift) +
  // SiLU of h1 + b0 + e): what their GroupNorm passes run, and the convs' NormIn where the convs
  // apply them (fuse1 / fuse2).
  NormIn gn1(const L& s) const;
  NormIn gn2(const L& s) const;
  // Whether the engine runs op (a conv with a norm of its input) on a variant, the one forced by
  // UNET_KERNELS / --kernels if any.
  template <class Op>
  bool takes(const Op& op);
  void decide_fusion(L& s, int64_t b, Mode mode);
  void emb_layers_fwd();
  void emb_layers_bwd();
  ConvFwd with_out_stats(const L& s, ConvFwd c) const;  // c, writing s.out_mean/out_rstd if set
  void res_fwd(L& s);
  void attn_fwd(L& s);
  void res_bwd(L& s, const Tensor& dout);
  void attn_bwd(L& s, const Tensor& dout);
};

// A layer's output resolution.
int layer_out_res(const Layer& l);

}  // namespace unet
