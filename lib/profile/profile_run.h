// `unet profile`: runs one layer or the whole training step on the GPU under CUPTI and builds
// the report. The layers are the model's own code — a one-layer Model for resblock, attention,
// upsample, downsample and conv3x3, the trainer's TrainStep for the model — so the profile times
// exactly what `unet train` runs; conv1x1, groupnorm and linear time their ops alone, adamw the
// trainer's Optimizer.
#pragma once
#include <string>
#include <vector>

#include "config.h"
#include "device.h"

namespace unet {

struct ProfileRequest {
  std::string layer =
      "model";  // model|resblock|attention|conv3x3|conv1x1|groupnorm|linear|upsample|downsample|adamw
  std::string pass = "step";     // forward|backward|step
  std::string format = "table";  // table|csv|json
  std::string trace;             // Chrome trace path ("" = none)
  Precision precision = Precision::TF32;
  ModelConfig cfg;             // the model (preset/flags or a checkpoint's)
  std::vector<float> weights;  // the model's weights (layer model; empty: fresh init)
  std::string model_what;      // how the model was named (preset or checkpoint path)
  int batch = 32;
  int resolution = 0;  // 0: per-layer default
  int in_ch = 0;       // 0: the model's num_channels
  int out_ch = 0;      // 0: = in_ch
  int emb_ch = 0;      // 0: 4 x num_channels
  long long params = 0;
  int iters = 20, warmup = 5;
  bool measure_peaks = false, op_ranges = false, no_plain = false, no_graph = false;
  double peak_tflops = 0, peak_gbps = 0;
};

// The formatted report (table, CSV or JSON). Throws UserError on bad requests or without a GPU.
std::string run_profile(const ProfileRequest& r);

}  // namespace unet
