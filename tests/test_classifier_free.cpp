// Classifier-free guidance (classifier_free.h): the class dropout of training, observed over many
// steps against binomial bounds; the guided net against independent references — W = 1 is
// conditional sampling and W = 0 sampling with the null label (a tiny real model on the CPU
// engine, DDPM and DDIM, fixed and learned sigma), and guided DDIM / DDPM runs at W = 3 against a
// host loop in double that calls the same CPU model twice per step (labels, then null labels, each
// its own forward pass) and mixes eps itself; one forward pass of 2B per step; the null-class
// configuration, checkpoint attributes and add_null_class.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "checkpoint.h"
#include "classifier_free.h"
#include "diffusion.h"
#include "engine.h"
#include "init.h"
#include "model.h"
#include "params.h"
#include "rng.h"
#include "sampler.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {

ModelConfig tiny_cfg(bool learn_sigma, int classes = 4) {
  ModelConfig cfg = preset("tiny32");
  cfg.image_size = 8;
  cfg.num_channels = 32;
  cfg.channel_mult = {1, 2};
  cfg.num_res_blocks = 1;
  cfg.attention_resolutions = {4};
  cfg.num_head_channels = 16;
  cfg.learn_sigma = learn_sigma;
  cfg.use_scale_shift_norm = learn_sigma;
  cfg.class_cond = true;
  cfg.num_classes = classes;
  cfg.null_class = true;
  cfg.class_dropout = 0.1;
  cfg.dropout = 0;
  cfg.diffusion_steps = 100;
  cfg.noise_schedule = learn_sigma ? "cosine" : "linear";
  return cfg;
}

// Random weights everywhere (zero-initialised output layers would make eps == 0), label_emb N(0,9)
// so that the classes (and the null class) change the prediction visibly.
void random_weights(Model& m, Engine& e, uint64_t seed) {
  auto w = test::randn(m.arena_floats(), seed, 0.05f);
  const ParamInfo& le = m.table().at("label_emb.weight");
  auto l = test::randn(le.numel, seed + 17, 3.0f);
  std::copy(l.begin(), l.end(), w.begin() + (ptrdiff_t)le.offset);
  e.upload(m.params(), w.data());
}

// Runs the sampler on `net` (whose model is planned already).
std::vector<float> run(Engine& e, const SamplerNet& net, const SampleOptions& o, int n,
                       const std::vector<float>& noise, const std::vector<int32_t>& labels) {
  std::vector<float> out(noise.size(), std::numeric_limits<float>::quiet_NaN());
  sample(e, net, o, n, noise.data(), labels.data(), out.data(), nullptr);
  return out;
}

SamplerNet net_with_null(Model& m) {
  SamplerNet net = sampler_net(m);
  net.num_classes = m.config().label_rows();  // labels may name the null class
  return net;
}

}  // namespace

// The rate over many steps within binomial bounds (5 sigma: a false alarm about once in 10^6
// runs), for the whole batch and for either half of it, and pairs of neighbours dropped together
// at p^2 (independence). Fresh seed each run.
TEST(ClassDropout, RateWithinBinomialBounds) {
  const uint64_t seed = test::test_seed();
  const int B = 32, steps = 4000;
  for (double p : {0.1, 0.37, 0.005}) {
    int64_t n = 0, dropped = 0, first_half = 0, pairs = 0, pair_n = 0;
    std::vector<int32_t> lab(B);
    for (int64_t s = 0; s < steps; ++s) {
      for (int b = 0; b < B; ++b) lab[b] = b % 7;
      const int d = apply_class_dropout(seed, s, 0, B, p, 1000, lab.data());
      int counted = 0;
      for (int b = 0; b < B; ++b) {
        const bool dr = lab[b] == 1000;
        ASSERT_TRUE(dr || lab[b] == b % 7) << "a kept label changed";
        ASSERT_EQ(dr, class_dropped(seed, s, b, p));
        counted += dr;
        if (b < B / 2) first_half += dr;
        if (b + 1 < B) pairs += dr && class_dropped(seed, s, b + 1, p), ++pair_n;
      }
      ASSERT_EQ(d, counted);
      dropped += d;
      n += B;
    }
    auto within = [](int64_t k, int64_t trials, double q, const char* what, double p_) {
      const double mean = trials * q, sd = std::sqrt(trials * q * (1 - q));
      EXPECT_LE(std::fabs(k - mean), 5 * sd + 1e-9) << what << ": " << k << " of " << trials << " (expected "
                                                    << mean << " +- " << sd << ") at p=" << p_;
    };
    within(dropped, n, p, "dropped", p);
    within(first_half, n / 2, p, "dropped in the first half of the batch", p);
    within(pairs, pair_n, p * p, "neighbours dropped together", p);
  }
  // p = 0 never drops; the decision is a pure function of (seed, step, b); another seed differs.
  std::vector<int32_t> lab(B, 3);
  EXPECT_EQ(apply_class_dropout(seed, 5, 0, B, 0.0, 9, lab.data()), 0);
  EXPECT_EQ(lab, std::vector<int32_t>(B, 3));
  // A slice of the batch (a data-parallel rank's) decides as the whole batch does.
  std::vector<int32_t> whole(B, 3), slice(B / 2, 3);
  apply_class_dropout(seed, 6, 0, B, 0.5, 9, whole.data());
  apply_class_dropout(seed, 6, B / 2, B / 2, 0.5, 9, slice.data());
  EXPECT_EQ(slice, std::vector<int32_t>(whole.begin() + B / 2, whole.end()));
  int same = 0;
  for (int b = 0; b < 4096; ++b) {
    EXPECT_EQ(class_dropped(seed, 77, b, 0.5), class_dropped(seed, 77, b, 0.5));
    same += class_dropped(seed, 77, b, 0.5) == class_dropped(seed + 1, 77, b, 0.5);
    same += class_dropped(seed, 77, b, 0.5) == class_dropped(seed, 78, b, 0.5);
  }
  EXPECT_LT(same, 2 * 4096 * 0.6);  // about half agree by chance; identical streams would agree always
}

// The wrapper calls the net once per step with batch 2B: x twice, t twice, labels then null labels.
TEST(Guidance, OneForwardPassOfTwiceTheBatch) {
  auto be = make_cpu_engine();
  const int S = 4, C = 3, K = 5, n = 5;
  const size_t numel = size_t(S) * S * C;
  std::vector<int> calls_B;
  bool halves_ok = true;
  SamplerNet net;
  net.image_size = S, net.channels = C, net.class_cond = true, net.num_classes = K, net.diffusion_steps = 50;
  net.denoise = [&](const Tensor& x, const Tensor& t, const Tensor& y, const Tensor& out) {
    const int B2 = (int)x.dim[0], B = B2 / 2;
    calls_B.push_back(B2);
    const float* xp = x.f32();
    for (size_t i = 0; i < B * numel; ++i) halves_ok &= xp[i] == xp[B * numel + i];
    for (int b = 0; b < B; ++b) {
      halves_ok &= t.f32()[b] == t.f32()[B + b];
      halves_ok &= y.i32()[b] >= 0 && y.i32()[b] < K && y.i32()[B + b] == K;
    }
    // eps_c = 0.5 x + label, eps_u = 0.5 x - 1: guided = 0.5 x + W (label + 1) - 1.
    for (int b = 0; b < B2; ++b)
      for (size_t j = 0; j < numel; ++j)
        out.f32()[b * numel + j] = 0.5f * xp[b * numel + j] + (b < B ? float(y.i32()[b]) : -1.0f);
  };
  SampleOptions o;
  o.sampler = "ddim", o.steps = 4, o.batch_size = 2, o.clip = false;
  const std::vector<int32_t> labels = {0, 4, 2, 1, 3};
  auto noise = test::randn(n * numel, test::test_seed());
  const float w = 2.5f;
  SamplerNet g = classifier_free_guidance(*be, net, 2, w, K);
  auto got = run(*be, g, o, n, noise, labels);
  EXPECT_TRUE(halves_ok);
  EXPECT_EQ(calls_B, (std::vector<int>{4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2}));  // batches 2, 2, 1
  // The same run with the guided eps computed by a plain net.
  SamplerNet ref = net;
  ref.denoise = [&](const Tensor& x, const Tensor&, const Tensor& y, const Tensor& out) {
    const int B = (int)x.dim[0];
    for (int b = 0; b < B; ++b)
      for (size_t j = 0; j < numel; ++j)
        out.f32()[b * numel + j] = float(0.5 * x.f32()[b * numel + j] + w * (double(y.i32()[b]) + 1.0) - 1.0);
  };
  auto want = run(*be, ref, o, n, noise, labels);
  EXPECT_LT(test::rel_l2(got, want), 1e-6);
}

// W = 1 is conditional sampling and W = 0 null-label sampling (the guided eps is
// w * eps_c + (1 - w) * eps_u, exact at 0 and 1): DDIM with eta and DDPM, fixed and learned sigma.
// Bitwise where the model computes a sample the same in a batch of B and of 2B; the CPU GEMM's
// ragged-edge tiles round differently from its full tiles (rows of the embedding MLP: M = batch),
// so the limit is 1e-6 (measured: 0 for batches 4 | 8 and 1 | 2, ~2.5e-7 for 2 | 4). With learned
// sigma, DDPM at W = 0 takes the variance from the conditional half (GLIDE's and diffusers'
// convention), so there W = 0 is null-label eps with the conditional variance, not null-label
// sampling; MatchesModelCalledTwice checks that case.
TEST(Guidance, ScaleOneIsConditionalScaleZeroIsNull) {
  auto be = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  for (bool ls : {false, true}) {
    ModelConfig cfg = tiny_cfg(ls);
    ASSERT_EQ(cfg.validate(), "");
    Model m(cfg, *be);
    random_weights(m, *be, seed + ls);
    const int n = 5, bs = 4;  // batches 4 and 1
    m.plan(2 * bs, Mode::Sample);
    const size_t numel = size_t(8) * 8 * 3;
    auto noise = test::randn(n * numel, seed + 5);
    const std::vector<int32_t> labels = {2, 0, 3, 3, 1}, null(n, cfg.num_classes);
    for (const char* s : {"ddim", "ddpm"}) {
      SampleOptions o;
      o.sampler = s, o.steps = 6, o.eta = 0.6f, o.seed = seed + 9, o.batch_size = bs;
      auto cond = run(*be, net_with_null(m), o, n, noise, labels);
      auto uncond = run(*be, net_with_null(m), o, n, noise, null);
      auto w1 = run(*be, classifier_free_guidance(*be, sampler_net(m), bs, 1.0f, cfg.num_classes), o, n,
                    noise, labels);
      auto w0 = run(*be, classifier_free_guidance(*be, sampler_net(m), bs, 0.0f, cfg.num_classes), o, n,
                    noise, labels);
      const double d1 = test::max_abs_diff(w1, cond), d0 = test::max_abs_diff(w0, uncond);
      std::printf("%s learn_sigma=%d: W=1 vs conditional max diff %.3g, W=0 vs null label %.3g\n", s, ls, d1,
                  d0);
      EXPECT_LE(d1, 1e-6) << s << " learn_sigma=" << ls;
      if (!(ls && std::string(s) == "ddpm")) {
        EXPECT_LE(d0, 1e-6) << s << " learn_sigma=" << ls;
      }
      // ... and the labels matter: conditional and unconditional samples differ, by far more than
      // rounding (the equalities above hold to 1e-6). With this tiny random model the difference
      // measured 9.3e-4 to 0.1 over 70 seeds (1e-3 failed 2 of them), hence 1e-4.
      EXPECT_GT(test::rel_l2(cond, uncond), 1e-4) << s;
    }
  }
}

// Guided sampling at W = 3 against a host loop in double: per step the CPU model is called twice
// (labels, then null labels, batch n each), eps = eps_u + W (eps_c - eps_u) and the variance value
// of the conditional call, then SPEC §4's DDIM (eta 0.5) or DDPM (learned range / fixed large) step.
TEST(Guidance, MatchesModelCalledTwice) {
  auto be = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  const double W = 3.0;
  for (bool ls : {true, false}) {
    ModelConfig cfg = tiny_cfg(ls, 3);
    Model m(cfg, *be);
    random_weights(m, *be, seed + 100 + ls);
    const int n = 3, S = 8, C = 3, T = cfg.diffusion_steps;
    const size_t numel = size_t(S) * S * C, hw = size_t(S) * S;
    m.plan(2 * n, Mode::Sample);
    const std::vector<int32_t> labels = {1, 0, 2};
    Tensor xd = be->alloc(DType::F32, {n, S, S, C}), td = be->alloc(DType::F32, {n}),
           yd = be->alloc(DType::I32, {n}), od = be->alloc(DType::F32, {n, S, S, cfg.out_channels()});
    const int Co = cfg.out_channels();
    auto call = [&](const std::vector<float>& x, int t, const std::vector<int32_t>& y,
                    std::vector<float>& o) {
      const std::vector<float> tv(n, float(t));
      be->upload(xd, x.data());
      be->upload(td, tv.data());
      be->upload(yd, y.data());
      m.forward(xd, td, yd, od, false);
      o.resize(od.numel());
      be->download(o.data(), od);
    };
    for (const char* s : {"ddim", "ddpm"}) {
      const bool ddim = std::string(s) == "ddim";
      const int steps = 5;
      const double eta = 0.5;
      auto noise = test::randn(n * numel, seed + 7);
      SampleOptions o;
      o.sampler = s, o.steps = steps, o.eta = float(eta), o.seed = seed + 3, o.batch_size = n;
      auto got = run(*be, classifier_free_guidance(*be, sampler_net(m), n, float(W), cfg.num_classes), o, n,
                     noise, labels);
      // The reference.
      const Diffusion base(T, cfg.noise_schedule, ls);
      const std::vector<int> keep = sampler_timesteps(s, T, steps);
      std::vector<float> x = noise, oc, ou;
      const std::vector<int32_t> null(n, cfg.num_classes);
      for (int k = int(keep.size()) - 1; k >= 0; --k) {
        const int t = keep[k];
        call(x, t, labels, oc);
        call(x, t, null, ou);
        const double ab = base.alphas_cumprod[t], abp = k == 0 ? 1.0 : base.alphas_cumprod[keep[k - 1]];
        const double beta = 1 - ab / abp;
        const uint64_t key = rng_key(o.seed, Stream::SampleStep, uint64_t(t));
        for (size_t i = 0; i < x.size(); ++i) {
          const size_t b = i / numel, p = (i % numel) / C, c = i % C, at = (b * hw + p) * Co;
          const double ec = oc[at + c], eu = ou[at + c];
          const double eps = eu + W * (ec - eu);
          double x0 = x[i] / std::sqrt(ab) - std::sqrt(1 / ab - 1) * eps;
          x0 = std::min(1.0, std::max(-1.0, x0));
          const double z = normal(key, Stream::SampleStep, i);
          double xn;
          if (ddim) {
            const double e = (x[i] / std::sqrt(ab) - x0) / std::sqrt(1 / ab - 1);
            const double sigma = eta * std::sqrt((1 - abp) / (1 - ab)) * std::sqrt(1 - ab / abp);
            xn = std::sqrt(abp) * x0 + std::sqrt(std::max(0.0, 1 - abp - sigma * sigma)) * e +
                 (k > 0 ? sigma * z : 0.0);
          } else {
            xn = beta * std::sqrt(abp) / (1 - ab) * x0 + (1 - abp) * std::sqrt(1 - beta) / (1 - ab) * x[i];
            if (k > 0) {
              const double post = beta * (1 - abp) / (1 - ab);
              // fixed large: [posterior variance at index 1, beta_1, ...]; k > 0 here, so beta_k
              double log_var = std::log(beta);
              if (ls) {
                const double frac = (double(oc[at + C + c]) + 1) / 2;  // the conditional variance
                log_var = frac * std::log(beta) + (1 - frac) * std::log(post);
              }
              xn += std::exp(0.5 * log_var) * z;
            }
          }
          x[i] = float(xn);
        }
      }
      const double e = test::rel_l2(got, x);
      EXPECT_LT(e, 1e-5) << s << " learn_sigma=" << ls;
      // Guidance at W = 3 is measurably away from conditional sampling (rel 1e-3 to 1e-1 with these
      // weights, 100x the limit above or more: a wrong mix would show).
      auto cond = run(*be, net_with_null(m), o, n, noise, labels);
      const double away = test::rel_l2(got, cond);
      std::printf("%s learn_sigma=%d: guided vs the reference rel %.3g; vs conditional sampling rel %.3g\n",
                  s, ls, e, away);
      EXPECT_GT(away, 2e-4) << s;
    }
  }
}

// A checkpoint with a null class: attributes, label_emb [K + 1, D], round trip; without one the
// file carries neither attribute. add_null_class gives what init with the null class gives.
TEST(Guidance, NullClassConfigAndCheckpoint) {
  ModelConfig c = tiny_cfg(false, 5);
  EXPECT_EQ(c.validate(), "");
  EXPECT_EQ(c.label_rows(), 6);
  EXPECT_EQ(build_param_table(c).at("label_emb.weight").shape, (std::vector<int64_t>{6, 128}));
  ModelConfig bad = c;
  bad.class_dropout = 1.0;
  EXPECT_NE(bad.validate().find("--class-dropout must be in [0, 1)"), std::string::npos) << bad.validate();
  bad = c;
  bad.class_cond = false;
  EXPECT_NE(bad.validate().find("needs --class-cond"), std::string::npos) << bad.validate();
  bad = c;
  bad.null_class = false;
  EXPECT_NE(bad.validate().find("needs a null class"), std::string::npos) << bad.validate();

  const uint64_t seed = test::test_seed();
  const std::string dir = test::temp_dir("cfg_ckpt");
  Checkpoint ck;
  ck.cfg = c;
  ck.cfg.class_dropout = 0.15;
  ck.model = init_params(build_param_table(ck.cfg), seed);
  save_checkpoint(dir + "/a.h5", ck);
  Checkpoint back = load_checkpoint(dir + "/a.h5");
  EXPECT_TRUE(back.cfg.null_class);
  EXPECT_EQ(back.cfg.class_dropout, 0.15);
  EXPECT_EQ(back.model, ck.model);
  {
    h5::File f = h5::File::open(dir + "/a.h5");
    EXPECT_EQ(h5::shape(f, "model/label_emb.weight"), (std::vector<hsize_t>{6, 128}));
  }
  // Without a null class: no attribute, K rows.
  Checkpoint plain;
  plain.cfg = c;
  plain.cfg.null_class = false, plain.cfg.class_dropout = 0;
  plain.model = init_params(build_param_table(plain.cfg), seed);
  save_checkpoint(dir + "/b.h5", plain);
  {
    h5::File f = h5::File::open(dir + "/b.h5");
    EXPECT_FALSE(h5::has_attr(f, "/", "null_class"));
    EXPECT_FALSE(h5::has_attr(f, "/", "class_dropout"));
    EXPECT_EQ(h5::shape(f, "model/label_emb.weight"), (std::vector<hsize_t>{5, 128}));
  }
  // add_null_class: the K-class init plus the row equals the (K+1)-row init, every tensor.
  Checkpoint grown = plain;
  add_null_class(grown, seed);
  EXPECT_TRUE(grown.cfg.null_class);
  ModelConfig want_cfg = plain.cfg;
  want_cfg.null_class = true;
  EXPECT_EQ(grown.model, init_params(build_param_table(want_cfg), seed));
  Checkpoint uncond = plain;
  uncond.cfg.class_cond = false;
  uncond.model = init_params(build_param_table(uncond.cfg), seed);
  EXPECT_THROW(add_null_class(uncond, seed), UserError);
}

// On the GPU: guided sampling through the CUDA engine agrees with the CPU engine (fp32), DDPM with
// learned range and DDIM. Skips without a CUDA device.
TEST(Guidance, CudaMatchesCpu) {
  std::string why;
  auto gpu = make_cuda_engine(Precision::FP32, &why);
  if (!gpu) GTEST_SKIP() << "no CUDA engine: " << why;
  auto cpu = make_cpu_engine();
  const uint64_t seed = test::test_seed();
  ModelConfig cfg = tiny_cfg(true, 4);
  Model mc(cfg, *cpu), mg(cfg, *gpu);
  auto w = test::randn(mc.arena_floats(), seed, 0.05f);
  cpu->upload(mc.params(), w.data());
  gpu->upload(mg.params(), w.data());
  const int n = 5, bs = 2;
  mc.plan(2 * bs, Mode::Sample);
  mg.plan(2 * bs, Mode::Sample);
  const size_t numel = size_t(8) * 8 * 3;
  const std::vector<int32_t> labels = {0, 3, 1, 2, 3};
  for (const char* s : {"ddim", "ddpm"}) {
    SampleOptions o;
    o.sampler = s, o.steps = 20, o.eta = 0.3f, o.seed = seed, o.batch_size = bs;
    std::vector<float> a(n * numel), b(n * numel, std::numeric_limits<float>::quiet_NaN());
    sample(*cpu, classifier_free_guidance(*cpu, sampler_net(mc), bs, 4.0f, cfg.num_classes), o, n, nullptr,
           labels.data(), a.data(), nullptr);
    sample(*gpu, classifier_free_guidance(*gpu, sampler_net(mg), bs, 4.0f, cfg.num_classes), o, n, nullptr,
           labels.data(), b.data(), nullptr);
    EXPECT_LT(test::rel_l2(b, a), 1e-4) << s;
  }
}
