// concat family: channel concat (a first) and its split — lib/ops/concat.h, lib/ops/concat.cpp,
// kernels/concat/ (CUDA).
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Concat, ChannelsAFirstAndBackward) {
  const int B = 2, HW = 5, Ca = 3, Cb = 4, C = Ca + Cb;
  V a = rnd((size_t)B * HW * Ca), b = rnd((size_t)B * HW * Cb), y = nans((size_t)B * HW * C);
  ref::concat_fwd<double>(a.data(), b.data(), y.data(), B, HW, Ca, Cb);
  for (int r = 0; r < B * HW; ++r)
    for (int c = 0; c < C; ++c) ASSERT_EQ(y[r * C + c], c < Ca ? a[r * Ca + c] : b[r * Cb + c - Ca]);
  V dy = rnd(y.size()), da = nans(a.size()), db = nans(b.size());
  ref::concat_bwd<double>(dy.data(), da.data(), db.data(), B, HW, Ca, Cb);
  auto loss = [&] {
    ref::concat_fwd<double>(a.data(), b.data(), y.data(), B, HW, Ca, Cb);
    return dot(y, dy);
  };
  gradcheck("da", a, da, loss);
  gradcheck("db", b, db, loss);
  Dev d;
  Tensor Y = d.poisoned({B, HW, 1, C}), DA = d.poisoned({B, HW, 1, Ca}), DB = d.poisoned({B, HW, 1, Cb});
  Tensor DY = d.put(dy, {B, HW, 1, C});
  d.run(ConcatFwd{d.put(a, {B, HW, 1, Ca}), d.put(b, {B, HW, 1, Cb}), Y});
  ref::concat_fwd<double>(a.data(), b.data(), y.data(), B, HW, Ca, Cb);  // y after gradcheck is stale
  EXPECT_EQ(d.get(Y), tof(y));                                           // pure copies: exact
  d.run(ConcatBwd{DY, DA, {}});
  EXPECT_EQ(d.get(DA), tof(da));
  d.run(ConcatBwd{DY, {}, DB});
  EXPECT_EQ(d.get(DB), tof(db));
}

TEST(ConcatVariants, SmallAndSeed64Shapes) {
  SKIP_WITHOUT_GPU();
  for (auto [B, H, Ca, Cb] : {std::tuple{2, 3, 3, 5}, std::tuple{2, 4, 8, 4}, std::tuple{32, 64, 64, 64},
                              std::tuple{32, 8, 256, 192}}) {
    const std::string w =
        std::to_string(B) + "x" + std::to_string(H) + " " + std::to_string(Ca) + "+" + std::to_string(Cb);
    check_variants<ConcatFwd>(
        "concat " + w,
        [&, B = B, H = H, Ca = Ca, Cb = Cb](const Alloc& A, DType act) {
          return ConcatFwd{A(act, {B, H, H, Ca}), A(act, {B, H, H, Cb}), A(act, {B, H, H, Ca + Cb})};
        },
        Tol{0, 0, 0});
    check_variants<ConcatBwd>(
        "split " + w,
        [&, B = B, H = H, Ca = Ca, Cb = Cb](const Alloc& A, DType act) {
          return ConcatBwd{A(act, {B, H, H, Ca + Cb}), A(act, {B, H, H, Ca}), A(act, {B, H, H, Cb})};
        },
        Tol{0, 0, 0});
    check_variants<ConcatBwd>(
        "split one side " + w,
        [&, B = B, H = H, Ca = Ca, Cb = Cb](const Alloc& A, DType act) {
          return ConcatBwd{A(act, {B, H, H, Ca + Cb}), {}, A(act, {B, H, H, Cb})};
        },
        Tol{0, 0, 0});
  }
}

// ConcatFwd's optional GroupNorm statistics of y (mean, rstd [B, G]; the decoder's skip
// concatenations give their norm's with UNET_CONV_STATS): on the CPU against GroupNormFwd's of the
// same y (with an offset the statistics must keep), y still the exact concatenation.
TEST(Concat, GroupNormStatisticsOfTheOutput) {
  const int B = 3, H = 4, Ca = 6, Cb = 10, C = Ca + Cb, G = 4;  // groups straddle a | b
  V a = rnd((size_t)B * H * H * Ca), b = rnd((size_t)B * H * H * Cb), y((size_t)B * H * H * C);
  for (double& v : b) v = 2.0 * v + 5.0;
  ref::concat_fwd<double>(a.data(), b.data(), y.data(), B, H * H, Ca, Cb);
  Dev d;
  ConcatFwd o{d.put(a, {B, H, H, Ca}), d.put(b, {B, H, H, Cb}), d.poisoned({B, H, H, C})};
  o.mean = d.poisoned({B, G}), o.rstd = d.poisoned({B, G});
  d.run(o);
  EXPECT_EQ(d.get(o.y), tof(y));
  V mean(B * G), rstd(B * G);
  ref::groupnorm_stats<double>(y.data(), mean.data(), rstd.data(), B, H * H, C, G);
  EXPECT_LT(rel(d.get(o.mean), mean), 1e-6);
  EXPECT_LT(rel(d.get(o.rstd), rstd), 1e-6);
}

// The same on the GPU: every variant ("rows" in its copying pass, "cuda" by a statistics pass
// after) against the CPU engine, with 16-byte vectors and without, at the decoder's shapes.
TEST(ConcatVariants, GroupNormStatisticsOfTheOutput) {
  SKIP_WITHOUT_GPU();
  for (auto [B, H, Ca, Cb, G] : {std::tuple{2, 3, 6, 10, 4}, std::tuple{2, 5, 8, 16, 8}, std::tuple{32, 64, 128, 64, 32},
                                 std::tuple{32, 16, 384, 192, 32}, std::tuple{3, 8, 256, 256, 32}}) {
    const std::string w = std::to_string(B) + "x" + std::to_string(H) + " " + std::to_string(Ca) + "+" +
                          std::to_string(Cb) + " G" + std::to_string(G);
    check_variants<ConcatFwd>(
        "concat stats " + w,
        [&, B = B, H = H, Ca = Ca, Cb = Cb, G = G](const Alloc& A, DType act) {
          ConcatFwd o{A(act, {B, H, H, Ca}), A(act, {B, H, H, Cb}), A(act, {B, H, H, Ca + Cb})};
          o.mean = A(DType::F32, {B, G}), o.rstd = A(DType::F32, {B, G});
          return o;
        },
        Tol{});
  }
}

}  // namespace
