// pool family: the classifier head's attention-pooling tokens (PoolTokensFwd/Bwd) and pooled-token
// selection (PoolSelectFwd/Bwd) — lib/ops/pool.h, lib/ops/pool.cpp (CPU), kernels/pool/ (CUDA).
// Against AttentionPool2d's formulas written out naively (NCHW, positional_embedding [C, T]),
// central finite differences in double, the float engine, and every CUDA variant.
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Pool, TokensMatchAttentionPool2dAndGradients) {
  const int B = 3, C = 5, H = 3, W = 4, P = H * W, T = P + 1;
  // torch: x [B,C,H,W] -> cat([x.mean(-1), x], -1) + pos[None] : [B, C, T]
  V xt = rnd((size_t)B * C * P), pos = rnd((size_t)C * T), yt((size_t)B * C * T);
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) {
      double m = 0;
      for (int p = 0; p < P; ++p) m += xt[((size_t)b * C + c) * P + p];
      yt[((size_t)b * C + c) * T] = m / P + pos[(size_t)c * T];
      for (int p = 0; p < P; ++p)
        yt[((size_t)b * C + c) * T + 1 + p] = xt[((size_t)b * C + c) * P + p] + pos[(size_t)c * T + 1 + p];
    }
  V x = nchw_to_nhwc(xt, B, C, H, W), expect = nchw_to_nhwc(yt, B, C, 1, T), y = nans(expect.size());
  ref::pool_tokens_fwd<double>(x.data(), pos.data(), y.data(), B, P, C);
  EXPECT_LT(rel(y, expect), 1e-15);
  V dy = rnd(y.size()), dx = nans(x.size()), dpos = nans(pos.size());
  ref::pool_tokens_bwd<double>(dy.data(), dx.data(), dpos.data(), B, P, C);
  auto loss = [&] {
    ref::pool_tokens_fwd<double>(x.data(), pos.data(), y.data(), B, P, C);
    return dot(y, dy);
  };
  gradcheck("dx", x, dx, loss);
  gradcheck("dpos", pos, dpos, loss);
  Dev d;
  Tensor Y = d.poisoned({B, 1, T, C}), DX = d.poisoned({B, H, W, C}), DP = d.poisoned({C, T});
  d.run(PoolTokensFwd{d.put(x, {B, H, W, C}), d.put(pos, {C, T}), Y});
  EXPECT_LT(rel(d.get(Y), expect), 1e-6);
  d.run(PoolTokensBwd{d.put(dy, {B, 1, T, C}), DX, DP});
  EXPECT_LT(rel(d.get(DX), dx), 1e-6);
  EXPECT_LT(rel(d.get(DP), dpos), 1e-6);
  d.run(PoolTokensBwd{d.put(dy, {B, 1, T, C}), DX, {}});  // dpos optional
  EXPECT_LT(rel(d.get(DX), dx), 1e-6);
}

TEST(Pool, SelectFirstToken) {
  const int B = 2, T = 5, C = 3;
  V x = rnd((size_t)B * T * C), y = nans((size_t)B * C);
  ref::pool_select_fwd<double>(x.data(), y.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) EXPECT_EQ(y[(size_t)b * C + c], x[(size_t)b * T * C + c]);
  V dy = rnd(y.size()), dx = nans(x.size());
  ref::pool_select_bwd<double>(dy.data(), dx.data(), B, T, C);
  gradcheck("dx", x, dx, [&] {
    ref::pool_select_fwd<double>(x.data(), y.data(), B, T, C);
    return dot(y, dy);
  });
  Dev d;
  Tensor Y = d.poisoned({B, C}), DX = d.poisoned({B, 1, T, C});
  d.run(PoolSelectFwd{d.put(x, {B, 1, T, C}), Y});
  EXPECT_EQ(d.get(Y), tof(y));
  d.run(PoolSelectBwd{d.put(dy, {B, C}), DX});
  EXPECT_EQ(d.get(DX), tof(dx));
}

TEST(PoolVariants, SmallAndReleasedShapes) {
  SKIP_WITHOUT_GPU();
  // (B, R, C): small odd sizes, the tiny32 classifier's head, the released 64x64 classifier's head
  // (8x8 map, 512 channels) at batch 32.
  for (auto [B, R, C] : {std::tuple{2, 3, 5}, std::tuple{4, 8, 64}, std::tuple{32, 8, 512}}) {
    const int T = R * R + 1;
    const std::string w = std::to_string(B) + "x" + std::to_string(R) + "x" + std::to_string(C);
    // Sums in the same order as the CPU (one thread per channel): fp32 bitwise up to the division.
    check_variants<PoolTokensFwd>(
        "tokens " + w,
        [&, B = B, R = R, C = C, T = T](const Alloc& A, DType act) {
          return PoolTokensFwd{A(act, {B, R, R, C}), A(DType::F32, {C, T}), A(act, {B, 1, T, C})};
        },
        Tol{1e-6, 1e-6, 1e-2});
    check_variants<PoolTokensBwd>(
        "tokens bwd " + w,
        [&, B = B, R = R, C = C, T = T](const Alloc& A, DType act) {
          return PoolTokensBwd{A(act, {B, 1, T, C}), A(act, {B, R, R, C}), A(DType::F32, {C, T})};
        },
        Tol{1e-6, 1e-6, 1e-2});
    check_variants<PoolSelectFwd>(
        "select " + w,
        [&, B = B, C = C, T = T](const Alloc& A, DType act) {
          return PoolSelectFwd{A(act, {B, 1, T, C}), A(DType::F32, {B, C})};
        },
        Tol{0, 0, 0});
    check_variants<PoolSelectBwd>(
        "select bwd " + w,
        [&, B = B, C = C, T = T](const Alloc& A, DType act) {
          return PoolSelectBwd{A(DType::F32, {B, C}), A(act, {B, 1, T, C})};
        },
        Tol{0, 0, 0});
  }
}

}  // namespace
