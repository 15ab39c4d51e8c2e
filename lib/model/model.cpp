// The guided-diffusion UNet on the Backend op interface.
//
// Memory plan (per batch size, allocated once in plan()):
//  * saved for backward, per layer: its output, conv outputs that feed a GroupNorm (h1), the
//    emb projection, GroupNorm statistics, attention qkv / output / softmax weights, and the
//    concat input of every output block;
//  * NOT saved: GroupNorm+SiLU outputs, up/down-sampled copies and dropout results — backward
//    recomputes them into shared scratch buffers (cheap memory-bound work, saves ~half the memory);
//  * shared scratch S0..S2 (S2 with scale-shift only) and gradient scratch D0..D3, ping-pong gradient buffers
//  P0..P2, each of
//    the largest activation size; one gradient buffer per skip connection.
#include "model.h"

#include <algorithm>
#include <stdexcept>

#include "rng.h"

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
    // parameter offsets into the arena (SIZE_MAX = absent)
    size_t w0 = SIZE_MAX, b0 = SIZE_MAX;    // Conv/Down/Up conv, Attn qkv, Res in_layers.2
    size_t n1w = SIZE_MAX, n1b = SIZE_MAX;  // Res in_layers.0, Attn norm
    size_t ew = SIZE_MAX, eb = SIZE_MAX;    // Res emb_layers.1
    size_t n2w = SIZE_MAX, n2b = SIZE_MAX;  // Res out_layers.0
    size_t w2 = SIZE_MAX, b2 = SIZE_MAX;    // Res out_layers.3, Attn proj_out
    size_t sw = SIZE_MAX, sb = SIZE_MAX;    // Res skip_connection
    // saved activations
    const float* in = nullptr;  // input pointer of the last forward (owned elsewhere)
    float* out = nullptr;
    float *h1 = nullptr, *e = nullptr, *xu = nullptr;
    float *mean1 = nullptr, *rstd1 = nullptr, *mean2 = nullptr, *rstd2 = nullptr;
    float *qkv = nullptr, *att = nullptr, *attw = nullptr;
  };

  Model& m;
  Backend& be;
  const ModelConfig& cfg;
  int B = 0;
  size_t max_act = 0;  // floats per batch-of-B activation scratch
  std::vector<std::vector<L>> in_blocks, out_blocks;
  std::vector<L> mid;
  std::vector<float*> cat, dskip;  // per output block / per input block
  // embeddings
  float *temb = nullptr, *a1 = nullptr, *a1s = nullptr, *emb = nullptr, *semb = nullptr;
  float *d_semb = nullptr, *d_part = nullptr, *d_emb = nullptr, *d_a1s = nullptr, *d_a1 = nullptr,
        *DE = nullptr;
  const float* t_in = nullptr;
  const int32_t* labels_in = nullptr;
  const float* x_in = nullptr;
  // output layer
  size_t on_w = 0, on_b = 0, oc_w = 0, oc_b = 0;
  float *o_mean = nullptr, *o_rstd = nullptr;
  const float* h_last = nullptr;
  // scratch
  float* S[3] = {};
  float* D[4] = {};
  float* P[3] = {};
  bool train = false;
  uint64_t seed = 0;

  Impl(Model& model) : m(model), be(model.be_), cfg(model.cfg_) {
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
    const ParamTable& t = m.table_;
    on_w = t.at("out.0.weight").offset, on_b = t.at("out.0.bias").offset;
    oc_w = t.at("out.2.weight").offset, oc_b = t.at("out.2.bias").offset;
  }

  float* P_(size_t off) const { return m.params_ + off; }
  float* G_(size_t off) const { return m.grads_ + off; }
  float* alloc(size_t n) { return be.alloc(n); }

  template <class F>
  void each_layer(F f) {
    for (auto& b : in_blocks)
      for (auto& l : b) f(l);
    for (auto& l : mid) f(l);
    for (auto& b : out_blocks)
      for (auto& l : b) f(l);
  }

  void plan(int batch) {
    B = batch;
    const size_t b = (size_t)B;
    max_act = b * cfg.in_channels * cfg.image_size * cfg.image_size;
    max_act = std::max(max_act, b * cfg.out_channels() * cfg.image_size * cfg.image_size);
    int max_e = 0;
    each_layer([&](L& s) {
      const Layer& l = s.l;
      size_t hw_in = (size_t)l.res * l.res, hw_out = (size_t)s.ro * s.ro;
      size_t big = std::max({hw_in * l.cin, hw_out * l.cout, hw_out * l.cin});
      if (l.kind == Layer::Attn) big = std::max(big, hw_in * 3 * l.cin);
      max_act = std::max(max_act, b * big);
      if (l.kind == Layer::Res) max_e = std::max(max_e, cfg.use_scale_shift_norm ? 2 * l.cout : l.cout);
    });
    S[0] = alloc(max_act), S[1] = alloc(max_act);
    if (cfg.use_scale_shift_norm) S[2] = alloc(max_act);  // pre-SiLU value, scale-shift only
    for (auto& d : D) d = alloc(max_act);
    for (auto& p : P) p = alloc(max_act);
    const int mc = cfg.num_channels, ed = cfg.time_embed_dim();
    temb = alloc(b * mc);
    a1 = alloc(b * ed), a1s = alloc(b * ed), emb = alloc(b * ed), semb = alloc(b * ed);
    d_semb = alloc(b * ed), d_part = alloc(b * ed), d_emb = alloc(b * ed), d_a1s = alloc(b * ed),
    d_a1 = alloc(b * ed);
    DE = alloc(b * std::max(max_e, 1));
    each_layer([&](L& s) {
      const Layer& l = s.l;
      size_t hw_in = (size_t)l.res * l.res, hw_out = (size_t)s.ro * s.ro;
      s.out = alloc(b * hw_out * l.cout);
      if (l.kind == Layer::Res) {
        s.h1 = alloc(b * hw_out * l.cout);
        s.e = alloc(b * (cfg.use_scale_shift_norm ? 2 * l.cout : l.cout));
        if (l.updown) s.xu = alloc(b * hw_out * l.cin);
        s.mean1 = alloc(b * kGroups), s.rstd1 = alloc(b * kGroups);
        s.mean2 = alloc(b * kGroups), s.rstd2 = alloc(b * kGroups);
      } else if (l.kind == Layer::Attn) {
        s.mean1 = alloc(b * kGroups), s.rstd1 = alloc(b * kGroups);
        s.qkv = alloc(b * hw_in * 3 * l.cin);
        s.att = alloc(b * hw_in * l.cin);
        s.attw = alloc(b * l.heads * hw_in * hw_in);
      }
    });
    cat.clear();
    for (auto& blk : out_blocks) {
      const Layer& l = blk[0].l;
      cat.push_back(alloc(b * l.res * l.res * l.cin));
    }
    dskip.clear();
    for (auto& blk : in_blocks) {
      const L& last = blk.back();
      dskip.push_back(alloc(b * last.ro * last.ro * last.l.cout));
    }
    o_mean = alloc(b * kGroups), o_rstd = alloc(b * kGroups);
  }

  // ---------------- forward ----------------
  void emb_fwd() {
    const int mc = cfg.num_channels, ed = cfg.time_embed_dim();
    const ParamTable& t = m.table_;
    be.range_push("time_embed fwd");
    be.timestep_embedding(t_in, temb, B, mc);
    be.linear_fwd(temb, P_(t.at("time_embed.0.weight").offset), P_(t.at("time_embed.0.bias").offset), a1, B,
                  mc, ed);
    be.silu_fwd(a1, a1s, (size_t)B * ed);
    be.linear_fwd(a1s, P_(t.at("time_embed.2.weight").offset), P_(t.at("time_embed.2.bias").offset), emb, B,
                  ed, ed);
    if (cfg.class_cond) be.embedding_add_fwd(labels_in, P_(t.at("label_emb.weight").offset), emb, B, ed);
    be.silu_fwd(emb, semb, (size_t)B * ed);
    be.range_pop();
  }

  float dropout_p() const { return train ? cfg.dropout : 0.0f; }
  uint64_t dseed(const L& s) const { return hash64(seed, (uint64_t)s.index); }

  void resample_fwd(int updown, const float* x, float* y, int H, int C) {
    if (updown < 0)
      be.avgpool2x2_fwd(x, y, B, H, H, C);
    else
      be.upsample2x_fwd(x, y, B, H, H, C);
  }
  void resample_bwd(int updown, const float* dy, float* dx, int H, int C) {
    if (updown < 0)
      be.avgpool2x2_bwd(dy, dx, B, H, H, C);
    else
      be.upsample2x_bwd(dy, dx, B, H, H, C);
  }

  // SiLU(GN(in)) (optionally resampled) -> returns the conv1 input pointer (scratch).
  const float* res_conv1_input(L& s) {
    const Layer& l = s.l;
    be.groupnorm_fwd(s.in, P_(s.n1w), P_(s.n1b), S[0], s.mean1, s.rstd1, B, l.res * l.res, l.cin, kGroups,
                     true);
    if (!l.updown) return S[0];
    resample_fwd(l.updown, S[0], S[1], l.res, l.cin);
    return S[1];
  }
  // Activation that feeds conv2 (after norm, emb, SiLU, dropout) into S[0]; for scale-shift
  // also leaves GN(h1) in S[1] and the pre-SiLU value in S[2] (backward needs them).
  void res_conv2_input(L& s) {
    const Layer& l = s.l;
    const int hw = s.ro * s.ro;
    const size_t n = (size_t)B * hw * l.cout;
    if (!cfg.use_scale_shift_norm) {
      be.groupnorm_fwd(s.h1, P_(s.n2w), P_(s.n2b), S[0], s.mean2, s.rstd2, B, hw, l.cout, kGroups, true);
    } else {
      be.groupnorm_fwd(s.h1, P_(s.n2w), P_(s.n2b), S[1], s.mean2, s.rstd2, B, hw, l.cout, kGroups, false);
      be.scale_shift_fwd(S[1], s.e, S[2], B, hw, l.cout);
      be.silu_fwd(S[2], S[0], n);
    }
    if (dropout_p() > 0) be.dropout_fwd(S[0], S[0], n, dropout_p(), dseed(s));
  }

  void res_fwd(L& s) {
    const Layer& l = s.l;
    const int hw = s.ro * s.ro, ed = cfg.time_embed_dim();
    const float* c1in = res_conv1_input(s);
    const float* xs = s.in;
    if (l.updown) {
      resample_fwd(l.updown, s.in, s.xu, l.res, l.cin);
      xs = s.xu;
    }
    be.conv2d_fwd(c1in, P_(s.w0), P_(s.b0), s.h1, B, s.ro, s.ro, l.cin, l.cout, 3, 1);
    const int ecols = cfg.use_scale_shift_norm ? 2 * l.cout : l.cout;
    be.linear_fwd(semb, P_(s.ew), P_(s.eb), s.e, B, ed, ecols);
    if (!cfg.use_scale_shift_norm) be.add_bcast_fwd(s.h1, s.e, B, hw, l.cout);
    res_conv2_input(s);
    be.conv2d_fwd(S[0], P_(s.w2), P_(s.b2), S[1], B, s.ro, s.ro, l.cout, l.cout, 3, 1);
    const size_t n = (size_t)B * hw * l.cout;
    if (s.sw != SIZE_MAX) {
      be.conv2d_fwd(xs, P_(s.sw), P_(s.sb), s.out, B, s.ro, s.ro, l.cin, l.cout, 1, 1);
      be.add(s.out, S[1], s.out, n);
    } else {
      be.add(xs, S[1], s.out, n);
    }
  }

  void attn_fwd(L& s) {
    const Layer& l = s.l;
    const int T = l.res * l.res, C = l.cin;
    be.groupnorm_fwd(s.in, P_(s.n1w), P_(s.n1b), S[0], s.mean1, s.rstd1, B, T, C, kGroups, false);
    be.linear_fwd(S[0], P_(s.w0), P_(s.b0), s.qkv, B * T, C, 3 * C);
    be.attention_fwd(s.qkv, s.att, s.attw, B, T, C, l.heads, !cfg.use_new_attention_order);
    be.linear_fwd(s.att, P_(s.w2), P_(s.b2), S[1], B * T, C, C);
    be.add(s.in, S[1], s.out, (size_t)B * T * C);
  }

  void layer_fwd(L& s, const float* in) {
    s.in = in;
    be.range_push(s.fwd_name.c_str());
    const Layer& l = s.l;
    switch (l.kind) {
      case Layer::Conv:
        be.conv2d_fwd(in, P_(s.w0), P_(s.b0), s.out, B, l.res, l.res, l.cin, l.cout, 3, 1);
        break;
      case Layer::Down:
        be.conv2d_fwd(in, P_(s.w0), P_(s.b0), s.out, B, l.res, l.res, l.cin, l.cout, 3, 2);
        break;
      case Layer::Up:
        be.upsample2x_fwd(in, S[0], B, l.res, l.res, l.cin);
        be.conv2d_fwd(S[0], P_(s.w0), P_(s.b0), s.out, B, s.ro, s.ro, l.cin, l.cout, 3, 1);
        break;
      case Layer::Res:
        res_fwd(s);
        break;
      case Layer::Attn:
        attn_fwd(s);
        break;
    }
    be.range_pop();
  }

  void forward(const float* x, float* y) {
    x_in = x;
    emb_fwd();
    const float* h = x;
    for (auto& blk : in_blocks)
      for (auto& s : blk) {
        layer_fwd(s, h);
        h = s.out;
      }
    for (auto& s : mid) {
      layer_fwd(s, h);
      h = s.out;
    }
    size_t skip = in_blocks.size();
    for (size_t bi = 0; bi < out_blocks.size(); ++bi) {
      auto& blk = out_blocks[bi];
      const L& src = in_blocks[--skip].back();
      const Layer& l0 = blk[0].l;
      const int cskip = src.l.cout, ch = l0.cin - cskip;
      be.range_push("concat fwd");
      be.concat_fwd(h, src.out, cat[bi], B, l0.res * l0.res, ch, cskip);
      be.range_pop();
      h = cat[bi];
      for (auto& s : blk) {
        layer_fwd(s, h);
        h = s.out;
      }
    }
    h_last = h;
    const int R = cfg.image_size, C = m.arch_.out_cin;
    be.range_push("out fwd");
    be.groupnorm_fwd(h, P_(on_w), P_(on_b), S[0], o_mean, o_rstd, B, R * R, C, kGroups, true);
    be.conv2d_fwd(S[0], P_(oc_w), P_(oc_b), y, B, R, R, C, cfg.out_channels(), 3, 1);
    be.range_pop();
  }

  // ---------------- backward ----------------
  void res_bwd(L& s, const float* dout, float* dx) {
    const Layer& l = s.l;
    const int hw = s.ro * s.ro, ed = cfg.time_embed_dim();
    const size_t n_out = (size_t)B * hw * l.cout;
    const float* xs = l.updown ? s.xu : s.in;
    // skip path
    const float* dxs = dout;
    if (s.sw != SIZE_MAX) {
      be.conv2d_bwd(xs, P_(s.sw), dout, D[0], G_(s.sw), G_(s.sb), B, s.ro, s.ro, l.cin, l.cout, 1, 1);
      dxs = D[0];
    }
    // out_layers: recompute conv2's input, then back through conv2, dropout, SiLU/norm/emb
    res_conv2_input(s);
    be.conv2d_bwd(S[0], P_(s.w2), dout, D[1], G_(s.w2), G_(s.b2), B, s.ro, s.ro, l.cout, l.cout, 3, 1);
    if (dropout_p() > 0) be.dropout_bwd(D[1], D[1], n_out, dropout_p(), dseed(s));
    const int ecols = cfg.use_scale_shift_norm ? 2 * l.cout : l.cout;
    if (!cfg.use_scale_shift_norm) {
      be.groupnorm_bwd(s.h1, P_(s.n2w), P_(s.n2b), s.mean2, s.rstd2, D[1], D[2], G_(s.n2w), G_(s.n2b), B, hw,
                       l.cout, kGroups, true);
      be.add_bcast_bwd(D[2], DE, B, hw, l.cout);
    } else {
      be.silu_bwd(S[2], D[1], D[1], n_out);
      be.scale_shift_bwd(S[1], s.e, D[1], D[3], DE, B, hw, l.cout);
      be.groupnorm_bwd(s.h1, P_(s.n2w), P_(s.n2b), s.mean2, s.rstd2, D[3], D[2], G_(s.n2w), G_(s.n2b), B, hw,
                       l.cout, kGroups, false);
    }
    be.linear_bwd(semb, P_(s.ew), DE, d_part, G_(s.ew), G_(s.eb), B, ed, ecols);
    be.add(d_semb, d_part, d_semb, (size_t)B * ed);
    // in_layers: recompute SiLU(GN(x)) (resampled), back through conv1, resample, norm
    const float* c1in = res_conv1_input(s);
    be.conv2d_bwd(c1in, P_(s.w0), D[2], D[3], G_(s.w0), G_(s.b0), B, s.ro, s.ro, l.cin, l.cout, 3, 1);
    const float* dg1 = D[3];
    if (l.updown) {  // D[1] (conv2's input gradient) is consumed by now
      resample_bwd(l.updown, D[3], D[1], l.res, l.cin);
      dg1 = D[1];
    }
    be.groupnorm_bwd(s.in, P_(s.n1w), P_(s.n1b), s.mean1, s.rstd1, dg1, dx, G_(s.n1w), G_(s.n1b), B,
                     l.res * l.res, l.cin, kGroups, true);
    const size_t n_in = (size_t)B * l.res * l.res * l.cin;
    if (l.updown) {
      resample_bwd(l.updown, dxs, D[1], l.res, l.cin);
      dxs = D[1];
    }
    be.add(dx, dxs, dx, n_in);
  }

  void attn_bwd(L& s, const float* dout, float* dx) {
    const Layer& l = s.l;
    const int T = l.res * l.res, C = l.cin;
    be.linear_bwd(s.att, P_(s.w2), dout, D[0], G_(s.w2), G_(s.b2), B * T, C, C);
    be.attention_bwd(s.qkv, s.attw, D[0], D[1], B, T, C, l.heads, !cfg.use_new_attention_order);
    be.groupnorm_fwd(s.in, P_(s.n1w), P_(s.n1b), S[0], s.mean1, s.rstd1, B, T, C, kGroups, false);
    be.linear_bwd(S[0], P_(s.w0), D[1], D[2], G_(s.w0), G_(s.b0), B * T, C, 3 * C);
    be.groupnorm_bwd(s.in, P_(s.n1w), P_(s.n1b), s.mean1, s.rstd1, D[2], D[3], G_(s.n1w), G_(s.n1b), B, T, C,
                     kGroups, false);
    be.add(dout, D[3], dx, (size_t)B * T * C);
  }

  // dx may be nullptr only for the first conv (the model input needs no gradient).
  void layer_bwd(L& s, const float* dout, float* dx) {
    be.range_push(s.bwd_name.c_str());
    const Layer& l = s.l;
    switch (l.kind) {
      case Layer::Conv:
        be.conv2d_bwd(s.in, P_(s.w0), dout, dx, G_(s.w0), G_(s.b0), B, l.res, l.res, l.cin, l.cout, 3, 1);
        break;
      case Layer::Down:
        be.conv2d_bwd(s.in, P_(s.w0), dout, dx, G_(s.w0), G_(s.b0), B, l.res, l.res, l.cin, l.cout, 3, 2);
        break;
      case Layer::Up:
        be.upsample2x_fwd(s.in, S[0], B, l.res, l.res, l.cin);
        be.conv2d_bwd(S[0], P_(s.w0), dout, D[0], G_(s.w0), G_(s.b0), B, s.ro, s.ro, l.cin, l.cout, 3, 1);
        be.upsample2x_bwd(D[0], dx, B, l.res, l.res, l.cin);
        break;
      case Layer::Res:
        res_bwd(s, dout, dx);
        break;
      case Layer::Attn:
        attn_bwd(s, dout, dx);
        break;
    }
    be.range_pop();
  }

  void backward(const float* dy) {
    const int ed = cfg.time_embed_dim(), mc = cfg.num_channels;
    be.fill(d_semb, 0.0f, (size_t)B * ed);
    // out: GN+SiLU then conv
    const int R = cfg.image_size, C = m.arch_.out_cin;
    be.range_push("out bwd");
    be.groupnorm_fwd(h_last, P_(on_w), P_(on_b), S[0], o_mean, o_rstd, B, R * R, C, kGroups, true);
    be.conv2d_bwd(S[0], P_(oc_w), dy, D[0], G_(oc_w), G_(oc_b), B, R, R, C, cfg.out_channels(), 3, 1);
    int cur = 0;  // P[cur] holds the gradient flowing down
    be.groupnorm_bwd(h_last, P_(on_w), P_(on_b), o_mean, o_rstd, D[0], P[cur], G_(on_w), G_(on_b), B, R * R,
                     C, kGroups, true);
    be.range_pop();
    const size_t n_in = in_blocks.size();
    for (size_t bi = out_blocks.size(); bi-- > 0;) {
      auto& blk = out_blocks[bi];
      for (size_t j = blk.size(); j-- > 0;) {
        int nxt = j == 0 ? 2 : (cur == 0 ? 1 : 0);  // layer 0 writes the concat gradient into P[2]
        layer_bwd(blk[j], P[cur], P[nxt]);
        cur = nxt;
      }
      const Layer& l0 = blk[0].l;
      const size_t si = n_in - 1 - bi;
      const int cskip = in_blocks[si].back().l.cout, ch = l0.cin - cskip;
      be.range_push("concat bwd");
      be.concat_bwd(P[2], P[0], dskip[si], B, l0.res * l0.res, ch, cskip);
      be.range_pop();
      cur = 0;
    }
    for (size_t j = mid.size(); j-- > 0;) {
      int nxt = cur == 0 ? 1 : 0;
      layer_bwd(mid[j], P[cur], P[nxt]);
      cur = nxt;
    }
    for (size_t bi = n_in; bi-- > 0;) {
      auto& blk = in_blocks[bi];
      const L& last = blk.back();
      be.add(P[cur], dskip[bi], P[cur], (size_t)B * last.ro * last.ro * last.l.cout);
      for (size_t j = blk.size(); j-- > 0;) {
        int nxt = cur == 0 ? 1 : 0;
        layer_bwd(blk[j], P[cur], bi == 0 ? nullptr : P[nxt]);
        cur = nxt;
      }
    }
    // embeddings
    const ParamTable& t = m.table_;
    be.range_push("time_embed bwd");
    be.silu_bwd(emb, d_semb, d_emb, (size_t)B * ed);
    if (cfg.class_cond)
      be.embedding_bwd(labels_in, d_emb, G_(t.at("label_emb.weight").offset), B, cfg.num_classes, ed);
    size_t w2 = t.at("time_embed.2.weight").offset, b2 = t.at("time_embed.2.bias").offset;
    size_t w0 = t.at("time_embed.0.weight").offset, b0 = t.at("time_embed.0.bias").offset;
    be.linear_bwd(a1s, P_(w2), d_emb, d_a1s, G_(w2), G_(b2), B, ed, ed);
    be.silu_bwd(a1, d_a1s, d_a1, (size_t)B * ed);
    be.linear_bwd(temb, P_(w0), d_a1, nullptr, G_(w0), G_(b0), B, mc, ed);
    be.range_pop();
  }
};

Model::Model(const ModelConfig& cfg, Backend& be) : cfg_(cfg), be_(be) {
  std::string err = cfg_.validate();
  if (!err.empty()) throw std::invalid_argument("invalid model config: " + err);
  table_ = build_param_table(cfg_);
  arch_ = build_arch(cfg_);
  params_ = be_.alloc(table_.total);
  grads_ = be_.alloc(table_.total);
  be_.fill(grads_, 0.0f, table_.total);
  impl_ = std::make_unique<Impl>(*this);
}

Model::~Model() = default;

void Model::plan(int B) {
  if (B <= planned_) return;
  impl_->plan(B);
  planned_ = B;
}

void Model::forward(const float* x, const float* t, const int32_t* labels, float* out, int B, bool train,
                    uint64_t dropout_seed) {
  if (B > planned_) plan(B);
  impl_->B = B;
  impl_->t_in = t;
  impl_->labels_in = labels;
  impl_->train = train;
  impl_->seed = dropout_seed;
  impl_->forward(x, out);
}

void Model::backward(const float* dout, int B) {
  if (B != impl_->B || !impl_->train)
    throw std::logic_error("Model::backward must follow forward(train=true) with the same batch");
  impl_->backward(dout);
}

}  // namespace unet
