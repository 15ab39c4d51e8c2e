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

// Samples per quartile of a log window: this rank's, summed over the ranks when several.
void gather_quartiles(Communicator* comm, int64_t* quartile_n) {
  if (!comm || comm->size() <= 1) return;
  std::string mine(4 * sizeof(int64_t), '\0');
  std::memcpy(&mine[0], quartile_n, 4 * sizeof(int64_t));
  int64_t total[4] = {0, 0, 0, 0};
  for (const std::string& r : comm->all_gather(mine)) {
    int64_t q[4];
    std::memcpy(q, r.data(), sizeof q);
    for (int k = 0; k < 4; ++k) total[k] += q[k];
  }
  std::memcpy(quartile_n, total, sizeof total);
}

// ---- the diffusion model (unet train) ----------------------------------------------------------
class DiffusionTask final : public TrainTask {
 public:
  DiffusionTask(const ModelConfig& cfg, const TrainOptions& o) : cfg_(cfg), o_(o) {}

  int diffusion_steps() const override { return cfg_.diffusion_steps; }
  bool dropout() const override { return cfg_.dropout != 0.0f; }

  void check_data(const DatasetInfo& info, const std::string& dataset) const override {
    if (info.image_size != cfg_.image_size)
      throw UserError(dataset + ": images are " + std::to_string(info.image_size) + "x" +
                      std::to_string(info.image_size) + " but the model's --image-size is " +
                      std::to_string(cfg_.image_size));
    if (cfg_.in_channels != 3)
      throw UserError(dataset + ": datasets are RGB but the model has --in-channels " +
                      std::to_string(cfg_.in_channels));
    if (cfg_.class_cond && !info.has_labels)
      throw UserError(
          dataset +
          ": the model is class-conditional but the dataset has no labels (prepare --labels subdirs)");
    if (cfg_.class_cond && (int64_t)info.class_names.size() > cfg_.num_classes)
      throw UserError(dataset + ": " + std::to_string(info.class_names.size()) +
                      " classes but the model has --num-classes " + std::to_string(cfg_.num_classes));
    // Classifier-free guidance's class dropout needs the null class's row of label_emb.
    if (!(o_.class_dropout >= 0 && o_.class_dropout < 1))
      throw UserError("--class-dropout must be in [0, 1), not " + std::to_string(o_.class_dropout));
    if (o_.class_dropout > 0 && !cfg_.null_class)
      throw UserError(std::string("--class-dropout: ") +
                      (cfg_.class_cond ? "the model has no null class (a label_emb row beyond its classes)"
                                       : "the model is not class-conditional"));
  }

  Network& build(Engine& eng) override {
    model_ = std::make_unique<Model>(cfg_, eng);
    return *model_;
  }

  void make_step(Engine& eng, Optimizer& opt, int Bl, int microbatch, Communicator* comm) override {
    eng_ = &eng;
    ts_ = std::make_unique<TrainStep>(eng, *model_, opt, Bl, microbatch);
    ts_->set_communicator(comm && comm->size() > 1 ? comm : nullptr);
    comm_ = comm && comm->size() > 1 ? comm : nullptr;
    Bl_ = Bl;
    host_labels_ = (int32_t*)eng.device().alloc_host(sizeof(int32_t) * Bl);
    host_t_.resize(Bl), host_w_.assign(Bl, 1.0f), host_terms_.resize((size_t)Bl * kLossTerms),
        host_loss_.resize(Bl);
  }

  void start(Engine&, const Checkpoint& ck, bool resume, int64_t, int, int) override {
    model_->refresh_weights();  // the uploaded weights' copy, before a step is captured
    diff_ = std::make_unique<Diffusion>(cfg_.diffusion_steps, cfg_.noise_schedule, cfg_.learn_sigma);
    // Timesteps: the loader's uniform draws, or guided-diffusion's LossSecondMomentResampler, whose
    // history is part of the checkpoint (exact resume).
    if (o_.schedule_sampler == "loss-second-moment") {
      lsm_ = std::make_unique<LossSecondMomentResampler>(cfg_.diffusion_steps);
      if (resume && !ck.loss_counts.empty())
        lsm_->load(ck.loss_history, ck.loss_counts, "the resumed checkpoint");
    } else if (o_.schedule_sampler != "uniform") {
      throw UserError("--schedule-sampler must be uniform or loss-second-moment, not '" +
                      o_.schedule_sampler + "'");
    }
  }

  std::vector<std::string> columns() const override {
    // guided-diffusion's mse/vb with the hybrid loss, and its per-quartile losses.
    std::vector<std::string> c;
    if (hybrid()) c.insert(c.end(), {"mse", "vb"});
    c.insert(c.end(), {"loss_q0", "loss_q1", "loss_q2", "loss_q3"});
    return c;
  }

  void set_batch(const Batch& b, int64_t step, int first) override {
    for (int i = 0; i < Bl_; ++i) host_labels_[i] = b.labels[i];
    if (cfg_.class_cond && o_.class_dropout > 0) {  // this rank's slice of the global batch of `step`
      const int mine =
          apply_class_dropout(o_.seed, step, first, Bl_, o_.class_dropout, cfg_.num_classes, host_labels_);
      // The count of the whole batch (the draws are a function of the global sample: no reduction).
      int all = mine;
      if (comm_) {
        all = 0;
        for (int i = 0; i < o_.batch_size; ++i) all += class_dropped(o_.seed, step, i, o_.class_dropout);
      }
      labels_dropped += all;
      labels_seen += o_.batch_size;
    }
    if (lsm_)
      lsm_->sample(o_.seed, step, Bl_, b.t.data(), host_t_.data(), host_w_.data(), first);
    else
      for (int i = 0; i < Bl_; ++i) host_t_[i] = (int)b.t[i];
    for (int i = 0; i < Bl_; ++i) ++quartile_n_[quartile(host_t_[i], cfg_.diffusion_steps)];
    ts_->set_timesteps(*diff_, host_t_.data(), lsm_ ? host_w_.data() : nullptr);
    eng_->upload(ts_->x0, b.x0.data());
    draw_train_noise(eng_->ops(), ts_->noise, o_.seed, step, first);
    if (cfg_.class_cond) eng_->upload(ts_->labels, host_labels_);
  }

  void enqueue(uint64_t dropout_seed) override { ts_->enqueue(dropout_seed); }

  void after_step(int64_t) override {
    if (!lsm_) return;
    // The step's per-sample losses feed the history (waits for the step).
    {
      ControlPlane::Wait w(comm_ ? comm_->control() : nullptr);
      eng_->download(host_terms_.data(), ts_->terms);
    }
    for (int i = 0; i < Bl_; ++i) host_loss_[i] = host_terms_[(size_t)i * kLossTerms + kTermLoss];
    if (!comm_) {
      lsm_->update(host_t_.data(), host_loss_.data(), Bl_);
      return;
    }
    // Every rank updates with the global batch in rank order: the same history everywhere.
    std::string mine((size_t)Bl_ * (sizeof(int) + sizeof(float)), '\0');
    std::memcpy(&mine[0], host_t_.data(), sizeof(int) * Bl_);
    std::memcpy(&mine[sizeof(int) * Bl_], host_loss_.data(), sizeof(float) * Bl_);
    for (const std::string& r : comm_->all_gather(mine)) {
      std::vector<int> rt(Bl_);
      std::vector<float> rl(Bl_);
      std::memcpy(rt.data(), r.data(), sizeof(int) * Bl_);
      std::memcpy(rl.data(), r.data() + sizeof(int) * Bl_, sizeof(float) * Bl_);
      lsm_->update(rt.data(), rl.data(), Bl_);
    }
  }

  double window(Communicator* comm, double n_samples, std::map<std::string, double>& row, std::string& terms,
                std::string& tail) override {
    float st[7];
    if (comm_) {  // the global batch: sums over the ranks
      comm->all_reduce(ts_->stats, ReduceOp::Sum);
      gather_quartiles(comm, quartile_n_);
    }
    {
      ControlPlane::Wait w(comm_ ? comm_->control() : nullptr);
      eng_->download(st, ts_->stats);
    }
    row["mse"] = st[1] / n_samples, row["vb"] = st[2] / n_samples;
    if (hybrid())
      terms = " (mse " + fmt_g(st[1] / n_samples, 5) + ", vb " + fmt_g(st[2] / n_samples, 5) + ")";
    for (int q = 0; q < 4; ++q) {
      if (quartile_n_[q] == 0) continue;  // no sample in this quartile: an empty cell
      const double v = st[3 + q] / quartile_n_[q];
      row["loss_q" + std::to_string(q)] = v;
      tail += " q" + std::to_string(q) + " " + fmt_g(v, 4);
    }
    return st[0] / n_samples;
  }

  void reset_window() override {
    ts_->reset_stats();
    for (int64_t& n : quartile_n_) n = 0;
  }

  bool window_finite(Communicator* comm) override {
    float h[7];
    if (comm_) comm->all_reduce(ts_->stats, ReduceOp::Sum);
    {
      ControlPlane::Wait w(comm_ ? comm_->control() : nullptr);
      eng_->download(h, ts_->stats);
    }
    return std::isfinite(h[0]);
  }

  void fill_checkpoint(Checkpoint& c) const override {
    c.cfg = cfg_;
    c.cfg.class_dropout = o_.class_dropout;  // the rate this run trains with (what --resume continues)
    if (lsm_) c.loss_history = lsm_->history(), c.loss_counts = lsm_->counts();
  }

  void preview(Engine& eng, Optimizer& opt, const TrainOptions& o, const DatasetInfo& info,
               int64_t at) override {
    // EMA weights for the preview, then the training weights back (device copies, no host trip).
    const int n = std::min(16, o.batch_size);
    const int R = cfg_.image_size, Cin = cfg_.in_channels;
    if (!preview_) {
      preview_ =
          std::make_unique<Sampler>(eng, sampler_net(*model_), std::min(n, ts_->microbatch()));  // planned
      kept_ = eng.alloc(DType::F32, {(int64_t)model_->arena_floats()});
    }
    eng.ops().run(Copy{model_->params(), kept_});
    eng.ops().run(Copy{opt.ema(), model_->params()});
    SampleOptions so;
    so.sampler = "ddim";
    so.steps = std::min(50, cfg_.diffusion_steps);
    so.seed = o.seed;
    so.batch_size = n;
    std::vector<int32_t> lab(n);
    for (int i = 0; i < n; ++i)
      lab[i] = (int32_t)(i % std::max<int64_t>(1, (int64_t)info.class_names.size()));
    std::vector<float> imgs((size_t)n * R * R * Cin);
    preview_->run(so, n, nullptr, cfg_.class_cond ? lab.data() : nullptr, imgs.data(), nullptr);
    eng.ops().run(Copy{kept_, model_->params()});
    model_->refresh_weights();  // (the sampler left the EMA's copy; the captured step casts none)
    char name[48];
    std::snprintf(name, sizeof name, "/samples_%07lld.png", (long long)at);
    save_grid_png(o.rundir + name, imgs.data(), n, R, R, Cin);
  }

  int64_t labels_seen = 0, labels_dropped = 0;  // --class-dropout

 private:
  bool hybrid() const { return cfg_.learn_sigma && !cfg_.use_kl; }  // mse and vb columns

  ModelConfig cfg_;
  TrainOptions o_;
  Engine* eng_ = nullptr;
  Communicator* comm_ = nullptr;
  std::unique_ptr<Model> model_;
  std::unique_ptr<TrainStep> ts_;
  std::unique_ptr<Diffusion> diff_;
  std::unique_ptr<LossSecondMomentResampler> lsm_;
  int Bl_ = 0;
  int32_t* host_labels_ = nullptr;
  std::vector<int> host_t_;
  std::vector<float> host_w_, host_terms_, host_loss_;
  int64_t quartile_n_[4] = {0, 0, 0, 0};  // samples per quartile in the log window (this rank)
  std::unique_ptr<Sampler> preview_;      // allocated once, at the first preview
  Tensor kept_;                           // the training weights while the preview uses the EMA
};
}  // namespace

void draw_train_noise(Ops& ops, const Tensor& z, uint64_t seed, int64_t step, int64_t first) {
  ops.run(NormalFill{z, DataLoader::noise_key(seed, step), static_cast<uint64_t>(Stream::TrainNoise),
                     static_cast<uint64_t>(first) * z.per_sample()});
}

TrainResult train(Engine& eng, const std::string& dataset, Checkpoint ck, bool resume, const TrainOptions& o,
                  Communicator* comm, const std::function<void()>& started) {
  DiffusionTask task(ck.cfg, o);
  TrainResult r = run_training(eng, dataset, std::move(ck), resume, o, comm, task, started);
  r.labels_seen = task.labels_seen, r.labels_dropped = task.labels_dropped;
  return r;
}

TrainResult run_training(Engine& eng, const std::string& dataset, Checkpoint ck, bool resume,
                         const TrainOptions& o, Communicator* comm, TrainTask& task,
                         const std::function<void()>& started) {
  namespace fs = std::filesystem;
  Device& dev = eng.device();
  const int B = o.batch_size;  // global
  const bool multi = comm && comm->size() > 1;
  const bool root = !multi || comm->root();
  const bool quiet = o.quiet || !root;
  TrainResult res;

  int64_t step = resume ? ck.state.at("step") : 0;
  // On resume the caller has already taken seed, batch size, lr, ... from the checkpoint unless
  // a flag overrode them (resolve_resume), so `o` is authoritative here.
  const uint64_t seed = o.seed;

  DataLoader loader(
      dataset, B, task.diffusion_steps(), seed, o.flip, step, 3,
      [&dev](size_t bytes) { return dev.alloc_host(bytes); }, multi ? comm->rank() : 0,
      multi ? comm->size() : 1);
  const int Bl = loader.local_batch();  // this rank's slice
  const DatasetInfo& info = loader.info();
  task.check_data(info, dataset);

  Network& net = task.build(eng);
  const size_t P = net.arena_floats();
  OptimizerOptions oo;
  oo.lr = o.lr, oo.weight_decay = o.weight_decay, oo.beta1 = kBeta1, oo.beta2 = kBeta2, oo.eps = kEps;
  oo.ema_rate = o.ema_rate, oo.grad_clip = o.grad_clip, oo.warmup = o.lr_warmup;
  oo.anneal = o.lr_anneal_steps;
  Optimizer opt(eng, P, oo);
  task.make_step(eng, opt, Bl, (int)o.microbatch, multi ? comm : nullptr);
  eng.upload(net.params(), ck.model.data());
  if (multi) comm->broadcast(net.params(), 0);  // every rank starts from rank 0's weights
  const bool have_opt = resume && ck.has_optimizer;
  opt.load(have_opt ? ck.opt.m.data() : nullptr, have_opt ? ck.opt.v.data() : nullptr,
           ck.ema.empty() ? nullptr : ck.ema.data(), step);
  if (ck.ema.empty()) opt.init_ema(net.params());
  task.start(eng, ck, resume, step, multi ? comm->rank() : 0, multi ? comm->size() : 1);
  const int first = loader.first();  // this rank's slice of the global batch

  if (started) started();
  if (!quiet)
    std::printf("memory: %.2f GB on %s (activations %.2f GB planned for batch %d%s)%s%s\n",
                dev.bytes_held() / 1e9, eng.name().c_str(), net.activation_bytes() / 1e9, Bl,
                multi ? " per rank" : "", loader.streaming() ? "; dataset streamed from disk" : "",
                net.plan_report().find("recomputes") != std::string::npos
                    ? "; backward recomputes the normalized activations (to fit, or UNET_RECOMPUTE)"
                    : "");

  const std::string metrics = o.rundir + "/metrics.csv";
  // A resumed run on an older metrics.csv keeps that file's columns.
  std::vector<std::string> columns = {"step", "loss", "grad_norm", "lr", "images_per_s", "ms_per_step"};
  for (const std::string& c : task.columns()) columns.push_back(c);
  // A new metrics.csv is made with the first row, so that a run which ends before one (refused,
  // diverged at its first step) leaves a new run directory empty for NewDirCleanup (cmd/train.cpp).
  std::ofstream csv;
  bool new_metrics = false;
  if (root) {  // rank 0 alone writes the run directory
    std::error_code ec;  // (the command made and checked the directory; no exception from here)
    fs::create_directories(o.rundir, ec);
    new_metrics = !fs::exists(metrics, ec);
    if (!new_metrics) {
      csv.open(metrics, std::ios::app);
      if (!csv) throw UserError(metrics + ": cannot write");
      columns = csv_header(metrics);
    }
  }

  int64_t saved_at = -1;
  const ParamTable& table = net.table();
  const bool keep_ema = task.keep_ema();
  std::string nonfinite;  // the tensor that stopped a save
  // Returns false (and saves nothing) when the weights are no longer finite: a checkpoint must
  // never replace the last good one with a diverged state.
  auto save = [&](int64_t at) -> bool {
    Checkpoint c;
    task.fill_checkpoint(c);
    c.model.resize(P), c.ema.resize(P), c.opt.m.resize(P), c.opt.v.resize(P);
    eng.download(c.model.data(), net.params());
    opt.save(c.opt.m.data(), c.opt.v.data(), c.ema.data());
    if (!keep_ema) c.ema.clear();
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

  // One training step on the device, from the uploaded batch to the EMA. With CUDA graphs
  // (GPU, no dropout: its per-step seed would be baked into the graph) it is captured once and
  // replayed.
  const bool use_graph = dev.supports_graphs() && !task.dropout() && !std::getenv("UNET_NO_CUDA_GRAPH");
  bool captured = false;

  // Ranks agree on stopping (Ctrl-C reaches them at different steps) every few steps: every step
  // on the CPU, every 8th on a GPU (a round trip to rank 0 each time).
  const int64_t agree_every = eng.is_cuda() ? 8 : 1;

  const int64_t start = step;
  // The GPU's time per step (CUDA events around each step's work; the host's waits between steps
  // excluded), for the log line beside the wall time: the fences around the step before this one
  // (`done`: complete once this step's uploads, queued after it, are), added to the window's sum
  // then, or at the log line (which waits for the step).
  std::pair<uint64_t, uint64_t> done{0, 0};
  double gpu_ms = 0.0;
  int64_t gpu_steps = 0;
  auto fold_gpu_time = [&] {
    const double ms = dev.fence_ms(done.first, done.second);
    if (ms >= 0) gpu_ms += ms, ++gpu_steps;
    done = {0, 0};
  };
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
    task.set_batch(*b, step, first);
    const uint64_t fence = dev.fence();
    // Several ranks: the first step runs eagerly, so that NCCL sets up its connections before
    // the step is captured.
    if (!use_graph || (multi && step == start)) {
      task.enqueue(hash64(seed, (uint64_t)Stream::Dropout, (uint64_t)step));
    } else {
      if (!captured) {  // record once (nothing runs), then replay every step
        dev.graph_begin();
        task.enqueue(0);
        dev.graph_end(step_graph_pdl(eng.precision()));
        captured = true;
      }
      dev.graph_launch();
    }
    const uint64_t step_end = dev.fence();
    ++step;
    ++window_steps;
    if (multi) comm->set_progress(step);
    {
      ControlPlane::Wait w(multi ? comm->control() : nullptr);
      dev.fence_wait(fence);  // this step's batch has been copied: the loader may refill its buffer
    }
    fold_gpu_time();
    done = {fence, step_end};
    task.after_step(step);

    const bool last = o.steps > 0 && step >= o.steps;
    const bool log_now = (o.log_every > 0 && step % o.log_every == 0) || last;
    const bool save_now = (o.save_every > 0 && step % o.save_every == 0) || last;
    if (log_now || save_now) {
      float norm_sum = 0;
      const double n_samples = (double)window_steps * B;
      std::map<std::string, double> row;
      std::string terms, tail;
      const double mean_loss = task.window(multi ? comm : nullptr, n_samples, row, terms, tail);
      eng.download(&norm_sum, opt.norm_sum());
      fold_gpu_time();  // (the downloads waited for this step)
      const double mean_norm = norm_sum / window_steps;
      if (!std::isfinite(mean_loss))
        return diverged(std::string("the loss became ") + (std::isnan(mean_loss) ? "NaN" : "Inf") +
                        (std::isfinite(mean_norm) ? "" : " (and the gradient norm non-finite)"));
      const double dt = now_seconds() - t_window;
      const double ms = 1000.0 * dt / window_steps, ips = B * window_steps / dt;
      if (first_window) res.first_loss = mean_loss, first_window = false;
      res.last_loss = mean_loss;
      row["step"] = (double)step, row["loss"] = mean_loss, row["grad_norm"] = mean_norm;
      row["lr"] = opt.lr_at(step - 1), row["images_per_s"] = ips, row["ms_per_step"] = ms;
      if (root) {
        if (new_metrics) {
          csv.open(metrics, std::ios::app);
          for (size_t i = 0; i < columns.size(); ++i) csv << (i ? "," : "") << columns[i];
          csv << '\n';
          new_metrics = false;
        }
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
        char gpu[32] = "";
        if (gpu_steps > 0) std::snprintf(gpu, sizeof gpu, " (GPU %.2f)", gpu_ms / gpu_steps);
        std::printf("step %lld | loss %.5f%s | grad norm %.4f | lr %.3g | %.1f img/s | %.2f ms/step%s |%s\n",
                    (long long)step, mean_loss, terms.c_str(), mean_norm, opt.lr_at(step - 1), ips, ms, gpu,
                    tail.c_str());
        std::fflush(stdout);
      }
      task.reset_window();
      opt.reset_norm_sum();
      window_steps = 0, gpu_ms = 0.0, gpu_steps = 0;
      t_window = now_seconds();
      if (save_now && !save_all(step)) return diverged("the weights became non-finite: " + nonfinite);
    }
    if (root && o.sample_every > 0 && step % o.sample_every == 0) task.preview(eng, opt, o, info, step);
    if (!quiet)
      prog.update(step, res.last_loss > 0 ? "loss " + std::to_string(res.last_loss).substr(0, 7) : "");
  }
  if (!quiet) prog.finish();
  if (res.interrupted && step > start && saved_at != step) {
    if (task.window_finite(multi ? comm : nullptr) && !save_all(step))
      return diverged("the weights became non-finite: " + nonfinite);
  }
  res.step = step;
  return res;
}

}  // namespace unet
