#include "trainer.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "classifier_free.h"
#include "dataloader.h"
#include "diffusion.h"
#include "grid.h"
#include "model.h"
#include "objective.h"
#include "optim.h"
#include "params.h"
#include "resume.h"
#include "rng.h"
#include "sampler.h"
#include "train_step.h"
#include "util.h"

namespace unet {

std::atomic<bool>& stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;

std::string ckpt_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "ckpt_%07lld.h5", (long long)step);
  return b;
}

// The column names of an existing CSV file's first line.
std::vector<std::string> csv_header(const std::string& path) {
  std::ifstream in(path);
  std::string line, col;
  std::getline(in, line);
  std::vector<std::string> cols;
  std::stringstream ss(line);
  while (std::getline(ss, col, ',')) cols.push_back(col);
  return cols;
}

std::string fmt_g(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*g", digits, v);
  return b;
}

// Copies src to dst atomically (temp + rename): latest.h5 is never half-written; a failed copy
// (disk full) is a UserError naming dst and the cause.
void atomic_copy(const std::string& src, const std::string& dst) { copy_file_atomic(src, dst); }
}  // namespace

TrainResult train(Engine& eng, const std::string& dataset, Checkpoint ck, bool resume, const TrainOptions& o,
                  Communicator* comm, const std::function<void()>& started) {
  namespace fs = std::filesystem;
  const ModelConfig& cfg = ck.cfg;
  Device& dev = eng.device();
  const int B = o.batch_size;  // global
  const bool multi = comm && comm->size() > 1;
  const bool root = !multi || comm->root();
  const bool quiet = o.quiet || !root;
  const int R = cfg.image_size, Cin = cfg.in_channels;
  const size_t n_img = (size_t)R * R * Cin;
  TrainResult res;

  int64_t step = resume ? ck.state.at("step") : 0;
  // On resume the caller has already taken seed, batch size, lr, ... from the checkpoint unless
  // a flag overrode them (resolve_resume), so `o` is authoritative here.
  const uint64_t seed = o.seed;

  DataLoader loader(
      dataset, B, cfg.diffusion_steps, seed, o.flip, step, 3,
      [&dev](size_t bytes) { return dev.alloc_host(bytes); }, multi ? comm->rank() : 0,
      multi ? comm->size() : 1);
  const int Bl = loader.local_batch();  // this rank's slice
  const DatasetInfo& info = loader.info();
  if (info.image_size != R)
    throw UserError(dataset + ": images are " + std::to_string(info.image_size) + "x" +
                    std::to_string(info.image_size) + " but the model's --image-size is " +
                    std::to_string(R));
  if (Cin != 3)
    throw UserError(dataset + ": datasets are RGB but the model has --in-channels " + std::to_string(Cin));
  if (cfg.class_cond && !info.has_labels)
    throw UserError(
        dataset +
        ": the model is class-conditional but the dataset has no labels (prepare --labels subdirs)");
  if (cfg.class_cond && (int64_t)info.class_names.size() > cfg.num_classes)
    throw UserError(dataset + ": " + std::to_string(info.class_names.size()) +
                    " classes but the model has --num-classes " + std::to_string(cfg.num_classes));

  // Classifier-free guidance's class dropout needs the null class's row of label_emb.
  if (!(o.class_dropout >= 0 && o.class_dropout < 1))
    throw UserError("--class-dropout must be in [0, 1), not " + std::to_string(o.class_dropout));
  if (o.class_dropout > 0 && !cfg.null_class)
    throw UserError(std::string("--class-dropout: ") +
                    (cfg.class_cond ? "the model has no null class (a label_emb row beyond its classes)"
                                    : "the model is not class-conditional"));

  Model model(cfg, eng);
  const size_t P = model.arena_floats();
  OptimizerOptions oo;
  oo.lr = o.lr, oo.weight_decay = o.weight_decay, oo.beta1 = kBeta1, oo.beta2 = kBeta2, oo.eps = kEps;
  oo.ema_rate = o.ema_rate, oo.grad_clip = o.grad_clip, oo.warmup = o.lr_warmup;
  Optimizer opt(eng, P, oo);
  TrainStep ts(eng, model, opt, Bl, (int)o.microbatch);
  ts.set_communicator(multi ? comm : nullptr);
  eng.upload(model.params(), ck.model.data());
  if (multi) comm->broadcast(model.params(), 0);  // every rank starts from rank 0's weights
  const bool have_opt = resume && ck.has_optimizer;
  opt.load(have_opt ? ck.opt.m.data() : nullptr, have_opt ? ck.opt.v.data() : nullptr,
           ck.ema.empty() ? nullptr : ck.ema.data(), step);
  if (ck.ema.empty()) opt.init_ema(model.params());

  Diffusion diff(cfg.diffusion_steps, cfg.noise_schedule, cfg.learn_sigma);
  int32_t* host_labels = (int32_t*)dev.alloc_host(sizeof(int32_t) * Bl);
  // Timesteps: the loader's uniform draws, or guided-diffusion's LossSecondMomentResampler, whose
  // history is part of the checkpoint (exact resume).
  std::unique_ptr<LossSecondMomentResampler> lsm;
  if (o.schedule_sampler == "loss-second-moment") {
    lsm = std::make_unique<LossSecondMomentResampler>(cfg.diffusion_steps);
    if (resume && !ck.loss_counts.empty())
      lsm->load(ck.loss_history, ck.loss_counts, "the resumed checkpoint");
  } else if (o.schedule_sampler != "uniform") {
    throw UserError("--schedule-sampler must be uniform or loss-second-moment, not '" + o.schedule_sampler +
                    "'");
  }
  std::vector<int> host_t(Bl);
  std::vector<float> host_w(Bl, 1.0f), host_terms((size_t)Bl * kLossTerms), host_loss(Bl);
  const Objective& obj = ts.objective();
  const bool hybrid = obj.learn_sigma && !obj.use_kl;  // mse and vb columns
  int64_t quartile_n[4] = {0, 0, 0, 0};                // samples per quartile in the log window (this rank)
  const int first = multi ? comm->rank() * Bl : 0;     // this rank's slice of the global batch

  if (started) started();
  if (!quiet)
    std::printf("memory: %.2f GB on %s (activations %.2f GB planned for batch %d%s)%s\n",
                dev.bytes_held() / 1e9, eng.name().c_str(), model.activation_bytes() / 1e9, Bl,
                multi ? " per rank" : "", loader.streaming() ? "; dataset streamed from disk" : "");

  const std::string metrics = o.rundir + "/metrics.csv";
  // Columns: guided-diffusion's mse/vb with the hybrid loss, and its per-quartile losses. A run
  // resumed on an older metrics.csv keeps that file's columns.
  std::vector<std::string> columns = {"step", "loss", "grad_norm", "lr", "images_per_s", "ms_per_step"};
  if (hybrid) columns.insert(columns.end(), {"mse", "vb"});
  columns.insert(columns.end(), {"loss_q0", "loss_q1", "loss_q2", "loss_q3"});
  std::ofstream csv;
  if (root) {  // rank 0 alone writes the run directory
    if (!fs::exists(o.rundir)) fs::create_directories(o.rundir);
    const bool new_metrics = !fs::exists(metrics);
    csv.open(metrics, std::ios::app);
    if (!csv) throw UserError(metrics + ": cannot write");
    if (new_metrics) {
      for (size_t i = 0; i < columns.size(); ++i) csv << (i ? "," : "") << columns[i];
      csv << '\n';
    } else {
      columns = csv_header(metrics);
    }
  }

  int64_t saved_at = -1;
  const ParamTable table = build_param_table(cfg);
  std::string nonfinite;  // the tensor that stopped a save
  // Returns false (and saves nothing) when the weights are no longer finite: a checkpoint must
  // never replace the last good one with a diverged state.
  auto save = [&](int64_t at) -> bool {
    Checkpoint c;
    c.cfg = cfg;
    c.cfg.class_dropout = o.class_dropout;  // the rate this run trains with (what --resume continues)
    c.model.resize(P), c.ema.resize(P), c.opt.m.resize(P), c.opt.v.resize(P);
    eng.download(c.model.data(), model.params());
    opt.save(c.opt.m.data(), c.opt.v.data(), c.ema.data());
    // Never replace the last good checkpoint with a diverged state; say which tensor went bad.
    const std::pair<const std::vector<float>*, const char*> arenas[] = {
        {&c.model, "model"}, {&c.ema, "ema"}, {&c.opt.m, "optimizer/m"}, {&c.opt.v, "optimizer/v"}};
    for (auto [arena, group] : arenas) {
      nonfinite = nonfinite_tensor(table, *arena, group);
      if (!nonfinite.empty()) return false;
    }
    c.has_optimizer = true;
    c.opt.step = at;
    c.opt.lr = o.lr, c.opt.beta1 = kBeta1, c.opt.beta2 = kBeta2, c.opt.eps = kEps,
    c.opt.weight_decay = o.weight_decay;
    store_train_settings(o, info, c);  // batch size, seed, lr, warmup, EMA, clip, flips, dataset, ...
    if (lsm) c.loss_history = lsm->history(), c.loss_counts = lsm->counts();
    c.state["step"] = at;
    const std::string path = o.rundir + "/" + ckpt_name(at);
    save_checkpoint(path, c);
    atomic_copy(path, o.rundir + "/latest.h5");
    res.last_checkpoint = path;
    saved_at = at;
    return true;
  };
  // Rank 0 saves; every rank learns whether the weights were still finite, so all stop alike.
  auto save_all = [&](int64_t at) -> bool {
    bool ok = true;
    if (root) ok = save(at);
    if (multi) {
      const std::string r = comm->broadcast_host(ok ? std::string("1") : "0" + nonfinite);
      ok = r == "1";
      if (!ok) nonfinite = r.substr(1);
    }
    if (ok) saved_at = at;  // on every rank: the decision to save on the way out must agree
    return ok;
  };
  auto diverged = [&](const std::string& what) {
    if (!quiet && stderr_is_tty()) std::fprintf(stderr, "\n");  // end the progress line
    res.stop_reason = what + " at step " + std::to_string(step);
    res.diverged = true;
    res.step = step;
    return res;
  };

  std::unique_ptr<Sampler> preview;  // allocated once, at the first preview
  Tensor kept;                       // the training weights while the preview uses the EMA
  auto sample_grid = [&](int64_t at) {
    // EMA weights for the preview, then the training weights back (device copies, no host trip).
    const int n = std::min(16, B);
    if (!preview) {
      preview = std::make_unique<Sampler>(eng, sampler_net(model),
                                          std::min(n, ts.microbatch()));  // planned for that
      kept = eng.alloc(DType::F32, {(int64_t)P});
    }
    eng.ops().run(Copy{model.params(), kept});
    eng.ops().run(Copy{opt.ema(), model.params()});
    SampleOptions so;
    so.sampler = "ddim";
    so.steps = std::min(50, cfg.diffusion_steps);
    so.seed = seed;
    so.batch_size = n;
    std::vector<int32_t> lab(n);
    for (int i = 0; i < n; ++i)
      lab[i] = (int32_t)(i % std::max<int64_t>(1, (int64_t)info.class_names.size()));
    std::vector<float> imgs((size_t)n * n_img);
    preview->run(so, n, nullptr, cfg.class_cond ? lab.data() : nullptr, imgs.data(), nullptr);
    eng.ops().run(Copy{kept, model.params()});
    char name[48];
    std::snprintf(name, sizeof name, "/samples_%07lld.png", (long long)at);
    save_grid_png(o.rundir + name, imgs.data(), n, R, R, Cin);
  };

  // One training step on the device, from the uploaded batch to the EMA. With CUDA graphs
  // (GPU, no dropout: its per-step seed would be baked into the graph) it is captured once and
  // replayed.
  const bool use_graph = dev.supports_graphs() && cfg.dropout == 0.0f && !std::getenv("UNET_NO_CUDA_GRAPH");
  bool captured = false;

  // Ranks agree on stopping (Ctrl-C reaches them at different steps) every few steps: every step
  // on the CPU, every 8th on a GPU (a round trip to rank 0 each time).
  const int64_t agree_every = eng.is_cuda() ? 8 : 1;

  const int64_t start = step;
  Progress prog("train", o.steps > 0 ? o.steps : step, "step");
  double t_window = now_seconds();
  int64_t window_steps = 0;
  bool first_window = true;
  while (o.steps == 0 || step < o.steps) {
    bool stop = stop_requested().load();
    if (multi) stop = step % agree_every == 0 ? comm->any(stop) : false;
    if (stop) {
      res.interrupted = true;
      break;
    }
    Batch* b = loader.next();
    for (int i = 0; i < Bl; ++i) host_labels[i] = b->labels[i];
    if (cfg.class_cond && o.class_dropout > 0) {  // this rank's slice of the global batch of `step`
      const int mine =
          apply_class_dropout(seed, step, first, Bl, o.class_dropout, cfg.num_classes, host_labels);
      // The count of the whole batch (the draws are a function of the global sample: no reduction).
      int all = mine;
      if (multi) {
        all = 0;
        for (int i = 0; i < B; ++i) all += class_dropped(seed, step, i, o.class_dropout);
      }
      res.labels_dropped += all;
      res.labels_seen += B;
    }
    if (lsm)
      lsm->sample(seed, step, Bl, b->t.data(), host_t.data(), host_w.data(), first);
    else
      for (int i = 0; i < Bl; ++i) host_t[i] = (int)b->t[i];
    for (int i = 0; i < Bl; ++i) ++quartile_n[quartile(host_t[i], cfg.diffusion_steps)];
    ts.set_timesteps(diff, host_t.data(), lsm ? host_w.data() : nullptr);
    eng.upload(ts.x0, b->x0.data());
    eng.upload(ts.noise, b->noise.data());
    if (cfg.class_cond) eng.upload(ts.labels, host_labels);
    const uint64_t fence = dev.fence();
    // Several ranks: the first step runs eagerly, so that NCCL sets up its connections before
    // the step is captured.
    if (!use_graph || (multi && step == start)) {
      ts.enqueue(hash64(seed, (uint64_t)Stream::Dropout, (uint64_t)step));
    } else {
      if (!captured) {  // record once (nothing runs), then replay every step
        dev.graph_begin();
        ts.enqueue(0);
        dev.graph_end();
        captured = true;
      }
      dev.graph_launch();
    }
    ++step;
    ++window_steps;
    if (multi) comm->set_progress(step);
    {
      ControlPlane::Wait w(multi ? comm->control() : nullptr);
      dev.fence_wait(fence);  // this step's batch has been copied: the loader may refill its buffer
    }
    if (lsm) {  // the step's per-sample losses feed the history (waits for the step)
      {
        ControlPlane::Wait w(multi ? comm->control() : nullptr);
        eng.download(host_terms.data(), ts.terms);
      }
      for (int i = 0; i < Bl; ++i) host_loss[i] = host_terms[(size_t)i * kLossTerms + kTermLoss];
      if (!multi) {
        lsm->update(host_t.data(), host_loss.data(), Bl);
      } else {  // every rank updates with the global batch in rank order: the same history everywhere
        std::string mine((size_t)Bl * (sizeof(int) + sizeof(float)), '\0');
        std::memcpy(&mine[0], host_t.data(), sizeof(int) * Bl);
        std::memcpy(&mine[sizeof(int) * Bl], host_loss.data(), sizeof(float) * Bl);
        for (const std::string& r : comm->all_gather(mine)) {
          std::vector<int> rt(Bl);
          std::vector<float> rl(Bl);
          std::memcpy(rt.data(), r.data(), sizeof(int) * Bl);
          std::memcpy(rl.data(), r.data() + sizeof(int) * Bl, sizeof(float) * Bl);
          lsm->update(rt.data(), rl.data(), Bl);
        }
      }
    }

    const bool last = o.steps > 0 && step >= o.steps;
    const bool log_now = (o.log_every > 0 && step % o.log_every == 0) || last;
    const bool save_now = (o.save_every > 0 && step % o.save_every == 0) || last;
    if (log_now || save_now) {
      float st[7], norm_sum = 0;
      if (multi) {  // the global batch: sums over the ranks
        comm->all_reduce(ts.stats, ReduceOp::Sum);
        std::string mine(sizeof quartile_n, '\0');
        std::memcpy(&mine[0], quartile_n, sizeof quartile_n);
        int64_t total[4] = {0, 0, 0, 0};
        for (const std::string& r : comm->all_gather(mine)) {
          int64_t q[4];
          std::memcpy(q, r.data(), sizeof q);
          for (int k = 0; k < 4; ++k) total[k] += q[k];
        }
        std::memcpy(quartile_n, total, sizeof total);
      }
      {
        ControlPlane::Wait w(multi ? comm->control() : nullptr);
        eng.download(st, ts.stats);
      }
      eng.download(&norm_sum, opt.norm_sum());
      const double n_samples = (double)window_steps * B;
      const double mean_loss = st[0] / n_samples, mean_norm = norm_sum / window_steps;
      if (!std::isfinite(mean_loss))
        return diverged(std::string("the loss became ") + (std::isnan(mean_loss) ? "NaN" : "Inf") +
                        (std::isfinite(mean_norm) ? "" : " (and the gradient norm non-finite)"));
      const double dt = now_seconds() - t_window;
      const double ms = 1000.0 * dt / window_steps, ips = B * window_steps / dt;
      if (first_window) res.first_loss = mean_loss, first_window = false;
      res.last_loss = mean_loss;
      std::map<std::string, double> row = {{"step", (double)step},     {"loss", mean_loss},
                                           {"grad_norm", mean_norm},   {"lr", opt.lr_at(step - 1)},
                                           {"images_per_s", ips},      {"ms_per_step", ms},
                                           {"mse", st[1] / n_samples}, {"vb", st[2] / n_samples}};
      std::string quart;
      for (int q = 0; q < 4; ++q) {
        if (quartile_n[q] == 0) continue;  // no sample in this quartile: an empty cell
        const double v = st[3 + q] / quartile_n[q];
        row["loss_q" + std::to_string(q)] = v;
        quart += " q" + std::to_string(q) + " " + fmt_g(v, 4);
      }
      if (root) {
        for (size_t i = 0; i < columns.size(); ++i) {
          if (i) csv << ',';
          auto it = row.find(columns[i]);
          if (it == row.end()) continue;
          if (columns[i] == "step")
            csv << step;
          else
            csv << it->second;
        }
        csv << '\n';
        csv.flush();
        if (!csv) throw UserError(metrics + ": cannot write (" + errno_text(errno) + ")");  // disk full
      }
      if (!quiet) {
        if (stderr_is_tty()) std::fprintf(stderr, "\r\033[K");
        const std::string terms =
            hybrid ? " (mse " + fmt_g(st[1] / n_samples, 5) + ", vb " + fmt_g(st[2] / n_samples, 5) + ")"
                   : "";
        std::printf("step %lld | loss %.5f%s | grad norm %.4f | lr %.3g | %.1f img/s | %.2f ms/step |%s\n",
                    (long long)step, mean_loss, terms.c_str(), mean_norm, opt.lr_at(step - 1), ips, ms,
                    quart.c_str());
        std::fflush(stdout);
      }
      ts.reset_stats();
      for (int64_t& n : quartile_n) n = 0;
      opt.reset_norm_sum();
      window_steps = 0;
      t_window = now_seconds();
      if (save_now && !save_all(step)) return diverged("the weights became non-finite: " + nonfinite);
    }
    if (root && o.sample_every > 0 && step % o.sample_every == 0) sample_grid(step);
    if (!quiet)
      prog.update(step, res.last_loss > 0 ? "loss " + std::to_string(res.last_loss).substr(0, 7) : "");
  }
  if (!quiet) prog.finish();
  if (res.interrupted && step > start && saved_at != step) {
    float h[7];
    if (multi) comm->all_reduce(ts.stats, ReduceOp::Sum);
    {
      ControlPlane::Wait w(multi ? comm->control() : nullptr);
      eng.download(h, ts.stats);
    }
    if (std::isfinite(h[0]) && !save_all(step))
      return diverged("the weights became non-finite: " + nonfinite);
  }
  res.step = step;
  return res;
}

}  // namespace unet
