// unet train DATA.h5 — thin: parse flags, pick the starting checkpoint, call lib/trainer.
#include <csignal>
#include <ctime>
#include <filesystem>

#include "checkpoint.h"
#include "commands.h"
#include "init.h"
#include "params.h"
#include "trainer.h"
#include "util.h"

namespace unet {
namespace {
struct TrainArgs {
  std::string data, init, resume, rundir;
  TrainOptions opt;
  bool no_flip = false;
  ModelFlags model;
  DeviceFlags dev;
};

void on_signal(int) { stop_requested().store(true); }

std::string default_rundir() {
  std::time_t t = std::time(nullptr);
  char b[64];
  std::strftime(b, sizeof b, "runs/%Y%m%d-%H%M%S", std::localtime(&t));
  return b;
}

void run(TrainArgs& a) {
  namespace fs = std::filesystem;
  TrainOptions o = a.opt;
  o.flip = !a.no_flip;
  if (!a.init.empty() && !a.resume.empty()) throw UserError("--init and --resume are exclusive");
  if ((!a.init.empty() || !a.resume.empty()) && a.model.any_given())
    throw UserError(
        "model flags cannot be combined with --init/--resume: the model comes from the checkpoint");
  if (o.batch_size < 1) throw UserError("--batch-size must be positive");
  if (!(o.lr > 0)) throw UserError("--lr must be positive");
  if (o.weight_decay < 0) throw UserError("--weight-decay must be >= 0");
  if (!(o.ema_rate >= 0 && o.ema_rate <= 1)) throw UserError("--ema-rate must be in [0, 1]");
  if (o.steps < 0 || o.save_every < 0 || o.log_every < 0 || o.sample_every < 0 || o.lr_warmup < 0)
    throw UserError("step counts must be >= 0");
  if (o.grad_clip < 0) throw UserError("--grad-clip must be >= 0");
  if (!fs::exists(a.data)) throw UserError(a.data + ": no such file");

  Checkpoint ck;
  const bool resume = !a.resume.empty();
  if (resume) {
    ck = load_checkpoint(a.resume, /*need_optimizer=*/true);
    if (!ck.state.count("step"))
      throw UserError(a.resume + ": no training state (state/step); use --init to start from it");
    if (a.rundir.empty()) a.rundir = fs::path(a.resume).parent_path().string();
    if (a.rundir.empty()) a.rundir = ".";
    if (o.steps > 0 && o.steps <= ck.state.at("step"))
      throw UserError("--steps " + std::to_string(o.steps) + " is not past the checkpoint's step " +
                      std::to_string(ck.state.at("step")) + " (--steps counts from the start of training)");
  } else if (!a.init.empty()) {
    ck = load_checkpoint(a.init);
    if (!ck.ema.empty()) ck.ema.clear();  // a fresh run's EMA starts from the weights it trains
  } else {
    ck.cfg = a.model.resolve();
    ck.model = init_params(build_param_table(ck.cfg), o.seed);
  }
  if (a.rundir.empty()) a.rundir = default_rundir();
  o.rundir = a.rundir;
  if (!resume && fs::exists(o.rundir + "/latest.h5"))
    throw UserError(o.rundir + ": already holds a run (latest.h5); continue it with --resume " + o.rundir +
                    "/latest.h5 or choose another -o");
  std::error_code ec;
  fs::create_directories(o.rundir, ec);
  if (!fs::is_directory(o.rundir)) throw UserError(o.rundir + ": cannot create the run directory");
  check_writable_dir_for(o.rundir + "/metrics.csv");

  auto eng = a.dev.make();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const ParamTable t = build_param_table(ck.cfg);
  std::printf("unet train: %.2f M parameters, batch %d, %s step %lld%s -> %s\n", t.count / 1e6, o.batch_size,
              resume ? "resuming at" : "starting at", resume ? (long long)ck.state.at("step") : 0LL,
              o.steps ? (" until step " + std::to_string(o.steps)).c_str() : " (until interrupted)",
              o.rundir.c_str());
  std::fflush(stdout);
  TrainResult r = train(*eng, a.data, std::move(ck), resume, o);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (r.diverged) throw UserError("training stopped: the loss is not finite (see above)");
  if (r.interrupted)
    std::printf("interrupted at step %lld", (long long)r.step);
  else
    std::printf("finished at step %lld", (long long)r.step);
  if (!r.last_checkpoint.empty())
    std::printf("; checkpoint %s (also %s/latest.h5)", r.last_checkpoint.c_str(), o.rundir.c_str());
  std::printf("\n");
  std::printf("peak %s memory %.2f GB (planned buffers and workspaces%s)\n", eng->is_cuda() ? "GPU" : "host",
              eng->device().bytes_held() / 1e9, eng->is_cuda() ? "; the CUDA context not counted" : "");
}
}  // namespace

void register_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* sub = app.add_subcommand("train", "train a model on a dataset made by `unet prepare`");
  sub->add_option("data", a->data, "dataset (HDF5 from unet prepare)")->required();
  sub->add_option("--init", a->init, "start from this checkpoint's weights (fresh optimizer)");
  sub->add_option("--resume", a->resume,
                  "continue this checkpoint's run exactly (weights, EMA, optimizer, data order, RNG)");
  sub->add_option("-o,--output", a->rundir,
                  "run directory (default runs/<date>-<time>, or the --resume checkpoint's directory)");
  auto& o = a->opt;
  sub->add_option("--batch-size", o.batch_size, "images per step (default 32)");
  sub->add_option("--lr", o.lr, "AdamW learning rate (default 1e-4)");
  sub->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (default 0)");
  sub->add_option("--ema-rate", o.ema_rate, "EMA decay of the weights (default 0.9999)");
  sub->add_option("--steps", o.steps,
                  "stop at this global step, counting steps before a resume (default: until Ctrl-C)");
  sub->add_option("--save-every", o.save_every,
                  "checkpoint every N steps (default 10000; always at the end)");
  sub->add_option("--log-every", o.log_every, "log loss/grad norm/speed every N steps (default 10)");
  sub->add_option("--sample-every", o.sample_every,
                  "write a sample grid (EMA, DDIM 50) every N steps (default never)");
  sub->add_option("--grad-clip", o.grad_clip, "clip the global gradient norm to X (default off)");
  sub->add_option("--lr-warmup", o.lr_warmup, "linear learning-rate warmup over N steps (default 0)");
  sub->add_flag("--no-flip", a->no_flip, "disable random horizontal flips");
  sub->add_option("--seed", o.seed,
                  "seed of data order, noise, timesteps, flips, dropout and fresh init (default 0)");
  a->model.add(sub);
  a->dev.add(sub);
  sub->callback([a] { run(*a); });
}

}  // namespace unet
