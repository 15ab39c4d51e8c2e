// loss and diffusion families: the MSE and its gradient (lib/ops/loss.h), q_sample and the
// samplers' arithmetic (lib/ops/diffusion_ops.h); CPU in lib/ops/*.cpp, CUDA in kernels/loss/
// and kernels/diffusion/.
#include "ops_common.h"

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
  check_variants<QSample>(
      "q_sample",
      [](const Alloc& A, DType) {
        return QSample{A(DType::F32, {32, 64, 64, 3}), A(DType::F32, {32, 64, 64, 3}), A(DType::F32, {64}),
                       A(DType::F32, {32, 64, 64, 3})};
      },
      f32);
}

}  // namespace
