// The parameter list of a model configuration: guided-diffusion's state_dict names, PyTorch
// shapes, init rule, and the offset of each tensor in the flat parameter arena.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace unet {

enum class InitRule {
  Uniform,  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch conv/linear default, weight and bias)
  Ones,     // GroupNorm weight
  Zeros,    // GroupNorm bias, and zero_module() tensors
  Normal,   // N(0, std^2): label_emb (std 1), the classifier's positional_embedding (1/sqrt(C))
};

struct ParamInfo {
  std::string name;            // e.g. "input_blocks.1.0.in_layers.2.weight"
  std::vector<int64_t> shape;  // PyTorch shape, e.g. {64, 3, 3, 3}
  InitRule init = InitRule::Uniform;
  int64_t fan_in = 0;    // for Uniform
  double std = 1.0;      // for Normal
  bool conv3x3 = false;  // 4-D [Co,Ci,3,3] stored as [Co,3,3,Ci] in the engine
  size_t offset = 0;     // floats from the start of the arena (256-byte aligned)
  size_t numel = 0;
};

struct ParamTable {
  std::vector<ParamInfo> params;                         // in guided-diffusion state_dict order
  size_t total = 0;                                      // arena size in floats (incl. alignment padding)
  size_t count = 0;                                      // number of parameters (sum of numel)
  const ParamInfo* find(const std::string& name) const;  // nullptr if absent
  const ParamInfo& at(const std::string& name) const;    // throws std::logic_error if absent
};

ParamTable build_param_table(const ModelConfig& cfg);
// guided-diffusion's EncoderUNetModel (pool "attention"): time_embed, input_blocks, middle_block
// as the UNet's, then out.0 (GroupNorm) and out.2 (AttentionPool2d: positional_embedding [C, T],
// qkv_proj [3C, C, 1], c_proj [num_classes, C, 1]).
ParamTable build_param_table(const ClassifierConfig& cfg);
struct Layer;
// The parameters of one layer of the UNet alone, named as in the UNet (for one-layer networks).
ParamTable build_layer_param_table(const ModelConfig& cfg, const Layer& l);

// PyTorch layout <-> engine layout for one tensor (identity except conv3x3).
void torch_to_engine(const ParamInfo& p, const float* src, float* dst);
void engine_to_torch(const ParamInfo& p, const float* src, float* dst);

}  // namespace unet
