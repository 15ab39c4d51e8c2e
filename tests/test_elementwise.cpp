// elementwise family: silu, add, cast, copy, fill — lib/ops/elementwise.h (reference; also the
// broadcast add and scale-shift the fused ops are built from), lib/ops/elementwise.cpp (CPU),
// kernels/elementwise/ (CUDA).
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Elementwise, SiluAddCopyFill) {
  const size_t n = 333;
  const int64_t N = (int64_t)n;
  V x = rnd(n, -4, 4), dy = rnd(n), y = nans(n), dx = nans(n);
  ref::silu_fwd<double>(x.data(), y.data(), n);
  V expect(n);
  for (size_t i = 0; i < n; ++i) expect[i] = x[i] / (1 + std::exp(-x[i]));
  EXPECT_LT(rel(y, expect), 1e-15);
  ref::silu_bwd<double>(x.data(), dy.data(), dx.data(), n);
  gradcheck("silu dx", x, dx, [&] {
    ref::silu_fwd<double>(x.data(), y.data(), n);
    return dot(y, dy);
  });
  Dev d;
  Tensor X = d.put(x), Y = d.poisoned({N}), DX = d.poisoned({N});
  d.run(SiluFwd{X, Y});
  ref::silu_fwd<double>(x.data(), y.data(), n);
  EXPECT_LT(rel(d.get(Y), y), 1e-6);
  d.run(SiluBwd{X, d.put(dy), DX});
  EXPECT_LT(rel(d.get(DX), dx), 1e-6);

  V a = rnd(n), b = rnd(n);
  F fa = tof(a), fb = tof(b);
  Tensor A = d.put(a), Bt = d.put(b), S = d.poisoned({N});
  d.run(Add{A, Bt, S});
  F s = d.get(S);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(s[i], fa[i] + fb[i]);
  d.run(Add{A, Bt, A});  // y aliasing a
  EXPECT_EQ(d.get(A), s);
  Tensor C = d.poisoned({N});
  d.run(Copy{Bt, C});
  EXPECT_EQ(d.get(C), fb);
  d.run(Fill{C, 2.5f});
  for (float v : d.get(C)) ASSERT_EQ(v, 2.5f);
}

// Cast rounds to nearest even exactly as CUDA's __float2bfloat16_rn (ties, NaN, infinities) and
// widens exactly.
TEST(Elementwise, CastBf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16_bits_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1). 1 + 3*2^-8 ties up to 1 + 2^-6.
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256), 1.0f + 1.0f / 64);
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256 + 1.0f / 65536), 1.0f + 1.0f / 128);
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
  EXPECT_EQ(round_bf16(INFINITY), INFINITY);
  EXPECT_EQ(round_bf16(-3.4e38f), -INFINITY);  // beyond bf16's largest finite value
  Dev d;
  auto e = make_cpu_engine(Precision::BF16);
  V x = rnd(1000, -100, 100);
  Tensor X = d.put(x);
  Tensor H = e->alloc(DType::BF16, {1000}), Y = d.poisoned({1000});
  d.run(Cast{X, H});  // f32 -> bf16 through the f32 engine: the emulation is per tensor dtype
  d.run(Cast{H, Y});
  F y = d.get(Y), fx = tof(x);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], round_bf16(fx[i])) << i;
}

TEST(Elementwise, BroadcastAddAndScaleShiftReferences) {
  const int B = 3, HW = 7, C = 5;
  V h = rnd((size_t)B * HW * C), e = rnd((size_t)B * C), dh = rnd(h.size());
  V y = h;
  ref::add_bcast_fwd<double>(y.data(), e.data(), B, HW, C);
  for (int b = 0; b < B; ++b)
    for (int hw = 0; hw < HW; ++hw)
      for (int c = 0; c < C; ++c) {
        const size_t i = ((size_t)b * HW + hw) * C + c;
        ASSERT_EQ(y[i], h[i] + e[b * C + c]);
      }
  V de = nans(e.size());
  ref::add_bcast_bwd<double>(dh.data(), de.data(), B, HW, C);
  gradcheck("de", e, de, [&] {
    y = h;
    ref::add_bcast_fwd<double>(y.data(), e.data(), B, HW, C);
    return dot(y, dh);
  });
  const size_t n = (size_t)B * HW * C;
  V x = rnd(n), ss = rnd((size_t)B * 2 * C), dy = rnd(n), z = nans(n);
  ref::scale_shift_fwd<double>(x.data(), ss.data(), z.data(), B, HW, C);
  for (int b = 0; b < B; ++b)
    for (int hw = 0; hw < HW; ++hw)
      for (int c = 0; c < C; ++c) {
        const size_t i = ((size_t)b * HW + hw) * C + c;
        ASSERT_NEAR(z[i], x[i] * (1 + ss[b * 2 * C + c]) + ss[b * 2 * C + C + c], 1e-15);
      }
  V dx = nans(n), dss = nans(ss.size());
  ref::scale_shift_bwd<double>(x.data(), ss.data(), dy.data(), dx.data(), dss.data(), B, HW, C);
  auto loss = [&] {
    ref::scale_shift_fwd<double>(x.data(), ss.data(), z.data(), B, HW, C);
    return dot(z, dy);
  };
  gradcheck("dx", x, dx, loss);
  gradcheck("dss", ss, dss, loss);
}

// ---- CUDA variants ----

TEST(ElementwiseVariants, AllOps) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 333, 1 << 20}) {
    const std::string w = std::to_string(n);
    check_variants<SiluFwd>(
        "silu fwd " + w,
        [n](const Alloc& A, DType act) {
          return SiluFwd{A(act, {n}), A(act, {n})};
        },
        Tol{});
    // The embedding MLP's SiLU stays f32 in every precision.
    check_variants<SiluFwd>(
        "silu f32 " + w,
        [n](const Alloc& A, DType) {
          return SiluFwd{A(DType::F32, {n}), A(DType::F32, {n})};
        },
        Tol{});
    check_variants<SiluBwd>(
        "silu bwd " + w,
        [n](const Alloc& A, DType) {
          return SiluBwd{A(DType::F32, {n}), A(DType::F32, {n}), A(DType::F32, {n})};
        },
        Tol{});
    // Adds and casts store one rounding of exact inputs: bitwise equal to the CPU.
    check_variants<Add>(
        "add " + w,
        [n](const Alloc& A, DType act) {
          return Add{A(act, {n}), A(act, {n}), A(act, {n})};
        },
        Tol{0, 0, 0});
    check_variants<Cast>(
        "cast to act " + w,
        [n](const Alloc& A, DType act) {
          return Cast{A(DType::F32, {n}), A(act, {n})};
        },
        Tol{0, 0, 0});
    check_variants<Cast>(
        "cast from act " + w,
        [n](const Alloc& A, DType act) {
          return Cast{A(act, {n}), A(DType::F32, {n})};
        },
        Tol{0, 0, 0});
    check_variants<Copy>(
        "copy " + w,
        [n](const Alloc& A, DType act) {
          return Copy{A(act, {n}), A(act, {n})};
        },
        Tol{0, 0, 0});
    check_variants<Fill>(
        "fill " + w,
        [n](const Alloc& A, DType act) {
          return Fill{A(act, {n}), -1.25f};
        },
        Tol{0, 0, 0});
  }
}

}  // namespace
