// Shared flag groups: guided-diffusion model flags and --device/--precision.
#include <cstdio>

#include "commands.h"
#include "util.h"

namespace unet {

void ModelFlags::add(CLI::App* app, bool with_preset) {
  if (with_preset)
    preset_opt =
        app->add_option("--preset", preset,
                        "model preset (default seed64); imagenet*, lsun256: OpenAI's released models")
            ->check(CLI::IsMember(preset_names()));
  auto opt_int = [&](const char* name, int ModelConfig::*field, const char* help) {
    auto* o = app->add_option(name, v.*field, help)->group("Model");
    opts.push_back({o, [this, field](ModelConfig& c) { c.*field = v.*field; }});
  };
  auto opt_bool = [&](const char* name, bool ModelConfig::*field, const char* help) {
    auto* o = app->add_flag(name, v.*field, help)->group("Model");
    opts.push_back({o, [this, field](ModelConfig& c) { c.*field = v.*field; }});
  };
  opt_int("--image-size", &ModelConfig::image_size, "image size (square), default 64");
  opt_int("--in-channels", &ModelConfig::in_channels, "image channels, default 3");
  opt_int("--num-channels", &ModelConfig::num_channels, "base channel count, default 64");
  auto* cm = app->add_option("--channel-mult", channel_mult,
                             "channel multiplier per level (may be fractional, e.g. 0.5), default 1,2,3,4")
                 ->group("Model");
  opts.push_back(
      {cm, [this](ModelConfig& c) { c.channel_mult = parse_mult_list(channel_mult, "--channel-mult"); }});
  opt_int("--num-res-blocks", &ModelConfig::num_res_blocks, "ResBlocks per level, default 2");
  auto* ar = app->add_option("--attention-resolutions", attention_resolutions,
                             "feature-map sizes with attention (16 = 16x16), default 16,8")
                 ->group("Model");
  opts.push_back({ar, [this](ModelConfig& c) {
                    c.attention_resolutions =
                        attention_resolutions.empty() || attention_resolutions == "none"
                            ? std::vector<int>{}
                            : parse_int_list(attention_resolutions, "--attention-resolutions");
                  }});
  opt_int("--num-heads", &ModelConfig::num_heads,
          "attention heads (when --num-head-channels is -1), default 1");
  opt_int("--num-head-channels", &ModelConfig::num_head_channels,
          "channels per attention head, -1 = use --num-heads; default 32");
  opt_bool("--use-new-attention-order", &ModelConfig::use_new_attention_order,
           "split qkv before heads (default true)");
  opt_bool("--use-scale-shift-norm", &ModelConfig::use_scale_shift_norm,
           "FiLM-style scale/shift from the embedding");
  opt_bool("--resblock-updown", &ModelConfig::resblock_updown, "ResBlocks do the up/downsampling");
  opt_bool("--learn-sigma", &ModelConfig::learn_sigma, "output the variance too (out channels x2)");
  opt_bool("--class-cond", &ModelConfig::class_cond, "class-conditional (label embedding)");
  opt_int("--num-classes", &ModelConfig::num_classes, "number of classes with --class-cond, default 1000");
  auto* dr = app->add_option("--dropout", v.dropout, "dropout in ResBlocks, default 0.0")->group("Model");
  opts.push_back({dr, [this](ModelConfig& c) { c.dropout = v.dropout; }});
  opt_int("--diffusion-steps", &ModelConfig::diffusion_steps, "diffusion steps T, default 1000");
  auto* ns =
      app->add_option("--noise-schedule", v.noise_schedule, "linear (default) or cosine")->group("Model");
  opts.push_back({ns, [this](ModelConfig& c) { c.noise_schedule = v.noise_schedule; }});
}

bool ModelFlags::any_given() const {
  if (preset_opt && preset_opt->count()) return true;
  for (auto& o : opts)
    if (o.first->count()) return true;
  return false;
}

ModelConfig ModelFlags::apply(ModelConfig base) const {
  for (auto& o : opts)
    if (o.first->count()) o.second(base);
  std::string err = base.validate();
  if (!err.empty()) throw UserError("invalid model: " + err);
  return base;
}

ModelConfig ModelFlags::resolve() const { return apply(unet::preset(preset)); }

void DeviceFlags::add(CLI::App* app) {
  app->add_option("--device", device, "cuda or cpu (default: cuda when a GPU is present)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app->add_option("--precision", precision, "fp32, tf32 or bf16 (default: tf32 on GPU, fp32 on CPU)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
}

std::unique_ptr<Backend> DeviceFlags::make(bool quiet) const {
  std::unique_ptr<Backend> be;
  if (device == "cuda" || device.empty()) {
    std::string why;
    be = make_cuda_backend(&why);
    if (!be && device == "cuda") throw UserError("--device cuda: no usable GPU (" + why + ")");
    if (!be && !quiet) std::fprintf(stderr, "unet: no GPU (%s); using the CPU\n", why.c_str());
  }
  if (!be) be = make_cpu_backend();
  Precision p =
      precision.empty() ? (be->is_cuda() ? Precision::TF32 : Precision::FP32) : parse_precision(precision);
  if (!be->is_cuda() && p != Precision::FP32)
    throw UserError(std::string("--precision ") + precision_name(p) +
                    " needs a GPU; the CPU engine is fp32 only");
  be->set_precision(p);
  if (!quiet) std::fprintf(stderr, "unet: device %s, precision %s\n", be->name().c_str(), precision_name(p));
  return be;
}

}  // namespace unet
