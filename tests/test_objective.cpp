// guided-diffusion's training objective (issue 12): the DiffusionLoss / LossStats ops (lib/ops/loss.h,
// loss_math.h; CUDA in kernels/loss/diffusion_loss.cu), the host coefficient rows and the
// LossSecondMomentResampler (lib/train/objective.h), micro-batches (lib/train/train_step.h).
//
//  * the double reference against central finite differences: the mean channels get the MSE's
//    gradient only (stop-gradient for vb), the variance channels get vb's; with use_kl everything
//    gets vb's; t = 0 (decoder NLL, all three of its branches) and t > 0 (KL) in one batch;
//  * the double reference against scripts/diffusion_torch.py (guided-diffusion's formulas, autograd
//    for the gradient through frozen_out), run with python3 + torch: rel 1e-9 (both float64 on the
//    same float32 coefficients; only libm and summation order differ);
//  * the float engine against the double reference: rel 1e-5 (terms) and 1e-5 (gradient);
//  * every CUDA variant against the CPU engine (check_variants, fp32 tolerance 1e-5; skips without
//    a GPU);
//  * the resampler's weights and draws against the transcription (weights rel 1e-12, draws equal),
//    its sampling distribution (frequencies within 5 sigma) and unbiasedness;
//  * a step in micro-batches against the whole batch: gradients rel 1e-5 (fp32 summation order).
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "checkpoint.h"
#include "diffusion.h"
#include "h5.h"
#include "init.h"
#include "model.h"
#include "objective.h"
#include "ops_common.h"
#include "optim.h"
#include "rng.h"
#include "train_step.h"
#include "util.h"

using namespace opt;
using namespace unet;

namespace {

// One batch of inputs in double, NHWC, with its coefficient rows.
struct Batch {
  int B = 5, H = 2, W = 2, C = 3, Co = 6;
  std::vector<int> t;
  V w, out, x0, noise, xt, coef;
  size_t P() const { return (size_t)H * W; }
  size_t D() const { return P() * C; }
};

struct Flags {
  bool learned = true, predict_xstart = false, use_kl = false, rescale = false;
  std::string schedule = "linear";
  int T = 40;
  ModelConfig cfg() const {
    ModelConfig c;
    c.learn_sigma = learned, c.predict_xstart = predict_xstart, c.use_kl = use_kl;
    c.rescale_learned_sigmas = rescale, c.diffusion_steps = T, c.noise_schedule = schedule;
    return c;
  }
};

// Realistic inputs: x0 on the uint8 grid (with -1 and 1 present), eps-like outputs near the noise
// (so the decoder NLL is not saturated), variance values in (-1, 1).
Batch make_batch(const Flags& f, std::vector<int> ts, int H = 2, int W = 2) {
  Batch b;
  b.B = (int)ts.size(), b.H = H, b.W = W, b.C = 3, b.Co = f.learned ? 6 : 3;
  b.t = ts;
  const Diffusion d(f.T, f.schedule, f.learned);
  const Objective obj(f.cfg());
  const size_t n = (size_t)b.B * b.D();
  V u = rnd(n, 0, 1), z = rnd(n, -1, 1), e = rnd(n, -1, 1), v = rnd((size_t)b.B * b.P() * 3, -0.9, 0.9);
  b.x0.resize(n), b.noise.resize(n), b.xt.resize(n);
  b.out.assign((size_t)b.B * b.P() * b.Co, 0.0);
  b.w = rnd(b.B, 0.5, 2.0);
  b.coef.resize((size_t)b.B * kLossCoefRows);
  for (int s = 0; s < b.B; ++s) {
    std::vector<float> row(kLossCoefRows);
    loss_coef_row(d, obj, ts[s], b.w[s], b.B, b.D(), row.data());
    for (int r = 0; r < kLossCoefRows; ++r) b.coef[(size_t)s * kLossCoefRows + r] = row[r];
    // The loss's scale factors exactly (the rows hold them rounded to float32, a 6e-8 effect that
    // would hide in the 1e-9 comparison with the transcription; the schedule's rows stay float32
    // as guided-diffusion's _extract_into_tensor makes them).
    double* c = &b.coef[(size_t)s * kLossCoefRows];
    c[kVbScale] = obj.vb_scale();
    c[kGradMse] = 2.0 * b.w[s] / ((double)b.B * b.D());
    c[kGradVb] = b.w[s] * obj.vb_scale() / ((double)b.B * b.D() * 0.69314718055994530942);
    c[kWeight] = b.w[s];
    const double sa = (float)d.sqrt_alphas_cumprod[ts[s]], s1 = (float)d.sqrt_one_minus_alphas_cumprod[ts[s]];
    for (size_t j = 0; j < b.D(); ++j) {
      const size_t i = s * b.D() + j;
      const int k = j == 0 ? 0 : j == 1 ? 255 : (int)(u[i] * 255.999);
      b.x0[i] = k / 127.5 - 1.0;
      b.noise[i] = 1.5 * z[i] + 0.3 * e[i];
      b.xt[i] = sa * b.x0[i] + s1 * b.noise[i];
      const size_t p = j / b.C, c = j % b.C, o = (s * b.P() + p) * b.Co + c;
      // eps prediction near the noise; x0 prediction near x0
      b.out[o] = f.predict_xstart ? b.x0[i] + 0.02 * e[i] : b.noise[i] + 0.1 * e[i];
      if (f.learned) b.out[o + b.C] = v[s * b.P() * 3 + p * 3 + c];
    }
  }
  return b;
}

struct Result {
  V terms, dout;
};

Result run_ref(const Batch& b, const Flags& f, bool grad = true, bool clip = false) {
  Result r;
  r.terms.assign((size_t)b.B * kLossTerms, kNaN);
  if (grad) r.dout.assign(b.out.size(), kNaN);
  ref::diffusion_loss<double>(b.out.data(), b.x0.data(), b.xt.data(), b.noise.data(), b.coef.data(),
                              r.terms.data(), grad ? r.dout.data() : nullptr, b.B, b.P(), b.C, b.Co,
                              f.predict_xstart, f.use_kl, clip);
  return r;
}

// sum_b w_b / B * term_b: the scalar whose gradient dout is.
double weighted(const Batch& b, const V& terms, int term) {
  double s = 0;
  for (int i = 0; i < b.B; ++i) s += b.w[i] / b.B * terms[(size_t)i * kLossTerms + term];
  return s;
}

// Central differences of loss() over the elements idx of x, against ana: relative L2 error.
double fd_error(V& x, const V& ana, const std::vector<size_t>& idx, const std::function<double()>& loss,
                double* norm = nullptr) {
  double err = 0, nrm = 0;
  for (size_t i : idx) {
    const double save = x[i], h = 1e-6;
    x[i] = save + h;
    const double lp = loss();
    x[i] = save - h;
    const double lm = loss();
    x[i] = save;
    const double num = (lp - lm) / (2 * h);
    err += (num - ana[i]) * (num - ana[i]);
    nrm += ana[i] * ana[i];
  }
  if (norm) *norm = std::sqrt(nrm);
  return nrm > 0 ? std::sqrt(err / nrm) : INFINITY;
}

std::vector<Flags> all_flags() {
  std::vector<Flags> v;
  Flags f;
  v.push_back(f);  // hybrid, linear
  f.schedule = "cosine", f.rescale = true;
  v.push_back(f);  // hybrid, RESCALED_MSE, cosine
  f = Flags{}, f.predict_xstart = true;
  v.push_back(f);  // hybrid, x0 prediction
  f = Flags{}, f.use_kl = true;
  v.push_back(f);  // RESCALED_KL, learned range
  f.learned = false;
  v.push_back(f);  // RESCALED_KL, fixed-large variance
  f = Flags{}, f.learned = false;
  v.push_back(f);  // plain MSE
  return v;
}

std::string name(const Flags& f) {
  return std::string(f.learned ? "learned" : "fixed") + (f.use_kl ? " use_kl" : "") +
         (f.predict_xstart ? " x0" : " eps") + (f.rescale ? " rescaled" : "") + " " + f.schedule;
}

TEST(Objective, GradientFiniteDifferences) {
  for (const Flags& f : all_flags()) {
    SCOPED_TRACE(name(f));
    Batch b = make_batch(f, {0, 1, 17, 39, 0});
    const Result r = run_ref(b, f);
    std::vector<size_t> mean_idx, var_idx;
    for (size_t o = 0; o < b.out.size(); ++o) ((int)(o % b.Co) < b.C ? mean_idx : var_idx).push_back(o);
    auto total = [&] { return weighted(b, run_ref(b, f, false).terms, kTermLoss); };
    auto mse = [&] { return weighted(b, run_ref(b, f, false).terms, kTermMse); };
    auto vb = [&] { return weighted(b, run_ref(b, f, false).terms, kTermVb); };
    if (f.use_kl) {
      EXPECT_LT(fd_error(b.out, r.dout, mean_idx, total), 1e-6) << "mean channels, use_kl: vb's gradient";
    } else {
      // The mean channels get the MSE's gradient only...
      EXPECT_LT(fd_error(b.out, r.dout, mean_idx, mse), 1e-6) << "mean channels: the MSE's gradient";
      if (f.learned) {
        // ...although vb does depend on them (the stop-gradient is not vacuous).
        V num(b.out.size(), 0.0);
        for (size_t i : mean_idx) {
          const double s = b.out[i];
          b.out[i] = s + 1e-6;
          const double lp = vb();
          b.out[i] = s - 1e-6;
          const double lm = vb();
          b.out[i] = s;
          num[i] = (lp - lm) / 2e-6;
        }
        EXPECT_GT(std::sqrt(dot(num, num)), 1e-4) << "vb depends on the mean channels";
      }
    }
    if (f.learned) {
      double nrm = 0;
      EXPECT_LT(fd_error(b.out, r.dout, var_idx, total, &nrm), 1e-6) << "variance channels: vb's gradient";
      EXPECT_GT(nrm, 0) << "the variance channels get a gradient";
    }
    // Terms: loss = mse + vb (or vb alone with use_kl); vb is 0 without a vb term.
    for (int s = 0; s < b.B; ++s) {
      const double* t = &r.terms[(size_t)s * kLossTerms];
      const bool has_vb = f.learned || f.use_kl;
      EXPECT_NEAR(t[kTermLoss], f.use_kl ? t[kTermVb] : t[kTermMse] + t[kTermVb], 1e-12);
      if (!has_vb) {
        EXPECT_EQ(t[kTermVb], 0.0);
      }
      if (has_vb) {
        EXPECT_GT(std::fabs(t[kTermVb]), 0.0);
      }
    }
  }
}

TEST(Objective, FloatEngineMatchesDouble) {
  for (const Flags& f : all_flags())
    for (bool clip : {false, true}) {
      SCOPED_TRACE(name(f) + (clip ? " clip" : ""));
      const Batch b = make_batch(f, {0, 3, 20, 39, 0, 11}, 4, 4);
      const Result r = run_ref(b, f, !clip, clip);
      Dev d;
      const int64_t B = b.B, H = b.H, W = b.W;
      Tensor terms = d.poisoned({B, kLossTerms}),
             dout = clip ? Tensor{} : d.poisoned({B, H, W, (int64_t)b.Co});
      d.run(DiffusionLoss{d.put(b.out, {B, H, W, (int64_t)b.Co}), d.put(b.x0, {B, H, W, 3}),
                          d.put(b.xt, {B, H, W, 3}), d.put(b.noise, {B, H, W, 3}),
                          d.put(b.coef, {B, kLossCoefRows}), terms, dout, f.predict_xstart, f.use_kl, clip});
      EXPECT_LT(rel(d.get(terms), r.terms), 1e-5);
      if (!clip) {
        EXPECT_LT(rel(d.get(dout), r.dout), 1e-5);
      }
    }
}

TEST(Objective, LossStats) {
  const int B = 7;
  V terms = rnd((size_t)B * kLossTerms, 0, 2), coef((size_t)B * kLossCoefRows, 0.0);
  V w = rnd(B, 0.5, 2);
  for (int b = 0; b < B; ++b)
    coef[(size_t)b * kLossCoefRows + kWeight] = w[b], coef[(size_t)b * kLossCoefRows + kQuartile] = b % 4;
  V stats = {1, 2, 3, 4, 5, 6, 7}, want = stats;
  for (int b = 0; b < B; ++b) {
    const double* t = &terms[(size_t)b * kLossTerms];
    want[0] += w[b] * t[kTermLoss], want[1] += w[b] * t[kTermMse], want[2] += w[b] * t[kTermVb];
    want[3 + b % 4] += w[b] * t[kTermLoss];
  }
  ref::loss_stats<double>(terms.data(), coef.data(), stats.data(), B);
  EXPECT_LT(rel(stats, want), 1e-14);
}

// ---- against the PyTorch transcription (scripts/diffusion_torch.py) ----

int run_script(const std::string& args) {
  return run_python(source_dir() + "/scripts/diffusion_torch.py " + args);
}
// NHWC [B,P,C] <-> NCHW [B,C,P] in double.
V to_nchw(const V& x, int B, size_t P, int C) {
  V y(x.size());
  for (int b = 0; b < B; ++b)
    for (size_t p = 0; p < P; ++p)
      for (int c = 0; c < C; ++c) y[((size_t)b * C + c) * P + p] = x[((size_t)b * P + p) * C + c];
  return y;
}
V to_nhwc(const V& x, int B, size_t P, int C) {
  V y(x.size());
  for (int b = 0; b < B; ++b)
    for (size_t p = 0; p < P; ++p)
      for (int c = 0; c < C; ++c) y[((size_t)b * P + p) * C + c] = x[((size_t)b * C + c) * P + p];
  return y;
}
V read_f64(h5::File& f, const std::string& name, size_t n) {
  V v(n);
  h5::read(f, name, h5::DType::F64, v.data(), n);
  return v;
}

TEST(Objective, MatchesPyTorchTranscription) {
  if (!have_torch()) GTEST_SKIP() << "python3 with torch and h5py is not available";
  const std::string dir = temp_dir("objective");
  for (const Flags& f : all_flags()) {
    SCOPED_TRACE(name(f));
    const Batch b = make_batch(f, {0, 1, 2, 20, 38, 39, 0, 5}, 3, 2);
    const Result r = run_ref(b, f);
    const hsize_t B = b.B, H = b.H, W = b.W;
    const std::string in = dir + "/in.h5", out = dir + "/out.h5";
    {
      h5::File h = h5::File::create(in);
      h5::set_attr(h, "/", "T", (int64_t)f.T);
      h5::set_attr(h, "/", "schedule", f.schedule);
      h5::set_attr(h, "/", "learn_sigma", (int64_t)f.learned);
      h5::set_attr(h, "/", "predict_xstart", (int64_t)f.predict_xstart);
      h5::set_attr(h, "/", "use_kl", (int64_t)f.use_kl);
      h5::set_attr(h, "/", "rescale_learned_sigmas", (int64_t)f.rescale);
      h5::write(h, "out", h5::DType::F64, to_nchw(b.out, b.B, b.P(), b.Co).data(), {B, (hsize_t)b.Co, H, W});
      h5::write(h, "x0", h5::DType::F64, to_nchw(b.x0, b.B, b.P(), 3).data(), {B, 3, H, W});
      h5::write(h, "noise", h5::DType::F64, to_nchw(b.noise, b.B, b.P(), 3).data(), {B, 3, H, W});
      std::vector<int64_t> t(b.t.begin(), b.t.end());
      h5::write_i64(h, "t", t.data(), {B});
      h5::write(h, "w", h5::DType::F64, b.w.data(), {B});
      h.close();
    }
    ASSERT_EQ(run_script("objective " + in + " " + out), 0);
    h5::File h = h5::File::open(out);
    const V grad = to_nhwc(read_f64(h, "grad", b.out.size()), b.B, b.P(), b.Co);
    EXPECT_LT(rel(r.dout, grad), 1e-9) << "gradient (autograd through frozen_out)";
    auto col = [&](const Result& x, int term) {
      V v(b.B);
      for (int s = 0; s < b.B; ++s) v[s] = x.terms[(size_t)s * kLossTerms + term];
      return v;
    };
    EXPECT_LT(rel(col(r, kTermLoss), read_f64(h, "loss", b.B)), 1e-9) << "loss";
    if (!f.use_kl) {
      EXPECT_LT(rel(col(r, kTermMse), read_f64(h, "mse", b.B)), 1e-9) << "mse";
    }
    if (f.learned && !f.use_kl) {
      EXPECT_LT(rel(col(r, kTermVb), read_f64(h, "vb", b.B)), 1e-9) << "vb";
    }
    // The bound's terms (calc_bpd_loop: predicted x0 clipped; vb unscaled) with vb_scale rows 1.
    Flags fe = f;
    fe.use_kl = false, fe.rescale = false;
    Batch be = b;
    const Diffusion d(f.T, f.schedule, f.learned);
    ModelConfig ce = fe.cfg();
    const Objective oe(ce);
    for (int s = 0; s < b.B; ++s) {
      std::vector<float> row(kLossCoefRows);
      loss_coef_row(d, oe, b.t[s], 1.0, b.B, b.D(), row.data());
      for (int k = 0; k < kLossCoefRows; ++k) be.coef[(size_t)s * kLossCoefRows + k] = row[k];
      be.coef[(size_t)s * kLossCoefRows + kWeight] = 1.0;
    }
    fe.use_kl = true;  // the op computes vb whatever the variance when use_kl is set
    const Result e = run_ref(be, fe, false, true);
    EXPECT_LT(rel(col(e, kTermVb), read_f64(h, "eval_vb", b.B)), 1e-9)
        << "vb term per timestep (t = 0 and t > 0)";
    EXPECT_LT(rel(col(e, kTermX0Mse), read_f64(h, "eval_x0_mse", b.B)), 1e-9) << "x0 mse";
    EXPECT_LT(rel(col(e, kTermEpsMse), read_f64(h, "eval_mse", b.B)), 1e-9) << "eps mse";
  }
}

// ---- every CUDA variant against the CPU engine ----

TEST(ObjectiveVariants, DiffusionLossAndStats) {
  SKIP_WITHOUT_GPU();
  const Tol f32{1e-5, 1e-5, 1e-5};  // f32 in every precision
  struct Shape {
    int64_t B, R;
    Flags f;
    bool clip;
  };
  std::vector<Shape> shapes;
  for (const Flags& f : all_flags()) shapes.push_back({6, 8, f, false});
  Flags ev = Flags{};
  ev.use_kl = true;
  shapes.push_back({5, 8, ev, true});
  Flags big = Flags{};
  big.T = 1000;
  shapes.push_back({32, 64, big, false});
  for (const Shape& s : shapes) {
    const int64_t C = 3, Co = s.f.learned ? 6 : 3;
    std::vector<int> ts(s.B);
    for (int i = 0; i < s.B; ++i) ts[i] = i % 3 == 0 ? 0 : (i * 7919) % s.f.T;
    const Batch b = make_batch(s.f, ts, (int)s.R, (int)s.R);
    check_variants<DiffusionLoss>(
        name(s.f) + " B=" + std::to_string(s.B) + " R=" + std::to_string(s.R) + (s.clip ? " clip" : ""),
        [&](const Alloc& A, DType) {
          return DiffusionLoss{A(DType::F32, {s.B, s.R, s.R, Co}),
                               A(DType::F32, {s.B, s.R, s.R, C}),
                               A(DType::F32, {s.B, s.R, s.R, C}),
                               A(DType::F32, {s.B, s.R, s.R, C}),
                               A(DType::F32, {s.B, kLossCoefRows}),
                               A(DType::F32, {s.B, kLossTerms}),
                               s.clip ? Tensor{} : A(DType::F32, {s.B, s.R, s.R, Co}),
                               s.f.predict_xstart,
                               s.f.use_kl,
                               s.clip};
        },
        f32, [&](Engine& e, DiffusionLoss& op) {  // realistic inputs (random ones saturate the decoder NLL)
          from_host(e, op.out, tof(b.out)), from_host(e, op.x0, tof(b.x0)), from_host(e, op.xt, tof(b.xt));
          from_host(e, op.noise, tof(b.noise)), from_host(e, op.coef, tof(b.coef));
        });
  }
  check_variants<LossStats>(
      "loss_stats",
      [](const Alloc& A, DType) {
        return LossStats{A(DType::F32, {37, kLossTerms}), A(DType::F32, {37, kLossCoefRows}),
                         A(DType::F32, {7})};
      },
      Tol{1e-6, 1e-6, 1e-6},
      [](Engine& e, LossStats& op) {
        std::vector<float> c = to_host(e, op.coef);
        for (int b = 0; b < 37; ++b) c[(size_t)b * kLossCoefRows + kQuartile] = (float)(b % 4);
        from_host(e, op.coef, c);
      });
}

// ---- the schedule sampler ----

TEST(Resampler, MatchesTranscription) {
  if (!have_torch()) GTEST_SKIP() << "python3 with torch and h5py is not available";
  // S: the warm-up (10 losses of each of the 12 timesteps, 8 draws a step) ends after 20-35 steps
  // (UNET_TEST_SEED=1492435698 left only 5 warm steps of 40), so 60 keeps 25 or more to compare
  const int T = 12, B = 8, S = 60;
  const uint64_t seed = test_seed() % 1000003;
  LossSecondMomentResampler r(T);
  std::vector<int64_t> ts((size_t)S * B);
  V losses((size_t)S * B);
  std::vector<std::vector<double>> weights;
  std::vector<int> drawn((size_t)S * B);
  std::vector<float> wdrawn((size_t)S * B);
  std::vector<int> warm(S);
  const V noise = rnd((size_t)S * B, 0, 1);
  for (int s = 0; s < S; ++s) {
    weights.push_back(r.weights());
    warm[s] = r.warmed_up();
    std::vector<float> tu(B);
    const uint64_t kt = rng_key(seed, Stream::TrainTimestep, (uint64_t)s);
    for (int b = 0; b < B; ++b) tu[b] = (float)randint(kt, Stream::TrainTimestep, b, T);
    std::vector<int> t(B);
    std::vector<float> w(B), l(B);
    r.sample(seed, s, B, tu.data(), t.data(), w.data());
    for (int b = 0; b < B; ++b) {
      drawn[(size_t)s * B + b] = t[b], wdrawn[(size_t)s * B + b] = w[b];
      ts[(size_t)s * B + b] = t[b];
      l[b] = (float)(0.1 * (t[b] + 1) + noise[(size_t)s * B + b]);  // losses that grow with t
      losses[(size_t)s * B + b] = l[b];
      if (!warm[s]) {
        EXPECT_EQ(t[b], (int)tu[b]) << "uniform until warm";
      }
      if (!warm[s]) {
        EXPECT_EQ(w[b], 1.0f);
      }
    }
    r.update(t.data(), l.data(), B);
  }
  ASSERT_TRUE(r.warmed_up()) << "the test should reach the warm phase";
  const std::string dir = temp_dir("resampler"), in = dir + "/in.h5", out = dir + "/out.h5";
  {
    h5::File h = h5::File::create(in);
    h5::set_attr(h, "/", "T", (int64_t)T);
    h5::set_attr(h, "/", "seed", (int64_t)seed);
    h5::write_i64(h, "ts", ts.data(), {(hsize_t)S, (hsize_t)B});
    h5::write(h, "losses", h5::DType::F64, losses.data(), {(hsize_t)S, (hsize_t)B});
    h.close();
  }
  ASSERT_EQ(run_script("resampler " + in + " " + out), 0);
  h5::File h = h5::File::open(out);
  const V pw = read_f64(h, "weights", (size_t)S * T);
  std::vector<int64_t> pt((size_t)S * B);
  h5::read(h, "t", h5::DType::I64, pt.data(), pt.size());
  std::vector<float> pwt((size_t)S * B);
  h5::read(h, "w", h5::DType::F32, pwt.data(), pwt.size());
  int warm_steps = 0;
  for (int s = 0; s < S; ++s) {
    EXPECT_LT(rel(weights[s], V(pw.begin() + (size_t)s * T, pw.begin() + (size_t)(s + 1) * T)), 1e-12) << s;
    if (!warm[s]) continue;
    ++warm_steps;
    for (int b = 0; b < B; ++b) {
      EXPECT_EQ(drawn[(size_t)s * B + b], pt[(size_t)s * B + b]) << "step " << s << " sample " << b;
      EXPECT_NEAR(wdrawn[(size_t)s * B + b], pwt[(size_t)s * B + b], 1e-6 * pwt[(size_t)s * B + b]);
    }
  }
  EXPECT_GT(warm_steps, 5);
}

TEST(Resampler, SamplingDistributionAndUnbiasedness) {
  const int T = 20, B = 1000, S = 200;
  LossSecondMomentResampler r(T);
  for (int rep = 0; rep < LossSecondMomentResampler::kHistory; ++rep)
    for (int t = 0; t < T; ++t) {
      const float l = (float)(t + 1) * (rep % 2 ? 1.2f : 0.8f);
      r.update(&t, &l, 1);
    }
  ASSERT_TRUE(r.warmed_up());
  const std::vector<double> w = r.weights();
  double sw = 0;
  for (double x : w) sw += x;
  EXPECT_NEAR(sw, 1.0, 1e-12);
  // p_t ∝ sqrt(mean(loss^2)) = (t+1) sqrt((0.64 + 1.44)/2), mixed with 0.001 uniform.
  double z = 0;
  for (int t = 0; t < T; ++t) z += t + 1;
  // (The history holds float32 losses: 1e-7 relative.)
  for (int t = 0; t < T; ++t) EXPECT_NEAR(w[t], (t + 1) / z * 0.999 + 0.001 / T, 1e-7 * w[t]);
  std::vector<double> count(T, 0);
  double est = 0;
  std::vector<int> t(B);
  std::vector<float> wt(B), none(B, 0.0f);
  for (int s = 0; s < S; ++s) {
    r.sample(42, s, B, none.data(), t.data(), wt.data());
    for (int b = 0; b < B; ++b) {
      ++count[t[b]];
      est += wt[b] * std::cos(0.3 * t[b]);  // importance-weighted mean of f(t)
      EXPECT_NEAR(wt[b], 1.0 / (T * w[t[b]]), 1e-6 / (T * w[t[b]]));
    }
  }
  const double N = (double)S * B;
  for (int k = 0; k < T; ++k) {
    const double sd = std::sqrt(N * w[k] * (1 - w[k]));
    EXPECT_LT(std::fabs(count[k] - N * w[k]), 5 * sd) << "t " << k;
  }
  double mean_f = 0;
  for (int k = 0; k < T; ++k) mean_f += std::cos(0.3 * k) / T;
  EXPECT_NEAR(est / N, mean_f, 0.01) << "importance weights keep the uniform mean";
  // Deterministic in (seed, step).
  std::vector<int> t2(B);
  std::vector<float> w2(B);
  r.sample(42, 7, B, none.data(), t.data(), wt.data());
  r.sample(42, 7, B, none.data(), t2.data(), w2.data());
  EXPECT_EQ(t, t2);
}

TEST(Resampler, LoadRejectsBadState) {
  LossSecondMomentResampler r(5);
  EXPECT_THROW(r.load(std::vector<double>(40, 0.0), std::vector<int64_t>(4, 0), "x.h5"), UserError);
  EXPECT_THROW(r.load(std::vector<double>(50, 0.0), std::vector<int64_t>(5, 11), "x.h5"), UserError);
  std::vector<double> h(50, 1.0);
  h[3] = NAN;
  EXPECT_THROW(r.load(h, std::vector<int64_t>(5, 10), "x.h5"), UserError);
}

// ---- micro-batches and the checkpoint ----

ModelConfig tiny_model() {
  ModelConfig c;
  c.image_size = 8, c.num_channels = 32, c.channel_mult = {1, 2}, c.num_res_blocks = 1;
  c.attention_resolutions = {4}, c.num_head_channels = 16, c.learn_sigma = true, c.diffusion_steps = 30;
  c.noise_schedule = "cosine", c.class_cond = true, c.num_classes = 3;
  return c;
}

TEST(Microbatch, SameAsFullBatch) {
  const ModelConfig cfg = tiny_model();
  const int B = 4;
  const std::vector<float> w0 = init_params(build_param_table(cfg), 5);
  auto params = [&] {
    // Random weights everywhere (init zeroes the output layer: a vacuous gradient).
    std::vector<float> p = w0;
    const std::vector<float> r = randn(p.size(), 99, 0.05f);
    for (size_t i = 0; i < p.size(); ++i) p[i] += r[i];
    return p;
  }();
  const size_t n = (size_t)B * 8 * 8 * 3;
  const std::vector<float> x0 = randu(n, 1, -1, 1), noise = randn(n, 2);
  const std::vector<int> ts = {0, 7, 29, 15};
  const std::vector<float> iw = {1.0f, 0.5f, 2.0f, 1.25f};
  const std::vector<int32_t> labels = {0, 2, 1, 2};
  struct Out {
    std::vector<float> grad, terms, params;
  };
  auto run = [&](int micro) {
    auto eng = make_cpu_engine();
    Model model(cfg, *eng);
    Optimizer opt(*eng, model.arena_floats(), OptimizerOptions{});
    TrainStep ts_(*eng, model, opt, B, micro);
    eng->upload(model.params(), params.data());
    opt.init_ema(model.params());
    const Diffusion d(cfg.diffusion_steps, cfg.noise_schedule, cfg.learn_sigma);
    ts_.set_timesteps(d, ts.data(), iw.data());
    eng->upload(ts_.x0, x0.data());
    eng->upload(ts_.noise, noise.data());
    eng->upload(ts_.labels, labels.data());
    ts_.enqueue(0);
    Out o;
    o.grad.resize(model.arena_floats()), o.params.resize(model.arena_floats()),
        o.terms.resize(B * kLossTerms);
    eng->download(o.grad.data(), ts_.gradients());
    eng->download(o.params.data(), model.params());
    eng->download(o.terms.data(), ts_.terms);
    return o;
  };
  const Out full = run(0), halves = run(2), singles = run(1);
  double gn = 0;
  for (float g : full.grad) gn += (double)g * g;
  ASSERT_GT(gn, 0);
  EXPECT_LT(rel_l2(halves.grad, full.grad), 1e-5);
  EXPECT_LT(rel_l2(singles.grad, full.grad), 1e-5);
  EXPECT_LT(rel_l2(halves.terms, full.terms), 1e-5);
  EXPECT_LT(rel_l2(singles.terms, full.terms), 1e-5);
  // AdamW's first step is about lr * sign(g): near-zero gradients amplify the summation-order
  // differences, so the weights after it agree less closely than the gradients.
  EXPECT_LT(rel_l2(halves.params, full.params), 1e-4);
  EXPECT_THROW(
      {
        auto eng = make_cpu_engine();
        Model model(cfg, *eng);
        Optimizer opt(*eng, model.arena_floats(), OptimizerOptions{});
        TrainStep bad(*eng, model, opt, B, 3);
      },
      UserError);
}

TEST(Checkpoint, ObjectiveFlagsAndSamplerHistory) {
  ModelConfig cfg = tiny_model();
  cfg.use_kl = true, cfg.predict_xstart = true, cfg.rescale_learned_sigmas = false,
  cfg.rescale_timesteps = true;
  Checkpoint ck;
  ck.cfg = cfg;
  ck.model = init_params(build_param_table(cfg), 1);
  ck.loss_history.resize((size_t)cfg.diffusion_steps * 10);
  for (size_t i = 0; i < ck.loss_history.size(); ++i) ck.loss_history[i] = 0.001 * i;
  ck.loss_counts.assign(cfg.diffusion_steps, 10);
  ck.loss_counts[3] = 4;
  ck.state["step"] = 5;
  const std::string path = temp_dir("ckobj") + "/c.h5";
  save_checkpoint(path, ck);
  const Checkpoint back = load_checkpoint(path);
  EXPECT_TRUE(back.cfg.use_kl && back.cfg.predict_xstart && !back.cfg.rescale_learned_sigmas &&
              back.cfg.rescale_timesteps);
  EXPECT_EQ(back.loss_history, ck.loss_history);
  EXPECT_EQ(back.loss_counts, ck.loss_counts);
  {
    h5::File f = h5::File::open(path);
    EXPECT_EQ(h5::get_attr_i64(f, "/", "use_kl"), 1);
    EXPECT_EQ(h5::get_attr_i64(f, "/", "rescale_learned_sigmas"), 0);
  }
}

}  // namespace
