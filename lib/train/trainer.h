// The training loop: data -> q_sample -> model -> loss (objective.h) -> backward -> clip -> AdamW
// -> EMA, all on the backend's stream with no host synchronisation inside a step; the loss terms
// and grad norm are accumulated on the device and read back only at --log-every / checkpoint
// time. The loss-second-moment schedule sampler is the exception: it reads each step's
// per-sample losses back (one host sync per step) to update its history before drawing the next
// step's timesteps, exactly as guided-diffusion orders it.
//
// One loop serves `unet train` (the diffusion model) and `unet train-classifier` (the noisy-image
// classifier, classifier_train.h): the data order, CUDA-graph capture, stop agreement, logging
// cadence, metrics.csv, checkpoints and exact resume are the loop's; a TrainTask supplies the
// network, its step, its timesteps and its metrics.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "comm.h"
#include "config.h"
#include "engine.h"

namespace unet {

struct TrainOptions {
  int batch_size = 32;
  double lr = 1e-4;
  double weight_decay = 0.0;
  double ema_rate = 0.9999;
  int64_t steps = 0;  // stop at this global step (0 = run until interrupted)
  int64_t save_every = 10000;
  int64_t log_every = 10;
  int64_t sample_every = 0;  // 0 = never
  double grad_clip = 0.0;    // 0 = off
  int64_t lr_warmup = 0;
  int64_t lr_anneal_steps = 0;  // the learning rate's linear decay to 0 (guided-diffusion's); 0 = none
  bool flip = true;
  uint64_t seed = 0;
  std::string schedule_sampler = "uniform";  // uniform | loss-second-moment (guided-diffusion's names)
  int64_t microbatch = 0;                    // samples per micro-batch (0 = the whole batch)
  double class_dropout = 0.0;  // P(label -> null class) per sample (classifier_free.h); needs a null class
  uint64_t dataset_fingerprint = 0;  // DatasetReader::fingerprint(), recorded for resume
  // train-classifier: inputs noised at uniform t (guided-diffusion's --noised; else t = 0, clean
  // images), and a validation batch every eval_every steps when val_data is given.
  bool noised = true;
  int64_t eval_every = 5;
  std::string val_data;
  std::string rundir;
  bool quiet = false;  // no progress line (tests)
};

struct TrainResult {
  int64_t step = 0;          // global step reached
  double last_loss = 0;      // mean loss of the last logged window
  double first_loss = 0;     // mean loss of the first logged window
  bool interrupted = false;  // SIGINT/SIGTERM
  bool diverged = false;     // NaN/Inf loss or weights
  std::string stop_reason;   // with diverged: what became non-finite, at which step
  std::string last_checkpoint;
  int64_t labels_seen = 0, labels_dropped = 0;  // --class-dropout: labels of this run, and those dropped
};

// Set by the signal handler of `unet train`; the loop saves and stops at the next step boundary.
std::atomic<bool>& stop_requested();

class Network;
class Optimizer;
struct Batch;
struct DatasetInfo;

// The noise of a training batch, z [B, H, W, C] for global samples first .. first + B - 1 of step
// (DataLoader::noise_key), drawn by the engine where it is used (op NormalFill): on one host
// thread it took 12 ms a batch of 32 at 64x64, longer than a bf16 step.
void draw_train_noise(Ops& ops, const Tensor& z, uint64_t seed, int64_t step, int64_t first);

// What a run trains. The loop calls, in order: check_data, build (the network), make_step (after
// the optimizer exists), start; then per step set_batch, enqueue, (fence), after_step; per log
// window window + reset_window; per save fill_checkpoint; and preview at --sample-every.
class TrainTask {
 public:
  virtual ~TrainTask() = default;
  virtual int diffusion_steps() const = 0;  // T of the loader's uniform timesteps
  virtual bool dropout() const = 0;         // a per-step dropout seed: no CUDA graph
  // The dataset against the network: UserError naming `path`.
  virtual void check_data(const DatasetInfo& info, const std::string& path) const = 0;
  virtual Network& build(Engine& eng) = 0;
  // The step for this rank's batch Bl (planned for micro-batches of `microbatch`).
  virtual void make_step(Engine& eng, Optimizer& opt, int Bl, int microbatch, Communicator* comm) = 0;
  // Before the first step: resumed state (ck), this rank's place (rank of world), the step reached.
  virtual void start(Engine& eng, const Checkpoint& ck, bool resume, int64_t step, int rank, int world) = 0;
  // metrics.csv columns after step, the loss, the grad norm, lr, images/s and ms/step.
  virtual std::vector<std::string> columns() const = 0;
  // Host side of `step`: this rank's timesteps and inputs (first = its offset in the global
  // batch), uploaded asynchronously (the loop fences before the next call); the noise drawn on
  // the engine's stream (draw_train_noise: batches hold none).
  virtual void set_batch(const Batch& b, int64_t step, int first) = 0;
  virtual void enqueue(uint64_t dropout_seed) = 0;  // the device work of the step
  // After the step (its batch copied; a host synchronisation is allowed). step = steps done.
  virtual void after_step(int64_t step) { (void)step; }
  // The log window of n_samples samples (global): sums over the ranks, the metrics by column
  // name into row, text after the loss (" (mse ...)") and at the end of the log line; the mean loss.
  virtual double window(Communicator* comm, double n_samples, std::map<std::string, double>& row,
                        std::string& terms, std::string& tail) = 0;
  virtual void reset_window() = 0;
  // Whether the window so far has a finite loss (the save on the way out of an interrupted run).
  virtual bool window_finite(Communicator* comm) = 0;
  // The checkpoint's configuration and the task's state (the sampler history); whether the EMA
  // is worth saving.
  virtual void fill_checkpoint(Checkpoint& c) const = 0;
  virtual bool keep_ema() const { return true; }
  // --sample-every: a preview in the run directory (EMA weights).
  virtual void preview(Engine& eng, Optimizer& opt, const TrainOptions& o, const DatasetInfo& info,
                       int64_t at) {
    (void)eng, (void)opt, (void)o, (void)info, (void)at;
  }
};

// The loop, for any task (`train` below is it with the diffusion task); `started` as train's.
TrainResult run_training(Engine& eng, const std::string& dataset, Checkpoint ck, bool resume,
                         const TrainOptions& opt, Communicator* comm, TrainTask& task,
                         const std::function<void()>& started = {});

// `ck` holds the starting point: model (and, on resume, ema/optimizer/state). `resume` says
// whether ck.state/optimizer continue a previous run.
//
// Data-parallel (comm with several ranks): opt.batch_size is the global batch, each rank trains on
// its slice and the gradients are averaged before the optimizer; every rank starts from the same
// weights (ck) and so stays identical. Rank 0 alone writes metrics, checkpoints and sample grids;
// logged losses are averaged over the ranks; a stop (Ctrl-C, divergence) happens at the same step
// on every rank.
// `started` (optional) is called once everything is allocated, before the first step: the caller's
// informational lines come after every check, the memory plan's included.
TrainResult train(Engine& eng, const std::string& dataset, Checkpoint ck, bool resume,
                  const TrainOptions& opt, Communicator* comm = nullptr,
                  const std::function<void()>& started = {});

}  // namespace unet
