// `unet train-classifier`: guided-diffusion's classifier_train.py on the shared training loop
// (trainer.h run_training): each batch is noised at uniform timesteps (q_sample; with noised off,
// t = 0 and the clean images), the classifier sees the original timestep, the loss is the
// cross-entropy of its logits (mean over the batch), AdamW (with the loop's clipping, warmup and an
// optional EMA), micro-batches and data-parallel ranks as `unet train`.
//
// Logged per window, as guided-diffusion's log_loss_dict: loss, top-1 and top-5 accuracy (acc1,
// acc5), and each of them per quarter of [0, T) (loss_q0..3, acc1_q0..3, acc5_q0..3). With a
// validation set, every eval_every steps (at steps 0, E, 2E, ... counted before the step, as
// classifier_train.py) one validation batch goes through the same noising and forward, no
// gradients: val_loss, val_acc1, val_acc5 and their quartiles, averaged over the window's
// validation batches. Validation batches come from their own deterministic loader (seed, index of
// the evaluation), so a resumed run evaluates the same batches.
#pragma once
#include <memory>

#include "classifier.h"
#include "dataloader.h"
#include "diffusion.h"
#include "rng.h"
#include "train_step.h"
#include "trainer.h"

namespace unet {

// The classifier's step: q_sample, forward, cross-entropy (scale 1/B: the batch mean), backward.
class ClassifierStep : public StepBase {
 public:
  ClassifierStep(Engine& eng, Classifier& cls, Optimizer& opt, int B, int microbatch);

  // Inputs: x0, noise [B,H,W,C] f32, t [B] f32 (the classifier's timestep), coef [2B] =
  // sqrt(abar_t) | sqrt(1 - abar_t), labels i32 [B], quartile i32 [B]; set_timesteps() fills t,
  // coef and quartile.
  Tensor x0, noise, t, coef, labels, quartile;
  Tensor terms;  // f32 [B, kClassTerms] of the last step
  Tensor stats;  // f32 [kClassStats] since reset_stats()
  // The validation batch's inputs (same layout) and sums.
  Tensor val_x0, val_noise, val_t, val_coef, val_labels, val_quartile, val_stats;

  // t, coef, quartile for integer timesteps ti (noised), or t = 0 with coef (1, 0) (clean images);
  // asynchronous uploads from pinned memory. val: into the validation inputs.
  void set_timesteps(const Diffusion& d, const int* ti, bool noised, bool val = false);
  void reset_stats();

  void forward(uint64_t dropout_seed, int micro = 0) override;
  void backward(int micro = 0) override;
  // The validation batch: q_sample, forward, loss terms into val_stats; no gradients.
  void evaluate();

 private:
  Classifier& cls_;
  int T_;
  Tensor xt_, logits_, dlogits_, val_terms_;
  float* h_[2][3] = {};  // pinned t, coef, quartile (as i32) for the step and for validation
};

class ClassifierTask final : public TrainTask {
 public:
  ClassifierTask(const ClassifierConfig& cfg, const TrainOptions& o);
  int diffusion_steps() const override { return cfg_.diffusion_steps; }
  bool dropout() const override { return false; }
  void check_data(const DatasetInfo& info, const std::string& path) const override;
  Network& build(Engine& eng) override;
  void make_step(Engine& eng, Optimizer& opt, int Bl, int microbatch, Communicator* comm) override;
  void start(Engine& eng, const Checkpoint& ck, bool resume, int64_t step, int rank, int world) override;
  std::vector<std::string> columns() const override;
  void set_batch(const Batch& b, int64_t step, int first) override;
  void enqueue(uint64_t dropout_seed) override { step_->enqueue(dropout_seed); }
  void after_step(int64_t step) override;
  double window(Communicator* comm, double n_samples, std::map<std::string, double>& row, std::string& terms,
                std::string& tail) override;
  void reset_window() override;
  bool window_finite(Communicator* comm) override;
  void fill_checkpoint(Checkpoint& c) const override;
  bool keep_ema() const override { return o_.ema_rate > 0; }

  // The validation batches evaluated before step `step` (0-based steps s < step with s % E == 0).
  static int64_t evaluations_before(int64_t step, int64_t every) {
    return every > 0 ? (step + every - 1) / every : 0;
  }

 private:
  ClassifierConfig cfg_;
  TrainOptions o_;
  Engine* eng_ = nullptr;
  Communicator* comm_ = nullptr;
  std::unique_ptr<Classifier> cls_;
  std::unique_ptr<ClassifierStep> step_;
  std::unique_ptr<Diffusion> diff_;
  std::unique_ptr<DataLoader> val_;
  // The validation batches' own seed: their order, flips, timesteps and noise are a function of
  // (seed, evaluation index) only.
  uint64_t val_seed() const { return hash64(o_.seed, 0x76616c6964ull); }
  int Bl_ = 0;
  int32_t* host_labels_ = nullptr;
  std::vector<int> host_t_;
  int64_t quartile_n_[4] = {0, 0, 0, 0}, val_quartile_n_[4] = {0, 0, 0, 0};
  int64_t val_batches_ = 0;  // in the log window (this rank)
};

}  // namespace unet
