#include "blocks.h"

#include <algorithm>
#include <stdexcept>

#include "env_vars.h"
#include "planner.h"
#include "rng.h"
#include "util.h"

namespace unet {

int layer_out_res(const Layer& l) {
  if (l.kind == Layer::Down || (l.kind == Layer::Res && l.updown < 0)) return l.res / 2;
  if (l.kind == Layer::Up || (l.kind == Layer::Res && l.updown > 0)) return l.res * 2;
  return l.res;
}

size_t Blocks::L::lowest_param() const {
  return std::min({w0, b0, n1w, n1b, n2w, n2b, w2, b2, sw, sb});
}

Blocks::Blocks(Engine& e, const ModelConfig& c, const ParamTable& t, const Tensor& params,
               const Tensor& shadow, const Tensor& grads)
    : eng(e),
      cfg(c),
      table(t),
      A(e.act_dtype()),
      conv_stats(env_conv_stats()),
      fuse_norm(env_fuse_norm()),
      cat_norm(env_cat_norm()),
      lanes(env_lanes()),
      skip_branch(lanes && env_skip_branch(A == DType::BF16)),
      link_bias(A == DType::BF16),
      params_(params),
      shadow_(shadow),
      grads_(grads) {}

Blocks::L Blocks::make(const Layer& l) {
  L s;
  s.l = l;
  s.index = next_index_++;
  s.ro = layer_out_res(l);
  s.fwd_name = l.prefix + " fwd";
  s.bwd_name = l.prefix + " bwd";
  auto off = [&](const std::string& n) { return table.at(l.prefix + n).offset; };
  switch (l.kind) {
    case Layer::Conv:
      s.w0 = off(".weight"), s.b0 = off(".bias");
      break;
    case Layer::Down:
      s.w0 = off(".op.weight"), s.b0 = off(".op.bias");
      break;
    case Layer::Up:
      s.w0 = off(".conv.weight"), s.b0 = off(".conv.bias");
      break;
    case Layer::Res:
      s.n1w = off(".in_layers.0.weight"), s.n1b = off(".in_layers.0.bias");
      s.w0 = off(".in_layers.2.weight"), s.b0 = off(".in_layers.2.bias");
      s.ew = off(".emb_layers.1.weight"), s.eb = off(".emb_layers.1.bias");
      s.n2w = off(".out_layers.0.weight"), s.n2b = off(".out_layers.0.bias");
      s.w2 = off(".out_layers.3.weight"), s.b2 = off(".out_layers.3.bias");
      if (l.cin != l.cout) s.sw = off(".skip_connection.weight"), s.sb = off(".skip_connection.bias");
      break;
    case Layer::Attn:
      s.n1w = off(".norm.weight"), s.n1b = off(".norm.bias");
      s.w0 = off(".qkv.weight"), s.b0 = off(".qkv.bias");
      s.w2 = off(".proj_out.weight"), s.b2 = off(".proj_out.bias");
      break;
  }
  return s;
}

// ---- parameters ----
Tensor Blocks::P(size_t off, std::initializer_list<int64_t> d) const {
  return Tensor(params_.f32() + off, DType::F32, d);
}
Tensor Blocks::W(size_t off, std::initializer_list<int64_t> d) const {
  if (A == DType::BF16) return Tensor(shadow_.bf16() + off, DType::BF16, d);
  return P(off, d);
}
Tensor Blocks::G(size_t off, std::initializer_list<int64_t> d) const {
  if (!wgrad) return Tensor{};
  if (!grads_.defined()) throw std::logic_error("parameter gradients need plan(B, Mode::Train)");
  return Tensor(grads_.f32() + off, DType::F32, d);
}

void Blocks::conv_filter_grad(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db,
                              const Tensor& demb, int stride, const NormIn& norm) {
  if (dw.defined() || db.defined() || demb.defined()) run_side(ConvBwdFilter{x, dy, dw, db, demb, stride, norm});
}

template <class Op>
bool Blocks::takes(const Op& op) {
  const std::vector<std::string> v = eng.base_ops().variants_for(op);
  if (const auto* f = kernel_override_for(Op::kName, Op::kFamily))
    return std::find(v.begin(), v.end(), f->second) != v.end();
  return !v.empty();
}

bool Blocks::gn1_writes_cat(const L& s, int64_t b, int64_t ca) {
  const Layer& l = s.l;
  if (!cat_norm || l.kind != Layer::Res || s.fuse1 || s.stats_in || ca <= 0 || ca >= l.cin) return false;
  auto t = [](DType d, std::initializer_list<int64_t> dims) { return Tensor(nullptr, d, dims); };
  const int64_t r = l.res, g = kGroups;
  GroupNormFwd f{t(A, {b, r, r, ca}),    t(DType::F32, {l.cin}), t(DType::F32, {l.cin}), {},
                 t(A, {b, r, r, l.cin}), t(DType::F32, {b, g}),  t(DType::F32, {b, g}),  true};
  f.x2 = t(A, {b, r, r, l.cin - ca}), f.xcat = t(A, {b, r, r, l.cin});
  return takes(f);
}

// Probes the engine with the ops the ResBlock's convs will run (shapes and dtypes; no data yet).
void Blocks::decide_fusion(L& s, int64_t b, Mode mode) {
  s.fuse1 = s.fuse2 = false;
  if (!fuse_norm) return;
  const Layer& l = s.l;
  const int64_t ri = l.res, ro = s.ro, ci = l.cin, co = l.cout, g = kGroups;
  const bool ss = cfg.use_scale_shift_norm, wg = mode == Mode::Train;
  auto t = [](DType d, std::initializer_list<int64_t> dims) { return Tensor(nullptr, d, dims); };
  const Tensor f32g = t(DType::F32, {b, g});
  auto probe = [&](int64_t c, bool second, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias,
                   const Tensor& res) {
    NormIn n{t(DType::F32, {c}), t(DType::F32, {c}), second && ss ? t(DType::F32, {b, 2 * c}) : Tensor{},
             f32g, f32g, second ? t(DType::F32, {c}) : Tensor{},
             second && !ss ? t(DType::F32, {b, c}) : Tensor{}, true};
    ConvFwd f{x, w, bias, {}, res, y, 1};
    f.norm = n;
    if (!takes(f)) return false;
    if (!wg) return true;
    ConvBwdFilter bf{x, y, t(DType::F32, {w.dim[0], 3, 3, w.dim[3]}), bias, {}, 1};
    bf.norm = n;
    return takes(bf);
  };
  if (!l.updown)
    s.fuse1 = probe(ci, false, t(A, {b, ri, ri, ci}), t(A, {co, 3, 3, ci}), t(A, {b, ro, ro, co}), {}, {});
  if (cfg.dropout == 0.f)
    s.fuse2 = probe(co, true, t(A, {b, ro, ro, co}), t(A, {co, 3, 3, co}), t(A, {b, ro, ro, co}),
                    t(DType::F32, {co}), t(A, {b, ro, ro, co}));
  fused_norms += s.fuse1 + s.fuse2;
}

NormIn Blocks::gn1(const L& s) const {
  const int ci = s.l.cin;
  return NormIn{vec(s.n1w, ci), vec(s.n1b, ci), {}, at(s.mean1), at(s.rstd1), {}, {}, true};
}
NormIn Blocks::gn2(const L& s) const {
  const int co = s.l.cout;
  Tensor xbias, xemb;
  h1_offsets(s, xbias, xemb);
  return NormIn{vec(s.n2w, co), vec(s.n2b, co), cfg.use_scale_shift_norm ? at(s.e) : Tensor{},
                at(s.mean2),    at(s.rstd2),    xbias,
                xemb,           true};
}

size_t Blocks::L::out_bias() const {
  switch (l.kind) {
    case Layer::Conv:
    case Layer::Down:
    case Layer::Up:
      return b0;
    case Layer::Res:  // (with the skip path dout itself, GN1's backward sums it as it adds it)
      return sw != SIZE_MAX || l.updown ? b2 : SIZE_MAX;
    case Layer::Attn:  // (the norm's backward sums it as it adds dout)
      return SIZE_MAX;
  }
  return SIZE_MAX;
}

void Blocks::link_bias_grad(L& from, L& to) {
  const size_t b = from.out_bias();
  if (!link_bias || b == SIZE_MAX || !to.dx.defined() || to.dx2.defined()) return;
  if (to.l.kind != Layer::Res && to.l.kind != Layer::Attn) return;  // (their dx comes from a norm's backward)
  to.dx_total_param = b, from.db_given = true;
  ++bias_links;
}

uint64_t Blocks::dseed(const L& s) const { return hash64(seed, (uint64_t)s.index); }

// ---------------- buffer declarations ----------------
void Blocks::declare_embedding(Planner& pl, int Bp, Mode mode, bool mlp) {
  const int64_t b = Bp, ed = cfg.time_embed_dim();
  auto f32 = [&](const std::string& n, std::initializer_list<int64_t> d) {
    return pl.declare(n, DType::F32, d);
  };
  if (mlp) {
    temb = f32("temb", {b, cfg.num_channels});
    a1 = f32("a1", {b, ed}), a1s = f32("a1s", {b, ed}), emb = f32("emb", {b, ed});
  }
  semb = f32("semb", {b, ed});
  group_emb_ = mlp;
  fused_norms = cat_norms = 0;
  emb_users_.clear();
  if (mode == Mode::Train) {
    d_semb = f32("d_semb", {b, ed});
    if (mlp) d_emb = f32("d_emb", {b, ed}), d_a1s = f32("d_a1s", {b, ed}), d_a1 = f32("d_a1", {b, ed});
  }
}

void Blocks::declare_layer(Planner& pl, L& s, int Bp, Mode mode, bool with_dx) {
  const bool bw = mode != Mode::Sample, wg = mode == Mode::Train;
  const int64_t b = Bp, ed = cfg.time_embed_dim();
  auto act = [&](const std::string& n, int64_t h, int64_t c) { return pl.declare(n, A, {b, h, h, c}); };
  auto f32 = [&](const std::string& n, std::initializer_list<int64_t> d) {
    return pl.declare(n, DType::F32, d);
  };
  const bool ss = cfg.use_scale_shift_norm;
  const Layer& l = s.l;
  const std::string& p = l.prefix;
  const int64_t ri = l.res, ro = s.ro, ci = l.cin, co = l.cout;
  s.out = act(p + ".out", ro, co);
  if (bw && with_dx) s.dx = act(p + ".dx", ri, ci);
  switch (l.kind) {
    case Layer::Conv:
    case Layer::Down:
      break;
    case Layer::Up:
      s.f_up = act(p + ".f_up", ro, ci);
      if (wg) s.b_up = act(p + ".b_up", ro, ci);
      if (bw) s.b_dup = act(p + ".b_dup", ro, ci);
      break;
    case Layer::Res: {
      if (group_emb_) emb_users_.push_back(&s);
      const int64_t ec = ss ? 2 * co : co;
      s.h1 = act(p + ".h1", ro, co);
      s.e = f32(p + ".e", {b, ec});
      s.mean1 = f32(p + ".mean1", {b, kGroups}), s.rstd1 = f32(p + ".rstd1", {b, kGroups});
      s.mean2 = f32(p + ".mean2", {b, kGroups}), s.rstd2 = f32(p + ".rstd2", {b, kGroups});
      if (l.updown) s.xu = act(p + ".xu", ro, ci);
      decide_fusion(s, b, mode);
      if (!s.fuse1) s.f_n1 = act(p + ".f_n1", ri, ci);
      if (l.updown) s.f_n1r = act(p + ".f_n1r", ro, ci);
      if (!s.fuse2) s.f_n2 = act(p + ".f_n2", ro, co);
      if (s.sw != SIZE_MAX) s.f_sk = act(p + ".f_sk", ro, co);
      if (bw) {
        if (wg && !s.fuse2) s.b_n2 = act(p + ".b_n2", ro, co);
        s.b_dn2 = act(p + ".b_dn2", ro, co);
        s.b_dh1 = act(p + ".b_dh1", ro, co);
        if (wg) s.b_de = f32(p + ".b_de", {b, ec});
        if (wg && !group_emb_) s.b_dpart = f32(p + ".b_dpart", {b, ed});
        if (wg && !s.fuse1) s.b_n1 = act(p + ".b_n1", ri, ci);
        if (wg && l.updown) s.b_n1r = act(p + ".b_n1r", ro, ci);
        if (l.updown) s.b_dn1 = act(p + ".b_dn1", ri, ci);
        s.b_dn1r = act(p + ".b_dn1r", ro, ci);
        if (s.sw != SIZE_MAX) s.b_dxs = act(p + ".b_dxs", ro, ci);
        if (l.updown) s.b_dxs2 = act(p + ".b_dxs2", ri, ci);
      }
      break;
    }
    case Layer::Attn:
      s.mean1 = f32(p + ".mean", {b, kGroups}), s.rstd1 = f32(p + ".rstd", {b, kGroups});
      s.f_n1 = act(p + ".f_n", ri, ci);
      s.qkv = act(p + ".qkv", ri, 3 * ci);
      s.att = act(p + ".att", ri, ci);
      s.lse = f32(p + ".lse", {b, l.heads, ri * ri});
      if (bw) {
        s.b_datt = act(p + ".b_datt", ri, ci), s.b_dqkv = act(p + ".b_dqkv", ri, 3 * ci);
        if (wg) s.b_n = act(p + ".b_n", ri, ci);
        s.b_dn = act(p + ".b_dn", ri, ci);
      }
      break;
  }
}

void Blocks::chain_stats(L& from, L& to) const {
  // every kind ends with a ConvFwd writing `out`; ResBlocks and attention start with a norm of `in`
  if (!conv_stats || (to.l.kind != Layer::Res && to.l.kind != Layer::Attn)) return;
  from.out_mean = to.mean1, from.out_rstd = to.rstd1;
  to.stats_in = true;
}

// ---------------- forward ----------------
void Blocks::refresh_shadow() {
  if (A == DType::F32 || ((shadow_held_ || shadow_kept_) && shadow_fresh_)) return;
  run(Cast{params_, shadow_});
  if (!tracing) shadow_fresh_ = shadow_held_ || shadow_kept_;  // (a traced pass casts nothing)
}

void Blocks::embedding_fwd(const Tensor& t_in, const Tensor& labels) {
  const int mc = cfg.num_channels, ed = cfg.time_embed_dim();
  ScopedRange r(eng.device(), "time_embed fwd");
  run(TimestepEmbedding{t_in, at(temb)});
  // The embedding MLP stays f32 in every precision (tiny; autocast-level accuracy is not needed).
  run(LinearFwd{at(temb), P(table.at("time_embed.0.weight").offset, {ed, mc}),
                vec(table.at("time_embed.0.bias").offset, ed), at(a1)});
  run(SiluFwd{at(a1), at(a1s)});
  run(LinearFwd{at(a1s), P(table.at("time_embed.2.weight").offset, {ed, ed}),
                vec(table.at("time_embed.2.bias").offset, ed), at(emb)});
  if (cfg.class_cond)
    run(EmbeddingAdd{labels, P(table.at("label_emb.weight").offset, {cfg.label_rows(), ed}), at(emb)});
  run(SiluFwd{at(emb), at(semb)});
  emb_layers_fwd();
}

// Every ResBlock's e = semb W^T + b, in groups of kLinearGroup.
void Blocks::emb_layers_fwd() {
  if (emb_users_.empty()) return;
  ScopedRange r(eng.device(), "emb_layers fwd");
  const int ed = cfg.time_embed_dim();
  for (size_t c0 = 0; c0 < emb_users_.size(); c0 += kLinearGroup) {
    LinearGroupFwd g{};
    g.x = at(semb);
    for (size_t k = c0; k < std::min(emb_users_.size(), c0 + kLinearGroup); ++k) {
      const L& s = *emb_users_[k];
      const int ec = (int)s.e.dim[1];
      g.w[k - c0] = P(s.ew, {ec, ed}), g.b[k - c0] = vec(s.eb, ec), g.y[k - c0] = at(s.e);
    }
    run(g);
  }
}

// Their gradients from every ResBlock's b_de: d_semb (overwritten), the weights' and biases'. The
// groups run last to first, each adding to the d_semb of the ones after it (the order in which
// the blocks' backward passes come).
void Blocks::emb_layers_bwd() {
  if (emb_users_.empty()) return;
  ScopedRange r(eng.device(), "emb_layers bwd");
  const int ed = cfg.time_embed_dim();
  const size_t n = emb_users_.size(), groups = (n + kLinearGroup - 1) / kLinearGroup;
  auto group = [&](size_t gi) {
    LinearGroupBwd g{};
    g.x = at(semb), g.dx = at(d_semb);
    if (gi + 1 < groups) g.dx_in = at(d_semb);
    for (size_t k = gi * kLinearGroup; k < std::min(n, (gi + 1) * kLinearGroup); ++k) {
      const L& s = *emb_users_[k];
      const size_t j = k - gi * kLinearGroup;
      const int ec = (int)s.e.dim[1];
      g.w[j] = P(s.ew, {ec, ed}), g.dy[j] = at(s.b_de), g.dw[j] = G(s.ew, {ec, ed}), g.db[j] = gvec(s.eb, ec);
    }
    return g;
  };
  // With lanes, the weight and bias gradients (no one reads them before the step's end) on the
  // side lane, issued first so that they do not wait for d_semb, beside the main lane's d_semb and
  // the time MLP's backward that it feeds (seed64 tf32, H100: the group's gradients took 24 of
  // the ~75 us of small launches at the end of the backward).
  if (lanes) {
    ops().lane(true);
    for (size_t gi = groups; gi-- > 0;) {
      LinearGroupBwd g = group(gi);
      g.dx = g.dx_in = Tensor{};
      run(g);
    }
    ops().lane(false);
  }
  for (size_t gi = groups; gi-- > 0;) {
    LinearGroupBwd g = group(gi);
    if (lanes)
      for (int j = 0; j < kLinearGroup; ++j) g.dw[j] = g.db[j] = Tensor{};
    run(g);
  }
}

void Blocks::resample(int updown, const Tensor& x, const Tensor& y) {
  if (updown < 0)
    run(AvgPoolFwd{x, y});
  else
    run(UpsampleFwd{x, y});
}
void Blocks::resample_bwd(int updown, const Tensor& dy, const Tensor& dx) {
  if (updown < 0)
    run(AvgPoolBwd{dy, dx});
  else
    run(UpsampleBwd{dy, dx});
}

// SiLU(GN1(in)), resampled with updown: conv1's input, in n1 (and n1r). In backward (recompute)
// the forward's statistics are reused.
Tensor Blocks::res_conv1_input(L& s, const Tensor& n1, const Tensor& n1r, bool recompute) {
  const Layer& l = s.l;
  const NormIn n = gn1(s);
  const bool have_stats = recompute || s.stats_in;
  if (s.fuse1) {  // conv1 applies it: its statistics only
    if (!have_stats) run(norm_fwd(n, at(s.in), {}));
    return at(s.in);
  }
  if (have_stats) {
    run(norm_apply(n, at(s.in), at(n1)));
  } else if (s.cat_a.defined()) {  // (writes in, from its parts; a recompute has the statistics)
    GroupNormFwd f = norm_fwd(n, s.cat_a, at(n1));
    f.x2 = s.cat_b, f.xcat = at(s.in);
    run(f);
  } else {
    run(norm_fwd(n, at(s.in), at(n1)));
  }
  if (!l.updown) return at(n1);
  resample(l.updown, at(n1), at(n1r));
  return at(n1r);
}
// conv1's bias and (without scale-shift) embedding, which GN2 adds to h1.
void Blocks::h1_offsets(const L& s, Tensor& xbias, Tensor& xemb) const {
  xbias = vec(s.b0, s.l.cout);
  if (!cfg.use_scale_shift_norm) xemb = at(s.e);
}
// SiLU(GN2(h1 [+ b0 + e]) [* (1 + scale) + shift]) with dropout: conv2's input, in n2. have_stats: mean2 and
// rstd2 are written already (backward's recompute, or conv1 gave them).
void Blocks::res_conv2_input(L& s, const Tensor& n2, bool have_stats) {
  const NormIn n = gn2(s);
  if (s.fuse2) {  // conv2 applies it: its statistics only
    if (!have_stats) run(norm_fwd(n, at(s.h1), {}));
    return;
  }
  if (have_stats)
    run(norm_apply(n, at(s.h1), at(n2)));
  else
    run(norm_fwd(n, at(s.h1), at(n2)));
  if (dropout_p() > 0) run(DropoutFwd{at(n2), at(n2), dropout_p(), dseed(s)});
}

void Blocks::res_fwd(L& s) {
  const Layer& l = s.l;
  const int ed = cfg.time_embed_dim(), ci = l.cin, co = l.cout;
  const bool ss = cfg.use_scale_shift_norm;
  Device& d = eng.device();
  if (!group_emb_) {  // else emb_layers_fwd made e
    join_emb();
    ScopedRange r(d, "emb_layers");
    run(LinearFwd{at(semb), P(s.ew, {ss ? 2 * co : co, ed}), vec(s.eb, ss ? 2 * co : co), at(s.e)});
  }
  Tensor xs = at(s.in);
  // Without resampling, the skip connection's 1x1 conv reads only the block's input: on the side
  // lane, beside in_layers and the second norm, joined before conv2 adds it.
  const bool skip_side = s.sw != SIZE_MAX && !l.updown && lanes;
  auto skip_conv = [&] {
    ScopedRange r(d, "skip_connection");
    const ConvFwd c{xs, Wc(s.sw, co, 1, ci), vec(s.sb, co), {}, {}, at(s.f_sk), 1};
    if (skip_side)
      run_side(c);
    else
      run(c);
  };
  // The skip conv on the side lane goes first, but after GN1 where GN1 writes the concatenation
  // it reads (in_layers is two ranges then).
  const bool cat_by_gn1 = s.cat_a.defined();
  Tensor c1in;
  if (cat_by_gn1) {
    ScopedRange r(d, "in_layers");
    c1in = res_conv1_input(s, s.f_n1, s.f_n1r);
  }
  if (skip_side) skip_conv();
  {
    ScopedRange r(d, "in_layers");
    if (!cat_by_gn1) c1in = res_conv1_input(s, s.f_n1, s.f_n1r);
    if (l.updown) {
      resample(l.updown, at(s.in), at(s.xu));
      xs = at(s.xu);
    }
    ConvFwd c1{c1in, Wc(s.w0, co, 3, ci), {}, {}, {}, at(s.h1), 1};  // bias, emb: GN2 adds them
    if (s.fuse1) c1.norm = gn1(s);
    run(c1);
  }
  Tensor res = xs;
  if (s.sw != SIZE_MAX) {
    if (!skip_side) skip_conv();  // after the resampling of xs
    res = at(s.f_sk);
  }
  ScopedRange r(d, "out_layers");
  join_emb();  // (GN2 adds e)
  res_conv2_input(s, s.f_n2);
  if (skip_side) join_lanes();
  ConvFwd c2{s.fuse2 ? at(s.h1) : at(s.f_n2), Wc(s.w2, co, 3, co), vec(s.b2, co), {}, res, at(s.out), 1};
  if (s.fuse2) c2.norm = gn2(s);
  run(with_out_stats(s, c2));
}

ConvFwd Blocks::with_out_stats(const L& s, ConvFwd c) const {
  if (s.out_mean.defined()) c.mean = at(s.out_mean), c.rstd = at(s.out_rstd);
  return c;
}

void Blocks::attn_fwd(L& s) {
  const int C = s.l.cin;
  Device& d = eng.device();
  {
    ScopedRange r(d, "norm");
    if (s.stats_in)
      run(GroupNormApply{at(s.in), vec(s.n1w, C), vec(s.n1b, C), {}, at(s.mean1), at(s.rstd1), at(s.f_n1), false});
    else
      run(GroupNormFwd{
          at(s.in), vec(s.n1w, C), vec(s.n1b, C), {}, at(s.f_n1), at(s.mean1), at(s.rstd1), false});
  }
  {
    ScopedRange r(d, "qkv");
    run(ConvFwd{at(s.f_n1), Wc(s.w0, 3 * C, 1, C), vec(s.b0, 3 * C), {}, {}, at(s.qkv), 1});
  }
  {
    ScopedRange r(d, "attention");
    run(AttentionFwd{at(s.qkv), at(s.att), at(s.lse), !cfg.use_new_attention_order});
  }
  ScopedRange r(d, "proj_out");
  run(with_out_stats(s, ConvFwd{at(s.att), Wc(s.w2, C, 1, C), vec(s.b2, C), {}, at(s.in), at(s.out), 1}));
}

void Blocks::layer_fwd(L& s, const Tensor& in) {
  s.in = in;
  ScopedRange r(eng.device(), s.fwd_name.c_str());
  const Layer& l = s.l;
  switch (l.kind) {
    case Layer::Conv:
      run(with_out_stats(s, ConvFwd{in, Wc(s.w0, l.cout, 3, l.cin), vec(s.b0, l.cout), {}, {}, at(s.out), 1}));
      break;
    case Layer::Down:
      run(with_out_stats(s, ConvFwd{in, Wc(s.w0, l.cout, 3, l.cin), vec(s.b0, l.cout), {}, {}, at(s.out), 2}));
      break;
    case Layer::Up:
      run(UpsampleFwd{in, at(s.f_up)});
      run(with_out_stats(s,
                         ConvFwd{at(s.f_up), Wc(s.w0, l.cout, 3, l.cin), vec(s.b0, l.cout), {}, {}, at(s.out), 1}));
      break;
    case Layer::Res:
      res_fwd(s);
      break;
    case Layer::Attn:
      attn_fwd(s);
      break;
  }
}

// ---------------- backward ----------------
// Without parameter gradients (wgrad false) only the data path runs: no recompute of the convs'
// inputs, no filter gradients, no embedding gradients.
void Blocks::res_bwd(L& s, const Tensor& dout) {
  const Layer& l = s.l;
  const int ed = cfg.time_embed_dim(), ci = l.cin, co = l.cout;
  const bool ss = cfg.use_scale_shift_norm;
  const Tensor xs = l.updown ? at(s.xu) : at(s.in);
  // the skip path's gradient is dout itself, which GN1's backward adds into dx (so needs a dx)
  const bool plain_skip = s.sw == SIZE_MAX && !l.updown && s.dx.defined();
  Device& d = eng.device();
  // The skip path's gradient (dout through the 1x1 conv and the resampling, or dout itself) is
  // added to dx by GN1's backward (no separate add pass). With lanes its data path runs on the
  // branch (Ops::branch), beside out_layers' and in_layers' data gradients, the main lane's chain.
  const bool on_branch = skip_branch && (s.sw != SIZE_MAX || l.updown);
  // conv2's and conv1's bias (and conv1's embedding) gradients from their filter gradients
  // (sums_in_filter), else from GN1's and GN2's backward (decided on the ops' shapes: conv1's input
  // is in's, resampled)
  const Tensor x2 = s.fuse2 ? at(s.h1) : at(keep ? s.f_n2 : s.b_n2), x1 = l.updown ? at(s.f_n1r) : at(s.in);
  const bool f2 = wgrad && plain_skip && !s.db_given &&
                  sums_in_filter(ConvBwdFilter{x2, dout, Gc(s.w2, co, 3, co), gvec(s.b2, co), {}, 1,
                                               s.fuse2 ? gn2(s) : NormIn{}});
  const bool f1 = wgrad && sums_in_filter(ConvBwdFilter{x1, at(s.b_dh1), Gc(s.w0, co, 3, ci), gvec(s.b0, co), {},
                                                        1, s.fuse1 ? gn1(s) : NormIn{}});
  // (the embedding's gradient when it is added, not scale-shifted, and the grouped embedding
  // backward sums it after a join: emb_from_filter)
  const bool e1 = f1 && !ss && group_emb_;
  if (tracing && (f1 || f2)) ++filter_sums;
  if (e1) emb_from_filter = true;
  Tensor dxs = dout;
  auto skip_data = [&] {
    ScopedRange r(d, "skip_connection");
    if (s.sw != SIZE_MAX) {
      run(ConvBwdData{dout, Wc(s.sw, co, 1, ci), at(s.b_dxs), 1});
      dxs = at(s.b_dxs);
    }
    if (l.updown) {
      resample_bwd(l.updown, dxs, at(s.b_dxs2));
      dxs = at(s.b_dxs2);
    }
  };
  if (on_branch) {
    ops().branch(true);
    skip_data();
    ops().branch(false);
  }
  {
    // out_layers: recompute conv2's input, then back through conv2, dropout, SiLU/scale-shift/norm
    ScopedRange r(d, "out_layers");
    if (wgrad) {
      if (!keep && !s.fuse2) res_conv2_input(s, s.b_n2, true);
      // conv2's bias gradient (the column sums of dout) comes from GN1's backward below, which
      // adds dout into dx anyway, when dout is what it adds (no skip conv, no resampling), unless
      // the filter gradient sums it (f2)
      conv_filter_grad(x2, dout, Gc(s.w2, co, 3, co), (plain_skip && !f2) || s.db_given ? Tensor{} : gvec(s.b2, co),
                       {}, 1, s.fuse2 ? gn2(s) : NormIn{});
    }
    run(ConvBwdData{dout, Wc(s.w2, co, 3, co), at(s.b_dn2), 1});
    if (dropout_p() > 0) run(DropoutBwd{at(s.b_dn2), at(s.b_dn2), dropout_p(), dseed(s)});
    // conv1's bias and embedding gradients are the column sums of this dx (dh1): summed as written
    Tensor xbias, xemb;
    h1_offsets(s, xbias, xemb);
    run(GroupNormBwd{at(s.h1), vec(s.n2w, co), vec(s.n2b, co), ss ? at(s.e) : Tensor{}, at(s.mean2),
                     at(s.rstd2), at(s.b_dn2), at(s.b_dh1), gvec(s.n2w, co), gvec(s.n2b, co),
                     ss && wgrad ? at(s.b_de) : Tensor{}, true, {}, !ss && wgrad && !e1 ? at(s.b_de) : Tensor{},
                     f1 ? Tensor{} : gvec(s.b0, co), {}, xbias, xemb});
  }
  if (s.sw != SIZE_MAX) {
    ScopedRange r(d, "skip_connection");
    // the 1x1 conv's bias gradient is conv2's (both are the column sums of dout)
    conv_filter_grad(xs, dout, Gc(s.sw, co, 1, ci), {}, {}, 1);
    if (wgrad) run_side(Copy{gvec(s.b2, co), gvec(s.sb, co)});  // after conv2's, on its lane
  }
  if (!on_branch) skip_data();
  {
    // in_layers: recompute SiLU(GN1(x)) (resampled) unless kept; conv1's filter gradient also
    // yields the embedding gradient (per-sample sums of dh1) when the embedding was added, not
    // scale-shifted
    ScopedRange r(d, "in_layers");
    // Measured and not kept (H100 seed64, 2026-11-25): conv1's data gradient issued before its
    // filter gradient, so that the side lane's filter gradient starts when the data gradient is
    // done and runs beside GN1's backward (memory-bound; the 64x64 level's left the side lane idle
    // for ~0.2 ms) rather than beside the data gradient: tf32 12.394 -> 12.364 ms in one run (3
    // rounds), 12.305 -> 12.329 in another (4), bf16 7.590 -> 7.589; conv2's the same way, 12.403.
    if (wgrad) {
      const Tensor c1in = s.fuse1     ? at(s.in)
                          : !keep    ? res_conv1_input(s, s.b_n1, s.b_n1r, true)
                          : l.updown ? at(s.f_n1r)
                                     : at(s.f_n1);
      conv_filter_grad(c1in, at(s.b_dh1), Gc(s.w0, co, 3, ci), f1 ? gvec(s.b0, co) : Tensor{},
                       e1 ? at(s.b_de) : Tensor{}, 1, s.fuse1 ? gn1(s) : NormIn{});
    }
    run(ConvBwdData{at(s.b_dh1), Wc(s.w0, co, 3, ci), at(s.b_dn1r), 1});
    Tensor dg1 = at(s.b_dn1r);
    if (l.updown) {
      resample_bwd(l.updown, at(s.b_dn1r), at(s.b_dn1));
      dg1 = at(s.b_dn1);
    }
    if (on_branch) ops().join_branch();
    GroupNormBwd n1{at(s.in), vec(s.n1w, ci), vec(s.n1b, ci), {}, at(s.mean1), at(s.rstd1), dg1, at(s.dx),
                    gvec(s.n1w, ci), gvec(s.n1b, ci), {}, true, dxs, {}, {},
                    plain_skip && !f2 ? gvec(s.b2, co) : Tensor{}};
    if (s.dx2.defined()) n1.dx2 = at(s.dx2);
    if (s.dx_add.defined()) n1.add2 = at(s.dx_add);
    if (s.dx_total_param != SIZE_MAX) n1.dx_total = gvec(s.dx_total_param, ci);
    run(n1);
  }
  if (wgrad && !group_emb_) {  // else emb_layers_bwd, after every layer
    ScopedRange r(d, "emb_layers");
    const int ec = ss ? 2 * co : co;
    run(LinearBwd{at(semb), P(s.ew, {ec, ed}), at(s.b_de), at(s.b_dpart), G(s.ew, {ec, ed}), gvec(s.eb, ec)});
    run(Add{at(d_semb), at(s.b_dpart), at(d_semb)});
  }
}

void Blocks::attn_bwd(L& s, const Tensor& dout) {
  const int C = s.l.cin;
  Device& d = eng.device();
  {
    ScopedRange r(d, "proj_out");
    // proj_out's bias gradient (the column sums of dout) comes from the norm's backward below
    conv_filter_grad(at(s.att), dout, Gc(s.w2, C, 1, C), {}, {}, 1);
    run(ConvBwdData{dout, Wc(s.w2, C, 1, C), at(s.b_datt), 1});
  }
  {
    ScopedRange r(d, "attention");
    run(AttentionBwd{at(s.qkv), at(s.att), at(s.lse), at(s.b_datt), at(s.b_dqkv),
                     !cfg.use_new_attention_order});
  }
  {
    ScopedRange r(d, "qkv");
    if (wgrad) {
      if (!keep)
        run(GroupNormApply{
            at(s.in), vec(s.n1w, C), vec(s.n1b, C), {}, at(s.mean1), at(s.rstd1), at(s.b_n), false});
      conv_filter_grad(at(keep ? s.f_n1 : s.b_n), at(s.b_dqkv), Gc(s.w0, 3 * C, 1, C), gvec(s.b0, 3 * C), {}, 1);
    }
    run(ConvBwdData{at(s.b_dqkv), Wc(s.w0, 3 * C, 1, C), at(s.b_dn), 1});
  }
  ScopedRange r(d, "norm");  // dx = the norm's gradient + dout (the residual), in one pass
  run(GroupNormBwd{at(s.in), vec(s.n1w, C), vec(s.n1b, C), {}, at(s.mean1), at(s.rstd1), at(s.b_dn), at(s.dx),
                   gvec(s.n1w, C), gvec(s.n1b, C), {}, false, dout, {},
                   s.dx_total_param != SIZE_MAX ? gvec(s.dx_total_param, C) : Tensor{}, gvec(s.b2, C)});
}

Tensor Blocks::layer_bwd(L& s, const Tensor& dout, bool join) {
  ScopedRange r(eng.device(), s.bwd_name.c_str());
  const Layer& l = s.l;
  switch (l.kind) {
    case Layer::Conv:
    case Layer::Down: {
      const int stride = l.kind == Layer::Down ? 2 : 1;
      conv_filter_grad(at(s.in), dout, Gc(s.w0, l.cout, 3, l.cin), s.db_given ? Tensor{} : gvec(s.b0, l.cout), {},
                       stride);
      if (s.dx.defined()) run(ConvBwdData{dout, Wc(s.w0, l.cout, 3, l.cin), at(s.dx), stride});
      break;
    }
    case Layer::Up:
      if (wgrad) {
        if (!keep) run(UpsampleFwd{at(s.in), at(s.b_up)});
        conv_filter_grad(at(keep ? s.f_up : s.b_up), dout, Gc(s.w0, l.cout, 3, l.cin),
                         s.db_given ? Tensor{} : gvec(s.b0, l.cout), {}, 1);
      }
      run(ConvBwdData{dout, Wc(s.w0, l.cout, 3, l.cin), at(s.b_dup), 1});
      run(UpsampleBwd{at(s.b_dup), at(s.dx)});
      break;
    case Layer::Res:
      res_bwd(s, dout);
      break;
    case Layer::Attn:
      attn_bwd(s, dout);
      break;
  }
  if (join) join_lanes();  // the layer's gradients are final (the grad-ready hook may send them)
  return at(s.dx);
}

void Blocks::embedding_bwd_begin() {
  if (wgrad && !group_emb_) run(Fill{at(d_semb), 0.0f});
}

void Blocks::embedding_bwd(const Tensor& labels) {
  if (!wgrad) return;
  const int ed = cfg.time_embed_dim(), mc = cfg.num_channels;
  emb_layers_bwd();
  ScopedRange r(eng.device(), "time_embed bwd");
  run(SiluBwd{at(emb), at(d_semb), at(d_emb)});
  if (cfg.class_cond)
    run(EmbeddingBwd{labels, at(d_emb), G(table.at("label_emb.weight").offset, {cfg.label_rows(), ed})});
  const size_t w2 = table.at("time_embed.2.weight").offset, b2 = table.at("time_embed.2.bias").offset;
  const size_t w0 = table.at("time_embed.0.weight").offset, b0 = table.at("time_embed.0.bias").offset;
  const LinearBwd l2{at(a1s), P(w2, {ed, ed}), at(d_emb), at(d_a1s), G(w2, {ed, ed}), gvec(b2, ed)};
  if (lanes) {  // (as in emb_layers_bwd: the weight and bias gradients beside d_a1s)
    LinearBwd params = l2, data = l2;
    params.dx = {}, data.dw = data.db = {};
    run_side(params);
    run(data);
  } else {
    run(l2);
  }
  run(SiluBwd{at(a1), at(d_a1s), at(d_a1)});
  run(LinearBwd{at(temb), P(w0, {ed, mc}), at(d_a1), {}, G(w0, {ed, mc}), gvec(b0, ed)});
}

}  // namespace unet
