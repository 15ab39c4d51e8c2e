// unet init — fresh weights (PyTorch's default initialisation) written as an HDF5 checkpoint.
#include "init.h"

#include <algorithm>
#include <cstdio>

#include "checkpoint.h"
#include "commands.h"
#include "params.h"
#include "util.h"

namespace unet {

namespace {
struct InitArgs {
  std::string out, preset;
  uint64_t seed = 0;
  bool print_params = false;
  bool classifier = false;
  double class_dropout = 0;
  CLI::Option* class_dropout_opt = nullptr;
  ModelFlags flags;
  ClassifierFlags cflags;
};

void print_table(const ParamTable& t, const std::string& what) {
  std::printf("# %s\n# %zu tensors, %zu parameters; name, then PyTorch shape\n", what.c_str(),
              t.params.size(), t.count);
  for (auto& p : t.params) {
    std::string shape;
    for (size_t i = 0; i < p.shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(p.shape[i]);
    std::printf("%s %s\n", p.name.c_str(), shape.c_str());
  }
}

std::vector<std::string> all_presets() {
  std::vector<std::string> v = preset_names();
  for (auto& n : classifier_preset_names())
    if (std::find(v.begin(), v.end(), n) == v.end()) v.push_back(n);
  return v;
}
}  // namespace

void register_init(CLI::App& app) {
  auto args = std::make_shared<InitArgs>();
  auto* sub = app.add_subcommand("init", "fresh model (or --classifier) weights -> HDF5 checkpoint");
  sub->footer(
      "Weights follow PyTorch's defaults (conv/linear U(-1/sqrt(fan_in), 1/sqrt(fan_in)), GroupNorm 1/0,\n"
      "label_emb N(0,1), guided-diffusion's zero modules zero) and depend only on --seed.\n"
      "Presets imagenet64/128/256/512, imagenet256-uncond and lsun256 are the configurations of OpenAI's\n"
      "released guided-diffusion models (scripts/unet_ckpt.py import converts their .pt files).\n"
      "--classifier writes guided-diffusion's noisy-image classifier (EncoderUNetModel, attention pool) for\n"
      "`unet train-classifier` and `unet sample --classifier`: --classifier-* flags, --image-size,\n"
      "--in-channels, --num-classes, --diffusion-steps, --noise-schedule; --preset "
      "default|tiny32|imagenet64|\n"
      "imagenet128|imagenet256|imagenet512 (OpenAI's released classifiers).\n"
      "Example: unet init -o tiny.h5 --preset tiny32 --seed 1");
  // -o is checked in the callback: --print-params needs none.
  sub->add_option("-o,--output", args->out, "checkpoint to write (.h5); required");
  sub->add_option("--seed", args->seed, "random seed, 0 to 2^63-1 (default 0)")->check(seed_range());
  // Lets the 550 M-parameter presets be checked against PyTorch without writing 2.2 GB.
  sub->add_flag("--print-params", args->print_params,
                "write nothing; print the configuration and every tensor's name and PyTorch shape");
  sub->add_option("--preset", args->preset,
                  "model preset (default seed64); imagenet*, lsun256: OpenAI's released models. With "
                  "--classifier: default, tiny32, imagenet64/128/256/512 (OpenAI's released classifiers)")
      ->check(CLI::IsMember(all_presets()));
  sub->add_flag("--classifier", args->classifier,
                "write a noisy-image classifier (guided-diffusion's EncoderUNetModel) instead of a diffusion "
                "model");
  args->class_dropout_opt =
      sub->add_option(
             "--class-dropout", args->class_dropout,
             "classifier-free guidance: P in [0, 1) with --class-cond; P > 0 gives label_emb the null "
             "class's row (num_classes + 1 rows) and records P as `unet train`'s default class dropout")
          ->group("Model")
          ->check(real_range(0, 1));
  args->flags.add(sub, /*with_preset=*/false);
  args->cflags.add(sub, /*with_shared=*/false, /*with_preset=*/false);
  sub->callback([args] {
    Checkpoint ck;
    std::string overrides;
    if (args->classifier) {
      args->cflags.preset = args->preset.empty() ? "default" : args->preset;
      if (args->class_dropout_opt->count())
        throw UserError(
            "--class-dropout is a diffusion-model flag (classifier-free guidance), not a classifier's");
      ck.is_classifier = true;
      ck.ccfg = args->cflags.resolve(&args->flags);  // refuses diffusion-only model flags
      for (auto& o : args->cflags.opts)
        if (o.first->count()) overrides += (overrides.empty() ? "" : " ") + o.first->get_name();
    } else {
      if (args->cflags.any_given())
        throw UserError("--classifier-* flags describe a classifier: add --classifier");
      args->flags.preset = args->preset.empty() ? "seed64" : args->preset;
      const std::vector<std::string> models = preset_names();
      if (std::find(models.begin(), models.end(), args->flags.preset) == models.end())
        throw UserError("--preset " + args->flags.preset + " is a classifier preset: add --classifier");
      ck.cfg = args->flags.resolve();
      if (args->class_dropout_opt->count()) {
        ck.cfg.class_dropout = args->class_dropout;
        ck.cfg.null_class = args->class_dropout > 0;
        if (!ck.cfg.class_cond)
          throw UserError("--class-dropout needs --class-cond (the null class is a row of label_emb)");
        const std::string err = ck.cfg.validate();
        if (!err.empty()) throw UserError("invalid model: " + err);
      }
    }
    for (auto& o : args->flags.opts)
      if (o.first->count()) overrides += (overrides.empty() ? "" : " ") + o.first->get_name();
    if (args->class_dropout_opt->count())
      overrides += (overrides.empty() ? "" : " ") + std::string("--class-dropout");
    const ParamTable t = ck.table();
    if (args->print_params) {
      print_table(t, args->classifier ? "classifier " + ck.ccfg.describe() : ck.cfg.describe());
      return;
    }
    if (args->out.empty()) throw CLI::RequiredError("--output");
    check_writable_dir_for(args->out);  // fail before the work, not after
    // The same checks as loading: a checkpoint init writes can always be read back.
    check_model_size(t, 2, "the model flags");  // the weights + the tensor being written
    ck.model = init_params(t, args->seed);
    save_checkpoint(args->out, ck);

    std::string what = (args->classifier ? "classifier " : "") +
                       (args->classifier ? args->cflags.preset : args->flags.preset);
    if (!overrides.empty()) what += " with " + overrides;
    std::printf("%s: %s, %.2f M parameters, seed %llu\n", args->out.c_str(), what.c_str(), t.count / 1e6,
                (unsigned long long)args->seed);
  });
}

}  // namespace unet
