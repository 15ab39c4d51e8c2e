// Each subcommand file registers itself on the CLI11 app; main.cpp only dispatches.
#pragma once
#include <CLI/CLI.hpp>

#include "engine.h"
#include "config.h"

namespace unet {
void register_prepare(CLI::App& app);
void register_init(CLI::App& app);
void register_train(CLI::App& app);
void register_sample(CLI::App& app);
void register_profile(CLI::App& app);

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
  ModelConfig apply(ModelConfig base) const;  // base + explicit flags, validated (UserError)
  ModelConfig resolve() const;                // preset(--preset) + explicit flags, validated
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
};
}  // namespace unet
