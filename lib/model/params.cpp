#include "params.h"

#include <cmath>
#include <stdexcept>

#include "arch.h"

namespace unet {

namespace {
struct Builder {
  ParamTable t;
  void add(const std::string& name, std::vector<int64_t> shape, InitRule init, int64_t fan_in = 0) {
    ParamInfo p;
    p.name = name;
    p.shape = std::move(shape);
    p.init = init;
    p.fan_in = fan_in;
    p.conv3x3 = p.shape.size() == 4 && p.shape[2] == 3 && p.shape[3] == 3;
    p.numel = 1;
    for (auto d : p.shape) p.numel *= (size_t)d;
    p.offset = t.total;
    t.total += (p.numel + 63) / 64 * 64;  // 256-byte alignment of every tensor
    t.count += p.numel;
    t.params.push_back(std::move(p));
  }
  // Conv weight [o,i,k,k] and bias [o]; `zero` for zero_module().
  void conv(const std::string& pre, int i, int o, int k, bool zero = false) {
    auto r = zero ? InitRule::Zeros : InitRule::Uniform;
    add(pre + ".weight", {o, i, k, k}, r, (int64_t)i * k * k);
    add(pre + ".bias", {o}, r, (int64_t)i * k * k);
  }
  // 1-D conv with kernel 1 (attention qkv / proj_out): weight [o,i,1].
  void conv1d(const std::string& pre, int i, int o, bool zero = false) {
    auto r = zero ? InitRule::Zeros : InitRule::Uniform;
    add(pre + ".weight", {o, i, 1}, r, i);
    add(pre + ".bias", {o}, r, i);
  }
  void linear(const std::string& pre, int i, int o) {
    add(pre + ".weight", {o, i}, InitRule::Uniform, i);
    add(pre + ".bias", {o}, InitRule::Uniform, i);
  }
  void norm(const std::string& pre, int c) {
    add(pre + ".weight", {c}, InitRule::Ones);
    add(pre + ".bias", {c}, InitRule::Zeros);
  }
};

void add_layer(Builder& b, const ModelConfig& cfg, const Layer& l) {
  const int ed = cfg.time_embed_dim();
  switch (l.kind) {
    case Layer::Conv:
      b.conv(l.prefix, l.cin, l.cout, 3);
      break;
    case Layer::Down:
      b.conv(l.prefix + ".op", l.cin, l.cout, 3);
      break;
    case Layer::Up:
      b.conv(l.prefix + ".conv", l.cin, l.cout, 3);
      break;
    case Layer::Res:
      b.norm(l.prefix + ".in_layers.0", l.cin);
      b.conv(l.prefix + ".in_layers.2", l.cin, l.cout, 3);
      b.linear(l.prefix + ".emb_layers.1", ed, cfg.use_scale_shift_norm ? 2 * l.cout : l.cout);
      b.norm(l.prefix + ".out_layers.0", l.cout);
      b.conv(l.prefix + ".out_layers.3", l.cout, l.cout, 3, /*zero=*/true);
      if (l.cin != l.cout) b.conv(l.prefix + ".skip_connection", l.cin, l.cout, 1);
      break;
    case Layer::Attn:
      b.norm(l.prefix + ".norm", l.cin);
      b.conv1d(l.prefix + ".qkv", l.cin, 3 * l.cin);
      b.conv1d(l.prefix + ".proj_out", l.cin, l.cin, /*zero=*/true);
      break;
  }
}
}  // namespace

// The ResBlocks' embedding projections (emb_layers.1) first in the arena: their gradients come
// from one LinearGroupBwd at the end of the backward, after every layer's, so they must sit below
// every layer's parameters (the gradient-ready signal says "everything from this offset on is
// final", layer by layer, top down). Names, shapes and the checkpoint format are unchanged.
namespace {
void emb_layers_first(ParamTable& t) {
  size_t total = 0;
  for (bool emb : {true, false})
    for (auto& p : t.params)
      if ((p.name.find(".emb_layers.") != std::string::npos) == emb) {
        p.offset = total;
        total += (p.numel + 63) / 64 * 64;
      }
  t.total = total;
}
}  // namespace

ParamTable build_param_table(const ModelConfig& cfg) {
  Builder b;
  const Arch a = build_arch(cfg);
  const int mc = cfg.num_channels, ed = cfg.time_embed_dim();
  b.linear("time_embed.0", mc, ed);
  b.linear("time_embed.2", ed, ed);
  if (cfg.class_cond) b.add("label_emb.weight", {cfg.label_rows(), ed}, InitRule::Normal);
  for (auto& blk : a.input_blocks)
    for (auto& l : blk) add_layer(b, cfg, l);
  for (auto& l : a.middle) add_layer(b, cfg, l);
  for (auto& blk : a.output_blocks)
    for (auto& l : blk) add_layer(b, cfg, l);
  b.norm("out.0", a.out_cin);
  b.conv("out.2", cfg.level_channels(0), cfg.out_channels(), 3, /*zero=*/true);
  emb_layers_first(b.t);
  return std::move(b.t);
}

ParamTable build_param_table(const ClassifierConfig& cc) {
  Builder b;
  const ModelConfig cfg = cc.body();
  const Arch a = build_arch(cfg, /*encoder_only=*/true);
  const int mc = cfg.num_channels, ed = cfg.time_embed_dim(), C = a.out_cin;
  const int64_t T = (int64_t)a.out_res * a.out_res + 1;
  b.linear("time_embed.0", mc, ed);
  b.linear("time_embed.2", ed, ed);
  for (auto& blk : a.input_blocks)
    for (auto& l : blk) add_layer(b, cfg, l);
  for (auto& l : a.middle) add_layer(b, cfg, l);
  b.norm("out.0", C);
  b.add("out.2.positional_embedding", {C, T}, InitRule::Normal);
  b.t.params.back().std = 1.0 / std::sqrt((double)C);  // th.randn(C, T) / C ** 0.5
  b.conv1d("out.2.qkv_proj", C, 3 * C);
  b.conv1d("out.2.c_proj", C, cc.num_classes);
  emb_layers_first(b.t);
  return std::move(b.t);
}

ParamTable build_layer_param_table(const ModelConfig& cfg, const Layer& l) {
  Builder b;
  add_layer(b, cfg, l);
  return std::move(b.t);
}

const ParamInfo* ParamTable::find(const std::string& name) const {
  for (auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamInfo& ParamTable::at(const std::string& name) const {
  if (auto* p = find(name)) return *p;
  throw std::logic_error("no parameter named " + name);
}

void torch_to_engine(const ParamInfo& p, const float* src, float* dst) {
  if (!p.conv3x3) {
    for (size_t i = 0; i < p.numel; ++i) dst[i] = src[i];
    return;
  }
  const int64_t O = p.shape[0], I = p.shape[1];
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i)
      for (int k = 0; k < 9; ++k) dst[(o * 9 + k) * I + i] = src[(o * I + i) * 9 + k];
}

void engine_to_torch(const ParamInfo& p, const float* src, float* dst) {
  if (!p.conv3x3) {
    for (size_t i = 0; i < p.numel; ++i) dst[i] = src[i];
    return;
  }
  const int64_t O = p.shape[0], I = p.shape[1];
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i)
      for (int k = 0; k < 9; ++k) dst[(o * I + i) * 9 + k] = src[(o * 9 + k) * I + i];
}

}  // namespace unet
