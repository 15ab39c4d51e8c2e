// Diffusion schedules, respacing and one sampler step, against numbers computed independently
// (numpy's linspace values, Python's space_timesteps lists, closed forms in double here).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "diffusion.h"
#include "engine.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {

std::vector<int> range(int start, int stop, int step) {
  std::vector<int> v;
  for (int i = start; i < stop; i += step) v.push_back(i);
  return v;
}

// abar of the guided-diffusion cosine schedule, written out again.
double cos_abar(double s) {
  const double c = std::cos((s + 0.008) / 1.008 * 3.14159265358979323846 / 2);
  return c * c;
}

std::vector<float> nan_vec(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace

TEST(Schedule, LinearMatchesNumpyBitForBit) {
  // np.linspace(scale*1e-4, scale*0.02, T) printed with repr().
  auto b = linear_betas(1000);
  ASSERT_EQ(b.size(), 1000u);
  EXPECT_EQ(b[0], 0.0001);
  EXPECT_EQ(b[1], 0.00011991991991991993);
  EXPECT_EQ(b[500], 0.010059959959959959);
  EXPECT_EQ(b[998], 0.01998008008008008);
  EXPECT_EQ(b[999], 0.02);
  b = linear_betas(250);
  EXPECT_EQ(b[0], 0.0004);
  EXPECT_EQ(b[1], 0.0007196787148594378);
  EXPECT_EQ(b[125], 0.04035983935742972);
  EXPECT_EQ(b[248], 0.07968032128514056);
  EXPECT_EQ(b[249], 0.08);
  for (int i = 1; i < 250; ++i) EXPECT_GT(b[i], b[i - 1]);
}

TEST(Schedule, CosineClosedFormAndClip) {
  const int T = 1000;
  auto b = cosine_betas(T);
  ASSERT_EQ(b.size(), size_t(T));
  // Values from guided-diffusion's betas_for_alpha_bar (Python floats).
  EXPECT_NEAR(b[0], 4.128422482196914e-05, 1e-17);
  EXPECT_NEAR(b[1], 4.614175273665033e-05, 1e-17);
  EXPECT_NEAR(b[500], 0.003155691441585007, 1e-15);
  EXPECT_NEAR(b[998], 0.7499993929011166, 1e-12);
  EXPECT_EQ(b[999], 0.999);  // 1 - abar(1)/abar(0.999) ~ 1, clipped
  int clipped = 0;
  for (double x : b) clipped += x == 0.999;
  EXPECT_EQ(clipped, 1);
  // The unclipped betas telescope: prod (1 - b_i) = abar(t/T)/abar(0).
  Diffusion d(T, "cosine", false);
  for (int t : {0, 17, 400, 900, 997})
    EXPECT_NEAR(d.alphas_cumprod[t] / (cos_abar((t + 1.0) / T) / cos_abar(0)), 1.0, 1e-12) << t;
}

TEST(Schedule, RejectsBadInput) {
  EXPECT_THROW(named_betas("quadratic", 1000), UserError);
  EXPECT_THROW(named_betas("linear", 0), UserError);
  // guided-diffusion's linear schedule exceeds beta = 1 for very short processes.
  EXPECT_THROW(Diffusion(7, "linear", false), UserError);
  EXPECT_NO_THROW(Diffusion(7, "cosine", false));
}

TEST(Diffusion, CoefficientArraysClosedForm) {
  for (const char* sched : {"linear", "cosine"}) {
    Diffusion d(1000, sched, false);
    ASSERT_EQ(d.num_timesteps(), 1000);
    long double ab = 1.0L;
    for (int t = 0; t < 1000; ++t) {
      const double b = d.betas[t];
      const long double abp = ab;
      ab *= 1.0L - b;
      const double rel = 1e-12;
      ASSERT_NEAR(d.alphas_cumprod[t] / double(ab), 1.0, rel) << sched << t;
      EXPECT_NEAR(d.alphas_cumprod_prev[t] / double(abp), 1.0, rel);
      EXPECT_NEAR(d.sqrt_recip_alphas_cumprod[t] * std::sqrt(double(ab)), 1.0, rel);
      EXPECT_NEAR(d.sqrt_recipm1_alphas_cumprod[t] / std::sqrt(1.0 / double(ab) - 1.0), 1.0, 1e-9);
      EXPECT_NEAR(d.sqrt_one_minus_alphas_cumprod[t] / std::sqrt(1.0 - double(ab)), 1.0, 1e-9);
      const double pv = b * (1.0 - double(abp)) / (1.0 - double(ab));
      EXPECT_NEAR(d.posterior_variance[t], pv, 1e-12 * b);
      EXPECT_NEAR(d.posterior_mean_coef1[t], b * std::sqrt(double(abp)) / (1.0 - double(ab)), 1e-9);
      EXPECT_NEAR(d.posterior_mean_coef2[t], (1.0 - double(abp)) * std::sqrt(1.0 - b) / (1.0 - double(ab)),
                  1e-9);
      if (t > 0) {
        EXPECT_NEAR(d.posterior_log_variance_clipped[t], std::log(pv), 1e-9);
      }
      EXPECT_EQ(d.timestep_map[t], t);
    }
    EXPECT_EQ(d.alphas_cumprod_prev[0], 1.0);
    EXPECT_EQ(d.alphas_cumprod_next[999], 0.0);
    EXPECT_EQ(d.posterior_variance[0], 0.0);
    // Clipped log variance at 0 repeats index 1 (log 0 avoided).
    EXPECT_EQ(d.posterior_log_variance_clipped[0], std::log(d.posterior_variance[1]));
  }
}

TEST(Respacing, DdimStrides) {
  EXPECT_EQ(space_timesteps_ddim(1000, 50), range(0, 1000, 20));
  EXPECT_EQ(space_timesteps_ddim(1000, 10), range(0, 1000, 100));
  EXPECT_EQ(space_timesteps_ddim(1000, 7), range(0, 1000, 143));  // 143..166 all give 7; smallest
  EXPECT_EQ(space_timesteps_ddim(1000, 500), range(0, 1000, 2));
  EXPECT_EQ(space_timesteps_ddim(1000, 334), range(0, 1000, 3));
  EXPECT_EQ(space_timesteps_ddim(1000, 1000), range(0, 1000, 1));
  EXPECT_EQ(space_timesteps_ddim(1000, 1), std::vector<int>{0});
  EXPECT_THROW(space_timesteps_ddim(1000, 999), UserError);  // no integer stride gives 999
  EXPECT_THROW(space_timesteps_ddim(1000, 333), UserError);
  EXPECT_THROW(space_timesteps_ddim(1000, 0), UserError);
  EXPECT_THROW(space_timesteps_ddim(1000, 1001), UserError);
}

// --timestep-respacing: guided-diffusion's space_timesteps strings; expected lists from its
// algorithm (scripts/diffusion_torch.py's transcription of respace.py).
TEST(Respacing, GuidedDiffusionStrings) {
  // Sections as equal as possible, the first T % k one step longer (7 = 3 + 2 + 2).
  EXPECT_EQ(space_timesteps(7, "2,2,2"), (std::vector<int>{0, 2, 3, 4, 5, 6}));
  EXPECT_EQ(space_timesteps(10, "3,2,0"), (std::vector<int>{0, 2, 3, 4, 6}));  // 0 keeps none of 7..9
  EXPECT_EQ(space_timesteps(11, "1,1,1,1"), (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(space_timesteps(40, "3,5,2"), (std::vector<int>{0, 6, 13, 14, 17, 20, 23, 26, 27, 39}));
  const std::vector<int> big = space_timesteps(1000, "10,15,20");
  ASSERT_EQ(big.size(), 45u);
  EXPECT_EQ(std::vector<int>(big.begin(), big.begin() + 11),
            (std::vector<int>{0, 37, 74, 111, 148, 185, 222, 259, 296, 333, 334}));
  EXPECT_EQ(std::vector<int>(big.end() - 4, big.end()), (std::vector<int>{947, 964, 982, 999}));
  // One count is --steps N with ddpm, ddimN is --steps N with ddim; blanks around counts as int().
  EXPECT_EQ(space_timesteps(1000, "250"), space_timesteps_ddpm(1000, 250));
  EXPECT_EQ(space_timesteps(1000, " 25 "), space_timesteps_ddpm(1000, 25));
  EXPECT_EQ(space_timesteps(40, "ddim8"), range(0, 40, 5));
  EXPECT_EQ(space_timesteps(1000, "ddim50"), sampler_timesteps("ddim", 1000, 50));
  // Each failure is one UserError naming the spec.
  for (const char* bad : {"", "0", "0,0", "abc", "3,,2", "ddim", "ddimx", "ddim0", "ddim1001", "ddim999", "-3",
                          "1001", "2.5", "9999999999", "600,600", "1,1,1,1,1,1,1,1,1,1,1"}) {
    SCOPED_TRACE(bad);
    const int T = std::string(bad).find(",1,1,1,1") != std::string::npos ? 10 : 1000;
    try {
      space_timesteps(T, bad);
      ADD_FAILURE() << "accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

TEST(Respacing, DdpmSections) {
  EXPECT_EQ(space_timesteps_ddpm(1000, 10),
            (std::vector<int>{0, 111, 222, 333, 444, 555, 666, 777, 888, 999}));
  // Accumulated in float64: x_10 = 499.4999... rounds to 499 (the exact 499.5 would give 500).
  EXPECT_EQ(space_timesteps_ddpm(1000, 21),
            (std::vector<int>{0,   50,  100, 150, 200, 250, 300, 350, 400, 450, 499,
                              549, 599, 649, 699, 749, 799, 849, 899, 949, 999}));
  // Ties round half to even: 4.5 -> 4 (not 5), 499.5 -> 500.
  EXPECT_EQ(space_timesteps_ddpm(10, 5), (std::vector<int>{0, 2, 4, 7, 9}));
  EXPECT_EQ(space_timesteps_ddpm(6, 3), (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(space_timesteps_ddpm(1000, 3), (std::vector<int>{0, 500, 999}));
  auto v = space_timesteps_ddpm(1000, 250);
  ASSERT_EQ(v.size(), 250u);
  EXPECT_EQ(std::vector<int>(v.begin(), v.begin() + 8), (std::vector<int>{0, 4, 8, 12, 16, 20, 24, 28}));
  EXPECT_EQ(std::vector<int>(v.begin() + 100, v.begin() + 104), (std::vector<int>{401, 405, 409, 413}));
  EXPECT_EQ(std::vector<int>(v.end() - 4, v.end()), (std::vector<int>{987, 991, 995, 999}));
  EXPECT_EQ(space_timesteps_ddpm(1000, 1), std::vector<int>{0});
  EXPECT_EQ(space_timesteps_ddpm(1000, 1000), range(0, 1000, 1));
  EXPECT_THROW(space_timesteps_ddpm(1000, 1001), UserError);
  EXPECT_THROW(space_timesteps_ddpm(1000, 0), UserError);
  // Sampler front end: steps 0 = all T; unknown sampler rejected.
  EXPECT_EQ(sampler_timesteps("ddpm", 100, 0), range(0, 100, 1));
  EXPECT_EQ(sampler_timesteps("ddim", 100, 0), range(0, 100, 1));
  EXPECT_EQ(sampler_timesteps("ddim", 100, 20), range(0, 100, 5));
  EXPECT_THROW(sampler_timesteps("plms", 100, 0), UserError);
  EXPECT_THROW(sampler_timesteps("ddpm", 100, -1), UserError);
}

TEST(Respacing, RespacedBetasAndMap) {
  for (const char* sched : {"linear", "cosine"}) {
    Diffusion base(1000, sched, true);
    const auto keep = space_timesteps_ddpm(1000, 37);
    Diffusion d = base.respaced(keep);
    ASSERT_EQ(d.num_timesteps(), 37);
    EXPECT_TRUE(d.learn_sigma());
    EXPECT_EQ(d.timestep_map, keep);
    double last = 1.0;
    for (int k = 0; k < 37; ++k) {
      const double ab = base.alphas_cumprod[keep[k]];
      EXPECT_NEAR(d.betas[k], 1.0 - ab / last, 1e-15) << k;
      // The kept abar are the original ones, up to the cancellation in 1 - beta' that
      // guided-diffusion has too (cosine's last betas are ~1: abar ~1e-8 keeps ~8 digits).
      EXPECT_NEAR(d.alphas_cumprod[k] / ab, 1.0, 1e-7) << k;
      last = ab;
    }
    // Respacing a respaced process composes the maps.
    Diffusion d2 = d.respaced({0, 5, 36});
    EXPECT_EQ(d2.timestep_map, (std::vector<int>{keep[0], keep[5], keep[36]}));
    EXPECT_NEAR(d2.alphas_cumprod[2] / base.alphas_cumprod[keep[36]], 1.0, 1e-7);
    // Keeping every step reproduces the process.
    std::vector<int> all = range(0, 1000, 1);
    Diffusion full = base.respaced(all);
    for (int t = 0; t < 1000; ++t) EXPECT_NEAR(full.betas[t], base.betas[t], 1e-15);
  }
  Diffusion base(100, "linear", false);
  EXPECT_THROW(base.respaced({}), UserError);
  EXPECT_THROW(base.respaced({0, 0}), UserError);
  EXPECT_THROW(base.respaced({100}), UserError);
  // A single kept step: finite coefficients (guided-diffusion itself fails here).
  Diffusion one = base.respaced({0});
  EXPECT_TRUE(std::isfinite(one.posterior_log_variance_clipped[0]));
}

TEST(Diffusion, QSampleCoeffs) {
  Diffusion d(1000, "linear", false);
  const float t[3] = {0, 500, 999};
  float a[3], b[3];
  d.q_sample_coeffs(t, 3, a, b);
  for (int i = 0; i < 3; ++i) {
    const int k = int(t[i]);
    EXPECT_FLOAT_EQ(a[i], float(std::sqrt(d.alphas_cumprod[k])));
    EXPECT_FLOAT_EQ(b[i], float(std::sqrt(1 - d.alphas_cumprod[k])));
  }
}

// ---- one step on the CPU backend against a double-precision closed form ----

class StepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    be = make_cpu_engine();
    seed = test::test_seed();
  }
  // Uploads a host vector to fresh engine memory.
  Tensor dev(const std::vector<float>& h) {
    Tensor p = be->alloc(DType::F32, {(int64_t)h.size()});
    be->upload(p, h.data());
    return p;
  }
  std::vector<float> host(const Tensor& p, size_t n) {
    std::vector<float> h(n);
    be->download(h.data(), p);
    return h;
  }
  Ops& ops() { return be->ops(); }
  // The learned-range noise through its op.
  std::vector<float> lrn(const Diffusion& d, int k, const std::vector<float>& v,
                         const std::vector<float>& z) {
    Tensor y = dev(nan_vec(v.size()));
    const Diffusion::LogRange r = d.learned_range_bounds(k);
    ops().run(LearnedRangeNoise{dev(v), dev(z), y, r.min_log, r.max_log});
    return host(y, v.size());
  }
  std::unique_ptr<Engine> be;
  uint64_t seed = 0;
  const size_t n = 2 * 5 * 5 * 3;
};

TEST_F(StepTest, DdpmFixedLargeStep) {
  Diffusion base(1000, "linear", false);
  const auto keep = space_timesteps_ddpm(1000, 50);
  Diffusion d = base.respaced(keep);
  for (int k : {37, 1, 0}) {
    // x large enough that some predicted x0 leave [-1, 1] (so clipping matters).
    auto x = test::randn(n, seed + k, 1.5f), eps = test::randn(n, seed + 100 + k),
         z = test::randn(n, seed + 200 + k);
    for (bool clip : {true, false}) {
      Tensor xd = dev(x);
      Tensor x0d = dev(nan_vec(n));
      d.ddpm_step(ops(), k, xd, dev(eps), x0d, dev(z), float(d.fixed_large_std(k)), clip);
      auto got = host(xd, n);
      // Independent: the respaced process from the base abar at the kept timesteps.
      const double ab = base.alphas_cumprod[keep[k]];
      const double abp = k == 0 ? 1.0 : base.alphas_cumprod[keep[k - 1]];
      const double beta = 1 - ab / abp;
      int clipped = 0;
      std::vector<float> want(n);
      for (size_t i = 0; i < n; ++i) {
        double x0 = x[i] / std::sqrt(ab) - std::sqrt(1 / ab - 1) * eps[i];
        if (clip && std::fabs(x0) > 1) {
          x0 = x0 > 0 ? 1 : -1;
          ++clipped;
        }
        const double mean =
            beta * std::sqrt(abp) / (1 - ab) * x0 + (1 - abp) * std::sqrt(1 - beta) / (1 - ab) * x[i];
        want[i] = float(mean + (k > 0 ? std::sqrt(beta) * z[i] : 0.0));  // fixed large: var = beta_k
      }
      if (clip && k > 0) {
        EXPECT_GT(clipped, 0);
      }
      EXPECT_LT(test::rel_l2(got, want), 2e-6) << "k=" << k << " clip=" << clip;
    }
  }
  // Fixed-large at the first step uses posterior_variance[1].
  EXPECT_DOUBLE_EQ(d.fixed_large_std(0), std::sqrt(d.posterior_variance[1]));
}

TEST_F(StepTest, DdimStep) {
  Diffusion base(1000, "cosine", false);
  const auto keep = space_timesteps_ddim(1000, 25);
  Diffusion d = base.respaced(keep);
  for (double eta : {0.0, 0.5, 1.0}) {
    for (int k : {24, 3, 0}) {
      auto x = test::randn(n, seed + k, 1.5f), eps = test::randn(n, seed + 7 + k),
           z = test::randn(n, seed + 9 + k);
      for (bool clip : {true, false}) {
        Tensor xd = dev(x);
        const auto c = d.ddim_coeffs(k, eta);
        d.ddim_step(ops(), k, eta, xd, dev(eps), dev(nan_vec(n)), c.noise ? dev(z) : Tensor{}, clip);
        auto got = host(xd, n);
        const double ab = base.alphas_cumprod[keep[k]];
        const double abp = k == 0 ? 1.0 : base.alphas_cumprod[keep[k - 1]];
        const double sigma = eta * std::sqrt((1 - abp) / (1 - ab)) * std::sqrt(1 - ab / abp);
        std::vector<float> want(n);
        for (size_t i = 0; i < n; ++i) {
          double x0 = x[i] / std::sqrt(ab) - std::sqrt(1 / ab - 1) * eps[i];
          if (clip) x0 = std::min(1.0, std::max(-1.0, x0));
          const double e = (x[i] / std::sqrt(ab) - x0) / std::sqrt(1 / ab - 1);  // re-derived eps
          want[i] = float(std::sqrt(abp) * x0 + std::sqrt(std::max(0.0, 1 - abp - sigma * sigma)) * e +
                          (k > 0 ? sigma * z[i] : 0.0));
        }
        EXPECT_LT(test::rel_l2(got, want), 2e-6) << "eta=" << eta << " k=" << k << " clip=" << clip;
        EXPECT_EQ(c.noise, k > 0 && eta > 0);
      }
    }
  }
  // eta = 0 and unclipped x0: DDIM is deterministic and exact on x0 = its own prediction, i.e.
  // an x_t built from (x0, eps) with the model's eps maps to sqrt(abp) x0 + sqrt(1-abp) eps.
  const int k = 10;
  auto x0 = test::randu(n, seed + 1, -0.9f, 0.9f), eps = test::randn(n, seed + 2);
  const double ab = d.alphas_cumprod[k], abp = d.alphas_cumprod_prev[k];
  std::vector<float> xt(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    xt[i] = float(std::sqrt(ab) * x0[i] + std::sqrt(1 - ab) * eps[i]);
    want[i] = float(std::sqrt(abp) * x0[i] + std::sqrt(1 - abp) * eps[i]);
  }
  Tensor xd = dev(xt);
  d.ddim_step(ops(), k, 0.0, xd, dev(eps), dev(nan_vec(n)), Tensor{}, false);
  EXPECT_LT(test::rel_l2(host(xd, n), want), 1e-5);
}

TEST_F(StepTest, LearnedRangeVariance) {
  Diffusion base(1000, "cosine", true);
  const auto keep = space_timesteps_ddpm(1000, 100);
  Diffusion d = base.respaced(keep);
  auto v = test::randu(n, seed + 3, -1.0f, 1.0f), z = test::randn(n, seed + 4);
  v[0] = 1.0f;
  v[1] = -1.0f;
  for (int k : {1, 50, 99}) {
    std::vector<float> out = lrn(d, k, v, z);
    const double ab = base.alphas_cumprod[keep[k]], abp = base.alphas_cumprod[keep[k - 1]];
    const double beta = 1 - ab / abp;
    const double post = beta * (1 - abp) / (1 - ab);
    for (size_t i = 0; i < n; ++i) {
      const double frac = (v[i] + 1.0) / 2.0;
      const double sd = std::exp(0.5 * (frac * std::log(beta) + (1 - frac) * std::log(post)));
      EXPECT_NEAR(out[i], sd * z[i], 1e-5 * std::fabs(sd * z[i]) + 1e-7) << k << " " << i;
    }
    // v = 1 gives the large variance beta, v = -1 the posterior variance.
    EXPECT_NEAR(out[0], std::sqrt(beta) * z[0], 1e-5 * std::fabs(z[0]));
    EXPECT_NEAR(out[1], std::sqrt(post) * z[1], 1e-5 * std::fabs(z[1]));
  }
  // And through ddpm_step with noise_scale 1 the pre-scaled noise is added to the mean.
  auto x = test::randn(n, seed + 5), eps = test::randn(n, seed + 6);
  const int k = 50;
  std::vector<float> scaled = lrn(d, k, v, z);
  Tensor a = dev(x);
  Tensor b = dev(x);
  d.ddpm_step(ops(), k, a, dev(eps), dev(nan_vec(n)), dev(scaled), 1.0f, true);
  d.ddpm_step(ops(), k, b, dev(eps), dev(nan_vec(n)), Tensor{}, 0.0f, true);
  auto ha = host(a, n), hb = host(b, n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(ha[i] - hb[i], scaled[i], 1e-5);
}

TEST_F(StepTest, PredictX0Clip) {
  Diffusion d(1000, "linear", false);
  auto x = test::randn(n, seed + 8, 3.0f), eps = test::randn(n, seed + 9);
  const int k = 20;
  Tensor a = dev(nan_vec(n));
  Tensor b = dev(nan_vec(n));
  d.predict_x0(ops(), k, dev(x), dev(eps), a, true);
  d.predict_x0(ops(), k, dev(x), dev(eps), b, false);
  auto ha = host(a, n), hb = host(b, n);
  int outside = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = x[i] * d.sqrt_recip_alphas_cumprod[k] - eps[i] * d.sqrt_recipm1_alphas_cumprod[k];
    EXPECT_NEAR(hb[i], want, 1e-5 * (1 + std::fabs(want)));
    EXPECT_EQ(ha[i], std::min(1.0f, std::max(-1.0f, hb[i])));
    outside += std::fabs(hb[i]) > 1;
  }
  EXPECT_GT(outside, 0);
}
