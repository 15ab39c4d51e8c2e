// Parity with the PyTorch model (scripts/unet_torch.py, guided-diffusion's structure): forward
// output and every parameter gradient on golden files made by scripts/make_golden.py in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "checkpoint.h"
#include "engine.h"
#include "h5.h"
#include "layout.h"
#include "model.h"
#include "testutil.h"
#include "train_step.h"

using namespace unet;

namespace {

std::vector<std::string> golden_files() {
  std::vector<std::string> v;
  std::string dir = test::source_dir() + "/testdata/golden";
  if (!std::filesystem::is_directory(dir)) return v;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".h5") v.push_back(e.path().string());
  std::sort(v.begin(), v.end());
  return v;
}

// Runs one golden file on a backend; returns (out rel err, worst grad rel err, its name).
struct Result {
  double out_err = 0, grad_err = 0;
  std::string worst;
};

Result run_golden(Engine& eng, const std::string& path) {
  h5::File f = h5::File::open(path);
  ModelConfig cfg = read_config(f);
  Model model(cfg, eng);
  const ParamTable& tab = model.table();
  std::vector<float> w = read_param_group(f, "model", tab);
  std::vector<float> gref = read_param_group(f, "grad", tab);
  auto xs = h5::shape(f, "x");
  const int B = (int)xs[0], C = (int)xs[1], H = (int)xs[2], W = (int)xs[3], Co = cfg.out_channels();
  auto x = nchw_to_nhwc(h5::read_f32(f, "x").data(), B, C, H, W);
  auto t = h5::read_f32(f, "t");
  auto dout = nchw_to_nhwc(h5::read_f32(f, "dout").data(), B, Co, H, W);
  auto out_ref = nchw_to_nhwc(h5::read_f32(f, "out").data(), B, Co, H, W);
  std::vector<int32_t> labels(B, 0);
  if (cfg.class_cond) {
    auto l = h5::read_i64(f, "labels");
    for (int i = 0; i < B; ++i) labels[i] = (int32_t)l[i];
  }
  model.plan(B, Mode::Train);
  eng.upload(model.params(), w.data());
  Tensor dx = eng.alloc(DType::F32, {B, H, W, C}), dt = eng.alloc(DType::F32, {B});
  Tensor dy = eng.alloc(DType::F32, {B, H, W, Co}), dd = eng.alloc(DType::F32, {B, H, W, Co});
  Tensor dl = eng.alloc(DType::I32, {B});
  eng.upload(dx, x.data());
  eng.upload(dt, t.data());
  eng.upload(dd, dout.data());
  eng.upload(dl, labels.data());
  eng.ops().run(Fill{dy, NAN});  // poison
  model.forward(dx, dt, dl, dy, true, 0);
  std::vector<float> out(out_ref.size());
  eng.download(out.data(), dy);
  Result r;
  r.out_err = test::rel_l2(out, out_ref);
  model.backward(dd);
  std::vector<float> g(tab.total);
  eng.download(g.data(), model.grads());
  for (auto& p : tab.params) {
    double e = test::rel_l2(g.data() + p.offset, gref.data() + p.offset, p.numel);
    if (!(e <= r.grad_err)) r.grad_err = e, r.worst = p.name;
  }
  return r;
}

}  // namespace

TEST(ModelGolden, CpuMatchesPyTorchFloat64) {
  auto files = golden_files();
  ASSERT_FALSE(files.empty()) << "no golden files in testdata/golden (scripts/make_golden.py makes them)";
  auto eng = make_cpu_engine();
  for (auto& path : files) {
    SCOPED_TRACE(path);
    Result r = run_golden(*eng, path);
    // fp32 vs float64 reference: SPEC §5 asks 1e-5 relative for the forward, 1e-4 for gradients.
    EXPECT_LT(r.out_err, 1e-5) << "forward";
    EXPECT_LT(r.grad_err, 1e-4) << "worst gradient: " << r.worst;
    std::printf("[golden] %s cpu: out %.2e, worst grad %.2e (%s)\n",
                std::filesystem::path(path).filename().c_str(), r.out_err, r.grad_err, r.worst.c_str());
  }
}

// The CPU engine's bf16 emulation against float64: the same tolerance the CUDA bf16 engine must
// meet (activations and GEMM inputs rounded to 8 mantissa bits).
TEST(ModelGolden, CpuBf16EmulationWithinBf16Tolerance) {
  auto eng = make_cpu_engine(Precision::BF16);
  for (auto& path : golden_files()) {
    SCOPED_TRACE(path);
    Result r = run_golden(*eng, path);
    EXPECT_LT(r.out_err, 3e-2) << "forward";
    EXPECT_LT(r.grad_err, 1e-1) << "worst gradient: " << r.worst;
    std::printf("[golden] %s cpu bf16: out %.2e, worst grad %.2e (%s)\n",
                std::filesystem::path(path).filename().c_str(), r.out_err, r.grad_err, r.worst.c_str());
  }
}

TEST(ModelGolden, CudaMatchesPyTorchFloat64) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device found";
  for (Precision prec : {Precision::FP32, Precision::TF32, Precision::BF16}) {
    std::string why;
    auto eng = make_cuda_engine(prec, &why);
    ASSERT_TRUE(eng) << why;
    for (auto& path : golden_files()) {
      SCOPED_TRACE(path);
      Result r = run_golden(*eng, path);
      const double to = prec == Precision::FP32 ? 1e-5 : prec == Precision::TF32 ? 1e-2 : 3e-2;
      const double tg = prec == Precision::FP32 ? 1e-4 : prec == Precision::TF32 ? 5e-2 : 1e-1;
      EXPECT_LT(r.out_err, to) << "forward " << precision_name(prec);
      EXPECT_LT(r.grad_err, tg) << precision_name(prec) << " worst gradient: " << r.worst;
      std::printf("[golden] %s %s: out %.2e, worst grad %.2e (%s)\n",
                  std::filesystem::path(path).filename().c_str(), precision_name(prec), r.out_err, r.grad_err,
                  r.worst.c_str());
    }
  }
}

namespace {
// seed64's model at batch 4, random weights and inputs, one training forward + backward on a CUDA
// engine: its output and every parameter gradient; with `graph`, forward and backward captured as
// one CUDA graph (programmatic edges as `pdl` says) and replayed twice (the second replay's results).
std::vector<float> seed64_grads(Precision prec, bool graph, uint64_t seed, std::string* bad = nullptr,
                                Device::GraphPdl pdl = Device::GraphPdl::Off) {
  std::string why;
  auto eng = make_cuda_engine(prec, &why);
  if (!eng) ADD_FAILURE() << why;
  if (!eng) return {};
  const ModelConfig cfg = preset("seed64");
  Model model(cfg, *eng);
  const int B = 4, R = cfg.image_size, C = cfg.in_channels, Co = cfg.out_channels();
  model.plan(B, Mode::Train);
  const ParamTable& tab = model.table();
  const std::vector<float> w = test::random_params(tab, seed);
  eng->upload(model.params(), w.data());
  Tensor dx = eng->alloc(DType::F32, {B, R, R, C}), dt = eng->alloc(DType::F32, {B});
  Tensor dy = eng->alloc(DType::F32, {B, R, R, Co}), dd = eng->alloc(DType::F32, {B, R, R, Co});
  Tensor dl = eng->alloc(DType::I32, {B});
  const std::vector<float> x = test::randn((size_t)B * R * R * C, seed + 1);
  const std::vector<float> dout = test::randn((size_t)B * R * R * Co, seed + 2);
  const std::vector<float> t = {3.f, 250.f, 611.f, 998.f};
  const std::vector<int32_t> labels(B, 0);
  eng->upload(dx, x.data());
  eng->upload(dt, t.data());
  eng->upload(dd, dout.data());
  eng->upload(dl, labels.data());
  eng->ops().run(Fill{model.grads(), NAN});  // poison: every gradient must be written
  Device& dev = eng->device();
  auto step = [&] {
    model.forward(dx, dt, dl, dy, true, 7);
    model.backward(dd);
  };
  if (graph) {
    dev.graph_begin();
    step();
    dev.graph_end(pdl);
    dev.graph_launch();
    eng->ops().run(Fill{model.grads(), NAN});
    dev.graph_launch();
  } else {
    step();
  }
  std::vector<float> r((size_t)B * R * R * Co + tab.total);
  eng->download(r.data(), dy);
  eng->download(r.data() + (size_t)B * R * R * Co, model.grads());
  if (bad) {  // the tensors with values that are not finite (unwritten: NaN)
    size_t n = 0;
    for (size_t i = 0; i < (size_t)B * R * R * Co; ++i) n += !std::isfinite(r[i]);
    if (n) *bad += " output: " + std::to_string(n);
    for (auto& p : tab.params) {
      n = 0;
      for (size_t i = 0; i < p.numel; ++i) n += !std::isfinite(r[(size_t)B * R * R * Co + p.offset + i]);
      if (n) *bad += " " + p.name + ": " + std::to_string(n) + " of " + std::to_string(p.numel);
    }
  }
  return r;
}
// Elements whose bits differ.
size_t bitwise_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return differ;
}
}  // namespace

// Lanes (UNET_LANES, default on): the filter gradients run on a second stream beside the data
// gradients, and the forward's skip convs beside in_layers; with UNET_SKIP_BRANCH (default: bf16)
// the backward's skip connections on a third. The streams share nothing but read-only inputs and
// reductions never depend on timing, so the output and every gradient are bitwise those of one
// stream, eager and as a replayed CUDA graph (without programmatic edges, with `unet train`'s and
// with them into every unet kernel), in tf32 and bf16, with and without the third stream; the
// golden tests above check the values themselves.
TEST(ModelGolden, CudaLanesGiveTheSameResultsBitwise) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device found";
  const uint64_t seed = test::test_seed();
  for (Precision prec : {Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(prec));
    std::string bad;
    std::vector<float> one;
    {
      test::ScopedEnv lanes("UNET_LANES", "0");
      one = seed64_grads(prec, false, seed, &bad);
    }
    ASSERT_FALSE(one.empty());
    EXPECT_EQ(bad, "");
    double norm = 0;
    for (float v : one) norm += std::isfinite(v) ? std::fabs(v) : 0.0;
    EXPECT_GT(norm, 0.0);
    // eager; graphs without programmatic edges, with them where `unet train` puts them (tf32:
    // into the kernels nothing runs beside), and into every unet kernel (UNET_PDL=1)
    using P = Device::GraphPdl;
    struct Mode {
      bool graph;
      P pdl;
      const char* name;
    };
    std::vector<Mode> modes = {{false, P::Off, "eager"}, {true, P::Off, "graph"}};
    if (step_graph_pdl(prec) == P::Alone) modes.push_back({true, P::Alone, "graph as unet train"});
    modes.push_back({true, P::All, "graph, programmatic edges into every kernel"});
    for (const auto& m : modes)
      for (const char* branch : {"0", "1"}) {
        SCOPED_TRACE(std::string(m.name) + ", UNET_SKIP_BRANCH=" + branch);
        test::ScopedEnv skip_branch("UNET_SKIP_BRANCH", branch);
        const std::vector<float> two = seed64_grads(prec, m.graph, seed, nullptr, m.pdl);
        ASSERT_EQ(two.size(), one.size());
        EXPECT_EQ(bitwise_differences(one, two), 0u);
      }
  }
}

namespace {
// Three seed64 training steps (B = 4; the first eager, then a captured graph replayed twice):
// the weights, AdamW moments and EMA after them, flat; norm_sum: the logs' sum of gradient norms
// (finite only without poison, the gradients' NaN fill: the arena's padding is in the norm's sums).
std::vector<float> seed64_steps(Precision prec, uint64_t seed, bool* early, float* norm_sum = nullptr,
                                bool poison = true) {
  auto eng = make_cuda_engine(prec);
  if (!eng) return {};
  const ModelConfig cfg = preset("seed64");
  Model model(cfg, *eng);
  Optimizer opt(*eng, model.arena_floats(), OptimizerOptions{});
  const int B = 4;
  TrainStep step(*eng, model, opt, B);
  *early = step.updates_early();
  const std::vector<float> w = test::random_params(model.table(), seed);
  eng->upload(model.params(), w.data());
  opt.init_ema(model.params());
  const size_t img = (size_t)B * cfg.image_size * cfg.image_size * cfg.in_channels;
  const std::vector<float> x0 = test::randn(img, seed + 1), noise = test::randn(img, seed + 2);
  eng->upload(step.x0, x0.data());
  eng->upload(step.noise, noise.data());
  const Diffusion d(cfg.diffusion_steps, cfg.noise_schedule, cfg.learn_sigma);
  const std::vector<int> ts = {5, 300, 640, 997};
  step.set_timesteps(d, ts.data(), nullptr);
  eng->ops().run(Fill{model.grads(), poison ? NAN : 0.f});  // an update that reads a gradient early reads NaN
  step.enqueue(11);
  Device& dev = eng->device();
  dev.graph_begin();
  step.enqueue(12);
  dev.graph_end(step_graph_pdl(prec));  // as `unet train` captures its step
  dev.graph_launch();
  dev.graph_launch();
  const size_t n = model.arena_floats();
  std::vector<float> r(4 * n);
  eng->download(r.data(), model.params());
  opt.save(r.data() + n, r.data() + 2 * n, r.data() + 3 * n);
  if (norm_sum) eng->download(norm_sum, opt.norm_sum());
  return r;
}
}  // namespace

// With lanes (and no clipping, one process, one micro-batch) the optimizer updates each range of
// weights on its own stream as soon as the backward has finalized its gradients; each element's
// update is the one the whole-arena pass gives it, so weights, moments and EMA are bitwise those
// of one stream (UNET_LANES=0, which also updates at the end), after eager and graph steps.
TEST(ModelGolden, CudaEarlyOptimizerUpdatesGiveTheSameStateBitwise) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device found";
  const uint64_t seed = test::test_seed();
  for (Precision prec : {Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(prec));
    bool early = true;
    std::vector<float> one;
    {
      test::ScopedEnv lanes("UNET_LANES", "0");
      one = seed64_steps(prec, seed, &early);
    }
    EXPECT_FALSE(early);
    bool early2 = false;
    const std::vector<float> two = seed64_steps(prec, seed, &early2);
    EXPECT_TRUE(early2);
    {  // the logs' gradient norm: the early updates add each range's squares as they update it,
       // the single pass all at once (the ranges' f32 sums: a few f32 roundings apart)
      float norm1 = 0, norm2 = 0;
      bool e = false;
      {
        test::ScopedEnv lanes("UNET_LANES", "0");
        seed64_steps(prec, seed, &e, &norm1, false);
      }
      seed64_steps(prec, seed, &e, &norm2, false);
      EXPECT_GT(norm1, 0.f);
      EXPECT_NEAR(norm2, norm1, 1e-6 * norm1);
    }
    ASSERT_FALSE(one.empty());
    ASSERT_EQ(one.size(), two.size());
    EXPECT_EQ(bitwise_differences(one, two), 0u);
    // every parameter (not the arena's padding) finite in all four, and most weights moved
    const ParamTable tab = build_param_table(preset("seed64"));
    const std::vector<float> w = test::random_params(tab, seed);
    const size_t n = one.size() / 4;
    size_t bad = 0, moved = 0, total = 0;
    for (const auto& p : tab.params)
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        for (int k = 0; k < 4; ++k) bad += !std::isfinite(two[k * n + i]);
        moved += two[i] != w[i], ++total;
      }
    EXPECT_EQ(bad, 0u);
    EXPECT_GT(moved, total / 2);
  }
}
