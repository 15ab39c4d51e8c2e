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

}  // namespace
