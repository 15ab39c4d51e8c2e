#include "arch.h"

#include <algorithm>

namespace unet {

Arch build_arch(const ModelConfig& cfg, bool encoder_only) {
  Arch a;
  int ch = cfg.level_channels(0);
  int res = cfg.image_size;
  auto has_attn = [&](int r) {
    return std::find(cfg.attention_resolutions.begin(), cfg.attention_resolutions.end(), r) !=
           cfg.attention_resolutions.end();
  };
  auto name = [](const char* part, size_t i, size_t j) {
    return std::string(part) + "." + std::to_string(i) + "." + std::to_string(j);
  };
  a.input_blocks.push_back({Layer{Layer::Conv, "input_blocks.0.0", cfg.in_channels, ch, res}});
  std::vector<int> skip_ch = {ch};
  const int levels = (int)cfg.channel_mult.size();
  for (int level = 0; level < levels; ++level) {
    for (int r = 0; r < cfg.num_res_blocks; ++r) {
      size_t bi = a.input_blocks.size();
      std::vector<Layer> blk;
      int out = cfg.level_channels(level);
      blk.push_back(Layer{Layer::Res, name("input_blocks", bi, 0), ch, out, res});
      ch = out;
      if (has_attn(res))
        blk.push_back(Layer{Layer::Attn, name("input_blocks", bi, 1), ch, ch, res, 0, cfg.heads_for(ch)});
      a.input_blocks.push_back(blk);
      skip_ch.push_back(ch);
    }
    if (level != levels - 1) {
      size_t bi = a.input_blocks.size();
      if (cfg.resblock_updown)
        a.input_blocks.push_back({Layer{Layer::Res, name("input_blocks", bi, 0), ch, ch, res, -1}});
      else
        a.input_blocks.push_back({Layer{Layer::Down, name("input_blocks", bi, 0), ch, ch, res}});
      skip_ch.push_back(ch);
      res /= 2;
    }
  }
  a.middle = {Layer{Layer::Res, "middle_block.0", ch, ch, res},
              Layer{Layer::Attn, "middle_block.1", ch, ch, res, 0, cfg.heads_for(ch)},
              Layer{Layer::Res, "middle_block.2", ch, ch, res}};
  if (encoder_only) {
    a.out_cin = ch;
    a.out_res = res;
    return a;
  }
  for (int level = levels - 1; level >= 0; --level) {
    for (int i = 0; i <= cfg.num_res_blocks; ++i) {
      size_t bi = a.output_blocks.size();
      int ich = skip_ch.back();
      skip_ch.pop_back();
      int out = cfg.level_channels(level);
      std::vector<Layer> blk;
      blk.push_back(Layer{Layer::Res, name("output_blocks", bi, 0), ch + ich, out, res});
      ch = out;
      if (has_attn(res))
        blk.push_back(
            Layer{Layer::Attn, name("output_blocks", bi, blk.size()), ch, ch, res, 0, cfg.heads_for(ch)});
      if (level && i == cfg.num_res_blocks) {
        if (cfg.resblock_updown)
          blk.push_back(Layer{Layer::Res, name("output_blocks", bi, blk.size()), ch, ch, res, +1});
        else
          blk.push_back(Layer{Layer::Up, name("output_blocks", bi, blk.size()), ch, ch, res});
        res *= 2;
      }
      a.output_blocks.push_back(blk);
    }
  }
  a.out_cin = ch;
  a.out_res = res;
  return a;
}

}  // namespace unet
