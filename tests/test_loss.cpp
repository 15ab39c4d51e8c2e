// loss and diffusion families: the MSE and its gradient (lib/ops/loss.h), the classifier's
// cross-entropy with top-k hits and its log sums (CrossEntropy, ClassifierStats), q_sample, the
// samplers' arithmetic and their noise (lib/ops/diffusion_ops.h, NormalFill); CPU in
// lib/ops/*.cpp, CUDA in kernels/loss/ and kernels/diffusion/.
#include <algorithm>
#include <cstring>
#include <tuple>

#include "ops_common.h"
#include "rng.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Loss, MseValueAndGradient) {
  const size_t n = 40000;  // several reduction chunks
  V pred = rnd(n), target = rnd(n), dpred = nans(n);
  double expect = 0;
  for (size_t i = 0; i < n; ++i) expect += (pred[i] - target[i]) * (pred[i] - target[i]);
  expect /= n;
  double loss = kNaN;
  ref::mse_fwd_bwd<double>(pred.data(), target.data(), &loss, dpred.data(), n);
  EXPECT_NEAR(loss, expect, 1e-13 * expect);
  V small_p(pred.begin(), pred.begin() + 50), small_t(target.begin(), target.begin() + 50), gd = nans(50);
  double l2;
  ref::mse_fwd_bwd<double>(small_p.data(), small_t.data(), &l2, gd.data(), 50);
  gradcheck("dpred", small_p, gd, [&] {
    double l;
    ref::mse_fwd_bwd<double>(small_p.data(), small_t.data(), &l, nullptr, 50);
    return l;
  });
  Dev d;
  Tensor L = d.poisoned({1}), DP = d.poisoned({(int64_t)n});
  d.run(MseLoss{d.put(pred), d.put(target), L, DP});
  EXPECT_NEAR(d.get(L)[0], expect, 1e-6 * expect);
  EXPECT_LT(rel(d.get(DP), dpred), 1e-6);
}

// F.cross_entropy and classifier_train.py's compute_top_k written out: -log softmax(l)[y]; a hit
// at k when y is among the k largest logits.
TEST(Loss, CrossEntropyTopKAndGradient) {
  const int B = 7;
  for (int K : {1, 3, 5, 9, 1000}) {
    SCOPED_TRACE("K " + std::to_string(K));
    V l = rnd((size_t)B * K, -3, 3);
    std::vector<int32_t> y(B);
    for (int b = 0; b < B; ++b) y[b] = (int32_t)((b * 7 + K) % K);
    if (K >= 3) l[(size_t)0 * K + y[0]] = 5.0;  // sample 0 certainly right, sample 1 certainly wrong at top-1
    if (K >= 3) l[(size_t)1 * K + y[1]] = -5.0;
    V want_terms((size_t)B * kClassTerms);
    for (int b = 0; b < B; ++b) {
      double z = 0;
      for (int k = 0; k < K; ++k) z += std::exp(l[(size_t)b * K + k]);
      want_terms[(size_t)b * kClassTerms + kClassLoss] = -(l[(size_t)b * K + y[b]] - std::log(z));
      std::vector<std::pair<double, int>> order;
      for (int k = 0; k < K; ++k) order.push_back({-l[(size_t)b * K + k], k});
      std::sort(order.begin(), order.end());
      for (int kk : {1, 5}) {
        bool hit = false;
        for (int i = 0; i < std::min(kk, K); ++i) hit |= order[i].second == y[b];
        want_terms[(size_t)b * kClassTerms + (kk == 1 ? kClassTop1 : kClassTop5)] = hit;
      }
    }
    V terms = nans(want_terms.size()), dl = nans(l.size());
    const double scale = 1.0 / B;
    ref::cross_entropy<double>(l.data(), y.data(), terms.data(), dl.data(), scale, B, K);
    EXPECT_LT(rel(terms, want_terms), 1e-14);
    if (K >= 3) {
      EXPECT_EQ(terms[kClassTop1], 1.0);
      EXPECT_EQ(terms[kClassTerms + kClassTop1], 0.0);
    }
    V want_dl(l.size());  // softmax - onehot, written out
    for (int b = 0; b < B; ++b) {
      double z = 0;
      for (int k = 0; k < K; ++k) z += std::exp(l[(size_t)b * K + k]);
      for (int k = 0; k < K; ++k)
        want_dl[(size_t)b * K + k] = scale * (std::exp(l[(size_t)b * K + k]) / z - (k == y[b] ? 1.0 : 0.0));
    }
    EXPECT_LT(rel(dl, want_dl), K > 1 ? 1e-13 : INFINITY);
    if (K > 1 && K < 100) {  // (with 1000 classes most derivatives sit near double rounding of the loss)
      gradcheck("dlogits", l, dl, [&] {
        V t(terms.size());
        ref::cross_entropy<double>(l.data(), y.data(), t.data(), nullptr, 0.0, B, K);
        double s = 0;
        for (int b = 0; b < B; ++b) s += t[(size_t)b * kClassTerms + kClassLoss];
        return s * scale;
      });
    }
    Dev d;
    Tensor T = d.poisoned({B, kClassTerms}), DL = d.poisoned({B, K});
    d.run(CrossEntropy{d.put(l, {B, K}), d.labels(y), T, DL, (float)scale});
    EXPECT_LT(rel(d.get(T), terms), 1e-6);
    if (K > 1) {
      EXPECT_LT(rel(d.get(DL), dl), 1e-6);
    }
    // guidance: scale -S gives S * d log p(y) / d logits, and terms may be left out
    d.run(CrossEntropy{d.put(l, {B, K}), d.labels(y), {}, DL, -2.5f});
    V g = dl;
    for (double& v : g) v *= -2.5 / scale;
    if (K > 1) {
      EXPECT_LT(rel(d.get(DL), g), 1e-6);
    }
  }
}

TEST(Loss, ClassifierStatsByQuartile) {
  const int B = 9;
  V terms = rnd((size_t)B * kClassTerms);
  std::vector<int32_t> q(B);
  for (int b = 0; b < B; ++b) q[b] = (b * 5) % 4;
  V stats((size_t)kClassStats), want((size_t)kClassStats);
  for (int k = 0; k < kClassStats; ++k) stats[k] = want[k] = k;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < kClassTerms; ++j) {
      want[j] += terms[(size_t)b * kClassTerms + j];
      want[kClassTerms + kClassTerms * q[b] + j] += terms[(size_t)b * kClassTerms + j];
    }
  ref::classifier_stats<double>(terms.data(), q.data(), stats.data(), B);
  EXPECT_LT(rel(stats, want), 1e-14);
  Dev d;
  V init(kClassStats);
  for (int k = 0; k < kClassStats; ++k) init[k] = k;
  Tensor S = d.put(init);
  d.run(ClassifierStats{d.put(terms, {B, kClassTerms}), d.labels(q), S});
  EXPECT_LT(rel(d.get(S), want), 1e-6);
}

TEST(DiffusionOps, QSampleAxpbypczClampLearnedRange) {
  const int B = 3;
  const size_t np = 50, n = B * np;
  V x0 = rnd(n), noise = rnd(n), coef = rnd(2 * B, 0, 1);
  Dev d;
  Tensor XT = d.poisoned({B, (int64_t)np});
  d.run(QSample{d.put(x0, {B, (int64_t)np}), d.put(noise, {B, (int64_t)np}), d.put(coef), XT});
  F xt = d.get(XT);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(xt[i], coef[i / np] * x0[i] + coef[B + i / np] * noise[i], 1e-6);

  V x = rnd(n), y = rnd(n), z = rnd(n);
  Tensor Y = d.put(y), X = d.put(x), Z = d.put(z);
  d.run(Axpbypcz{X, Y, Z, 0.5f, -1.25f, 2.0f});
  F fy = d.get(Y);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(fy[i], 0.5 * x[i] - 1.25 * y[i] + 2 * z[i], 1e-6);
  Y = d.put(y);
  d.run(Axpbypcz{X, Y, {}, 0.5f, -1.25f, 0.0f});
  fy = d.get(Y);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(fy[i], 0.5 * x[i] - 1.25 * y[i], 1e-6);

  V c = rnd(n, -3, 3);
  Tensor Cc = d.put(c);
  d.run(Clamp{Cc, -1.0f, 1.0f});
  F fc = d.get(Cc);
  size_t clipped = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(fc[i], (float)std::min(1.0, std::max(-1.0, (double)(float)c[i])));
    clipped += std::fabs(c[i]) > 1;
  }
  EXPECT_GT(clipped, 0u);

  V v = rnd(n), zz = rnd(n);
  Tensor O = d.poisoned({(int64_t)n});
  d.run(LearnedRangeNoise{d.put(v), d.put(zz), O, -7.0f, -3.0f});
  F fo = d.get(O);
  for (size_t i = 0; i < n; ++i) {
    const double f = (v[i] + 1) / 2, lv = f * -3.0 + (1 - f) * -7.0;
    ASSERT_NEAR(fo[i], std::exp(0.5 * lv) * zz[i], 1e-6) << i;
  }
}

// The samplers' noise: element i is rng.h's normal(seed, stream, index0 + i), drawn one value at a
// time here (the op draws pairs, split across threads): exact on the CPU for even and odd starts,
// a size over the reference's thread chunks, and N(0, 1) in its moments.
TEST(DiffusionOps, NormalFillIsTheCounterDraws) {
  const uint64_t seed = unet::test::test_seed();
  Dev d;
  for (uint64_t index0 : {uint64_t{0}, uint64_t{7}, uint64_t{3} * 12288 * 64 + 1})
    for (int64_t n : {int64_t{1}, int64_t{6}, int64_t{200003}}) {
      Tensor Z = d.poisoned({n});
      d.run(unet::NormalFill{Z, seed, (uint64_t)unet::Stream::SampleStep, index0});
      const F z = d.get(Z);
      size_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float want = unet::normal(seed, unet::Stream::SampleStep, index0 + i);
        bad += std::memcmp(&z[i], &want, 4) != 0;
      }
      EXPECT_EQ(bad, 0u) << "index0 " << index0 << " n " << n;
      if (n > 1000) {
        double m = 0, v = 0;
        for (float x : z) m += x, v += (double)x * x;
        m /= n, v = v / n - m * m;
        EXPECT_LT(std::fabs(m), 0.01) << "mean";
        EXPECT_LT(std::fabs(v - 1), 0.02) << "variance";
      }
    }
  // Another stream or seed: other values.
  Tensor A = d.poisoned({64}), B = d.poisoned({64});
  d.run(unet::NormalFill{A, seed, (uint64_t)unet::Stream::SampleStep, 0});
  d.run(unet::NormalFill{B, seed, (uint64_t)unet::Stream::SampleInit, 0});
  EXPECT_NE(d.get(A), d.get(B));
}

// CUDA draws the CPU's values: the transform runs in double on both, so a float can differ only
// where CUDA's log/sin/cos and the host libm's round a double differently across a float's
// rounding boundary (about one value in 10^8): at most one float ulp, and rarely. Both kernel paths
// (pairs as vectors at an even start and a 16-byte aligned output, one value at a time otherwise),
// a tail that is not a multiple of 4, one sampling step's size.
TEST(DiffusionOps, NormalFillCudaDrawsTheCpuValues) {
  if (!have_gpu()) GTEST_SKIP() << no_gpu_reason();
  const uint64_t seed = unet::test::test_seed();
  unet::Engine& cpu = cpu_engine();
  unet::Engine* gpu = gpu_engine(unet::Precision::FP32);
  ASSERT_NE(gpu, nullptr);
  const int64_t step = 64LL * 64 * 64 * 3;  // 64 images at seed64's size
  for (uint64_t index0 : {uint64_t{0}, uint64_t{3}, uint64_t{5} * step})
    for (int64_t n : {int64_t{5}, step + 2}) {
      const Tensor c = cpu.alloc(DType::F32, {n}), g = gpu->alloc(DType::F32, {n});
      poison(cpu, c);
      poison(*gpu, g);
      cpu.ops().run(unet::NormalFill{c, seed, (uint64_t)unet::Stream::SampleStep, index0});
      gpu->ops().run(unet::NormalFill{g, seed, (uint64_t)unet::Stream::SampleStep, index0});
      const F want = to_host(cpu, c), got = to_host(*gpu, g);
      size_t differ = 0, far = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (got[i] == want[i]) continue;
        ++differ;
        far += !(std::fabs(got[i] - want[i]) <= std::fabs(want[i]) * 1.2e-7f);  // NaN counts as far
      }
      EXPECT_EQ(far, 0u) << "index0 " << index0 << " n " << n;
      EXPECT_LE(differ, 2u) << "index0 " << index0 << " n " << n;
    }
}

TEST(LossVariants, AllOps) {
  SKIP_WITHOUT_GPU();
  const Tol f32{1e-6, 1e-6, 1e-6};  // f32 in every precision; sums differ only in order
  for (int64_t n : {5, 3 * 64 * 64 * 32}) {
    const std::string w = std::to_string(n);
    check_variants<MseLoss>(
        "mse " + w,
        [n](const Alloc& A, DType) {
          return MseLoss{A(DType::F32, {n}), A(DType::F32, {n}), A(DType::F32, {1}), A(DType::F32, {n})};
        },
        f32);
    check_variants<Axpbypcz>(
        "axpbypcz " + w,
        [n](const Alloc& A, DType) {
          return Axpbypcz{A(DType::F32, {n}), A(DType::F32, {n}), A(DType::F32, {n}), 0.7f, -1.5f, 0.25f};
        },
        f32);  // the GPU contracts a*x + b*y into fused multiply-adds
    check_variants<Clamp>(
        "clamp " + w,
        [n](const Alloc& A, DType) {
          return Clamp{A(DType::F32, {n}), -0.5f, 0.75f};
        },
        Tol{0, 0, 0});
    check_variants<LearnedRangeNoise>(
        "learned range " + w,
        [n](const Alloc& A, DType) {
          return LearnedRangeNoise{A(DType::F32, {n}), A(DType::F32, {n}), A(DType::F32, {n}), -6.5f, -2.25f};
        },
        f32);
  }
  for (auto [B, K] : {std::pair{3, 4}, std::pair{32, 10}, std::pair{32, 1000}, std::pair{2, 300000}}) {
    const std::string w = std::to_string(B) + "x" + std::to_string(K);
    auto labels = [K = K](Engine& e, auto& op) {
      std::vector<float> y(op.labels.numel());
      for (size_t i = 0; i < y.size(); ++i) y[i] = (float)((i * 7919 + 3) % K);
      from_host(e, op.labels, y);
    };
    check_variants<CrossEntropy>(
        "cross_entropy " + w,
        [B = B, K = K](const Alloc& A, DType) {
          return CrossEntropy{A(DType::F32, {B, K}), A(DType::I32, {B}), A(DType::F32, {B, kClassTerms}),
                              A(DType::F32, {B, K}), 1.0f / B};
        },
        f32, [&](Engine& e, CrossEntropy& op) { labels(e, op); });
    check_variants<ClassifierStats>(
        "classifier_stats " + w,
        [B = B](const Alloc& A, DType) {
          return ClassifierStats{A(DType::F32, {B, kClassTerms}), A(DType::I32, {B}),
                                 A(DType::F32, {kClassStats})};
        },
        f32,
        [](Engine& e, ClassifierStats& op) {
          std::vector<float> q(op.quartile.numel());
          for (size_t i = 0; i < q.size(); ++i) q[i] = (float)(i % 4);
          from_host(e, op.quartile, q);
        });
  }
  check_variants<QSample>(
      "q_sample",
      [](const Alloc& A, DType) {
        return QSample{A(DType::F32, {32, 64, 64, 3}), A(DType::F32, {32, 64, 64, 3}), A(DType::F32, {64}),
                       A(DType::F32, {32, 64, 64, 3})};
      },
      f32);
}

}  // namespace

namespace {
// One sampler step two ways on engine e: the op sequence sampler.cpp runs (predict_x0's Copy,
// Axpbypcz and Clamp; NormalFill; LearnedRangeNoise with v; the update's Axpbypcz) and the op
// SampleStep reading the same numbers from coef. x0, z (the noise added) and x of each.
struct StepCase {
  bool xstart, clip, learned, noise;
  uint64_t index0;
};
struct StepOut {
  F x0, z, x;
};
std::pair<StepOut, StepOut> sample_step_both(unet::Engine& e, const StepCase& c, const F& x, const F& eps,
                                             const F& v, uint64_t key) {
  const int64_t n = (int64_t)x.size();
  auto put = [&](const F& h) {
    Tensor t = e.alloc(DType::F32, {n});
    e.upload(t, h.data());
    return t;
  };
  auto get = [&](const Tensor& t) {
    F h(t.numel());
    e.download(h.data(), t);
    return h;
  };
  auto nan = [&] {
    Tensor t = e.alloc(DType::F32, {n});
    poison(e, t);
    return t;
  };
  // made-up step numbers of the size a sampler's take (the op reads them, whatever they are)
  F coef(unet::kSampleStepCoefs, 0.f);
  coef[0] = 1.7f, coef[1] = -1.3f, coef[2] = 0.31f, coef[3] = 0.93f,
  coef[4] = c.noise ? (c.learned ? 1.f : 0.12f) : 0.f;
  coef[5] = -6.1f, coef[6] = -4.2f;
  unet::sample_step_put_u64(coef.data(), 7, key);
  unet::sample_step_put_u64(coef.data(), 9, c.index0);
  const auto stream = (uint64_t)unet::Stream::SampleStep;
  Tensor X = put(x), E = put(eps), V1 = put(v), X0 = nan(), Z = nan(), N = nan();
  auto& ops = e.ops();
  if (c.xstart) {
    ops.run(unet::Copy{E, X0});
  } else {
    ops.run(unet::Copy{X, X0});
    ops.run(unet::Axpbypcz{E, X0, {}, coef[1], coef[0], 0.f});
  }
  if (c.clip) ops.run(unet::Clamp{X0, -1.f, 1.f});
  ops.run(unet::NormalFill{Z, key, stream, c.index0});
  Tensor noise = Z;
  if (c.learned) ops.run(unet::LearnedRangeNoise{V1, Z, N, coef[5], coef[6]}), noise = N;
  ops.run(unet::Axpbypcz{X0, X, c.noise ? noise : Tensor{}, coef[2], coef[3], c.noise ? coef[4] : 0.f});
  const StepOut seq{get(X0), get(noise), get(X)};
  Tensor X2 = put(x), X02 = nan(), Z2 = nan(), C = e.alloc(DType::F32, {unet::kSampleStepCoefs});
  e.upload(C, coef.data());
  ops.run(unet::SampleStep{X2, E, c.learned ? V1 : Tensor{}, X02, Z2, C, stream, c.xstart, c.clip});
  return {seq, StepOut{get(X02), get(Z2), get(X2)}};
}
const StepCase kStepCases[] = {{false, true, false, true, 0},  {false, true, true, true, 6},
                               {true, false, false, true, 3},  {false, false, true, true, 1},
                               {false, true, false, false, 0}, {true, true, true, false, 5}};
}  // namespace

// SampleStep (one op for a sampler step, its numbers on the device) is the op sequence it
// replaces, bit for bit on the CPU: eps or x0 predictions, with and without clipping, fixed and
// learned-range noise, the last step's (none), even and odd noise offsets, a size that is not a
// multiple of 4.
TEST(DiffusionOps, SampleStepIsTheOpSequence) {
  const uint64_t key = unet::test::test_seed();
  const size_t n = 1003;
  const F x = tof(rnd(n, -2, 2)), eps = tof(rnd(n, -2, 2)), v = tof(rnd(n));
  for (const StepCase& c : kStepCases) {
    SCOPED_TRACE(::testing::Message() << "xstart " << c.xstart << " clip " << c.clip << " learned "
                                      << c.learned << " noise " << c.noise << " index0 " << c.index0);
    const auto [seq, one] = sample_step_both(cpu_engine(), c, x, eps, v, key);
    EXPECT_EQ(std::memcmp(one.x0.data(), seq.x0.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(one.z.data(), seq.z.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(one.x.data(), seq.x.data(), n * 4), 0);
    EXPECT_NE(one.x, x);  // (the step moved x)
  }
}

// The CUDA kernel: against the same sequence on the GPU (its kernels) and against the CPU, within
// NormalFill's tolerance (CUDA's and the host's libm can round a draw one float ulp apart) and
// expf's; both vector paths (even offsets: the draws in pairs), the scalar tail.
TEST(DiffusionOps, SampleStepCudaMatchesTheSequenceAndTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << no_gpu_reason();
  unet::Engine* gpu = gpu_engine(unet::Precision::FP32);
  ASSERT_NE(gpu, nullptr);
  const uint64_t key = unet::test::test_seed();
  const size_t n = 64 * 64 * 3 * 2 + 3;
  const F x = tof(rnd(n, -2, 2)), eps = tof(rnd(n, -2, 2)), v = tof(rnd(n));
  auto close = [](const F& a, const F& b) {
    size_t far = 0;
    for (size_t i = 0; i < a.size(); ++i) far += !(std::fabs(a[i] - b[i]) <= 4e-7f * (1 + std::fabs(b[i])));
    return far;
  };
  for (const StepCase& c : kStepCases) {
    SCOPED_TRACE(::testing::Message() << "xstart " << c.xstart << " clip " << c.clip << " learned "
                                      << c.learned << " noise " << c.noise << " index0 " << c.index0);
    const auto [seq, one] = sample_step_both(*gpu, c, x, eps, v, key);
    const auto [cpu_seq, cpu_one] = sample_step_both(cpu_engine(), c, x, eps, v, key);
    for (const auto& [got, want, what] :
         {std::tuple{one.x, seq.x, "x"}, std::tuple{one.x0, seq.x0, "x0"}, std::tuple{one.z, seq.z, "z"},
          std::tuple{one.x, cpu_one.x, "x vs cpu"}, std::tuple{one.z, cpu_one.z, "z vs cpu"}})
      EXPECT_EQ(close(got, want), 0u) << what;
  }
}
