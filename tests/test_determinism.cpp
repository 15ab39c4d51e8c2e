// The CPU engine's results are bitwise independent of the OpenMP thread count for every op with a
// reduction (bit-exact resume and the CPU/GPU comparisons rely on it).
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Determinism, BitwiseIndependentOfThreadCount) {
  const int B = 3, H = 12, W = 10, Ci = 32, Co = 48, G = 8, T = 40, C = 32, heads = 2;
  V x = rnd((size_t)B * H * W * Ci), w = rnd((size_t)Co * 9 * Ci), bias = rnd(Co),
    dy = rnd((size_t)B * H * W * Co);
  V gamma = rnd(Ci), beta = rnd(Ci), wl = rnd((size_t)Co * Ci), qkv = rnd((size_t)B * T * 3 * C);
  V dout = rnd((size_t)B * T * C), big = rnd(300000), big2 = rnd(300000), ss = rnd((size_t)B * 2 * Ci),
    emb = rnd((size_t)B * Co);
  const int H2 = (H - 1) / 2 + 1, W2 = (W - 1) / 2 + 1;
  V dy2 = rnd((size_t)B * H2 * W2 * Co),
    dyg = rnd((size_t)B * H * W * Ci);  // inputs drawn once, outside run()
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Dev d;
    std::vector<F> r;
    Tensor X = d.put(x, {B, H, W, Ci}), Wt = d.put(w, {Co, 3, 3, Ci}), DY = d.put(dy, {B, H, W, Co});
    for (int s : {1, 2}) {
      const int Ho = (H - 1) / s + 1, Wo = (W - 1) / s + 1;
      Tensor Y = d.poisoned({B, Ho, Wo, Co}), DX = d.poisoned({B, H, W, Ci}), DW = d.poisoned({Co, 3, 3, Ci});
      Tensor DB = d.poisoned({Co}), DE = d.poisoned({B, Co});
      Tensor DYs = s == 1 ? DY : d.put(dy2, {B, Ho, Wo, Co});
      d.run(ConvFwd{X, Wt, d.put(bias), d.put(emb, {B, Co}), {}, Y, s});
      d.run(ConvBwdData{DYs, Wt, DX, s});
      d.run(ConvBwdFilter{X, DYs, DW, DB, DE, s});
      for (const Tensor& t : {Y, DX, DW, DB, DE}) r.push_back(d.get(t));
    }
    Tensor Y = d.poisoned({B, H, W, Ci}), M = d.poisoned({B, G}), R = d.poisoned({B, G}),
           DX = d.poisoned({B, H, W, Ci});
    Tensor DG = d.poisoned({Ci}), DBt = d.poisoned({Ci}), DSS = d.poisoned({B, 2 * Ci}),
           SS = d.put(ss, {B, 2 * Ci});
    Tensor Ga = d.put(gamma), Be = d.put(beta), DYg = d.put(dyg, {B, H, W, Ci});
    d.run(GroupNormFwd{X, Ga, Be, SS, Y, M, R, true});
    d.run(GroupNormBwd{X, Ga, Be, SS, M, R, DYg, DX, DG, DBt, DSS, true, {}, {}, {}, {}});
    for (const Tensor& t : {Y, M, R, DX, DG, DBt, DSS}) r.push_back(d.get(t));
    const int N = B * H * W;  // linear over every pixel
    Tensor LX = d.put(x, {N, Ci}), LY = d.poisoned({N, Co}), LDX = d.poisoned({N, Ci}),
           LDW = d.poisoned({Co, Ci});
    Tensor LDB = d.poisoned({Co}), WL = d.put(wl, {Co, Ci});
    d.run(LinearFwd{LX, WL, d.put(bias), LY});
    d.run(LinearBwd{LX, WL, d.put(dy, {N, Co}), LDX, LDW, LDB});
    for (const Tensor& t : {LY, LDX, LDW, LDB}) r.push_back(d.get(t));
    Tensor Q = d.put(qkv, {B, T, 1, 3 * C}), O = d.poisoned({B, T, 1, C}), L = d.poisoned({B, heads, T});
    Tensor DQ = d.poisoned({B, T, 1, 3 * C});
    d.run(AttentionFwd{Q, O, L, false});
    d.run(AttentionBwd{Q, O, L, d.put(dout, {B, T, 1, C}), DQ, false});
    for (const Tensor& t : {O, L, DQ}) r.push_back(d.get(t));
    Tensor S = d.poisoned({1}), Ls = d.poisoned({1}), DP = d.poisoned({(int64_t)big.size()}),
           BIG = d.put(big);
    d.run(SumSquares{BIG, S});
    d.run(MseLoss{BIG, d.put(big2), Ls, DP});
    for (const Tensor& t : {S, Ls, DP}) r.push_back(d.get(t));
    return r;
  };
  const int saved = omp_get_max_threads();
  const auto r1 = run(1), r2 = run(2), r3 = run(3);
  omp_set_num_threads(saved);
  ASSERT_EQ(r1.size(), r2.size());
  for (size_t i = 0; i < r1.size(); ++i) {
    ASSERT_EQ(r1[i].size(), r2[i].size());
    size_t first = 0;
    while (first < r1[i].size() && std::memcmp(&r1[i][first], &r2[i][first], 4) == 0) ++first;
    EXPECT_EQ(0, std::memcmp(r1[i].data(), r2[i].data(), r1[i].size() * 4))
        << "result " << i << " (1 vs 2 threads), first difference at " << first << ": "
        << (first < r1[i].size() ? r1[i][first] : 0) << " vs " << (first < r2[i].size() ? r2[i][first] : 0);
    EXPECT_EQ(0, std::memcmp(r1[i].data(), r3[i].data(), r1[i].size() * 4))
        << "result " << i << " (1 vs 3 threads)";
  }
}

}  // namespace
