// resample family: nearest 2x upsampling and 2x2 average pooling — lib/ops/resample.h,
// lib/ops/resample.cpp (CPU), kernels/resample/ (CUDA).
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Resample, Upsample2xNearest) {
  const int B = 2, H = 3, W = 5, C = 4;
  V xt = rnd((size_t)B * C * H * W);
  V yt((size_t)B * C * 4 * H * W);  // torch: y[b,c,i,j] = x[b,c,i/2,j/2]
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < 2 * H; ++i)
        for (int j = 0; j < 2 * W; ++j)
          yt[(((size_t)b * C + c) * 2 * H + i) * 2 * W + j] =
              xt[(((size_t)b * C + c) * H + i / 2) * W + j / 2];
  V x = nchw_to_nhwc(xt, B, C, H, W), expect = nchw_to_nhwc(yt, B, C, 2 * H, 2 * W), y = nans(expect.size());
  ref::upsample2x_fwd<double>(x.data(), y.data(), B, H, W, C);
  EXPECT_EQ(y, expect);
  V dy = rnd(y.size()), dx = nans(x.size());
  ref::upsample2x_bwd<double>(dy.data(), dx.data(), B, H, W, C);
  gradcheck("dx", x, dx, [&] {
    ref::upsample2x_fwd<double>(x.data(), y.data(), B, H, W, C);
    return dot(y, dy);
  });
  Dev d;
  Tensor Y = d.poisoned({B, 2 * H, 2 * W, C}), DX = d.poisoned({B, H, W, C});
  d.run(UpsampleFwd{d.put(x, {B, H, W, C}), Y});
  EXPECT_EQ(d.get(Y), tof(expect));
  d.run(UpsampleBwd{d.put(dy, {B, 2 * H, 2 * W, C}), DX});
  EXPECT_LT(rel(d.get(DX), dx), 1e-6);
}

TEST(Resample, AvgPool2x2) {
  const int B = 2, C = 3, H = 4, W = 6, Ho = H / 2, Wo = W / 2;
  V xt = rnd((size_t)B * C * H * W), yt((size_t)B * C * Ho * Wo);
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < Ho; ++i)
        for (int j = 0; j < Wo; ++j) {
          double s = 0;
          for (int di = 0; di < 2; ++di)
            for (int dj = 0; dj < 2; ++dj) s += xt[(((size_t)b * C + c) * H + 2 * i + di) * W + 2 * j + dj];
          yt[(((size_t)b * C + c) * Ho + i) * Wo + j] = s / 4;
        }
  V x = nchw_to_nhwc(xt, B, C, H, W), expect = nchw_to_nhwc(yt, B, C, Ho, Wo), y = nans(expect.size());
  ref::avgpool2x2_fwd<double>(x.data(), y.data(), B, H, W, C);
  EXPECT_LT(rel(y, expect), 1e-15);
  V dy = rnd(y.size()), dx = nans(x.size());
  ref::avgpool2x2_bwd<double>(dy.data(), dx.data(), B, H, W, C);
  gradcheck("dx", x, dx, [&] {
    ref::avgpool2x2_fwd<double>(x.data(), y.data(), B, H, W, C);
    return dot(y, dy);
  });
  Dev d;
  Tensor Y = d.poisoned({B, Ho, Wo, C}), DX = d.poisoned({B, H, W, C});
  d.run(AvgPoolFwd{d.put(x, {B, H, W, C}), Y});
  EXPECT_LT(rel(d.get(Y), expect), 1e-6);
  d.run(AvgPoolBwd{d.put(dy, {B, Ho, Wo, C}), DX});
  EXPECT_LT(rel(d.get(DX), dx), 3e-7);
}

TEST(ResampleVariants, SmallAndSeed64Shapes) {
  SKIP_WITHOUT_GPU();
  // (B, H, W, C) of the small tensor; rectangular and odd ones for the 2x2 block kernel's indexing
  for (auto [B, H, W, C] : {std::tuple{2, 3, 3, 5}, std::tuple{2, 4, 4, 8}, std::tuple{32, 8, 8, 256},
                            std::tuple{32, 32, 32, 128}, std::tuple{32, 16, 16, 192}, std::tuple{3, 5, 7, 16},
                            std::tuple{2, 6, 1, 24}}) {
    const std::string w = std::to_string(B) + "x" + std::to_string(H) + "x" + std::to_string(W) + "x" +
                          std::to_string(C);
    // Pure data movement / sums of 4 in a fixed order: bitwise equal, except bf16 where the CPU
    // emulation rounds the same f32 sum (also exact).
    check_variants<UpsampleFwd>(
        "up " + w,
        [&, B = B, H = H, W = W, C = C](const Alloc& A, DType act) {
          return UpsampleFwd{A(act, {B, H, W, C}), A(act, {B, 2 * H, 2 * W, C})};
        },
        Tol{0, 0, 0});
    check_variants<UpsampleBwd>(
        "up bwd " + w,
        [&, B = B, H = H, W = W, C = C](const Alloc& A, DType act) {
          return UpsampleBwd{A(act, {B, 2 * H, 2 * W, C}), A(act, {B, H, W, C})};
        },
        Tol{1e-7, 1e-7, 5e-3});
    check_variants<AvgPoolFwd>(
        "pool " + w,
        [&, B = B, H = H, W = W, C = C](const Alloc& A, DType act) {
          return AvgPoolFwd{A(act, {B, 2 * H, 2 * W, C}), A(act, {B, H, W, C})};
        },
        Tol{1e-7, 1e-7, 5e-3});
    check_variants<AvgPoolBwd>(
        "pool bwd " + w,
        [&, B = B, H = H, W = W, C = C](const Alloc& A, DType act) {
          return AvgPoolBwd{A(act, {B, H, W, C}), A(act, {B, 2 * H, 2 * W, C})};
        },
        Tol{0, 0, 0});
  }
}

}  // namespace
