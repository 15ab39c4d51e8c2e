// The guided-diffusion UNet on the op table.
//
// Buffers (declared per layer and packed by the planner, so memory is shared wherever lifetimes
// allow — no hand-kept scratch pools):
//  * saved for backward: each layer's output, a ResBlock's first conv output h1 (+ the timestep
//    embedding add), its embedding projection e, GroupNorm statistics, resampled skip inputs,
//    attention qkv / output / log-sum-exp, the concat input of every output block;
//  * recomputed in backward instead of saved: GroupNorm(+scale-shift)+SiLU outputs, resampled
//    and dropped-out copies (memory-bound work, about half the activation memory);
//  * forward scratch and backward scratch are separate buffers, so neither keeps the other alive.
// Fusions the model asks of every engine: the embedding add and residual add in the conv
// epilogue (ConvFwd emb/res), scale-shift and SiLU in GroupNorm, the embedding gradient from the
// conv's filter gradient (ConvBwdFilter demb).
#include "model.h"

#include <algorithm>
#include <stdexcept>

#include "planner.h"
#include "rng.h"
#include "util.h"

namespace unet {

namespace {
constexpr int kGroups = 32;

int out_res(const Layer& l) {
  if (l.kind == Layer::Down || (l.kind == Layer::Res && l.updown < 0)) return l.res / 2;
  if (l.kind == Layer::Up || (l.kind == Layer::Res && l.updown > 0)) return l.res * 2;
  return l.res;
}

}  // namespace

struct Model::Impl {
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
    // saved
    Tensor out, h1, e, xu, mean1, rstd1, mean2, rstd2, qkv, att, lse;
    // forward scratch
    Tensor f_n1, f_n1r, f_n2, f_sk, f_up;
    // backward scratch
    Tensor b_n1, b_n1r, b_n2, b_dn2, b_dh1, b_de, b_dpart, b_dn1r, b_dn1, b_dxs, b_dxs2, b_up, b_dup, b_datt,
        b_dqkv, b_n, b_dn;
    Tensor dx;  // gradient of the input (absent for the first conv)
  };

  Model& m;
  Engine& eng;
  const ModelConfig& cfg;
  const bool single;
  const DType A;  // activation dtype
  int B = 0;      // batch of the current call (<= planned)
  bool train = false;
  uint64_t seed = 0;
  Ops* tracing = nullptr;  // the planner's tracer while planning

  std::vector<std::vector<L>> in_blocks, out_blocks;
  std::vector<L> mid;
  std::vector<Tensor> cat, dcat_h, dskip;  // per output block / per input block
  // embeddings (f32)
  Tensor temb, a1, a1s, emb, semb, d_semb, d_emb, d_a1s, d_a1;
  // model input / output
  Tensor x_a, n_out, o_mean, o_rstd, b_nout, b_dnout, d_hlast, dout_a;
  Tensor t_in, labels_in, x_in, h_last;
  // out layer params
  size_t on_w = 0, on_b = 0, oc_w = 0, oc_b = 0;

  Impl(Model& model)
      : m(model), eng(model.eng_), cfg(model.cfg_), single(model.single_), A(model.eng_.act_dtype()) {
    int idx = 0;
    auto make = [&](const Layer& l) {
      L s;
      s.l = l;
      s.index = idx++;
      s.ro = out_res(l);
      s.fwd_name = l.prefix + " fwd";
      s.bwd_name = l.prefix + " bwd";
      const ParamTable& t = m.table_;
      auto off = [&](const std::string& n) { return t.at(l.prefix + n).offset; };
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
    };
    const Arch& a = m.arch_;
    for (auto& blk : a.input_blocks) {
      in_blocks.emplace_back();
      for (auto& l : blk) in_blocks.back().push_back(make(l));
    }
    for (auto& l : a.middle) mid.push_back(make(l));
    for (auto& blk : a.output_blocks) {
      out_blocks.emplace_back();
      for (auto& l : blk) out_blocks.back().push_back(make(l));
    }
    if (!single) {
      const ParamTable& t = m.table_;
      on_w = t.at("out.0.weight").offset, on_b = t.at("out.0.bias").offset;
      oc_w = t.at("out.2.weight").offset, oc_b = t.at("out.2.bias").offset;
    }
  }

  Ops& ops() { return tracing ? *tracing : eng.ops(); }
  template <class Op>
  void run(const Op& op) {
    ops().run(op);
  }
  Tensor at(const Tensor& t) const { return t.defined() ? t.batch(B) : t; }

  // ---- parameters: f32 master views, compute-dtype views, gradient views ----
  Tensor P(size_t off, std::initializer_list<int64_t> d) const {
    return Tensor(m.params_.f32() + off, DType::F32, d);
  }
  // Weights a GEMM reads: the bf16 copy in the bf16 engine.
  Tensor W(size_t off, std::initializer_list<int64_t> d) const {
    if (A == DType::BF16) return Tensor(m.shadow_.bf16() + off, DType::BF16, d);
    return P(off, d);
  }
  Tensor G(size_t off, std::initializer_list<int64_t> d) const {
    if (!m.grads_.defined()) throw std::logic_error("Model: gradients need plan(B, Mode::Train)");
    return Tensor(m.grads_.f32() + off, DType::F32, d);
  }
  // conv weight [Co, k, k, Ci] as the GEMM reads it, and its gradient
  Tensor Wc(size_t off, int co, int k, int ci) const { return W(off, {co, k, k, ci}); }
  Tensor Gc(size_t off, int co, int k, int ci) const { return G(off, {co, k, k, ci}); }
  Tensor vec(size_t off, int n) const { return P(off, {n}); }
  Tensor gvec(size_t off, int n) const { return G(off, {n}); }

  template <class F>
  void each_layer(F f) {
    for (auto& b : in_blocks)
      for (auto& l : b) f(l);
    for (auto& l : mid) f(l);
    for (auto& b : out_blocks)
      for (auto& l : b) f(l);
  }

  // ---------------- buffer declarations (the same sequence in both planner phases) ----------------
  void declare(Planner& pl, int Bp, Mode mode) {
    const bool tr = mode == Mode::Train;
    const int64_t b = Bp, ed = cfg.time_embed_dim(), R = cfg.image_size;
    auto act = [&](const std::string& n, int64_t h, int64_t c) { return pl.declare(n, A, {b, h, h, c}); };
    auto f32 = [&](const std::string& n, std::initializer_list<int64_t> d) {
      return pl.declare(n, DType::F32, d);
    };
    const bool ss = cfg.use_scale_shift_norm;
    if (!single) {
      temb = f32("temb", {b, cfg.num_channels});
      a1 = f32("a1", {b, ed}), a1s = f32("a1s", {b, ed}), emb = f32("emb", {b, ed});
    }
    semb = f32("semb", {b, ed});
    if (tr) {
      d_semb = f32("d_semb", {b, ed});
      if (!single) d_emb = f32("d_emb", {b, ed}), d_a1s = f32("d_a1s", {b, ed}), d_a1 = f32("d_a1", {b, ed});
    }
    if (!single && A != DType::F32) x_a = act("x_act", R, cfg.in_channels);
    each_layer([&](L& s) {
      const Layer& l = s.l;
      const std::string& p = l.prefix;
      const int64_t ri = l.res, ro = s.ro, ci = l.cin, co = l.cout;
      s.out = act(p + ".out", ro, co);
      const bool first = !single && &s == &in_blocks[0][0];
      if (tr && !first) s.dx = act(p + ".dx", ri, ci);
      switch (l.kind) {
        case Layer::Conv:
        case Layer::Down:
          break;
        case Layer::Up:
          s.f_up = act(p + ".f_up", ro, ci);
          if (tr) s.b_up = act(p + ".b_up", ro, ci), s.b_dup = act(p + ".b_dup", ro, ci);
          break;
        case Layer::Res: {
          const int64_t ec = ss ? 2 * co : co;
          s.h1 = act(p + ".h1", ro, co);
          s.e = f32(p + ".e", {b, ec});
          s.mean1 = f32(p + ".mean1", {b, kGroups}), s.rstd1 = f32(p + ".rstd1", {b, kGroups});
          s.mean2 = f32(p + ".mean2", {b, kGroups}), s.rstd2 = f32(p + ".rstd2", {b, kGroups});
          if (l.updown) s.xu = act(p + ".xu", ro, ci);
          s.f_n1 = act(p + ".f_n1", ri, ci);
          if (l.updown) s.f_n1r = act(p + ".f_n1r", ro, ci);
          s.f_n2 = act(p + ".f_n2", ro, co);
          if (s.sw != SIZE_MAX) s.f_sk = act(p + ".f_sk", ro, co);
          if (tr) {
            s.b_n2 = act(p + ".b_n2", ro, co), s.b_dn2 = act(p + ".b_dn2", ro, co);
            s.b_dh1 = act(p + ".b_dh1", ro, co);
            s.b_de = f32(p + ".b_de", {b, ec}), s.b_dpart = f32(p + ".b_dpart", {b, ed});
            s.b_n1 = act(p + ".b_n1", ri, ci);
            if (l.updown) s.b_n1r = act(p + ".b_n1r", ro, ci), s.b_dn1 = act(p + ".b_dn1", ri, ci);
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
          if (tr) {
            s.b_datt = act(p + ".b_datt", ri, ci), s.b_dqkv = act(p + ".b_dqkv", ri, 3 * ci);
            s.b_n = act(p + ".b_n", ri, ci), s.b_dn = act(p + ".b_dn", ri, ci);
          }
          break;
      }
    });
    cat.clear(), dcat_h.clear(), dskip.clear();
    for (size_t bi = 0; bi < out_blocks.size(); ++bi) {
      const Layer& l = out_blocks[bi][0].l;
      const L& src = in_blocks[in_blocks.size() - 1 - bi].back();
      cat.push_back(act("concat." + std::to_string(bi), l.res, l.cin));
      if (tr) {
        dcat_h.push_back(act("concat." + std::to_string(bi) + ".dh", l.res, l.cin - src.l.cout));
        dskip.push_back(act("concat." + std::to_string(bi) + ".dskip", l.res, src.l.cout));
      }
    }
    if (!single) {
      const int C = m.arch_.out_cin;
      n_out = act("out.f_n", R, C);
      o_mean = f32("out.mean", {b, kGroups}), o_rstd = f32("out.rstd", {b, kGroups});
      if (tr) {
        b_nout = act("out.b_n", R, C), b_dnout = act("out.b_dn", R, C), d_hlast = act("out.dx", R, C);
        if (A != DType::F32) dout_a = act("out.dy", R, cfg.out_channels());
      }
    }
  }

  // ---------------- forward ----------------
  void emb_fwd() {
    const int mc = cfg.num_channels, ed = cfg.time_embed_dim();
    const ParamTable& t = m.table_;
    ScopedRange r(eng.device(), "time_embed fwd");
    run(TimestepEmbedding{t_in, at(temb)});
    // The embedding MLP stays f32 in every precision (tiny; autocast-level accuracy is not needed).
    run(LinearFwd{at(temb), P(t.at("time_embed.0.weight").offset, {ed, mc}),
                  vec(t.at("time_embed.0.bias").offset, ed), at(a1)});
    run(SiluFwd{at(a1), at(a1s)});
    run(LinearFwd{at(a1s), P(t.at("time_embed.2.weight").offset, {ed, ed}),
                  vec(t.at("time_embed.2.bias").offset, ed), at(emb)});
    if (cfg.class_cond)
      run(EmbeddingAdd{labels_in, P(t.at("label_emb.weight").offset, {cfg.num_classes, ed}), at(emb)});
    run(SiluFwd{at(emb), at(semb)});
  }

  float dropout_p() const { return train ? cfg.dropout : 0.0f; }
  uint64_t dseed(const L& s) const { return hash64(seed, (uint64_t)s.index); }

  void resample(int updown, const Tensor& x, const Tensor& y) {
    if (updown < 0)
      run(AvgPoolFwd{x, y});
    else
      run(UpsampleFwd{x, y});
  }
  void resample_bwd(int updown, const Tensor& dy, const Tensor& dx) {
    if (updown < 0)
      run(AvgPoolBwd{dy, dx});
    else
      run(UpsampleBwd{dy, dx});
  }

  // SiLU(GN1(in)), resampled with updown: conv1's input, in n1 (and n1r). In backward (recompute)
  // the forward's statistics are reused.
  Tensor res_conv1_input(L& s, const Tensor& n1, const Tensor& n1r, bool recompute = false) {
    const Layer& l = s.l;
    if (recompute)
      run(GroupNormApply{
          at(s.in), vec(s.n1w, l.cin), vec(s.n1b, l.cin), {}, at(s.mean1), at(s.rstd1), at(n1), true});
    else
      run(GroupNormFwd{
          at(s.in), vec(s.n1w, l.cin), vec(s.n1b, l.cin), {}, at(n1), at(s.mean1), at(s.rstd1), true});
    if (!l.updown) return at(n1);
    resample(l.updown, at(n1), at(n1r));
    return at(n1r);
  }
  // SiLU(GN2(h1) [* (1 + scale) + shift]) with dropout: conv2's input, in n2.
  void res_conv2_input(L& s, const Tensor& n2, bool recompute = false) {
    const Layer& l = s.l;
    const Tensor ss = cfg.use_scale_shift_norm ? at(s.e) : Tensor{};
    if (recompute)
      run(GroupNormApply{at(s.h1), vec(s.n2w, l.cout), vec(s.n2b, l.cout), ss, at(s.mean2), at(s.rstd2),
                         at(n2), true});
    else
      run(GroupNormFwd{at(s.h1), vec(s.n2w, l.cout), vec(s.n2b, l.cout), ss, at(n2), at(s.mean2), at(s.rstd2),
                       true});
    if (dropout_p() > 0) run(DropoutFwd{at(n2), at(n2), dropout_p(), dseed(s)});
  }

  void res_fwd(L& s) {
    const Layer& l = s.l;
    const int ed = cfg.time_embed_dim(), ci = l.cin, co = l.cout;
    const bool ss = cfg.use_scale_shift_norm;
    Device& d = eng.device();
    {
      ScopedRange r(d, "emb_layers");
      run(LinearFwd{at(semb), P(s.ew, {ss ? 2 * co : co, ed}), vec(s.eb, ss ? 2 * co : co), at(s.e)});
    }
    Tensor xs = at(s.in);
    {
      ScopedRange r(d, "in_layers");
      const Tensor c1in = res_conv1_input(s, s.f_n1, s.f_n1r);
      if (l.updown) {
        resample(l.updown, at(s.in), at(s.xu));
        xs = at(s.xu);
      }
      run(ConvFwd{c1in, Wc(s.w0, co, 3, ci), vec(s.b0, co), ss ? Tensor{} : at(s.e), {}, at(s.h1), 1});
    }
    Tensor res = xs;
    if (s.sw != SIZE_MAX) {
      ScopedRange r(d, "skip_connection");
      run(ConvFwd{xs, Wc(s.sw, co, 1, ci), vec(s.sb, co), {}, {}, at(s.f_sk), 1});
      res = at(s.f_sk);
    }
    ScopedRange r(d, "out_layers");
    res_conv2_input(s, s.f_n2);
    run(ConvFwd{at(s.f_n2), Wc(s.w2, co, 3, co), vec(s.b2, co), {}, res, at(s.out), 1});
  }

  void attn_fwd(L& s) {
    const int C = s.l.cin;
    Device& d = eng.device();
    {
      ScopedRange r(d, "norm");
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
    run(ConvFwd{at(s.att), Wc(s.w2, C, 1, C), vec(s.b2, C), {}, at(s.in), at(s.out), 1});
  }

  void layer_fwd(L& s, const Tensor& in) {
    s.in = in;
    ScopedRange r(eng.device(), s.fwd_name.c_str());
    const Layer& l = s.l;
    switch (l.kind) {
      case Layer::Conv:
        run(ConvFwd{in, Wc(s.w0, l.cout, 3, l.cin), vec(s.b0, l.cout), {}, {}, at(s.out), 1});
        break;
      case Layer::Down:
        run(ConvFwd{in, Wc(s.w0, l.cout, 3, l.cin), vec(s.b0, l.cout), {}, {}, at(s.out), 2});
        break;
      case Layer::Up:
        run(UpsampleFwd{in, at(s.f_up)});
        run(ConvFwd{at(s.f_up), Wc(s.w0, l.cout, 3, l.cin), vec(s.b0, l.cout), {}, {}, at(s.out), 1});
        break;
      case Layer::Res:
        res_fwd(s);
        break;
      case Layer::Attn:
        attn_fwd(s);
        break;
    }
  }

  void refresh_shadow() {
    if (A == DType::F32) return;
    run(Cast{m.params_, m.shadow_});
  }

  void forward(const Tensor& out) {
    refresh_shadow();
    if (single) {
      layer_fwd(in_blocks[0][0], x_in);
      return;
    }
    emb_fwd();
    Tensor h = x_in;
    if (A != DType::F32) {
      run(Cast{x_in, at(x_a)});
      h = at(x_a);
    }
    for (auto& blk : in_blocks)
      for (auto& s : blk) {
        layer_fwd(s, h);
        h = at(s.out);
      }
    for (auto& s : mid) {
      layer_fwd(s, h);
      h = at(s.out);
    }
    size_t skip = in_blocks.size();
    for (size_t bi = 0; bi < out_blocks.size(); ++bi) {
      const L& src = in_blocks[--skip].back();
      {
        ScopedRange r(eng.device(), "concat fwd");
        run(ConcatFwd{h, at(src.out), at(cat[bi])});
      }
      h = at(cat[bi]);
      for (auto& s : out_blocks[bi]) {
        layer_fwd(s, h);
        h = at(s.out);
      }
    }
    h_last = h;
    const int C = m.arch_.out_cin;
    ScopedRange r(eng.device(), "out fwd");
    run(GroupNormFwd{h, vec(on_w, C), vec(on_b, C), {}, at(n_out), at(o_mean), at(o_rstd), true});
    run(ConvFwd{
        at(n_out), Wc(oc_w, cfg.out_channels(), 3, C), vec(oc_b, cfg.out_channels()), {}, {}, out, 1});
  }

  // ---------------- backward ----------------
  void res_bwd(L& s, const Tensor& dout) {
    const Layer& l = s.l;
    const int ed = cfg.time_embed_dim(), ci = l.cin, co = l.cout;
    const bool ss = cfg.use_scale_shift_norm;
    const Tensor xs = l.updown ? at(s.xu) : at(s.in);
    Device& d = eng.device();
    {
      // out_layers: recompute conv2's input, then back through conv2, dropout, SiLU/scale-shift/norm
      ScopedRange r(d, "out_layers");
      res_conv2_input(s, s.b_n2, true);
      run(ConvBwdFilter{at(s.b_n2), dout, Gc(s.w2, co, 3, co), gvec(s.b2, co), {}, 1});
      run(ConvBwdData{dout, Wc(s.w2, co, 3, co), at(s.b_dn2), 1});
      if (dropout_p() > 0) run(DropoutBwd{at(s.b_dn2), at(s.b_dn2), dropout_p(), dseed(s)});
      run(GroupNormBwd{at(s.h1), vec(s.n2w, co), vec(s.n2b, co), ss ? at(s.e) : Tensor{}, at(s.mean2),
                       at(s.rstd2), at(s.b_dn2), at(s.b_dh1), gvec(s.n2w, co), gvec(s.n2b, co),
                       ss ? at(s.b_de) : Tensor{}, true});
    }
    {
      // in_layers: recompute SiLU(GN1(x)) (resampled); conv1's filter gradient also yields the
      // embedding gradient (per-sample sums of dh1) when the embedding was added, not scale-shifted
      ScopedRange r(d, "in_layers");
      const Tensor c1in = res_conv1_input(s, s.b_n1, s.b_n1r, true);
      run(ConvBwdFilter{c1in, at(s.b_dh1), Gc(s.w0, co, 3, ci), gvec(s.b0, co), ss ? Tensor{} : at(s.b_de),
                        1});
      run(ConvBwdData{at(s.b_dh1), Wc(s.w0, co, 3, ci), at(s.b_dn1r), 1});
      Tensor dg1 = at(s.b_dn1r);
      if (l.updown) {
        resample_bwd(l.updown, at(s.b_dn1r), at(s.b_dn1));
        dg1 = at(s.b_dn1);
      }
      run(GroupNormBwd{at(s.in),
                       vec(s.n1w, ci),
                       vec(s.n1b, ci),
                       {},
                       at(s.mean1),
                       at(s.rstd1),
                       dg1,
                       at(s.dx),
                       gvec(s.n1w, ci),
                       gvec(s.n1b, ci),
                       {},
                       true});
    }
    {
      ScopedRange r(d, "emb_layers");
      const int ec = ss ? 2 * co : co;
      run(LinearBwd{at(semb), P(s.ew, {ec, ed}), at(s.b_de), at(s.b_dpart), G(s.ew, {ec, ed}),
                    gvec(s.eb, ec)});
      run(Add{at(d_semb), at(s.b_dpart), at(d_semb)});
    }
    ScopedRange r(d, "skip_connection");
    Tensor dxs = dout;
    if (s.sw != SIZE_MAX) {
      run(ConvBwdFilter{xs, dout, Gc(s.sw, co, 1, ci), gvec(s.sb, co), {}, 1});
      run(ConvBwdData{dout, Wc(s.sw, co, 1, ci), at(s.b_dxs), 1});
      dxs = at(s.b_dxs);
    }
    if (l.updown) {
      resample_bwd(l.updown, dxs, at(s.b_dxs2));
      dxs = at(s.b_dxs2);
    }
    run(Add{at(s.dx), dxs, at(s.dx)});
  }

  void attn_bwd(L& s, const Tensor& dout) {
    const int C = s.l.cin;
    Device& d = eng.device();
    {
      ScopedRange r(d, "proj_out");
      run(ConvBwdFilter{at(s.att), dout, Gc(s.w2, C, 1, C), gvec(s.b2, C), {}, 1});
      run(ConvBwdData{dout, Wc(s.w2, C, 1, C), at(s.b_datt), 1});
    }
    {
      ScopedRange r(d, "attention");
      run(AttentionBwd{at(s.qkv), at(s.att), at(s.lse), at(s.b_datt), at(s.b_dqkv),
                       !cfg.use_new_attention_order});
    }
    {
      ScopedRange r(d, "qkv");
      run(GroupNormApply{
          at(s.in), vec(s.n1w, C), vec(s.n1b, C), {}, at(s.mean1), at(s.rstd1), at(s.b_n), false});
      run(ConvBwdFilter{at(s.b_n), at(s.b_dqkv), Gc(s.w0, 3 * C, 1, C), gvec(s.b0, 3 * C), {}, 1});
      run(ConvBwdData{at(s.b_dqkv), Wc(s.w0, 3 * C, 1, C), at(s.b_dn), 1});
    }
    ScopedRange r(d, "norm");
    run(GroupNormBwd{at(s.in),
                     vec(s.n1w, C),
                     vec(s.n1b, C),
                     {},
                     at(s.mean1),
                     at(s.rstd1),
                     at(s.b_dn),
                     at(s.dx),
                     gvec(s.n1w, C),
                     gvec(s.n1b, C),
                     {},
                     false});
    run(Add{dout, at(s.dx), at(s.dx)});
  }

  // Returns the gradient of the layer's input (absent for the model's first conv).
  Tensor layer_bwd(L& s, const Tensor& dout) {
    ScopedRange r(eng.device(), s.bwd_name.c_str());
    const Layer& l = s.l;
    switch (l.kind) {
      case Layer::Conv:
      case Layer::Down: {
        const int stride = l.kind == Layer::Down ? 2 : 1;
        run(ConvBwdFilter{at(s.in), dout, Gc(s.w0, l.cout, 3, l.cin), gvec(s.b0, l.cout), {}, stride});
        if (s.dx.defined()) run(ConvBwdData{dout, Wc(s.w0, l.cout, 3, l.cin), at(s.dx), stride});
        break;
      }
      case Layer::Up:
        run(UpsampleFwd{at(s.in), at(s.b_up)});
        run(ConvBwdFilter{at(s.b_up), dout, Gc(s.w0, l.cout, 3, l.cin), gvec(s.b0, l.cout), {}, 1});
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
    return at(s.dx);
  }

  // Tells the grad-ready hook that every gradient from `first` on is final (not while planning).
  void ready(size_t first) {
    if (m.grad_ready_ && !tracing) m.grad_ready_(first);
  }
  static size_t lowest(const L& s) {
    return std::min({s.w0, s.b0, s.n1w, s.n1b, s.ew, s.eb, s.n2w, s.n2b, s.w2, s.b2, s.sw, s.sb});
  }

  void backward(const Tensor& dy_in) {
    const int ed = cfg.time_embed_dim(), mc = cfg.num_channels;
    run(Fill{at(d_semb), 0.0f});
    if (single) {
      layer_bwd(in_blocks[0][0], dy_in);
      return;
    }
    Tensor dy = dy_in;
    const int C = m.arch_.out_cin;
    Tensor g;
    {
      ScopedRange r(eng.device(), "out bwd");
      if (A != DType::F32) {
        run(Cast{dy_in, at(dout_a)});
        dy = at(dout_a);
      }
      run(GroupNormApply{h_last, vec(on_w, C), vec(on_b, C), {}, at(o_mean), at(o_rstd), at(b_nout), true});
      run(ConvBwdFilter{
          at(b_nout), dy, Gc(oc_w, cfg.out_channels(), 3, C), gvec(oc_b, cfg.out_channels()), {}, 1});
      run(ConvBwdData{dy, Wc(oc_w, cfg.out_channels(), 3, C), at(b_dnout), 1});
      run(GroupNormBwd{h_last,
                       vec(on_w, C),
                       vec(on_b, C),
                       {},
                       at(o_mean),
                       at(o_rstd),
                       at(b_dnout),
                       at(d_hlast),
                       gvec(on_w, C),
                       gvec(on_b, C),
                       {},
                       true});
      g = at(d_hlast);
    }
    ready(std::min(on_w, oc_w));
    const size_t n_in = in_blocks.size();
    for (size_t bi = out_blocks.size(); bi-- > 0;) {
      auto& blk = out_blocks[bi];
      for (size_t j = blk.size(); j-- > 0;) g = layer_bwd(blk[j], g), ready(lowest(blk[j]));
      ScopedRange r(eng.device(), "concat bwd");
      run(ConcatBwd{g, at(dcat_h[bi]), at(dskip[bi])});
      g = at(dcat_h[bi]);
    }
    for (size_t j = mid.size(); j-- > 0;) g = layer_bwd(mid[j], g), ready(lowest(mid[j]));
    for (size_t bi = n_in; bi-- > 0;) {
      auto& blk = in_blocks[bi];
      run(Add{g, at(dskip[out_blocks.size() - 1 - bi]), g});
      for (size_t j = blk.size(); j-- > 0;) g = layer_bwd(blk[j], g), ready(lowest(blk[j]));
    }
    // embeddings
    const ParamTable& t = m.table_;
    ScopedRange r(eng.device(), "time_embed bwd");
    run(SiluBwd{at(emb), at(d_semb), at(d_emb)});
    if (cfg.class_cond)
      run(EmbeddingBwd{labels_in, at(d_emb), G(t.at("label_emb.weight").offset, {cfg.num_classes, ed})});
    const size_t w2 = t.at("time_embed.2.weight").offset, b2 = t.at("time_embed.2.bias").offset;
    const size_t w0 = t.at("time_embed.0.weight").offset, b0 = t.at("time_embed.0.bias").offset;
    run(LinearBwd{at(a1s), P(w2, {ed, ed}), at(d_emb), at(d_a1s), G(w2, {ed, ed}), gvec(b2, ed)});
    run(SiluBwd{at(a1), at(d_a1s), at(d_a1)});
    run(LinearBwd{at(temb), P(w0, {ed, mc}), at(d_a1), {}, G(w0, {ed, mc}), gvec(b0, ed)});
    ready(0);
  }
};

namespace {
ParamTable single_layer_table(const ModelConfig& cfg, const Layer& l) {
  return build_layer_param_table(cfg, l);
}
Arch single_layer_arch(const Layer& l) {
  Arch a;
  a.input_blocks.push_back({l});
  return a;
}
}  // namespace

Model::Model(const ModelConfig& cfg, Engine& eng) : cfg_(cfg), eng_(eng) {
  std::string err = cfg_.validate();
  if (!err.empty()) throw std::invalid_argument("invalid model config: " + err);
  table_ = build_param_table(cfg_);
  arch_ = build_arch(cfg_);
  params_ = Tensor(eng_.device().alloc(table_.total * 4), DType::F32, {(int64_t)table_.total});
  if (eng_.act_dtype() == DType::BF16)
    shadow_ = Tensor(eng_.device().alloc(table_.total * 2), DType::BF16, {(int64_t)table_.total});
  impl_ = std::make_unique<Impl>(*this);
}

Model::Model(const ModelConfig& cfg, Engine& eng, const Layer& only) : cfg_(cfg), eng_(eng), single_(true) {
  std::string err = cfg_.validate();
  if (!err.empty()) throw std::invalid_argument("invalid model config: " + err);
  table_ = single_layer_table(cfg_, only);
  arch_ = single_layer_arch(only);
  params_ = Tensor(eng_.device().alloc(table_.total * 4), DType::F32, {(int64_t)table_.total});
  if (eng_.act_dtype() == DType::BF16)
    shadow_ = Tensor(eng_.device().alloc(table_.total * 2), DType::BF16, {(int64_t)table_.total});
  impl_ = std::make_unique<Impl>(*this);
}

Model::~Model() = default;

namespace {
std::string gib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GB", b / 1e9);
  return s;
}
}  // namespace

void Model::plan(int B, Mode m) {
  if (B < 1) throw UserError("batch size must be >= 1, got " + std::to_string(B));
  if (planned_) {
    if (B <= planned_ && (m == mode_ || m == Mode::Sample)) return;
    throw std::logic_error("Model::plan: already planned for a smaller batch or another mode");
  }
  Impl& I = *impl_;
  Planner pl;
  if (m == Mode::Train && !grads_.defined()) {
    // The gradient arena is planned memory too (its own allocation: the all-reduce of
    // several GPUs and the optimizer read it as one flat tensor).
    grads_ = Tensor(eng_.device().alloc(table_.total * 4), DType::F32, {(int64_t)table_.total});
  }
  I.declare(pl, B, m);
  // Trace one step: externals are absent-data views with the right shapes.
  const int R = cfg_.image_size;
  Tensor x(nullptr, DType::F32, {B, R, R, cfg_.in_channels});
  Tensor out(nullptr, DType::F32, {B, R, R, cfg_.out_channels()});
  if (single_) {  // the layer reads and writes activations directly
    const Layer& l = arch_.input_blocks[0][0];
    x = Tensor(nullptr, eng_.act_dtype(), {B, l.res, l.res, l.cin});
    out = Tensor(nullptr, eng_.act_dtype(), {B, out_res(l), out_res(l), l.cout});
  }
  Tensor t(nullptr, DType::F32, {B});
  Tensor labels = cfg_.class_cond ? Tensor(nullptr, DType::I32, {B}) : Tensor();
  I.tracing = &pl.tracer(eng_.ops());
  try {
    I.B = B, I.train = m == Mode::Train, I.seed = 0;
    I.x_in = x, I.t_in = t, I.labels_in = labels;
    if (single_) I.run(Fill{I.at(I.semb), 0.f});  // an input the caller fills (emb_input())
    I.forward(out);
    if (m == Mode::Train) I.backward(out);
  } catch (...) {
    I.tracing = nullptr;
    throw;
  }
  I.tracing = nullptr;
  pl.pack();
  const size_t need = pl.arena_bytes();
  const size_t free = eng_.device().bytes_free();
  if (need > free)
    throw UserError(std::string(m == Mode::Train ? "training" : "sampling") + " at batch size " +
                    std::to_string(B) + " needs " + gib(need + eng_.device().bytes_held()) + " of " +
                    (eng_.is_cuda() ? "GPU" : "host") + " memory, " + gib(free + eng_.device().bytes_held()) +
                    " available; use a smaller --batch-size");
  void* arena = eng_.device().alloc(need);
  pl.bind(arena);
  I.declare(pl, B, m);
  eng_.ops().finalize();
  report_ = pl.report();
  arena_bytes_ = need;
  planned_ = B;
  mode_ = m;
  if (m == Mode::Train) eng_.ops().run(Fill{grads_, 0.f});
}

size_t Model::activation_bytes() const { return arena_bytes_; }
std::string Model::plan_report() const { return report_; }

Tensor Model::emb_input() const {
  if (!single_)
    throw std::logic_error("Model::emb_input: only single-layer networks read an embedding input");
  return impl_->semb.batch(planned_);
}

void Model::forward(const Tensor& x, const Tensor& t, const Tensor& labels, const Tensor& out, bool train,
                    uint64_t dropout_seed) {
  const int B = (int)x.dim[0];
  if (!planned_) plan(B, train ? Mode::Train : Mode::Sample);
  if (B > planned_) throw std::logic_error("Model::forward: batch larger than planned");
  if (train && mode_ != Mode::Train) throw std::logic_error("Model::forward(train): planned for sampling");
  Impl& I = *impl_;
  I.B = B;
  I.train = train;
  I.seed = dropout_seed;
  I.x_in = x;
  I.t_in = t;
  I.labels_in = cfg_.class_cond ? labels : Tensor();
  I.forward(out);
}

void Model::set_grad_ready_hook(std::function<void(size_t)> hook) { grad_ready_ = std::move(hook); }

void Model::backward(const Tensor& dout) {
  Impl& I = *impl_;
  if (!I.train || dout.dim[0] != I.B)
    throw std::logic_error("Model::backward must follow forward(train=true) with the same batch");
  I.backward(dout);
}

}  // namespace unet
