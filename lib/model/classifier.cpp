// The classifier on the op table: the shared blocks in EncoderUNetModel's order, then its head.
// Buffers of the head (f32 unless noted): the trunk's GroupNorm+SiLU output (activation dtype,
// recomputed in backward from the saved statistics), the tokens and qkv and attention output
// [B, 1, T, C] / [B, 1, T, 3C] (activation dtype, saved), the pooled token [B, C] and the logits.
#include "classifier.h"

#include <stdexcept>

#include "blocks.h"
#include "planner.h"
#include "util.h"

namespace unet {

struct Classifier::Impl {
  using L = Blocks::L;
  Classifier& c;
  Blocks bk;
  const DType A;
  std::vector<L> layers;  // input blocks then middle block, flattened
  int C = 0, R = 0, Tn = 0, heads = 0, K = 0;
  size_t on_w = 0, on_b = 0, pos = 0, qw = 0, qb = 0, cw = 0, cb = 0;
  // buffers
  Tensor x_a, n_out, o_mean, o_rstd, tokens, qkv, att, lse, sel;      // forward
  Tensor b_nout, d_sel, d_att, d_qkv, d_tokens, d_nout, d_h, dx_f32;  // backward
  Tensor x_in, t_in, h_last;

  Impl(Classifier& cl)
      : c(cl), bk(cl.eng_, cl.body_, cl.table_, cl.params_, cl.shadow_, cl.grads_), A(cl.eng_.act_dtype()) {
    for (auto& blk : c.arch_.input_blocks)
      for (auto& l : blk) layers.push_back(bk.make(l));
    for (auto& l : c.arch_.middle) layers.push_back(bk.make(l));
    C = c.arch_.out_cin, R = c.arch_.out_res, Tn = R * R + 1, heads = c.cfg_.pool_heads(),
    K = c.cfg_.num_classes;
    const ParamTable& t = c.table_;
    on_w = t.at("out.0.weight").offset, on_b = t.at("out.0.bias").offset;
    pos = t.at("out.2.positional_embedding").offset;
    qw = t.at("out.2.qkv_proj.weight").offset, qb = t.at("out.2.qkv_proj.bias").offset;
    cw = t.at("out.2.c_proj.weight").offset, cb = t.at("out.2.c_proj.bias").offset;
  }

  template <class Op>
  void run(const Op& op) {
    bk.run(op);
  }
  Tensor at(const Tensor& t) const { return bk.at(t); }

  void declare(Planner& pl, int Bp, Mode mode) {
    const bool bw = mode != Mode::Sample;
    const int64_t b = Bp, S = c.cfg_.image_size, Cin = c.cfg_.in_channels;
    auto act = [&](const std::string& n, int64_t h, int64_t w, int64_t ch) {
      return pl.declare(n, A, {b, h, w, ch});
    };
    auto f32 = [&](const std::string& n, std::initializer_list<int64_t> d) {
      return pl.declare(n, DType::F32, d);
    };
    bk.declare_embedding(pl, Bp, mode, true);
    if (A != DType::F32) x_a = act("x_act", S, S, Cin);
    // Guidance needs the gradient of the image: the first conv computes it too.
    for (L& s : layers) bk.declare_layer(pl, s, Bp, mode, true);
    n_out = act("out.f_n", R, R, C);
    o_mean = f32("out.mean", {b, Blocks::kGroups}), o_rstd = f32("out.rstd", {b, Blocks::kGroups});
    tokens = act("pool.tokens", 1, Tn, C);
    qkv = act("pool.qkv", 1, Tn, 3 * C);
    att = act("pool.att", 1, Tn, C);
    lse = f32("pool.lse", {b, heads, Tn});
    sel = f32("pool.sel", {b, C});
    if (bw) {
      if (mode == Mode::Train) b_nout = act("out.b_n", R, R, C);
      d_sel = f32("pool.d_sel", {b, C});
      d_att = act("pool.d_att", 1, Tn, C);
      d_qkv = act("pool.d_qkv", 1, Tn, 3 * C);
      d_tokens = act("pool.d_tokens", 1, Tn, C);
      d_nout = act("out.b_dn", R, R, C);
      d_h = act("out.dx", R, R, C);
      if (A != DType::F32) dx_f32 = pl.declare("dx_f32", DType::F32, {b, S, S, Cin});
    }
  }

  void forward(const Tensor& logits) {
    bk.refresh_shadow();
    bk.embedding_fwd(t_in, Tensor{});
    Tensor h = x_in;
    if (A != DType::F32) {
      run(Cast{x_in, at(x_a)});
      h = at(x_a);
    }
    for (L& s : layers) {
      bk.layer_fwd(s, h);
      h = at(s.out);
    }
    h_last = h;
    Device& d = bk.eng.device();
    {
      ScopedRange r(d, "out fwd");
      run(GroupNormFwd{h, bk.vec(on_w, C), bk.vec(on_b, C), {}, at(n_out), at(o_mean), at(o_rstd), true});
    }
    ScopedRange r(d, "pool fwd");
    run(PoolTokensFwd{at(n_out), bk.P(pos, {C, Tn}), at(tokens)});
    run(ConvFwd{at(tokens), bk.Wc(qw, 3 * C, 1, C), bk.vec(qb, 3 * C), {}, {}, at(qkv), 1});
    run(AttentionFwd{at(qkv), at(att), at(lse), /*legacy=*/false});  // AttentionPool2d: QKVAttention
    run(PoolSelectFwd{at(att), at(sel)});
    // c_proj reads only the pooled token; it runs in f32 in every precision (a [B,C]x[C,K] GEMM).
    run(LinearFwd{at(sel), bk.P(cw, {K, C}), bk.vec(cb, K), logits});
  }

  void ready(size_t first) {
    if (c.grad_ready_ && !bk.tracing) c.grad_ready_(first);
  }

  void backward(const Tensor& dlogits) {
    bk.embedding_bwd_begin();
    Device& d = bk.eng.device();
    {
      ScopedRange r(d, "pool bwd");
      run(LinearBwd{at(sel), bk.P(cw, {K, C}), dlogits, at(d_sel), bk.G(cw, {K, C}), bk.gvec(cb, K)});
      run(PoolSelectBwd{at(d_sel), at(d_att)});
      run(AttentionBwd{at(qkv), at(att), at(lse), at(d_att), at(d_qkv), false});
      bk.conv_filter_grad(at(tokens), at(d_qkv), bk.Gc(qw, 3 * C, 1, C), bk.gvec(qb, 3 * C), {}, 1);
      run(ConvBwdData{at(d_qkv), bk.Wc(qw, 3 * C, 1, C), at(d_tokens), 1});
      run(PoolTokensBwd{at(d_tokens), at(d_nout), bk.G(pos, {C, Tn})});
      bk.join_lanes();
    }
    {
      ScopedRange r(d, "out bwd");
      run(GroupNormBwd{h_last,
                       bk.vec(on_w, C),
                       bk.vec(on_b, C),
                       {},
                       at(o_mean),
                       at(o_rstd),
                       at(d_nout),
                       at(d_h),
                       bk.gvec(on_w, C),
                       bk.gvec(on_b, C),
                       {},
                       true, {}, {}, {}, {}});
    }
    ready(on_w);
    Tensor g = at(d_h);
    for (size_t j = layers.size(); j-- > 0;) g = bk.layer_bwd(layers[j], g), ready(layers[j].lowest_param());
    bk.embedding_bwd(Tensor{});
    ready(0);
    if (A != DType::F32) run(Cast{g, at(dx_f32)});
  }
};

namespace {
ParamTable checked_table(const ClassifierConfig& cfg) {
  std::string err = cfg.validate();
  if (!err.empty()) throw std::invalid_argument("invalid classifier config: " + err);
  return build_param_table(cfg);
}
}  // namespace

Classifier::Classifier(const ClassifierConfig& cfg, Engine& eng)
    : Network(eng, checked_table(cfg)), cfg_(cfg), body_(cfg.body()), arch_(build_arch(body_, true)) {
  impl_ = std::make_unique<Impl>(*this);
}

Classifier::~Classifier() = default;

void Classifier::declare(Planner& pl, int B, Mode m) { impl_->declare(pl, B, m); }
Blocks* Classifier::blocks() { return &impl_->bk; }

void Classifier::trace(Ops& tracer, int B, Mode m) {
  Impl& I = *impl_;
  const int S = cfg_.image_size;
  Tensor x(nullptr, DType::F32, {B, S, S, cfg_.in_channels});
  Tensor logits(nullptr, DType::F32, {B, cfg_.num_classes});
  Tensor t(nullptr, DType::F32, {B});
  Blocks& bk = I.bk;
  bk.tracing = &tracer;
  try {
    bk.B = B, bk.train = false, bk.wgrad = m == Mode::Train, bk.seed = 0;
    I.x_in = x, I.t_in = t;
    I.forward(logits);
    if (m != Mode::Sample) {
      I.backward(logits);
      // The input gradient is the pass's result: read it once more at the end, so the planner keeps
      // it live and packs nothing over it (the time-embedding backward runs after the first conv's).
      const Tensor g = eng_.act_dtype() == DType::F32 ? I.at(I.layers[0].dx) : I.at(I.dx_f32);
      tracer.run(Copy{g, g});
    }
  } catch (...) {
    bk.tracing = nullptr;
    throw;
  }
  bk.tracing = nullptr;
}

void Classifier::forward(const Tensor& x, const Tensor& t, const Tensor& logits) {
  const int B = (int)x.dim[0];
  if (!planned_) plan(B, Mode::Sample);
  if (B > planned_) throw std::logic_error("Classifier::forward: batch larger than planned");
  Impl& I = *impl_;
  Blocks& bk = I.bk;
  bk.B = B;
  bk.train = false;
  bk.wgrad = mode_ == Mode::Train;
  I.x_in = x;
  I.t_in = t;
  I.forward(logits);
}

void Classifier::backward(const Tensor& dlogits) {
  Impl& I = *impl_;
  if (mode_ == Mode::Sample) throw std::logic_error("Classifier::backward: planned for forward only");
  if (dlogits.dim[0] != I.bk.B)
    throw std::logic_error("Classifier::backward: batch differs from the forward's");
  I.backward(dlogits);
}

Tensor Classifier::input_grad() const {
  const Impl& I = *impl_;
  if (mode_ == Mode::Sample) throw std::logic_error("Classifier::input_grad: planned for forward only");
  return eng_.act_dtype() == DType::F32 ? I.bk.at(I.layers[0].dx) : I.bk.at(I.dx_f32);
}

}  // namespace unet
