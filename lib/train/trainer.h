// The training loop: data -> q_sample -> model -> loss (objective.h) -> backward -> clip -> AdamW
// -> EMA, all on the backend's stream with no host synchronisation inside a step; the loss terms
// and grad norm are accumulated on the device and read back only at --log-every / checkpoint
// time. The loss-second-moment schedule sampler is the exception: it reads each step's
// per-sample losses back (one host sync per step) to update its history before drawing the next
// step's timesteps, exactly as guided-diffusion orders it.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

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
  bool flip = true;
  uint64_t seed = 0;
  std::string schedule_sampler = "uniform";  // uniform | loss-second-moment (guided-diffusion's names)
  int64_t microbatch = 0;                    // samples per micro-batch (0 = the whole batch)
  double class_dropout = 0.0;  // P(label -> null class) per sample (classifier_free.h); needs a null class
  uint64_t dataset_fingerprint = 0;  // DatasetReader::fingerprint(), recorded for resume
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
