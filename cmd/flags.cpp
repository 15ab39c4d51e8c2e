// Shared flag groups: guided-diffusion model flags and --device/--precision.
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "util.h"

namespace unet {

namespace {
std::string fmt_real(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

CLI::Validator int_range(int64_t lo, int64_t hi) {
  const std::string want = "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, want](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end || errno == ERANGE || std::isspace((unsigned char)s[0]) || v < lo || v > hi)
          return want + ", not " + s;
        return "";
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator real_range(double lo, double hi, bool lo_open) {
  std::string want = "must be a finite number ";
  if (std::isinf(hi))
    want += (lo_open ? "> " : ">= ") + fmt_real(lo);
  else
    want += (lo_open ? "in (" : "in [") + fmt_real(lo) + ", " + fmt_real(hi) + "]";
  return CLI::Validator(
      [lo, hi, lo_open, want](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end || std::isspace((unsigned char)s[0]) || !std::isfinite(v) || v < lo ||
            (lo_open && v == lo) || v > hi)
          return want + ", not " + s;
        return "";
      },
      "NUMBER");
}

CLI::Validator seed_range() { return int_range(0, INT64_MAX); }

void ModelFlags::add(CLI::App* app, bool with_preset) {
  if (with_preset)
    preset_opt =
        app->add_option("--preset", preset,
                        "model preset (default seed64); imagenet*, lsun256: OpenAI's released models")
            ->check(CLI::IsMember(preset_names()));
  // Integers here only need to be integers; ModelConfig::validate() names the real bounds.
  auto opt_int = [&](const char* name, int ModelConfig::*field, const char* help) {
    auto* o = app->add_option(name, v.*field, help)->group("Model")->check(int_range(INT32_MIN, INT32_MAX));
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
  auto* dr = app->add_option("--dropout", v.dropout, "dropout in ResBlocks, default 0.0")
                 ->group("Model")
                 ->check(real_range(0, 1));
  opts.push_back({dr, [this](ModelConfig& c) { c.dropout = v.dropout; }});
  opt_int("--diffusion-steps", &ModelConfig::diffusion_steps, "diffusion steps T, default 1000");
  auto* ns =
      app->add_option("--noise-schedule", v.noise_schedule, "linear (default) or cosine")->group("Model");
  opts.push_back({ns, [this](ModelConfig& c) { c.noise_schedule = v.noise_schedule; }});
  opt_bool("--use-kl", &ModelConfig::use_kl,
           "train on the variational bound alone, x T (guided-diffusion's RESCALED_KL)");
  opt_bool("--predict-xstart", &ModelConfig::predict_xstart, "the model predicts x0 instead of eps");
  opt_bool("--rescale-learned-sigmas", &ModelConfig::rescale_learned_sigmas,
           "scale the hybrid loss's vb term by T/1000 (guided-diffusion's RESCALED_MSE)");
  opt_bool("--rescale-timesteps", &ModelConfig::rescale_timesteps, "the model sees t x 1000/T instead of t");
}

bool ModelFlags::any_given() const {
  if (preset_opt && preset_opt->count()) return true;
  for (auto& o : opts)
    if (o.first->count()) return true;
  return false;
}

std::string ModelFlags::given_names() const {
  std::string s;
  if (preset_opt && preset_opt->count()) s = preset_opt->get_name();
  for (auto& o : opts)
    if (o.first->count()) s += (s.empty() ? "" : " ") + o.first->get_name();
  return s;
}

ModelConfig ModelFlags::apply(ModelConfig base) const {
  for (auto& o : opts)
    if (o.first->count()) o.second(base);
  std::string err = base.validate();
  if (!err.empty()) throw UserError("invalid model: " + err);
  return base;
}

ModelConfig ModelFlags::resolve() const { return apply(unet::preset(preset)); }

void ClassifierFlags::add(CLI::App* app, bool with_shared, bool with_preset) {
  if (with_preset)
    preset_opt =
        app->add_option("--preset", preset,
                        "classifier preset (default: guided-diffusion's classifier defaults); imagenet64/"
                        "128/256/512: OpenAI's released classifiers")
            ->check(CLI::IsMember(classifier_preset_names()));
  const char* G = "Classifier";
  auto opt_int = [&](const char* name, int ClassifierConfig::*field, const char* help) {
    auto* o = app->add_option(name, v.*field, help)->group(G)->check(int_range(INT32_MIN, INT32_MAX));
    opts.push_back({o, [this, field](ClassifierConfig& c) { c.*field = v.*field; }});
  };
  auto opt_bool = [&](const char* name, bool ClassifierConfig::*field, const char* help) {
    auto* o = app->add_flag(name, v.*field, help)->group(G);
    opts.push_back({o, [this, field](ClassifierConfig& c) { c.*field = v.*field; }});
  };
  opt_int("--classifier-width", &ClassifierConfig::width, "base channel count (model_channels), default 128");
  opt_int("--classifier-depth", &ClassifierConfig::depth, "ResBlocks per level (num_res_blocks), default 2");
  auto* cm = app->add_option("--classifier-channel-mult", channel_mult,
                             "channel multiplier per level (default: create_classifier's for the image size: "
                             "64 -> 1,2,3,4, 128 -> 1,1,2,3,4, 256 -> 1,1,2,2,4,4, 512 -> 0.5,1,1,2,2,4,4)")
                 ->group(G);
  opts.push_back({cm, [this](ClassifierConfig& c) {
                    c.channel_mult = parse_mult_list(channel_mult, "--classifier-channel-mult");
                  }});
  auto* ar = app->add_option("--classifier-attention-resolutions", attention_resolutions,
                             "feature-map sizes with attention (16 = 16x16), default 32,16,8")
                 ->group(G);
  opts.push_back({ar, [this](ClassifierConfig& c) {
                    c.attention_resolutions =
                        attention_resolutions.empty() || attention_resolutions == "none"
                            ? std::vector<int>{}
                            : parse_int_list(attention_resolutions, "--classifier-attention-resolutions");
                  }});
  opt_bool("--classifier-use-scale-shift-norm", &ClassifierConfig::use_scale_shift_norm,
           "FiLM-style scale/shift from the embedding (default true; =false to turn off)");
  opt_bool("--classifier-resblock-updown", &ClassifierConfig::resblock_updown,
           "ResBlocks do the downsampling (default true; =false to turn off)");
  auto* pl = app->add_option("--classifier-pool", v.pool, "output head: attention (the only one implemented)")
                 ->group(G);
  opts.push_back({pl, [this](ClassifierConfig& c) { c.pool = v.pool; }});
  opt_int("--classifier-num-head-channels", &ClassifierConfig::num_head_channels,
          "channels per attention head, in the blocks and the pool (guided-diffusion fixes 64)");
  if (!with_shared) return;
  opt_int("--image-size", &ClassifierConfig::image_size, "image size (square), default 64");
  opt_int("--in-channels", &ClassifierConfig::in_channels, "image channels, default 3");
  opt_int("--num-classes", &ClassifierConfig::num_classes, "classes (logits), default 1000");
  opt_int("--diffusion-steps", &ClassifierConfig::diffusion_steps,
          "diffusion steps T of the noise the classifier is trained on, default 1000");
  auto* ns = app->add_option("--noise-schedule", v.noise_schedule, "linear (default) or cosine")->group(G);
  opts.push_back({ns, [this](ClassifierConfig& c) { c.noise_schedule = v.noise_schedule; }});
}

bool ClassifierFlags::any_given() const {
  if (preset_opt && preset_opt->count()) return true;
  for (auto& o : opts)
    if (o.first->count()) return true;
  return false;
}

std::string ClassifierFlags::given_names() const {
  std::string s;
  if (preset_opt && preset_opt->count()) s = preset_opt->get_name();
  for (auto& o : opts)
    if (o.first->count()) s += (s.empty() ? "" : " ") + o.first->get_name();
  return s;
}

ClassifierConfig ClassifierFlags::apply(ClassifierConfig base, const ModelFlags* model) const {
  if (model) {
    // The flags both networks have; every other model flag describes a diffusion model only.
    static const char* const kShared[] = {"--image-size", "--in-channels", "--num-classes",
                                          "--diffusion-steps", "--noise-schedule"};
    for (auto& o : model->opts) {
      if (!o.first->count()) continue;
      const std::string name = o.first->get_name();
      bool shared = false;
      for (const char* k : kShared) shared |= name == k;
      if (!shared)
        throw UserError(name +
                        " is a diffusion-model flag; a classifier takes --classifier-width, "
                        "--classifier-depth, --classifier-channel-mult, --classifier-attention-resolutions, "
                        "... (see --help)");
    }
    auto given = [&](const char* n) {
      for (auto& o : model->opts)
        if (o.first->count() && o.first->get_name() == n) return true;
      return false;
    };
    if (given("--image-size")) base.image_size = model->v.image_size;
    if (given("--in-channels")) base.in_channels = model->v.in_channels;
    if (given("--num-classes")) base.num_classes = model->v.num_classes;
    if (given("--diffusion-steps")) base.diffusion_steps = model->v.diffusion_steps;
    if (given("--noise-schedule")) base.noise_schedule = model->v.noise_schedule;
  }
  for (auto& o : opts)
    if (o.first->count()) o.second(base);
  const std::string err = base.validate();
  if (!err.empty()) throw UserError("invalid classifier: " + err);
  return base;
}

ClassifierConfig ClassifierFlags::resolve(const ModelFlags* model) const {
  return apply(classifier_preset(preset), model);
}

void DeviceFlags::add(CLI::App* app) {
  app->add_option("--device", device, "cuda or cpu (default: cuda when a GPU is present)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app->add_option("--precision", precision,
                  "fp32, tf32 or bf16 (default: tf32 on GPU, fp32 on CPU; bf16 on the CPU is an exact but "
                  "slow emulation of the GPU's rounding)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app->add_option("--kernels", kernels,
                  "force kernel variants, e.g. conv=ref (the CPU reference loops) or conv=im2col (family or "
                  "op = variant, comma-separated; also UNET_KERNELS)");
}

std::unique_ptr<Engine> DeviceFlags::make(bool quiet) const {
  std::string note;
  auto eng = make(&note);
  if (!quiet) std::fprintf(stderr, "unet: %s\n", note.c_str());
  return eng;
}

std::unique_ptr<Engine> DeviceFlags::make(std::string* note) const {
  if (!kernels.empty()) set_kernel_overrides(kernels);
  std::unique_ptr<Engine> eng;
  std::string no_gpu;
  if (device != "cpu") {
    std::string why;
    eng = make_cuda_engine(precision.empty() ? Precision::TF32 : parse_precision(precision), &why);
    if (!eng && device == "cuda") throw UserError("--device cuda: no usable GPU (" + why + ")");
    if (!eng) no_gpu = " (no GPU: " + why + ")";
  }
  if (!eng) {
    const Precision p = precision.empty() ? Precision::FP32 : parse_precision(precision);
    if (p == Precision::TF32)
      throw UserError("--precision tf32 needs a GPU; the CPU engine computes fp32 (or emulates bf16)");
    eng = make_cpu_engine(p);
  }
  check_kernel_overrides(eng->base_ops());  // a forced variant this engine lacks: refused now
  *note = "device " + eng->name() + no_gpu;
  return eng;
}

}  // namespace unet
