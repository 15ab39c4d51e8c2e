// The batched sampler against a direct host loop written from SPEC §4 in double precision
// (with a synthetic denoiser and with a tiny real Model on the CPU backend), plus the properties
// the CLI relies on: determinism, independence from --batch-size, original timesteps passed to
// the network, labels, progress, option errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "classifier_free.h"
#include "diffusion.h"
#include "engine.h"
#include "model.h"
#include "rng.h"
#include "sampler.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {

// A smooth synthetic denoiser on host memory (the CPU backend's pointers are host pointers):
// eps depends on x, t, position, channel and label; the variance value (learned sigma) on x, t.
struct FakeNet {
  int S = 4, C = 3;
  bool learn_sigma = false, class_cond = false;
  std::vector<float> calls_t;  // the t of each call's first sample
  std::vector<int> calls_B;
  std::vector<int32_t> seen_labels;
  std::vector<float> first_x;  // x of the very first call (x_T of the first batch)

  static double eps_of(double x, double t, size_t p, int c, int y) {
    return 0.6 * x + 0.3 * std::sin(0.01 * t + 0.1 * c + 0.05 * double(p)) + 0.05 * y;
  }
  static double var_of(double x, double t) { return std::tanh(0.5 * x + 0.001 * t); }

  SamplerNet net(int T, const std::string& schedule) {
    SamplerNet n;
    n.image_size = S, n.channels = C, n.learn_sigma = learn_sigma, n.class_cond = class_cond,
    n.num_classes = 5;
    n.diffusion_steps = T, n.noise_schedule = schedule;
    n.denoise = [this](const Tensor& xt, const Tensor& tt, const Tensor& yt, const Tensor& ot) {
      const float* x = xt.f32();
      const float* t = tt.f32();
      const int32_t* y = yt.defined() ? yt.i32() : nullptr;
      float* out = ot.f32();
      const int B = (int)xt.dim[0];
      calls_t.push_back(t[0]);
      calls_B.push_back(B);
      const size_t hw = size_t(S) * S, numel = hw * C;
      if (first_x.empty()) first_x.assign(x, x + B * numel);
      const int Co = learn_sigma ? 2 * C : C;
      for (int b = 0; b < B; ++b) {
        if (class_cond) seen_labels.push_back(y[b]);
        EXPECT_EQ(t[b], t[0]);
        for (size_t p = 0; p < hw; ++p)
          for (int c = 0; c < C; ++c) {
            const double xv = x[b * numel + p * C + c];
            out[(b * hw + p) * Co + c] = float(eps_of(xv, t[b], p, c, class_cond ? y[b] : 0));
            if (learn_sigma) out[(b * hw + p) * Co + C + c] = float(var_of(xv, t[b]));
          }
      }
    };
    return n;
  }
};

// The sampler loop of SPEC §4 on the host in double, from the base process's abar only.
// eps_fn(x, t, eps, var) evaluates the network on the whole batch (float in, double out).
using EpsFn = std::function<void(const std::vector<float>& x, int t, std::vector<double>& eps,
                                 std::vector<double>& var)>;
std::vector<float> reference_loop(const Diffusion& base, const std::vector<int>& keep, bool ddim, double eta,
                                  bool clip, bool learn_sigma, std::vector<float> x, size_t numel, int first,
                                  uint64_t seed, const EpsFn& eps_fn) {
  const size_t n = x.size();
  std::vector<double> eps(n), var(n);
  for (int k = int(keep.size()) - 1; k >= 0; --k) {
    const int t = keep[k];
    const double ab = base.alphas_cumprod[t], abp = k == 0 ? 1.0 : base.alphas_cumprod[keep[k - 1]];
    const double beta = 1 - ab / abp;
    eps_fn(x, t, eps, var);
    // Step noise per the documented counter contract.
    const uint64_t key = rng_key(seed, Stream::SampleStep, uint64_t(t));
    for (size_t i = 0; i < n; ++i) {
      double x0 = x[i] / std::sqrt(ab) - std::sqrt(1 / ab - 1) * eps[i];
      if (clip) x0 = std::min(1.0, std::max(-1.0, x0));
      const double z = normal(key, Stream::SampleStep, uint64_t(first) * numel + i);
      double xn;
      if (ddim) {
        const double e = (x[i] / std::sqrt(ab) - x0) / std::sqrt(1 / ab - 1);
        const double sigma = eta * std::sqrt((1 - abp) / (1 - ab)) * std::sqrt(1 - ab / abp);
        xn = std::sqrt(abp) * x0 + std::sqrt(std::max(0.0, 1 - abp - sigma * sigma)) * e +
             (k > 0 ? sigma * z : 0.0);
      } else {
        xn = beta * std::sqrt(abp) / (1 - ab) * x0 + (1 - abp) * std::sqrt(1 - beta) / (1 - ab) * x[i];
        if (k > 0) {
          double log_var = std::log(beta);  // fixed large
          if (learn_sigma) {
            const double post = beta * (1 - abp) / (1 - ab);
            const double frac = (var[i] + 1) / 2;
            log_var = frac * std::log(beta) + (1 - frac) * std::log(post);
          }
          xn += std::exp(0.5 * log_var) * z;
        }
      }
      x[i] = float(xn);
    }
  }
  return x;
}

EpsFn fake_eps(int S, int C, std::vector<int32_t> labels = {}) {
  return [=](const std::vector<float>& x, int t, std::vector<double>& eps, std::vector<double>& var) {
    const size_t hw = size_t(S) * S, numel = hw * C;
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t b = i / numel, p = (i % numel) / C;
      const int c = int(i % C);
      eps[i] = FakeNet::eps_of(x[i], t, p, c, labels.empty() ? 0 : labels[b]);
      var[i] = FakeNet::var_of(x[i], t);
    }
  };
}

}  // namespace

TEST(Sampler, MatchesHostLoopAllModes) {
  auto be = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  struct Case {
    const char* sampler;
    int T, steps;
    double eta;
    bool clip, learn_sigma;
    const char* schedule;
  };
  const Case cases[] = {
      {"ddim", 100, 10, 0.0, true, false, "linear"}, {"ddim", 100, 20, 0.7, true, true, "cosine"},
      {"ddim", 60, 0, 1.0, false, false, "cosine"},  {"ddpm", 100, 0, 0, true, false, "linear"},
      {"ddpm", 100, 13, 0, true, true, "cosine"},    {"ddpm", 80, 7, 0, false, true, "linear"},
  };
  for (const Case& cs : cases) {
    FakeNet f;
    f.learn_sigma = cs.learn_sigma;
    const int n = 3;
    const size_t numel = size_t(f.S) * f.S * f.C;
    SampleOptions o;
    o.sampler = cs.sampler, o.steps = cs.steps, o.eta = float(cs.eta), o.clip = cs.clip, o.seed = seed + 1;
    auto noise = test::randn(n * numel, seed);
    std::vector<float> out(n * numel, std::numeric_limits<float>::quiet_NaN());
    sample(*be, f.net(cs.T, cs.schedule), o, n, noise.data(), nullptr, out.data(), nullptr);
    Diffusion base(cs.T, cs.schedule, cs.learn_sigma);
    auto keep = sampler_timesteps(cs.sampler, cs.T, cs.steps);
    auto want = reference_loop(base, keep, std::string(cs.sampler) == "ddim", cs.eta, cs.clip, cs.learn_sigma,
                               noise, numel, 0, o.seed, fake_eps(f.S, f.C));
    EXPECT_LT(test::rel_l2(out, want), 1e-4) << cs.sampler << " steps=" << cs.steps << " eta=" << cs.eta;
    // The network saw the original timesteps, from the last kept one down to 0.
    ASSERT_EQ(f.calls_t.size(), keep.size());
    for (size_t i = 0; i < keep.size(); ++i) EXPECT_EQ(f.calls_t[i], float(keep[keep.size() - 1 - i]));
    if (cs.clip) {
      for (float v : out) ASSERT_LE(std::fabs(v), 1.0f + 1e-5f);
    }
  }
}

TEST(Sampler, DeterministicAndIndependentOfBatchSize) {
  auto be = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  const int n = 5;
  for (const char* s : {"ddpm", "ddim"}) {
    FakeNet f1, f2, f3;
    const size_t numel = size_t(f1.S) * f1.S * f1.C;
    SampleOptions o;
    o.sampler = s, o.steps = 8, o.eta = 0.5f, o.seed = seed;
    std::vector<float> a(n * numel), b(n * numel), c(n * numel);
    sample(*be, f1.net(50, "linear"), o, n, nullptr, nullptr, a.data(), nullptr);
    o.batch_size = 2;  // batches 2, 2, 1
    sample(*be, f2.net(50, "linear"), o, n, nullptr, nullptr, b.data(), nullptr);
    EXPECT_EQ(a, b) << s;
    EXPECT_EQ(f2.calls_B,
              (std::vector<int>{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1}));
    // x_T drawn from the rng per the documented contract.
    ASSERT_EQ(f1.first_x.size(), n * numel);
    for (size_t j = 0; j < n * numel; ++j) ASSERT_EQ(f1.first_x[j], normal(seed, Stream::SampleInit, j));
    // And the whole run equals the host loop from that x_T (same noise streams).
    auto want =
        reference_loop(Diffusion(50, "linear", false), sampler_timesteps(s, 50, 8), std::string(s) == "ddim",
                       0.5, true, false, f1.first_x, numel, 0, seed, fake_eps(f1.S, f1.C));
    EXPECT_LT(test::rel_l2(a, want), 1e-4) << s;
    o.seed = seed + 1;
    sample(*be, f3.net(50, "linear"), o, n, nullptr, nullptr, c.data(), nullptr);
    EXPECT_NE(a, c);
  }
}

// UNET_SAMPLE_STEP=1 (a step's arithmetic as the one op SampleStep, its numbers uploaded with
// the timesteps; the default) gives the images of the op sequence (UNET_SAMPLE_STEP=0) bit for bit
// on the CPU: DDPM with fixed and learned variance, DDIM with noise, x0 predictions, over batches
// of 2, 2 and 1.
TEST(Sampler, OneOpStepIsTheOpSequence) {
  auto be = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  const int n = 5;
  struct Case {
    const char* sampler;
    bool learn_sigma, xstart, clip;
  };
  for (const Case& c : {Case{"ddpm", false, false, true}, Case{"ddpm", true, false, true},
                        Case{"ddim", true, false, false}, Case{"ddpm", false, true, true}}) {
    SCOPED_TRACE(std::string(c.sampler) + (c.learn_sigma ? " learned" : "") + (c.xstart ? " xstart" : ""));
    FakeNet f;
    f.learn_sigma = c.learn_sigma;
    const size_t numel = size_t(f.S) * f.S * f.C;
    SampleOptions o;
    o.sampler = c.sampler, o.steps = 9, o.eta = 0.6f, o.seed = seed, o.batch_size = 2, o.clip = c.clip;
    SamplerNet net = f.net(60, "cosine");
    net.predict_xstart = c.xstart;
    std::vector<float> seq(n * numel), one(n * numel, std::numeric_limits<float>::quiet_NaN());
    std::vector<float> dflt(one);
    setenv("UNET_SAMPLE_STEP", "0", 1);
    sample(*be, net, o, n, nullptr, nullptr, seq.data(), nullptr);
    setenv("UNET_SAMPLE_STEP", "1", 1);
    sample(*be, net, o, n, nullptr, nullptr, one.data(), nullptr);
    unsetenv("UNET_SAMPLE_STEP");
    sample(*be, net, o, n, nullptr, nullptr, dflt.data(), nullptr);
    EXPECT_TRUE(one == seq) << "rel l2 " << test::rel_l2(one, seq);
    EXPECT_TRUE(dflt == one);
    EXPECT_GT(test::rel_l2(seq, std::vector<float>(seq.size(), 0.f)), 0.1);
  }
}

TEST(Sampler, LabelsAndProgress) {
  auto be = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  const int n = 4;
  FakeNet f;
  f.class_cond = true;
  const size_t numel = size_t(f.S) * f.S * f.C;
  std::vector<int32_t> labels = {3, 0, 4, 1};
  SampleOptions o;
  o.sampler = "ddim", o.steps = 5, o.seed = seed, o.batch_size = 3;
  auto noise = test::randn(n * numel, seed);
  std::vector<float> out(n * numel);
  std::vector<std::pair<int, int>> prog;
  sample(*be, f.net(100, "linear"), o, n, noise.data(), labels.data(), out.data(),
         [&](int d, int t) { prog.emplace_back(d, t); });
  ASSERT_EQ(prog.size(), 10u);  // 2 batches x 5 steps
  for (size_t i = 0; i < prog.size(); ++i) EXPECT_EQ(prog[i], std::make_pair(int(i) + 1, 10));
  // Labels reach the network with their samples (batch 0: 3 samples x 5 steps, then 1 x 5).
  ASSERT_EQ(f.seen_labels.size(), 20u);
  for (int s = 0; s < 5; ++s)
    for (int b = 0; b < 3; ++b) EXPECT_EQ(f.seen_labels[s * 3 + b], labels[b]);
  for (int s = 0; s < 5; ++s) EXPECT_EQ(f.seen_labels[15 + s], labels[3]);
  auto want = reference_loop(Diffusion(100, "linear", false), sampler_timesteps("ddim", 100, 5), true, 0,
                             true, false, noise, numel, 0, seed, fake_eps(f.S, f.C, labels));
  EXPECT_LT(test::rel_l2(out, want), 1e-4);
  // No labels for a class-conditional net: drawn in range, deterministically.
  FakeNet g, h;
  g.class_cond = h.class_cond = true;
  sample(*be, g.net(100, "linear"), o, n, noise.data(), nullptr, out.data(), nullptr);
  sample(*be, h.net(100, "linear"), o, n, noise.data(), nullptr, out.data(), nullptr);
  EXPECT_EQ(g.seen_labels, h.seen_labels);
  for (int32_t y : g.seen_labels) EXPECT_TRUE(y >= 0 && y < 5);
}

TEST(Sampler, RejectsBadOptions) {
  auto be = make_cpu_engine();
  FakeNet f;
  f.class_cond = true;
  std::vector<float> out(2 * 4 * 4 * 3);
  auto run = [&](SampleOptions o, int n = 2, const int32_t* y = nullptr) {
    sample(*be, f.net(100, "linear"), o, n, nullptr, y, out.data(), nullptr);
  };
  SampleOptions o;
  o.sampler = "plms";
  EXPECT_THROW(run(o), UserError);
  o = SampleOptions();
  o.steps = 101;
  EXPECT_THROW(run(o), UserError);
  o = SampleOptions();
  o.sampler = "ddim", o.steps = 99;  // no integer stride gives 99 of 100
  EXPECT_THROW(run(o), UserError);
  o = SampleOptions();
  o.sampler = "ddim", o.eta = 1.5f;
  EXPECT_THROW(run(o), UserError);
  o = SampleOptions();
  EXPECT_THROW(run(o, 0), UserError);
  const int32_t bad[2] = {0, 5};
  EXPECT_THROW(run(o, 2, bad), UserError);
}

// A tiny real UNet on the CPU backend: DDIM eta=0 from fixed noise is deterministic and equals
// the host loop driven by the same model's forward.
TEST(Sampler, TinyModelDdim) {
  auto be = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  ModelConfig cfg = preset("tiny32");
  cfg.image_size = 8;
  cfg.num_channels = 32;
  cfg.channel_mult = {1, 2};
  cfg.num_res_blocks = 1;
  cfg.attention_resolutions = {4};
  cfg.num_head_channels = 16;
  cfg.learn_sigma = true;
  cfg.class_cond = false;
  cfg.dropout = 0;
  cfg.diffusion_steps = 200;
  cfg.noise_schedule = "cosine";
  ASSERT_EQ(cfg.validate(), "");
  Model model(cfg, *be);
  // Random weights (not the zero-initialised output layers, which would make eps == 0).
  auto w = test::randn(model.arena_floats(), seed, 0.05f);
  be->upload(model.params(), w.data());
  const int n = 3, S = 8, C = 3;
  const size_t numel = size_t(S) * S * C;
  auto noise = test::randn(n * numel, seed + 1);
  SampleOptions o;
  o.sampler = "ddim", o.steps = 10, o.seed = seed, o.batch_size = 2;
  std::vector<float> a(n * numel), b(n * numel);
  sample(model, o, n, noise.data(), nullptr, a.data(), nullptr);
  sample(model, o, n, noise.data(), nullptr, b.data(), nullptr);
  EXPECT_EQ(a, b);
  // The host loop, calling the model one sample at a time (so batching is exercised too).
  Tensor xd = be->alloc(DType::F32, {1, S, S, C}), td = be->alloc(DType::F32, {1});
  Tensor od = be->alloc(DType::F32, {1, S, S, 2 * C});
  EpsFn eps_fn = [&](const std::vector<float>& x, int t, std::vector<double>& eps, std::vector<double>& var) {
    std::vector<float> o2(2 * numel);
    const float tf = float(t);
    for (int i = 0; i < n; ++i) {
      be->upload(xd, x.data() + i * numel);
      be->upload(td, &tf);
      model.forward(xd, td, {}, od, false);
      be->download(o2.data(), od);
      for (size_t p = 0; p < size_t(S) * S; ++p)
        for (int c = 0; c < C; ++c) {
          eps[i * numel + p * C + c] = o2[p * 2 * C + c];
          var[i * numel + p * C + c] = o2[p * 2 * C + C + c];
        }
    }
  };
  auto want = reference_loop(Diffusion(200, "cosine", true), sampler_timesteps("ddim", 200, 10), true, 0.0,
                             true, true, noise, numel, 0, seed, eps_fn);
  EXPECT_LT(test::rel_l2(a, want), 1e-4);
  // The model's eps is not trivial: the result differs from the all-zero-eps DDIM answer.
  auto zero_eps = reference_loop(
      Diffusion(200, "cosine", true), sampler_timesteps("ddim", 200, 10), true, 0.0, true, true, noise, numel,
      0, seed, [](const std::vector<float>&, int, std::vector<double>& e, std::vector<double>& v) {
        std::fill(e.begin(), e.end(), 0.0);
        std::fill(v.begin(), v.end(), 0.0);
      });
  EXPECT_GT(test::rel_l2(a, zero_eps), 1e-2);
}

// The GPU tests' model: 16x16, two levels, attention, learned sigma, 4 classes.
static ModelConfig gpu_test_config() {
  ModelConfig cfg = preset("tiny32");
  cfg.image_size = 16;
  cfg.num_channels = 32;
  cfg.channel_mult = {1, 2};
  cfg.num_res_blocks = 1;
  cfg.attention_resolutions = {8};
  cfg.num_head_channels = 16;
  cfg.learn_sigma = true;
  cfg.class_cond = true;
  cfg.num_classes = 4;
  cfg.dropout = 0;
  cfg.diffusion_steps = 100;
  cfg.noise_schedule = "linear";
  return cfg;
}

// On the GPU: the same sampler runs through the CUDA engine (split, axpbypcz, clamp and
// learned-range kernels) and agrees with the CPU run, DDIM and DDPM with learned range, fp32. Skips without a
// CUDA device.
TEST(Sampler, CudaMatchesCpu) {
  std::string why;
  auto gpu = make_cuda_engine(Precision::FP32, &why);
  if (!gpu) GTEST_SKIP() << "no CUDA engine: " << why;
  auto cpu = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  const ModelConfig cfg = gpu_test_config();
  ASSERT_EQ(cfg.validate(), "");
  Model mc(cfg, *cpu), mg(cfg, *gpu);
  auto w = test::randn(mc.arena_floats(), seed, 0.05f);
  cpu->upload(mc.params(), w.data());
  gpu->upload(mg.params(), w.data());
  const int n = 5;
  const size_t numel = size_t(16) * 16 * 3;
  const std::vector<int32_t> labels = {0, 3, 1, 2, 3};
  for (const char* s : {"ddim", "ddpm"}) {
    SampleOptions o;
    o.sampler = s, o.steps = 20, o.eta = 0.3f, o.seed = seed, o.batch_size = 2;
    std::vector<float> a(n * numel), b(n * numel, std::numeric_limits<float>::quiet_NaN());
    sample(mc, o, n, nullptr, labels.data(), a.data(), nullptr);
    sample(mg, o, n, nullptr, labels.data(), b.data(), nullptr);
    EXPECT_LT(test::rel_l2(b, a), 1e-4) << s;
  }
}

// `unet sample` replays the forward as a CUDA graph (captured at the second step of each batch
// size): bitwise the same images as eager launches, over batches of 2, 2 and 1 (a recapture), DDPM
// with learned range and DDIM, plain and through classifier-free guidance's wrapper, with and
// without programmatic dependent launch. Skips without a CUDA device.
TEST(Sampler, CudaGraphMatchesEager) {
  std::string why;
  for (Precision p : {Precision::FP32, Precision::BF16}) {
    auto gpu = make_cuda_engine(p, &why);
    if (!gpu) GTEST_SKIP() << "no CUDA engine: " << why;
    SCOPED_TRACE(precision_name(p));
    const uint64_t seed = test::test_seed();
    const ModelConfig cfg = gpu_test_config();
    ASSERT_EQ(cfg.validate(), "");
    const int n = 5;
    const size_t numel = size_t(16) * 16 * 3;
    const std::vector<int32_t> labels = {0, 3, 1, 2, 3};
    Model m(cfg, *gpu);
    auto w = test::randn(m.arena_floats(), seed, 0.05f);
    gpu->upload(m.params(), w.data());
    m.plan(4, Mode::Sample);  // classifier-free guidance runs 2 x the batch of 2
    for (bool cfg_guided : {false, true})
      for (const char* s : {"ddpm", "ddim"}) {
        SCOPED_TRACE(std::string(s) + (cfg_guided ? " cfg" : ""));
        SamplerNet net = sampler_net(m);
        if (cfg_guided) net = classifier_free_guidance(*gpu, std::move(net), 2, 3.0f, cfg.num_classes - 1);
        SampleOptions o;
        o.sampler = s, o.steps = 12, o.eta = 0.5f, o.seed = seed, o.batch_size = 2;
        std::vector<float> eager(n * numel), graphed(n * numel, std::numeric_limits<float>::quiet_NaN());
        sample(*gpu, net, o, n, nullptr, labels.data(), eager.data(), nullptr);
        o.cuda_graph = true;
        // without and with programmatic edges (UNET_PDL), and as by default (with, in sampling)
        for (const char* pdl : {"0", "1", ""}) {
          SCOPED_TRACE(std::string("UNET_PDL=") + pdl);
          setenv("UNET_PDL", pdl, 1);
          std::fill(graphed.begin(), graphed.end(), std::numeric_limits<float>::quiet_NaN());
          sample(*gpu, net, o, n, nullptr, labels.data(), graphed.data(), nullptr);
          EXPECT_TRUE(graphed == eager) << "rel l2 " << test::rel_l2(graphed, eager);
        }
        unsetenv("UNET_PDL");
        // the step as the op sequence after the forward's graph (UNET_SAMPLE_STEP=0; the default
        // puts it in the graph as one op, classifier-free guidance's wrapper too): the sequence's
        // kernels against the one op's
        setenv("UNET_SAMPLE_STEP", "0", 1);
        std::fill(graphed.begin(), graphed.end(), std::numeric_limits<float>::quiet_NaN());
        sample(*gpu, net, o, n, nullptr, labels.data(), graphed.data(), nullptr);
        unsetenv("UNET_SAMPLE_STEP");
        EXPECT_LT(test::rel_l2(graphed, eager), 1e-6);
        EXPECT_GT(test::rel_l2(eager, std::vector<float>(eager.size(), 0.f)), 0.1);  // not all zero
      }
  }
}
