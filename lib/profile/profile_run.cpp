#include "profile_run.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "engine.h"
#include "flops.h"
#include "init.h"
#include "model.h"
#include "optim.h"
#include "params.h"
#include "profile_report.h"
#include "profiler_cupti.h"
#include "train_step.h"
#include "util.h"

namespace unet {

namespace {

constexpr int kGroups = 32;

// Random device tensors from a counter-based generator (fast for the 100 MB inputs of a big layer).
class Filler {
 public:
  Filler(Engine& eng, uint64_t seed) : eng_(eng), seed_(seed) {}
  std::vector<float> host(size_t n, float scale) {
    std::vector<float> h(n);
    uint64_t s = ++seed_ * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; ++i) {
      uint64_t z = s + 0x9E3779B97F4A7C15ull * (i + 1);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      h[i] = scale * (2.0f * (float)(z >> 40) * (1.0f / 16777216.0f) - 1.0f);
    }
    return h;
  }
  // Fills t (f32 or bf16) with U(-scale, scale).
  void fill(const Tensor& t, float scale) {
    std::vector<float> h = host(t.numel(), scale);
    if (t.dtype == DType::BF16) {
      std::vector<uint16_t> b(h.size());
      for (size_t i = 0; i < h.size(); ++i) b[i] = float_to_bf16_bits(h[i]);
      eng_.upload(t, b.data());
    } else {
      eng_.upload(t, h.data());
    }
  }
  Tensor make(DType t, std::initializer_list<int64_t> dims, float scale) {
    Tensor x = eng_.alloc(t, dims);
    fill(x, scale);
    return x;
  }
  Tensor empty(DType t, std::initializer_list<int64_t> dims) { return eng_.alloc(t, dims); }

 private:
  Engine& eng_;
  uint64_t seed_;
};

struct Workload {
  virtual ~Workload() = default;
  virtual void forward() = 0;
  virtual void backward() {}
  virtual void update() {}
  virtual void backward_only() {}  // before a --pass backward loop (no update follows)
  virtual bool has_backward() const { return true; }
  std::string describe;
};

// The model workloads' timesteps (spread over the schedule) and classes, uploaded into t and
// labels (labels only for class-conditional models); returns the timesteps.
std::vector<float> upload_steps_and_labels(Engine& eng, const ModelConfig& cfg, int B, const Tensor& t,
                                           const Tensor& labels) {
  std::vector<float> ts(B);
  for (int i = 0; i < B; ++i) ts[i] = (float)((i * 7919) % cfg.diffusion_steps);
  eng.upload(t, ts.data());
  if (cfg.class_cond) {
    std::vector<int32_t> l(B);
    for (int i = 0; i < B; ++i) l[i] = (i * 31) % cfg.num_classes;
    eng.upload(labels, l.data());
  }
  return ts;
}

// ---- the full training step: the trainer's own TrainStep ----
struct ModelWork : Workload {
  Model model;
  Optimizer opt;
  TrainStep step;
  ModelWork(Engine& eng, Filler& f, const ModelConfig& cfg, int B, const std::vector<float>& weights)
      : model(cfg, eng), opt(eng, model.arena_floats(), OptimizerOptions{}), step(eng, model, opt, B) {
    eng.upload(model.params(), weights.data());
    opt.init_ema(model.params());
    f.fill(step.x0, 1.0f);
    f.fill(step.noise, 1.7f);  // roughly unit variance
    const std::vector<float> ts = upload_steps_and_labels(eng, cfg, B, step.t, step.labels);
    std::vector<float> c(2 * B);
    for (int i = 0; i < B; ++i) {
      const double ab = std::exp(-5.0 * ts[i] / cfg.diffusion_steps);
      c[i] = (float)std::sqrt(ab);
      c[B + i] = (float)std::sqrt(1 - ab);
    }
    eng.upload(step.coef, c.data());
  }
  void forward() override { step.forward(1234); }
  void backward() override { step.backward(); }
  void update() override { step.update(); }
  // the backward alone, without the optimizer's updates it would otherwise start during it
  void backward_only() override { step.allow_early_updates(false); }
};

// ---- the model's forward as `unet sample` runs it: planned for sampling (no saved activations,
// no gradients), eval mode (no dropout), weights as given and held (the bf16 copy of the weights
// is made by the first, untimed, forward only, as in a sampler's steps) ----
struct SampleWork : Workload {
  Engine& eng;
  Model model;
  Tensor x, t, labels, out;
  SampleWork(Engine& e, Filler& f, const ModelConfig& cfg, int B, const std::vector<float>& weights)
      : eng(e), model(cfg, e) {
    model.plan(B, Mode::Sample);
    eng.upload(model.params(), weights.data());
    model.hold_weights(true);
    const int R = cfg.image_size;
    x = f.make(DType::F32, {B, R, R, cfg.in_channels}, 1.7f);
    out = f.empty(DType::F32, {B, R, R, cfg.out_channels()});
    t = f.empty(DType::F32, {B});
    if (cfg.class_cond) labels = f.empty(DType::I32, {B});
    upload_steps_and_labels(eng, cfg, B, t, labels);
  }
  void forward() override {
    ScopedRange r(eng.device(), "forward");
    model.forward(x, t, labels, out, false);
  }
};

// ---- one layer of the UNet, as a one-layer Model ----
struct LayerWork : Workload {
  Engine& eng;
  Model model;
  std::unique_ptr<Optimizer> opt;
  Tensor x, dout;
  LayerWork(Engine& e, Filler& f, const ModelConfig& cfg, const Layer& l, int B) : eng(e), model(cfg, e, l) {
    model.plan(B, Mode::Train);
    // Random weights everywhere (init zeroes some layers; timings on zeros can mislead).
    f.fill(model.params(), 0.05f);
    f.fill(model.emb_input(), 1.0f);
    const int ro = l.kind == Layer::Down || l.updown < 0 ? l.res / 2
                   : l.kind == Layer::Up || l.updown > 0 ? l.res * 2
                                                         : l.res;
    x = f.make(e.act_dtype(), {B, l.res, l.res, l.cin}, 1.0f);
    dout = f.make(e.act_dtype(), {B, ro, ro, l.cout}, 1.0f);
    opt = std::make_unique<Optimizer>(e, model.arena_floats(), OptimizerOptions{});
    opt->init_ema(model.params());
  }
  void forward() override { model.forward(x, {}, {}, {}, true, 1234); }
  void backward() override { model.backward(dout); }
  void update() override {
    ScopedRange r(eng.device(), "optimizer");
    opt->step(model.params(), model.grads());
  }
};

// ---- single ops ----
struct Conv1x1Work : Workload {
  Engine& eng;
  Tensor x, w, b, y, dy, dx, dw, db;
  Conv1x1Work(Engine& e, Filler& f, int B, int R, int Ci, int Co) : eng(e) {
    const DType a = e.act_dtype();
    x = f.make(a, {B, R, R, Ci}, 1.0f), w = f.make(a, {Co, 1, 1, Ci}, 1.0f / std::sqrt((float)Ci));
    b = f.make(DType::F32, {Co}, 0.1f), y = f.empty(a, {B, R, R, Co});
    dy = f.make(a, {B, R, R, Co}, 1.0f), dx = f.empty(a, {B, R, R, Ci});
    dw = f.empty(DType::F32, {Co, 1, 1, Ci}), db = f.empty(DType::F32, {Co});
  }
  void forward() override {
    ScopedRange r(eng.device(), "conv1x1 fwd");
    eng.ops().run(ConvFwd{x, w, b, {}, {}, y, 1});
  }
  void backward() override {
    ScopedRange r(eng.device(), "conv1x1 bwd");
    eng.ops().run(ConvBwdFilter{x, dy, dw, db, {}, 1});
    eng.ops().run(ConvBwdData{dy, w, dx, 1});
  }
};

struct GroupNormWork : Workload {
  Engine& eng;
  Tensor x, g, b, y, mean, rstd, dy, dx, dg, db;
  GroupNormWork(Engine& e, Filler& f, int B, int R, int C) : eng(e) {
    const DType a = e.act_dtype();
    x = f.make(a, {B, R, R, C}, 1.0f), g = f.make(DType::F32, {C}, 1.0f), b = f.make(DType::F32, {C}, 0.1f);
    y = f.empty(a, {B, R, R, C}), mean = f.empty(DType::F32, {B, kGroups}),
    rstd = f.empty(DType::F32, {B, kGroups});
    dy = f.make(a, {B, R, R, C}, 1.0f), dx = f.empty(a, {B, R, R, C});
    dg = f.empty(DType::F32, {C}), db = f.empty(DType::F32, {C});
  }
  void forward() override {
    ScopedRange r(eng.device(), "groupnorm+silu fwd");
    eng.ops().run(GroupNormFwd{x, g, b, {}, y, mean, rstd, true});
  }
  void backward() override {
    ScopedRange r(eng.device(), "groupnorm+silu bwd");
    eng.ops().run(GroupNormBwd{x, g, b, {}, mean, rstd, dy, dx, dg, db, {}, true, {}, {}, {}, {}});
  }
};

struct LinearWork : Workload {
  Engine& eng;
  Tensor x, w, b, y, dy, dx, dw, db;
  LinearWork(Engine& e, Filler& f, int N, int I, int O) : eng(e) {
    x = f.make(DType::F32, {N, I}, 1.0f), w = f.make(DType::F32, {O, I}, 1.0f / std::sqrt((float)I));
    b = f.make(DType::F32, {O}, 0.1f), y = f.empty(DType::F32, {N, O});
    dy = f.make(DType::F32, {N, O}, 1.0f), dx = f.empty(DType::F32, {N, I});
    dw = f.empty(DType::F32, {O, I}), db = f.empty(DType::F32, {O});
  }
  void forward() override {
    ScopedRange r(eng.device(), "linear fwd");
    eng.ops().run(LinearFwd{x, w, b, y});
  }
  void backward() override {
    ScopedRange r(eng.device(), "linear bwd");
    eng.ops().run(LinearBwd{x, w, dy, dx, dw, db});
  }
};

struct AdamwWork : Workload {
  Engine& eng;
  Tensor p, g;
  Optimizer opt;
  AdamwWork(Engine& e, Filler& f, size_t n)
      : eng(e),
        p(f.make(DType::F32, {(int64_t)n}, 0.05f)),
        g(f.make(DType::F32, {(int64_t)n}, 0.01f)),
        opt(e, n, OptimizerOptions{}) {
    opt.init_ema(p);
  }
  void forward() override {
    ScopedRange r(eng.device(), "optimizer");
    opt.step(p, g);
  }
  bool has_backward() const override { return false; }
};

void need(bool ok, const std::string& msg) {
  if (!ok) throw UserError(msg);
}

std::string shape(int B, int R, int Ci, int Co) {
  char b[160];
  std::snprintf(b, sizeof b, "B=%d %dx%d %d->%d channels", B, R, R, Ci, Co);
  return b;
}

}  // namespace

std::string run_profile(const ProfileRequest& a) {
  need(a.batch >= 1, "--batch-size must be at least 1");
  need(a.iters >= 1, "--iters must be at least 1");
  need(a.warmup >= 0, "--warmup must not be negative");
  if (!a.trace.empty()) check_writable_dir_for(a.trace);
  ModelConfig cfg = a.cfg;

  // A GPU is required; say so in one line.
  std::string why;
  std::unique_ptr<Engine> eng = make_cuda_engine(a.precision, &why);
  if (!eng) throw UserError("profile needs a CUDA GPU (" + why + ")");
  check_kernel_overrides(eng->base_ops());  // a forced variant the engine lacks: before any work
  std::unique_ptr<prof::GpuProfiler> gp = prof::make_gpu_profiler(&why);
  if (!gp) throw UserError("profile needs a CUDA GPU (" + why + ")");
  const Precision prec = a.precision;

  prof::RangeTracker tracker([&gp] { return gp->timestamp(); });
  tracker.on_push = [&gp](uint64_t id) { gp->push_range(id); };
  tracker.on_pop = [&gp] { gp->pop_range(); };
  set_range_listener(&tracker);
  struct Unhook {
    ~Unhook() { set_range_listener(nullptr); }
  } unhook;
  flops::CountingOps counting(
      eng->base_ops(), eng->device(),
      [&tracker](const char* op, const std::string& v, const flops::Cost& c) {
        tracker.add_cost(c.flops, c.bytes);
        tracker.add_variant(std::string(op) + "=" + v);
      },
      a.op_ranges);
  counting.set_counting(false);
  eng->set_ops(&counting);
  Filler fill(*eng, 0x5eed);

  // Layer shapes: explicit flags, else the model configuration's.
  const int B = a.batch;
  const int Ci = a.in_ch > 0 ? a.in_ch : cfg.num_channels;
  const int Co = a.out_ch > 0 ? a.out_ch : Ci;
  int att_res = 0;
  for (int r : cfg.attention_resolutions) att_res = std::max(att_res, r);
  const int R = a.resolution > 0         ? a.resolution
                : a.layer == "attention" ? (att_res ? att_res : 16)
                : a.layer == "upsample"  ? cfg.image_size / 2
                                         : cfg.image_size;
  need(Ci >= 1 && Co >= 1 && R >= 1, "--in-channels, --out-channels and --resolution must be positive");
  auto need_groups = [&](int c, const char* what) {
    need(c % kGroups == 0,
         std::string(what) + " " + std::to_string(c) + " is not divisible by the 32 GroupNorm groups");
  };
  if (a.emb_ch > 0) {
    need(a.emb_ch % 4 == 0, "--emb-channels must be a multiple of 4 (it is 4 x --num-channels)");
    cfg.num_channels = a.emb_ch / 4;  // a one-layer network reads only the embedding width from it
  }

  std::unique_ptr<Workload> w;
  auto layer = [&](Layer::Kind k, int cin, int cout, int heads = 0) {
    Layer l{k, a.layer, cin, cout, R, 0, heads};
    return std::make_unique<LayerWork>(*eng, fill, cfg, l, B);
  };
  if (a.layer == "model") {
    ParamTable table = build_param_table(cfg);
    std::vector<float> weights = a.weights.empty() ? init_params(table, 0) : a.weights;
    // --pass forward profiles sampling's forward (what `unet sample` runs per step); backward
    // and step profile the training step.
    const bool sampling = a.pass == "forward";
    if (sampling)
      w = std::make_unique<SampleWork>(*eng, fill, cfg, B, weights);
    else
      w = std::make_unique<ModelWork>(*eng, fill, cfg, B, weights);
    char b[240];
    std::snprintf(b, sizeof b, "model %s (%.2f M parameters), B=%d %dx%d%s", a.model_what.c_str(),
                  table.count / 1e6, B, cfg.image_size, cfg.image_size,
                  sampling ? ", sampling's forward (eval mode, planned for sampling)" : "");
    w->describe = b;
  } else if (a.layer == "resblock") {
    need_groups(Ci, "--in-channels");
    need_groups(Co, "--out-channels");
    w = layer(Layer::Res, Ci, Co);
    w->describe = "resblock " + shape(B, R, Ci, Co) + ", emb " + std::to_string(cfg.time_embed_dim()) +
                  (cfg.use_scale_shift_norm ? ", scale-shift norm" : "") +
                  (cfg.dropout > 0 ? ", dropout " + std::to_string(cfg.dropout).substr(0, 4) : "");
  } else if (a.layer == "attention") {
    need_groups(Ci, "--in-channels");
    const int h = cfg.heads_for(Ci);
    need(h >= 1 && Ci % h == 0, "--layer attention: " + std::to_string(Ci) +
                                    " channels do not split into heads (--num-head-channels " +
                                    std::to_string(cfg.num_head_channels) + ", --num-heads " +
                                    std::to_string(cfg.num_heads) + ")");
    w = layer(Layer::Attn, Ci, Ci, h);
    w->describe = "attention " + shape(B, R, Ci, Ci) + ", " + std::to_string(h) + " heads" +
                  (cfg.use_new_attention_order ? "" : " (legacy order)");
  } else if (a.layer == "conv3x3") {
    w = layer(Layer::Conv, Ci, Co);
    w->describe = "conv3x3 " + shape(B, R, Ci, Co);
  } else if (a.layer == "downsample") {
    need(R % 2 == 0, "--layer downsample: --resolution must be even");
    w = layer(Layer::Down, Ci, Ci);
    w->describe = "downsample (3x3 conv, stride 2) " + shape(B, R, Ci, Ci);
  } else if (a.layer == "upsample") {
    w = layer(Layer::Up, Ci, Ci);
    w->describe = "upsample (nearest 2x + 3x3 conv) " + shape(B, R, Ci, Ci);
  } else if (a.layer == "conv1x1") {
    w = std::make_unique<Conv1x1Work>(*eng, fill, B, R, Ci, Co);
    w->describe = "conv1x1 " + shape(B, R, Ci, Co);
  } else if (a.layer == "groupnorm") {
    need_groups(Ci, "--in-channels");
    w = std::make_unique<GroupNormWork>(*eng, fill, B, R, Ci);
    w->describe = "groupnorm+silu " + shape(B, R, Ci, Ci);
  } else if (a.layer == "linear") {
    w = std::make_unique<LinearWork>(*eng, fill, B, Ci, Co);
    w->describe = "linear N=" + std::to_string(B) + " " + std::to_string(Ci) + "->" + std::to_string(Co);
  } else if (a.layer == "adamw") {
    const size_t n = a.params > 0 ? (size_t)a.params : build_param_table(cfg).total;
    w = std::make_unique<AdamwWork>(*eng, fill, n);
    w->describe = "adamw over " + std::to_string(n) + " parameters (grad norm + update + EMA)";
  } else {
    throw UserError("--layer " + a.layer + ": unknown layer");
  }
  if ((a.layer == "upsample" || a.layer == "downsample") && a.out_ch > 0 && a.out_ch != Ci)
    throw UserError("--layer " + a.layer + ": the UNet's " + a.layer +
                    " keeps the channel count (--out-channels)");
  std::string pass = w->has_backward() ? a.pass : "step";
  Device& dev = eng->device();
  dev.sync();

  prof::Peaks peaks = a.measure_peaks ? gp->measure_peaks(prec) : prof::device_peaks(gp->device(), prec);
  if (a.peak_tflops > 0)
    peaks.tflops = a.peak_tflops, peaks.source = "--peak-tflops/--peak-gbps and " + peaks.source;
  if (a.peak_gbps > 0)
    peaks.gbps = a.peak_gbps, peaks.source = "--peak-tflops/--peak-gbps and " + peaks.source;

  auto once = [&] {
    if (pass == "forward") {
      w->forward();
    } else if (pass == "backward") {
      w->backward();
    } else {
      w->forward();
      w->backward();
      w->update();
    }
  };
  if (pass == "backward") w->backward_only(), w->forward();  // saved activations for the backward-only loop

  // CUDA graphs: the timed kernels are replays of one captured iteration, as `unet train` runs
  // its step. Ranges (external correlation ids) only tag eager launches, so the layer table
  // comes from an eager pass of the same iterations first.
  const bool graph = !a.no_graph && dev.supports_graphs();
  std::fprintf(
      stderr, "unet: profiling %s, pass %s, precision %s on %s (%d warm-up + %d timed iterations%s)\n",
      w->describe.c_str(), pass.c_str(), precision_name(prec), gp->device().name.c_str(), a.warmup, a.iters,
      graph ? ", eager for the layer table, then as CUDA-graph replays" : ", eager launches");
  gp->start();
  for (int i = 0; i < a.warmup; ++i) once();
  gp->region_begin();
  tracker.clear();
  counting.set_counting(true);
  for (int i = 0; i < a.iters; ++i) once();
  const double region_ms = gp->region_end();
  counting.set_counting(false);
  std::vector<prof::Activity> acts = gp->take_activities();
  prof::assign_ranges_by_launch_time(acts, tracker.instances());

  prof::Report rep;
  rep.gpu = gp->device().name;
  rep.cudnn = cudnn_library();
  rep.target = w->describe;
  rep.precision = precision_name(prec);
  rep.pass = pass;
  rep.iters = a.iters;
  rep.warmup = a.warmup;
  rep.peaks = peaks;
  rep.events_ms = region_ms;
  rep.dropped = gp->dropped();
  rep.memory_bytes = dev.bytes_held();
  prof::build_report(rep, acts, tracker);
  rep.notes.push_back(
      "FLOPs count 2 per multiply-add (3x3 taps on padding included); bytes are the minimum traffic, each "
      "op's "
      "inputs read once and outputs written once at their storage size");
  size_t outside = 0;
  for (const auto& x : acts) outside += x.range == 0;
  if (outside)
    rep.notes.push_back(std::to_string(outside) + " of " + std::to_string(acts.size()) +
                        " GPU activities ran outside any layer range");
  for (const auto& l : rep.layers)
    if (prof::roofline(l.flops, l.bytes, (double)l.time_ns, rep.peaks).peak_pct > 100) {
      rep.notes.push_back(
          "Peak (%) above 100: that range's data stayed in the L2 cache, which is faster than the DRAM roof");
      break;
    }
  // The trace: the eager pass (there the kernels carry their layer ranges), then the graph replays.
  auto write_trace = [&](const std::vector<prof::Activity>* replays) {
    if (a.trace.empty()) return;
    AtomicFile f(a.trace);
    {
      std::ofstream os(f.tmp_path());
      prof::write_chrome_trace(os, acts, tracker, rep.gpu, replays);
      os.flush();
      if (!os) throw UserError(a.trace + ": write failed");
    }
    f.commit();
    rep.notes.push_back("trace written to " + a.trace + " (" +
                        (replays ? "the eager pass with its layers, then the CUDA-graph replays; " : "") +
                        "open in https://ui.perfetto.dev or chrome://tracing)");
  };

  // Ranges are plain host calls from here on: no external ids, nothing the layer table counts.
  tracker.on_push = nullptr;
  tracker.on_pop = nullptr;
  if (graph) {
    try {
      dev.graph_begin();
      once();
      // (as `unet sample` and `unet train` capture theirs)
      dev.graph_end(pass == "forward" ? Device::GraphPdl::All : step_graph_pdl(prec));
    } catch (const std::exception& e) {
      throw UserError(std::string("profile: capturing the iteration as a CUDA graph failed (") + e.what() +
                      "); --no-graph profiles eager launches");
    }
    for (int i = 0; i < std::max(1, a.warmup); ++i) dev.graph_launch();  // upload + warm-up
    gp->region_begin();
    for (int i = 0; i < a.iters; ++i) dev.graph_launch();
    const double graph_ms = gp->region_end();
    std::vector<prof::Activity> gacts = gp->take_activities();
    prof::use_graph_replays(rep, gacts, graph_ms);
    write_trace(&gacts);
    rep.dropped += gp->dropped();
    rep.notes.push_back(
        "kernel table, kernel sum and CUDA events: " + std::to_string(a.iters) +
        " replays of one iteration captured as a CUDA graph (as `unet train` runs its step); layer "
        "table and FLOPs: the eager pass before it (same iterations, one launch per kernel); "
        "--no-graph for eager only");
    uint64_t graph_records = 0;
    for (const auto& k : rep.kernels) graph_records += k.instances;
    for (const auto& k : rep.memops) graph_records += k.instances;
    if (graph_records != rep.eager.activities)
      rep.notes.push_back("the graph replays ran " + std::to_string(graph_records) +
                          " GPU activities, the eager pass " + std::to_string(rep.eager.activities) +
                          " (the driver may turn memsets into kernels)");
    if (cfg.dropout > 0 && (a.layer == "model" || a.layer == "resblock"))
      rep.notes.push_back(
          "dropout: its seed is fixed (captured in the graph), so every iteration uses the same mask");
  }
  if (!graph) write_trace(nullptr);
  acts.clear();
  gp->stop();
  if (rep.difference_pct() > 10) {
    char b[300];
    std::snprintf(
        b, sizeof b,
        "the GPU sat idle %.3f ms/iter between kernels: launch latency or a host that cannot issue kernels "
        "as fast as they run (small kernels)%s",
        rep.idle_ms_per_iter(), graph ? "" : "; CUDA graphs (the default) remove most of it");
    rep.notes.push_back(b);
  }

  if (!a.no_plain) {
    // The same iterations with CUPTI detached: what the profiler itself costs.
    rep.plain_events_ms = gp->time_ms([&] {
      for (int i = 0; i < a.iters; ++i) graph ? dev.graph_launch() : once();
    });
  }
  eng->set_ops(nullptr);

  return a.format == "json"  ? prof::format_json(rep)
         : a.format == "csv" ? prof::format_csv(rep)
                             : prof::format_table(rep);
}

}  // namespace unet
