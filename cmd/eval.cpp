// unet eval CKPT.h5 DATA.h5 — thin: load weights, call lib/train/eval (guided-diffusion's
// calc_bpd_loop), print the bound, write the per-timestep terms.
#include "eval.h"

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "checkpoint.h"
#include "commands.h"
#include "env_vars.h"
#include "model.h"
#include "params.h"
#include "preflight.h"
#include "util.h"

namespace unet {
namespace {
struct EvalArgs {
  std::string ckpt, data, csv;
  EvalOptions opt;
  bool no_ema = false, no_clip = false;
  DeviceFlags dev;
};

void run(EvalArgs& a) {
  namespace fs = std::filesystem;
  a.ckpt = checkpoint_arg(a.ckpt, "eval");
  // Everything is checked before the device and the long work: the output (never an input, never
  // a special file, in a writable directory), the environment, the checkpoint, the dataset against
  // the model, -n against the dataset, host memory.
  if (!a.csv.empty()) {
    check_writable_dir_for(a.csv);
    check_not_input(a.csv, a.ckpt, "checkpoint");
    check_not_input(a.csv, a.data, "dataset");
  }
  check_environment({{"checkpoint", a.ckpt}, {"dataset", a.data}});
  check_input_exists(a.data);
  Checkpoint ck = load_checkpoint(a.ckpt);
  const TrainData data = check_train_data(a.data, ck.cfg, a.ckpt);
  if (a.opt.n > data.info.count)
    throw UserError("-n " + std::to_string(a.opt.n) + ": " + a.data + " has " +
                    std::to_string(data.info.count) + " images");
  const int64_t n = a.opt.n > 0 ? a.opt.n : data.info.count;
  check_memory(eval_host_bytes(ck.cfg, build_param_table(ck.cfg), n, a.opt.batch_size),
               "evaluating " + std::to_string(n) + " images at batch size " +
                   std::to_string(std::min<int64_t>(n, a.opt.batch_size > 0 ? a.opt.batch_size : 32)));
  a.opt.clip = !a.no_clip;
  std::string device;
  auto eng = a.dev.make(&device);
  Model model(ck.cfg, *eng);
  const bool use_ema = !a.no_ema && !ck.ema.empty();
  eng->upload(model.params(), use_ema ? ck.ema.data() : ck.model.data());
  // Planned as evaluate() plans it: a batch beyond memory is refused before anything is printed.
  model.plan((int)std::min<int64_t>(n, a.opt.batch_size > 0 ? a.opt.batch_size : 32), Mode::Sample);
  std::printf("unet eval: %s weights of %s, %d timesteps, %s\n", use_ema ? "EMA" : "model", a.ckpt.c_str(),
              ck.cfg.diffusion_steps, device.c_str());
  std::fflush(stdout);
  std::unique_ptr<Progress> prog;  // made at the first call, when the total is known
  EvalResult r = evaluate(*eng, model, a.data, a.opt, [&](int64_t done, int64_t total) {
    if (!prog) prog = std::make_unique<Progress>("eval", (long)total, "call");
    prog->update((long)done);
  });
  if (prog) prog->finish();
  double sum_vb = 0, x0_mse = 0, mse = 0;
  for (size_t t = 0; t < r.vb.size(); ++t) sum_vb += r.vb[t], x0_mse += r.x0_mse[t], mse += r.mse[t];
  const double T = (double)r.vb.size();
  std::printf(
      "unet eval: %lld images: %.6f bits/dim (vb %.6f + prior %.6f); x0 MSE %.6f, eps MSE %.6f (means over "
      "t)\n",
      (long long)r.n, r.total_bpd, sum_vb, r.prior_bpd, x0_mse / T, mse / T);
  if (!a.csv.empty()) {
    AtomicFile af(a.csv);
    {
      std::ofstream f(af.tmp_path());
      f.precision(9);
      f << "t,vb,x0_mse,mse\n";
      for (size_t t = 0; t < r.vb.size(); ++t)
        f << t << ',' << r.vb[t] << ',' << r.x0_mse[t] << ',' << r.mse[t] << '\n';
      f << "prior," << r.prior_bpd << ",,\n";
      f << "total," << r.total_bpd << ",,\n";
      f.flush();
      if (!f) throw UserError(a.csv + ": cannot write (" + errno_text(errno) + ")");
    }
    af.commit();
    std::printf("wrote %s\n", a.csv.c_str());
  }
}
}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  auto* sub = app.add_subcommand(
      "eval", "negative log-likelihood (bits/dim) of a model on a dataset: guided-diffusion's calc_bpd_loop");
  sub->footer(
      "Per image: the variational bound's term at every timestep (KL for t > 0, the discretized-Gaussian\n"
      "decoder NLL at t = 0), the prior term and their total in bits/dim, and the x0 and eps MSE; averaged\n"
      "over images 0..N-1 of DATA. --csv writes the per-timestep means (t,vb,x0_mse,mse) and rows prior and\n"
      "total. The q_sample noise is drawn from --seed per (image, timestep): batch size does not matter.");
  sub->add_option("checkpoint", a->ckpt, "checkpoint (HDF5), or a run directory: its latest.h5")->required();
  sub->add_option("data", a->data, "dataset (HDF5 from unet prepare)")->required();
  sub->add_option("-n,--num-images", a->opt.n, "images 0..N-1 of the dataset (default: all)")
      ->check(int_range(1, INT64_MAX));
  sub->add_option("--batch-size", a->opt.batch_size, "images per model call (default min(N, 32))")
      ->check(int_range(1, kMaxBatch));
  sub->add_option("--csv", a->csv, "write the per-timestep terms here");
  sub->add_flag("--no-ema", a->no_ema, "use the raw weights instead of the EMA weights");
  sub->add_flag("--no-clip", a->no_clip, "do not clip the predicted x0 to [-1, 1] (clip_denoised=False)");
  sub->add_option("--seed", a->opt.seed, "seed of the q_sample noise, 0 to 2^63-1 (default 0)")
      ->check(seed_range());
  a->dev.add(sub);
  sub->callback([a] { run(*a); });
}

}  // namespace unet
