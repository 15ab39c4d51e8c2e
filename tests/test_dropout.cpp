// dropout family: a counter-based mask (lib/rng.h), no storage — lib/ops/dropout.h,
// lib/ops/dropout.cpp (CPU), kernels/dropout/ (CUDA).
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Dropout, HashMaskScaleAndBackward) {
  const size_t n = 200000;
  const int64_t N = (int64_t)n;
  const float p = 0.3f;
  const uint64_t seed = next_seed();
  Dev d;
  V x = rnd(n, 0.5, 1.5);  // nonzero, so a zero output means "dropped"
  F fx = tof(x);
  Tensor X = d.put(x), Y = d.poisoned({N}), DX = d.poisoned({N});
  d.run(DropoutFwd{X, Y, p, seed});
  F y = d.get(Y);
  const float s = 1.0f / (1.0f - p);
  size_t dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool keep = unet::dropout_uniform(seed, i) >= p;
    ASSERT_EQ(y[i], keep ? fx[i] * s : 0.0f) << i;
    dropped += !keep;
  }
  EXPECT_NEAR((double)dropped / n, p, 0.01);
  d.run(DropoutBwd{X, DX, p, seed});  // dy = x: same mask, same scale
  EXPECT_EQ(d.get(DX), y);
  d.run(DropoutFwd{X, Y, 0.0f, seed});  // p = 0 is the identity
  EXPECT_EQ(d.get(Y), fx);
  d.run(DropoutFwd{X, Y, 0.3f, seed + 1});  // another seed, another mask
  EXPECT_NE(d.get(Y), y);

  const size_t m = 300;  // gradient check in double
  V xs = rnd(m), dy = rnd(m), ys(m), dxs = nans(m);
  ref::dropout_bwd<double>(dy.data(), dxs.data(), m, 0.4f, seed);
  gradcheck("dropout dx", xs, dxs, [&] {
    ref::dropout_fwd<double>(xs.data(), ys.data(), m, 0.4f, seed);
    return dot(ys, dy);
  });
}

TEST(DropoutVariants, SameMaskAsTheCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {5, 1001, 1 << 20}) {
    const uint64_t seed = next_seed();
    check_variants<DropoutFwd>(
        "fwd " + std::to_string(n),
        [n, seed](const Alloc& A, DType act) {
          return DropoutFwd{A(act, {n}), A(act, {n}), 0.1f, seed};
        },
        Tol{0, 0, 0});
    check_variants<DropoutBwd>(
        "bwd " + std::to_string(n),
        [n, seed](const Alloc& A, DType act) {
          return DropoutBwd{A(act, {n}), A(act, {n}), 0.3f, seed};
        },
        Tol{0, 0, 0});
  }
}

}  // namespace
