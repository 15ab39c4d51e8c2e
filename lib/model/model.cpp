// The guided-diffusion UNet on the op table: the shared blocks (blocks.h) in UNetModel's order,
// plus what only the UNet has — the skip concatenations of the output blocks and the output
// layer (GroupNorm, SiLU, 3x3 conv). The concat input of every output block is saved for
// backward.
#include "model.h"

#include <algorithm>
#include <stdexcept>

#include "blocks.h"
#include "planner.h"
#include "util.h"

namespace unet {

struct Model::Impl {
  using L = Blocks::L;
  Model& m;
  Blocks bk;
  const ModelConfig& cfg;
  const bool single;
  const DType A;

  std::vector<std::vector<L>> in_blocks, out_blocks;
  std::vector<L> mid;
  std::vector<Tensor> cat, dcat_h, dskip;  // per output block / per input block
  // model input / output
  Tensor x_a, n_out, o_mean, o_rstd, b_nout, b_dnout, d_hlast, dout_a;
  Tensor t_in, labels_in, x_in, h_last;
  // Layers between the backward's lane joins: asked for (Model::set_backward_joins), and as the
  // last plan traced it (what backward() must follow: the planner's lane regions end at the joins).
  int join_every = Model::kJoinLayers, join_plan = Model::kJoinLayers;
  // out layer params
  size_t on_w = 0, on_b = 0, oc_w = 0, oc_b = 0;

  Impl(Model& model)
      : m(model),
        bk(model.eng_, model.cfg_, model.table_, model.params_, model.shadow_, model.grads_),
        cfg(model.cfg_),
        single(model.single_),
        A(model.eng_.act_dtype()) {
    const Arch& a = m.arch_;
    for (auto& blk : a.input_blocks) {
      in_blocks.emplace_back();
      for (auto& l : blk) in_blocks.back().push_back(bk.make(l));
    }
    for (auto& l : a.middle) mid.push_back(bk.make(l));
    for (auto& blk : a.output_blocks) {
      out_blocks.emplace_back();
      for (auto& l : blk) out_blocks.back().push_back(bk.make(l));
    }
    if (!single) {
      const ParamTable& t = m.table_;
      on_w = t.at("out.0.weight").offset, on_b = t.at("out.0.bias").offset;
      oc_w = t.at("out.2.weight").offset, oc_b = t.at("out.2.bias").offset;
    }
  }

  template <class Op>
  void run(const Op& op) {
    bk.run(op);
  }
  Tensor at(const Tensor& t) const { return bk.at(t); }

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
    join_plan = join_every;
    const bool tr = mode != Mode::Sample;
    const int64_t b = Bp, R = cfg.image_size;
    auto act = [&](const std::string& n, int64_t h, int64_t c) { return pl.declare(n, A, {b, h, h, c}); };
    auto f32 = [&](const std::string& n, std::initializer_list<int64_t> d) {
      return pl.declare(n, DType::F32, d);
    };
    bk.declare_embedding(pl, Bp, mode, !single);
    if (!single && A != DType::F32) x_a = act("x_act", R, cfg.in_channels);
    // The UNet's input gradient is never needed: its first conv computes none.
    // A ResBlock after a skip concatenation writes its input gradient as the concatenation's two
    // parts (dcat_h, dskip: no split pass), so declares no dx of its own.
    auto split_dx = [&](const L& s) {
      for (auto& blk : out_blocks)
        if (&s == &blk[0]) return s.l.kind == Layer::Res;
      return false;
    };
    each_layer([&](L& s) {
      s.dx = s.dx2 = s.dx_add = Tensor{};
      s.dx_total_param = SIZE_MAX, s.db_given = false;
      bk.declare_layer(pl, s, Bp, mode, single || (&s != &in_blocks[0][0] && !split_dx(s)));
    });
    cat.clear(), dcat_h.clear(), dskip.clear();
    for (size_t bi = 0; bi < out_blocks.size(); ++bi) {
      L& first = out_blocks[bi][0];
      const Layer& l = first.l;
      const L& src = in_blocks[in_blocks.size() - 1 - bi].back();
      cat.push_back(act("concat." + std::to_string(bi), l.res, l.cin));
      if (tr) {
        dcat_h.push_back(act("concat." + std::to_string(bi) + ".dh", l.res, l.cin - src.l.cout));
        dskip.push_back(act("concat." + std::to_string(bi) + ".dskip", l.res, src.l.cout));
        if (split_dx(first)) first.dx = dcat_h.back(), first.dx2 = dskip.back();
        // the skip's gradient joins the encoder's at the input of the layer after the skip's
        // source: a ResBlock adds it in its first norm's backward
        if (L* p = skip_joiner(in_blocks.size() - 1 - bi); p && p->l.kind == Layer::Res && p->dx.defined())
          p->dx_add = dskip.back();
      }
    }
    if (tr && !single) link_bias_grads();
    if (!single) {
      const int C = m.arch_.out_cin;
      n_out = act("out.f_n", R, C);
      o_mean = f32("out.mean", {b, Blocks::kGroups}), o_rstd = f32("out.rstd", {b, Blocks::kGroups});
      if (tr) {
        if (mode == Mode::Train) b_nout = act("out.b_n", R, C);
        b_dnout = act("out.b_dn", R, C), d_hlast = act("out.dx", R, C);
        if (A != DType::F32) dout_a = act("out.dy", R, cfg.out_channels());
      }
    }
    chain_stats(mode);
    // (after chain_stats: a concatenation that gives its block's statistics copies as before)
    cat_by_norm.assign(out_blocks.size(), false);
    for (size_t bi = 0; bi < out_blocks.size() && mode == Mode::Train; ++bi) {
      const L& src = in_blocks[in_blocks.size() - 1 - bi].back();
      cat_by_norm[bi] = bk.gn1_writes_cat(out_blocks[bi][0], b, out_blocks[bi][0].l.cin - src.l.cout);
      bk.cat_norms += cat_by_norm[bi];
    }
  }
  std::vector<bool> cat_by_norm;  // concatenation bi is written by out_blocks[bi][0]'s GN1

  // UNET_CONV_STATS: a layer whose input is the previous layer's output gets its first norm's
  // statistics from that layer's last conv, one after a skip concatenation from the concatenation,
  // the out norm from the last layer's conv. Sampling plans take the concatenations' always: H100,
  // seed64 at batch 64, same runs (2026-11-25), sampling's forward tf32 7.78 / 7.78 / 7.80 -> 7.63
  // / 7.63 / 7.64 ms, bf16 4.51 / 4.51 / 4.52 -> 4.38 / 4.40 / 4.40; the training step at batch 32
  // lost 0.03-0.09 ms (tf32) and 0.03 (bf16) with them: there the copy-and-sum pass
  // (rowblock::stats_rows_kernel, 0.42 ms a step) costs more over the plain copy (0.27) than the
  // statistics passes it saves (0.11).
  void chain_stats(Mode mode) {
    each_layer([&](L& s) { s.out_mean = s.out_rstd = Tensor{}, s.stats_in = false; });
    out_stats_in = false;
    cat_stats.assign(out_blocks.size(), false);
    if (single || !(bk.conv_stats || mode == Mode::Sample)) return;
    L* prev = nullptr;
    auto link = [&](L& s) {
      if (prev) bk.chain_stats(*prev, s);
      prev = &s;
    };
    for (auto& b : in_blocks)
      for (auto& s : b) link(s);
    for (auto& s : mid) link(s);
    cat_stats.assign(out_blocks.size(), false);
    for (size_t bi = 0; bi < out_blocks.size(); ++bi) {
      prev = nullptr;  // a concatenation comes first: it gives them
      L& first = out_blocks[bi][0];
      if (first.l.kind == Layer::Res || first.l.kind == Layer::Attn) cat_stats[bi] = first.stats_in = true;
      for (auto& s : out_blocks[bi]) link(s);
    }
    if (!bk.conv_stats) return;
    L& last = out_blocks.back().back();
    last.out_mean = o_mean, last.out_rstd = o_rstd;
    out_stats_in = true;
  }
  // Each layer whose output gradient is wholly the next layer's input gradient (within the encoder,
  // with the skip's added there; within the middle and each decoder block; the last decoder layer's
  // from the out norm) gets its conv bias gradient from that layer's norm backward.
  void link_bias_grads() {
    bk.bias_links = 0;
    L* prev = nullptr;
    for (auto& b : in_blocks)
      for (auto& s : b) {
        // across an encoder block the skip's gradient must be in the next layer's dx
        if (prev && (&s != &b[0] || s.dx_add.defined())) bk.link_bias_grad(*prev, s);
        prev = &s;
      }
    for (auto& s : mid) {
      if (prev && (&s != &mid[0] || s.dx_add.defined())) bk.link_bias_grad(*prev, s);
      prev = &s;
    }
    for (auto& b : out_blocks)
      for (size_t j = 1; j < b.size(); ++j) bk.link_bias_grad(b[j - 1], b[j]);
    if (out_blocks.empty() || out_blocks.back().empty()) return;
    L& last = out_blocks.back().back();
    if (bk.link_bias && last.out_bias() != SIZE_MAX) {  // the out norm's backward writes it
      last.db_given = true;
      ++bk.bias_links;
    }
  }

  // The layer whose input gradient is in_blocks[bi]'s output gradient (the skip to output block
  // n_out - 1 - bi joins it there), or null.
  L* skip_joiner(size_t bi) {
    if (bi + 1 < in_blocks.size()) return &in_blocks[bi + 1][0];
    return mid.empty() ? nullptr : &mid[0];
  }
  bool last_db_given() const { return !single && !out_blocks.empty() && out_blocks.back().back().db_given; }
  bool out_stats_in = false;
  std::vector<bool> cat_stats;  // concatenation bi gives out_blocks[bi][0]'s statistics

  // ---------------- forward ----------------
  void forward(const Tensor& out) {
    bk.refresh_shadow();
    if (single) {
      bk.layer_fwd(in_blocks[0][0], x_in);
      return;
    }
    bk.embedding_fwd_side(t_in, labels_in);
    Tensor h = x_in;
    if (A != DType::F32) {
      run(Cast{x_in, at(x_a)});
      h = at(x_a);
    }
    for (auto& blk : in_blocks)
      for (auto& s : blk) {
        bk.layer_fwd(s, h);
        h = at(s.out);
      }
    for (auto& s : mid) {
      bk.layer_fwd(s, h);
      h = at(s.out);
    }
    // Measured and not kept (H100, seed64 batch 32, same runs, 2026-11-25): training copying each
    // skip into its concatenation's second part on a third stream (Ops::branch) as soon as the
    // encoder had made it, the decoder copying only h: tf32 12.649 / 12.649 / 12.742 -> 12.683 /
    // 12.668 / 12.679 ms, bf16 7.714 / 7.710 / 7.710 -> 7.741 / 7.738 / 7.739, +0.06 GB.
    size_t skip = in_blocks.size();
    for (size_t bi = 0; bi < out_blocks.size(); ++bi) {
      const L& src = in_blocks[--skip].back();
      L& first = out_blocks[bi][0];
      first.cat_a = first.cat_b = Tensor{};
      if (cat_by_norm[bi]) {  // (its GN1 writes it)
        first.cat_a = h, first.cat_b = at(src.out);
      } else {
        ScopedRange r(bk.eng.device(), "concat fwd");
        ConcatFwd c{h, at(src.out), at(cat[bi])};
        if (cat_stats[bi]) c.mean = at(first.mean1), c.rstd = at(first.rstd1);
        run(c);
      }
      h = at(cat[bi]);
      for (auto& s : out_blocks[bi]) {
        bk.layer_fwd(s, h);
        h = at(s.out);
      }
    }
    h_last = h;
    const int C = m.arch_.out_cin;
    ScopedRange r(bk.eng.device(), "out fwd");
    if (out_stats_in)
      run(GroupNormApply{h, bk.vec(on_w, C), bk.vec(on_b, C), {}, at(o_mean), at(o_rstd), at(n_out), true});
    else
      run(GroupNormFwd{h, bk.vec(on_w, C), bk.vec(on_b, C), {}, at(n_out), at(o_mean), at(o_rstd), true});
    run(ConvFwd{
        at(n_out), bk.Wc(oc_w, cfg.out_channels(), 3, C), bk.vec(oc_b, cfg.out_channels()), {}, {}, out, 1});
    bk.join_emb();  // (a network without ResBlocks)
  }

  // ---------------- backward ----------------
  // Tells the grad-ready hook that every gradient from `first` on is final (not while planning).
  void ready(size_t first) {
    if (m.grad_ready_ && !bk.tracing) m.grad_ready_(first);
  }

  void backward(const Tensor& dy_in) {
    bk.embedding_bwd_begin();
    bk.emb_from_filter = false;
    if (single) {
      bk.layer_bwd(in_blocks[0][0], dy_in);
      return;
    }
    Tensor dy = dy_in;
    const int C = m.arch_.out_cin, Co = cfg.out_channels();
    Tensor g;
    {
      ScopedRange r(bk.eng.device(), "out bwd");
      if (A != DType::F32) {
        run(Cast{dy_in, at(dout_a)});
        dy = at(dout_a);
      }
      if (bk.wgrad) {
        if (!bk.keep)
          run(GroupNormApply{
              h_last, bk.vec(on_w, C), bk.vec(on_b, C), {}, at(o_mean), at(o_rstd), at(b_nout), true});
        bk.conv_filter_grad(at(bk.keep ? n_out : b_nout), dy, bk.Gc(oc_w, Co, 3, C), bk.gvec(oc_b, Co), {}, 1);
      }
      run(ConvBwdData{dy, bk.Wc(oc_w, Co, 3, C), at(b_dnout), 1});
      run(GroupNormBwd{h_last,
                       bk.vec(on_w, C),
                       bk.vec(on_b, C),
                       {},
                       at(o_mean),
                       at(o_rstd),
                       at(b_dnout),
                       at(d_hlast),
                       bk.gvec(on_w, C),
                       bk.gvec(on_b, C),
                       {},
                       true, {}, {},
                       last_db_given() ? bk.gvec(out_blocks.back().back().out_bias(), C) : Tensor{},
                       {}});
      g = at(d_hlast);
      bk.join_lanes();
    }
    ready(std::min(on_w, oc_w));
    // The side lane (filter gradients) is joined every join_plan layers (Model::set_backward_joins),
    // not after each: the main lane had waited there for the side lane (tf32: 1.2 ms of a 14.8 ms
    // step with only filter gradients running); between joins it goes on into the next layers, and
    // the planner keeps what the side lane's ops use live until the join. The grad-ready hook hears
    // of a layer at its join. H100, seed64, batch 32 (after the planner's lane rule was narrowed to
    // the side lane's buffers), joins every 1 / 3 / 5 / 8 layers: bf16 8.364 / 8.250 / 8.229 / 8.211
    // ms, 1.76 / 1.87 / 1.87 / 1.88 GB; tf32 14.761 / 14.608 / 14.585 / 14.563 ms, 2.88 / 3.11 / 3.11
    // / 3.13 GB. Again at 12.9 ms (2026-11-25, same runs; seed64's backward has 40 layers), every 5
    // / 22 / 25 / 28 / 31 / 34: tf32 12.89-12.92 / 12.82-12.84 / 12.77-12.78 / 12.74-12.75 /
    // 12.74-12.77 / 12.75-12.77 ms, bf16 7.90 / 7.87 / 7.88 / 7.86-7.87 / 7.86-7.88 / 7.88; 3.09 ->
    // 3.10 GB. So 28 (Model::kJoinLayers). Data-parallel training joined every 5 layers until
    // its all-reduce buckets started from the optimizer's stream (after both lanes), as the early
    // optimizer updates do: they hear of their gradients every kReadyEvery layers between joins.
    int unjoined = 0;         // layers since the last join
    size_t lowest = SIZE_MAX;  // the lowest parameter offset of the layers done (it only falls)
    // Joins before a layer once join_plan are pending; the last layers are joined after the
    // embedding's backward (so the input convolution's filter gradient runs beside it).
    // A hook whose work waits for both lanes (the early optimizer updates) hears of the gradients
    // every kReadyEvery layers between the joins as well.
    constexpr int kReadyEvery = 5;
    int unready = 0;
    auto back = [&](L& s) {
      if (unjoined == join_plan) {
        bk.join_lanes();
        ready(lowest);
        unjoined = unready = 0;
      } else if (m.ready_between_joins_ && unready == kReadyEvery) {
        ready(lowest);
        unready = 0;
      }
      g = bk.layer_bwd(s, g, false);
      lowest = std::min(lowest, s.lowest_param());
      ++unjoined, ++unready;
    };
    const size_t n_in = in_blocks.size();
    for (size_t bi = out_blocks.size(); bi-- > 0;) {
      auto& blk = out_blocks[bi];
      for (size_t j = blk.size(); j-- > 0;) back(blk[j]);
      if (!blk[0].dx2.defined()) {  // (else the layer wrote g as dcat_h and dskip)
        ScopedRange r(bk.eng.device(), "concat bwd");
        run(ConcatBwd{g, at(dcat_h[bi]), at(dskip[bi])});
      }
      g = at(dcat_h[bi]);
    }
    for (size_t j = mid.size(); j-- > 0;) back(mid[j]);
    for (size_t bi = n_in; bi-- > 0;) {
      auto& blk = in_blocks[bi];
      const L* joiner = skip_joiner(bi);  // (a ResBlock there added the skip's gradient already)
      if (!joiner || !joiner->dx_add.defined()) run(Add{g, at(dskip[out_blocks.size() - 1 - bi]), g});
      for (size_t j = blk.size(); j-- > 0;) back(blk[j]);
    }
    // (the embedding gradients that filter gradients on the side lane sum are complete at a join)
    // Measured and not kept (H100, seed64 tf32, 2026-11-25, same run, 8 alternated pairs): that
    // join before the input convolution's backward instead, so that its filter gradient runs
    // beside the embedding's backward: 12.462 -> 12.466 ms.
    if (bk.emb_from_filter) bk.join_lanes();
    bk.embedding_bwd(labels_in);
    bk.join_lanes();
    ready(0);
  }
};

namespace {
Arch single_layer_arch(const Layer& l) {
  Arch a;
  a.input_blocks.push_back({l});
  return a;
}
ParamTable checked_table(const ModelConfig& cfg) {
  std::string err = cfg.validate();
  if (!err.empty()) throw std::invalid_argument("invalid model config: " + err);
  return build_param_table(cfg);
}
ParamTable checked_layer_table(const ModelConfig& cfg, const Layer& l) {
  std::string err = cfg.validate();
  if (!err.empty()) throw std::invalid_argument("invalid model config: " + err);
  return build_layer_param_table(cfg, l);
}
}  // namespace

Model::Model(const ModelConfig& cfg, Engine& eng)
    : Network(eng, checked_table(cfg)), cfg_(cfg), arch_(build_arch(cfg)) {
  impl_ = std::make_unique<Impl>(*this);
}

Model::Model(const ModelConfig& cfg, Engine& eng, const Layer& only)
    : Network(eng, checked_layer_table(cfg, only)), cfg_(cfg), arch_(single_layer_arch(only)), single_(true) {
  impl_ = std::make_unique<Impl>(*this);
}

Model::~Model() = default;

void Model::declare(Planner& pl, int B, Mode m) { impl_->declare(pl, B, m); }
Blocks* Model::blocks() { return &impl_->bk; }

void Model::trace(Ops& tracer, int B, Mode m) {
  Impl& I = *impl_;
  // Externals are absent-data views with the right shapes.
  const int R = cfg_.image_size;
  Tensor x(nullptr, DType::F32, {B, R, R, cfg_.in_channels});
  Tensor out(nullptr, DType::F32, {B, R, R, cfg_.out_channels()});
  if (single_) {  // the layer reads and writes activations directly
    const Layer& l = arch_.input_blocks[0][0];
    x = Tensor(nullptr, eng_.act_dtype(), {B, l.res, l.res, l.cin});
    out = Tensor(nullptr, eng_.act_dtype(), {B, layer_out_res(l), layer_out_res(l), l.cout});
  }
  Tensor t(nullptr, DType::F32, {B});
  Tensor labels = cfg_.class_cond ? Tensor(nullptr, DType::I32, {B}) : Tensor();
  Blocks& bk = I.bk;
  bk.tracing = &tracer;
  bk.filter_sums = 0;
  try {
    bk.B = B, bk.train = m == Mode::Train, bk.wgrad = m == Mode::Train, bk.seed = 0;
    I.x_in = x, I.t_in = t, I.labels_in = labels;
    if (single_) I.run(Fill{I.at(bk.semb), 0.f});  // an input the caller fills (emb_input())
    I.forward(out);
    if (m != Mode::Sample) I.backward(out);
  } catch (...) {
    bk.tracing = nullptr;
    throw;
  }
  bk.tracing = nullptr;
}

Tensor Model::emb_input() const {
  if (!single_)
    throw std::logic_error("Model::emb_input: only single-layer networks read an embedding input");
  return impl_->bk.semb.batch(planned_);
}

void Model::forward(const Tensor& x, const Tensor& t, const Tensor& labels, const Tensor& out, bool train,
                    uint64_t dropout_seed) {
  const int B = (int)x.dim[0];
  if (!planned_) plan(B, train ? Mode::Train : Mode::Sample);
  if (B > planned_) throw std::logic_error("Model::forward: batch larger than planned");
  if (train && mode_ != Mode::Train) throw std::logic_error("Model::forward(train): planned for sampling");
  Impl& I = *impl_;
  Blocks& bk = I.bk;
  bk.B = B;
  bk.train = train;
  bk.wgrad = mode_ == Mode::Train;
  bk.seed = dropout_seed;
  I.x_in = x;
  I.t_in = t;
  I.labels_in = cfg_.class_cond ? labels : Tensor();
  I.forward(out);
}

void Model::hold_weights(bool on) { impl_->bk.hold_shadow(on); }
void Model::weights_kept_by_optimizer(bool on) { impl_->bk.keep_shadow(on); }
void Model::refresh_weights() { impl_->bk.recast_shadow(); }
void Model::set_backward_joins(int layers) {
  if (layers < 1) throw std::logic_error("Model::set_backward_joins: at least 1 layer");
  impl_->join_every = layers;
}

void Model::set_bias_from_filter_grads(bool on) {
  if (planned_) throw std::logic_error("Model::set_bias_from_filter_grads: after plan()");
  impl_->bk.bias_in_filter = on ? 1 : 0;
}

void Model::set_bias_from_next_norm(bool on) {
  if (planned_) throw std::logic_error("Model::set_bias_from_next_norm: after plan()");
  impl_->bk.link_bias = on;
}

void Model::backward(const Tensor& dout) {
  Impl& I = *impl_;
  if (!I.bk.train || dout.dim[0] != I.bk.B)
    throw std::logic_error("Model::backward must follow forward(train=true) with the same batch");
  I.backward(dout);
}

}  // namespace unet
