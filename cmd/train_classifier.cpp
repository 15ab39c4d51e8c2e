// unet train-classifier DATA.h5 — guided-diffusion's classifier_train.py: a noisy-image classifier
// (EncoderUNetModel) on a labelled dataset, through the training loop of `unet train`
// (train.cpp run_train; lib/train/classifier_train.h).
#include "commands.h"
#include "train_args.h"

namespace unet {

void register_train_classifier(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  a->classifier = true;
  // classifier_train.py's defaults: lr 3e-4, no EMA, no weight decay, noised inputs, a validation
  // batch every 5 steps.
  a->opt.lr = 3e-4;
  a->opt.ema_rate = 0.0;
  auto* sub = app.add_subcommand(
      "train-classifier", "train a noisy-image classifier (classifier guidance) on a labelled dataset");
  sub->footer(
      "guided-diffusion's classifier_train.py: each image is noised to x_t at a uniform timestep t (q_sample "
      "with\n"
      "the classifier's --diffusion-steps and --noise-schedule; --noised=false: t = 0, clean images), the\n"
      "classifier sees t, the loss is the cross-entropy (batch mean); AdamW. metrics.csv: loss, acc1, acc5 "
      "and\n"
      "each per quarter of [0, T) (loss_q0 ... acc5_q3), val_* the same on --val-data. --resume continues\n"
      "exactly, taking every setting from the checkpoint unless a flag overrides it.\n"
      "A fresh classifier comes from --preset and --classifier-* flags (as unet init --classifier) or "
      "--init.\n"
      "Example: unet train-classifier d.h5 --preset tiny32 --num-classes 10 --batch-size 64 --steps 20000");
  add_train_flags(sub, a.get());
  auto& o = a->opt;
  sub->add_flag(
      "--noised", o.noised,
      "noise the inputs at uniform timesteps (default true; --noised=false: clean images at t = 0)");
  sub->add_option("--val-data", o.val_data, "labelled validation dataset: val_* columns in metrics.csv");
  sub->add_option("--eval-every", o.eval_every,
                  "a validation batch after every N-th step (default 5, classifier_train.py's eval_interval)")
      ->check(setting_check("--eval-every"));
  a->cmodel.add(sub, /*with_shared=*/true, /*with_preset=*/true);
  sub->callback([a] { run_train(*a); });
}

}  // namespace unet
