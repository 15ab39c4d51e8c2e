// Each subcommand file registers itself on the CLI11 app; main.cpp only dispatches.
#pragma once
#include <CLI/CLI.hpp>

#include "config.h"
#include "engine.h"

namespace unet {
void register_prepare(CLI::App& app);
void register_init(CLI::App& app);
void register_train(CLI::App& app);
void register_sample(CLI::App& app);
void register_profile(CLI::App& app);
void register_eval(CLI::App& app);
void register_train_classifier(CLI::App& app);

// Flag validators that check the text before CLI11 converts it, so every bad value reads alike:
// "--jobs: must be an integer from 1 to 1024, not 0" (no 309-digit bounds, no silent wrap of -1
// into an unsigned seed, no nan/inf slipping through a `> 0` test).
CLI::Validator int_range(int64_t lo, int64_t hi);
// A finite number in [lo, hi] (hi = infinity: no upper bound); lo_open excludes lo itself.
CLI::Validator real_range(double lo, double hi, bool lo_open = false);
// Seeds: the documented range, 0 to 2^63-1 (stored as an int64 attribute in checkpoints).
CLI::Validator seed_range();
constexpr int64_t kMaxBatch = 65536;      // --batch-size of train and sample
constexpr int64_t kMaxSamples = 1 << 20;  // sample -n

// guided-diffusion's model flags (--image-size ... --noise-schedule), shared by init/train/
// profile. Values given explicitly override the preset / base config in apply().
struct ModelFlags {
  std::string preset = "seed64";
  ModelConfig v;  // parsed values; only those whose option was given are applied
  std::string channel_mult, attention_resolutions;
  std::vector<std::pair<CLI::Option*, std::function<void(ModelConfig&)>>> opts;
  CLI::Option* preset_opt = nullptr;
  void add(CLI::App* app, bool with_preset = true);
  bool any_given() const;                     // any model flag (or --preset) on the command line
  std::string given_names() const;            // those flags, "--preset --use-kl" (for messages)
  ModelConfig apply(ModelConfig base) const;  // base + explicit flags, validated (UserError)
  ModelConfig resolve() const;                // preset(--preset) + explicit flags, validated
};

// The classifier's flags (guided-diffusion's create_classifier names, dashed: --classifier-width
// ...). The flags it shares with the diffusion model (--image-size, --in-channels, --num-classes,
// --diffusion-steps, --noise-schedule) are added here with_shared, else read from a ModelFlags of
// the same command (unet init --classifier). Explicit values override the preset.
struct ClassifierFlags {
  std::string preset = "default";
  ClassifierConfig v;
  std::string channel_mult, attention_resolutions;
  std::vector<std::pair<CLI::Option*, std::function<void(ClassifierConfig&)>>> opts;
  CLI::Option* preset_opt = nullptr;
  void add(CLI::App* app, bool with_shared, bool with_preset);
  bool any_given() const;
  std::string given_names() const;  // the flags given, "--preset --classifier-width" (for messages)
  // base + explicit flags (+ the shared ones of `model`, when given there), validated (UserError).
  ClassifierConfig apply(ClassifierConfig base, const ModelFlags* model = nullptr) const;
  ClassifierConfig resolve(const ModelFlags* model = nullptr) const;  // classifier_preset(preset) + flags
};

// --device cuda|cpu and --precision fp32|tf32|bf16 with the SPEC's defaults.
struct DeviceFlags {
  std::string device;     // "" = auto
  std::string precision;  // "" = default for the device
  std::string kernels;    // --kernels family=variant,...
  void add(CLI::App* app);
  // Creates the engine, printing which one was chosen (to stderr). UserError when
  // --device cuda is asked for without a GPU.
  std::unique_ptr<Engine> make(bool quiet = false) const;
  // The same, printing nothing: `note` receives "device <engine name>" (with the reason when no
  // GPU was found), for the command's own summary line on stdout, so that stderr only ever
  // carries warnings and errors.
  std::unique_ptr<Engine> make(std::string* note) const;
};
}  // namespace unet
