// unet profile — per-kernel (nsys cuda_gpu_kern_sum style), per-layer and roofline breakdown of
// one layer or the full training step, from CUPTI activity records. Parses flags, resolves the
// model, and hands the work to lib/profile (run_profile).

#include <climits>
#include <cmath>
#include <cstdio>
#include <memory>

#include "checkpoint.h"
#include "commands.h"
#include "env_vars.h"
#include "profile_run.h"
#include "util.h"

namespace unet {

namespace {

struct ProfileArgs {
  ProfileRequest r;
  std::string checkpoint, precision = "tf32", kernels;
  ModelFlags model;
  CLI::Option* in_ch_opt = nullptr;
};

void run(ProfileArgs& a) {
  ProfileRequest& r = a.r;
  if (!a.kernels.empty()) set_kernel_overrides(a.kernels);
  r.precision = parse_precision(a.precision);
  a.checkpoint = checkpoint_arg(a.checkpoint, "profile");
  if (!a.checkpoint.empty()) check_input_exists(a.checkpoint);
  check_environment({{"checkpoint", a.checkpoint}});
  if (!r.trace.empty()) {  // before the GPU work (run_profile checks the directory)
    check_writable_dir_for(r.trace);
    check_not_input(r.trace, a.checkpoint, "checkpoint");
  }
  // --in-channels: a layer's input channels (any count), or with --layer model the image channels
  // (validated with the model). A layer's count is taken out before the model is validated.
  int layer_in = 0;
  if (a.in_ch_opt->count() && r.layer != "model") {
    layer_in = a.model.v.in_channels;
    if (layer_in < 1 || layer_in > kModelLimits.channels)
      throw UserError("--in-channels " + std::to_string(layer_in) + " is out of range (1 to " +
                      std::to_string(kModelLimits.channels) + ")");
    a.model.v.in_channels = 3;
  }
  // The model configuration: a checkpoint's, else preset + flags. It also gives the layer defaults.
  r.model_what = a.model.preset;
  if (!a.checkpoint.empty()) {
    if (r.layer == "model") {
      if (a.model.any_given())
        throw UserError(a.model.given_names() + ": model flags cannot be combined with a checkpoint (" +
                        a.checkpoint + ") when profiling the model");
      Checkpoint ck = load_checkpoint(a.checkpoint);
      r.cfg = ck.cfg;
      r.weights = std::move(ck.model);
    } else {
      r.cfg = a.model.apply(read_checkpoint_config(a.checkpoint));
    }
    r.model_what = a.checkpoint;
  } else {
    r.cfg = a.model.resolve();
  }
  if (layer_in) r.in_ch = layer_in;
  const std::string text = run_profile(r);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void register_profile(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  ProfileRequest& r = a->r;
  auto* sub = app.add_subcommand("profile", "per-kernel, per-layer and roofline GPU time breakdown (CUPTI)");
  sub->add_option("checkpoint", a->checkpoint, "checkpoint whose model (and weights) to profile (optional)");
  sub->add_option(
         "--layer", r.layer,
         "what to run: model (the full training step; default) or one layer alone: resblock, attention, "
         "conv3x3, conv1x1, groupnorm, linear, upsample, downsample, adamw")
      ->check(CLI::IsMember({"model", "resblock", "attention", "conv3x3", "conv1x1", "groupnorm", "linear",
                             "upsample", "downsample", "adamw"}));
  sub->add_option("--pass", r.pass,
                  "forward, backward or step (forward+backward, + AdamW for the model; default); with --layer model, forward is sampling's forward (eval mode, no dropout, memory planned for sampling)")
      ->check(CLI::IsMember({"forward", "backward", "step"}));
  // Every number is bounded at parse time (a layer as large as the largest model's allows).
  const ModelLimits& L = kModelLimits;
  sub->add_option("--batch-size", r.batch, "batch size (default 32)")->check(int_range(1, kMaxBatch));
  sub->add_option(
         "--resolution", r.resolution,
         "layer input size R (RxR feature maps; default: --image-size, 16 for attention, half for upsample)")
      ->check(int_range(1, L.image_size));
  sub->add_option("--out-channels", r.out_ch, "layer output channels (default: = input channels)")
      ->check(int_range(1, L.channels));
  sub->add_option("--emb-channels", r.emb_ch,
                  "resblock timestep-embedding width (default 4 x --num-channels)")
      ->check(int_range(1, 4 * L.channels));
  sub->add_option("--params", r.params, "adamw: number of parameters (default: the model's)")
      ->check(int_range(1, INT32_MAX));
  sub->add_option("--iters", r.iters, "timed iterations (default 20)")->check(int_range(1, 1000000));
  sub->add_option("--warmup", r.warmup, "untimed warm-up iterations first (default 5)")
      ->check(int_range(0, 1000000));
  sub->add_option("--precision", a->precision, "fp32, tf32 (default) or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  sub->add_option("--kernels", a->kernels,
                  "force kernel variants, e.g. conv=im2col (family or op = variant; also UNET_KERNELS)");
  sub->add_option("--format", r.format, "table (default), csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}));
  sub->add_option("--trace", r.trace, "write a Chrome trace-event JSON (Perfetto, chrome://tracing) here");
  sub->add_flag("--ops", r.op_ranges,
                "also mark every op as a range named op[variant] (finer roofline, more host overhead)");
  sub->add_flag(
      "--measure-peaks", r.measure_peaks,
      "measure the peaks (1 GiB device copy, 8192^3 cuBLAS GEMM) instead of datasheet/device values");
  sub->add_option("--peak-tflops", r.peak_tflops, "override the peak TFLOP/s of the roofline")
      ->check(real_range(0, INFINITY, true));
  sub->add_option("--peak-gbps", r.peak_gbps, "override the peak GB/s of the roofline")
      ->check(real_range(0, INFINITY, true));
  sub->add_flag("--no-plain-timing", r.no_plain, "skip the extra timing run without the profiler attached");
  sub->add_flag("--no-graph", r.no_graph,
                "time eager launches (one per kernel) instead of CUDA-graph replays of a captured iteration");
  a->model.add(sub);
  a->in_ch_opt = sub->get_option("--in-channels");
  a->in_ch_opt->description(
      "layer input channels (default --num-channels); with --layer model: image channels (default 3)");
  sub->footer(
      "Kernel times are CUPTI activity records (GPU start/end), summed like `nsys stats --report\n"
      "cuda_gpu_kern_sum`; layer ranges are the model's range_push/pop names (also emitted as NVTX).\n"
      "The timed iterations replay one captured iteration as a CUDA graph (as `unet train` does);\n"
      "the layer table comes from an eager pass of the same iterations before it (--no-graph: eager only).\n"
      "Layer FLOPs count 2 per multiply-add; bytes are each op's inputs read and outputs written once.\n"
      "Examples:\n"
      "  unet profile --layer model --batch-size 32\n"
      "  unet profile --layer resblock --batch-size 32 --resolution 64 --in-channels 192 --out-channels 64\n"
      "  unet profile --layer attention --resolution 16 --in-channels 256 --format json --trace att.json");
  sub->callback([a] { run(*a); });
}

}  // namespace unet
