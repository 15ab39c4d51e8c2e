// The UNet's block structure for a configuration, exactly as guided-diffusion's UNetModel
// builds it. Both the parameter table (names/shapes) and the model (forward/backward) walk this.
// The classifier (EncoderUNetModel) is the same input and middle blocks (encoder_only).
#pragma once
#include <string>
#include <vector>

#include "config.h"

namespace unet {

struct Layer {
  enum Kind { Conv, Res, Attn, Down, Up } kind;
  std::string prefix;  // e.g. "input_blocks.4.0"
  int cin = 0;         // input channels (for output-block ResBlocks: h channels + skip channels)
  int cout = 0;        // output channels
  int res = 0;         // spatial size (H = W) of the input
  int updown = 0;      // Res only: 0 plain, -1 down (resblock_updown), +1 up
  int heads = 0;       // Attn only
};

struct Arch {
  std::vector<std::vector<Layer>> input_blocks;   // each block's output is pushed on the skip stack
  std::vector<Layer> middle;                      // Res, Attn, Res
  std::vector<std::vector<Layer>> output_blocks;  // each starts with concat(h, skip.pop())
  int out_cin = 0;                                // channels into `out` (GN, SiLU, conv / pool)
  int out_res = 0;                                // feature-map size into `out`
};

// encoder_only: no output blocks; `out` reads the middle block (EncoderUNetModel).
Arch build_arch(const ModelConfig& cfg, bool encoder_only = false);

}  // namespace unet
