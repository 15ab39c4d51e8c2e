// groupnorm family: lib/ops/groupnorm.h (reference), lib/ops/groupnorm.cpp (CPU),
// kernels/groupnorm/ (CUDA), lib/ops/groupnorm_fast.cpp (the fast CPU variants). GroupNorm with
// optional scale-shift, SiLU and input offset (xbias/xemb), forward and backward; every CUDA variant vs the CPU engine, every
// fast CPU variant vs the CPU reference (odd shapes and every tiny32 shape, thread-count independent).
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

struct GnCase {
  int B, HW, C, G;
  bool silu;
};
class GroupNorm : public ::testing::TestWithParam<GnCase> {};

TEST_P(GroupNorm, ForwardMatchesTwoPassFormula) {
  const GnCase c = GetParam();
  const int cg = c.C / c.G;
  // Inputs with a large common offset: a one-pass E[x^2]-E[x]^2 in float would lose it.
  V x = rnd((size_t)c.B * c.HW * c.C, 2.0, 5.0), gamma = rnd(c.C), beta = rnd(c.C);
  V expect(x.size()), emean(c.B * c.G), erstd(c.B * c.G);
  for (int b = 0; b < c.B; ++b)
    for (int g = 0; g < c.G; ++g) {
      double m = 0, v = 0;
      for (int hw = 0; hw < c.HW; ++hw)
        for (int ch = g * cg; ch < (g + 1) * cg; ++ch) m += x[((size_t)b * c.HW + hw) * c.C + ch];
      m /= (double)c.HW * cg;
      for (int hw = 0; hw < c.HW; ++hw)
        for (int ch = g * cg; ch < (g + 1) * cg; ++ch)
          v += std::pow(x[((size_t)b * c.HW + hw) * c.C + ch] - m, 2);
      v /= (double)c.HW * cg;
      emean[b * c.G + g] = m;
      erstd[b * c.G + g] = 1 / std::sqrt(v + 1e-5);
      for (int hw = 0; hw < c.HW; ++hw)
        for (int ch = g * cg; ch < (g + 1) * cg; ++ch) {
          const size_t i = ((size_t)b * c.HW + hw) * c.C + ch;
          const double z = (x[i] - m) / std::sqrt(v + 1e-5) * gamma[ch] + beta[ch];
          expect[i] = c.silu ? z / (1 + std::exp(-z)) : z;
        }
    }
  V y = nans(x.size()), mean = nans(c.B * c.G), rstd = nans(c.B * c.G);
  ref::groupnorm_fwd<double>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), c.B,
                             c.HW, c.C, c.G, c.silu);
  EXPECT_LT(rel(y, expect), 1e-12);
  EXPECT_LT(rel(mean, emean), 1e-14);
  EXPECT_LT(rel(rstd, erstd), 1e-14);
  Dev d;
  Tensor Y = d.poisoned({c.B, c.HW, 1, c.C}), M = d.poisoned({c.B, c.G}), R = d.poisoned({c.B, c.G});
  d.run(GroupNormFwd{d.put(x, {c.B, c.HW, 1, c.C}), d.put(gamma), d.put(beta), {}, Y, M, R, c.silu});
  EXPECT_LT(rel(d.get(Y), expect), 2e-6);
  EXPECT_LT(rel(d.get(M), emean), 1e-7);
  EXPECT_LT(rel(d.get(R), erstd), 1e-7);
}

TEST_P(GroupNorm, GradientsMatchFiniteDifferences) {
  const GnCase c = GetParam();
  const size_t n = (size_t)c.B * c.HW * c.C;
  V x = rnd(n, -2, 2), gamma = rnd(c.C, 0.5, 1.5), beta = rnd(c.C), dy = rnd(n);
  V y(n), mean(c.B * c.G), rstd(c.B * c.G);
  ref::groupnorm_fwd<double>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), c.B,
                             c.HW, c.C, c.G, c.silu);
  V dx = nans(n), dg = nans(c.C), dbt = nans(c.C);
  ref::groupnorm_bwd<double>(x.data(), gamma.data(), beta.data(), mean.data(), rstd.data(), dy.data(),
                             dx.data(), dg.data(), dbt.data(), c.B, c.HW, c.C, c.G, c.silu);
  V m2(mean.size()), r2(mean.size());
  auto loss = [&] {
    ref::groupnorm_fwd<double>(x.data(), gamma.data(), beta.data(), y.data(), m2.data(), r2.data(), c.B, c.HW,
                               c.C, c.G, c.silu);
    return dot(y, dy);
  };
  gradcheck("dx", x, dx, loss);
  gradcheck("dgamma", gamma, dg, loss);
  gradcheck("dbeta", beta, dbt, loss);

  Dev d;
  Tensor X = d.put(x, {c.B, c.HW, 1, c.C}), Ga = d.put(gamma), Be = d.put(beta),
         DY = d.put(dy, {c.B, c.HW, 1, c.C});
  Tensor Y = d.poisoned({c.B, c.HW, 1, c.C}), M = d.poisoned({c.B, c.G}), R = d.poisoned({c.B, c.G});
  d.run(GroupNormFwd{X, Ga, Be, {}, Y, M, R, c.silu});
  Tensor DX = d.poisoned({c.B, c.HW, 1, c.C}), DG = d.poisoned({c.C}), DB = d.poisoned({c.C});
  d.run(GroupNormBwd{X, Ga, Be, {}, M, R, DY, DX, DG, DB, {}, c.silu, {}, {}, {}, {}});
  EXPECT_LT(rel(d.get(DX), dx), kF32Tol);
  EXPECT_LT(rel(d.get(DG), dg), kF32Tol);
  EXPECT_LT(rel(d.get(DB), dbt), kF32Tol);
  const F fdx = d.get(DX);
  DX = d.poisoned({c.B, c.HW, 1, c.C});
  d.run(GroupNormBwd{X, Ga, Be, {}, M, R, DY, DX, {}, {}, {}, c.silu, {}, {}, {}, {}});
  EXPECT_EQ(d.get(DX), fdx);
  // add: dx + add, the one f32 addition
  const V av = rnd(n);
  GroupNormBwd with_add{X, Ga, Be, {}, M, R, DY, d.poisoned({c.B, c.HW, 1, c.C}), {}, {}, {}, c.silu, {}, {}, {}, {}};
  with_add.add = d.put(av, {c.B, c.HW, 1, c.C});
  d.run(with_add);
  F want = fdx;
  for (size_t i = 0; i < want.size(); ++i) want[i] += (float)av[i];
  EXPECT_EQ(d.get(with_add.dx), want);
  // the column sums: of dx as written (add included) per sample and over the batch, and of add
  GroupNormBwd sums = with_add;
  sums.dx = d.poisoned({c.B, c.HW, 1, c.C}), sums.dx_sums = d.poisoned({c.B, c.C});
  sums.dx_total = d.poisoned({c.C}), sums.add_total = d.poisoned({c.C});
  d.run(sums);
  const F sdx = d.get(sums.dx);
  EXPECT_EQ(sdx, want);
  V per(c.B * c.C, 0.0), tot(c.C, 0.0), atot(c.C, 0.0);
  for (size_t i = 0; i < want.size(); ++i) {
    const size_t ch = i % c.C, b = i / ((size_t)c.HW * c.C);
    per[b * c.C + ch] += sdx[i], tot[ch] += sdx[i], atot[ch] += (float)av[i];
  }
  EXPECT_LT(rel(d.get(sums.dx_sums), per), 1e-6);
  EXPECT_LT(rel(d.get(sums.dx_total), tot), 1e-6);
  EXPECT_LT(rel(d.get(sums.add_total), atot), 1e-6);
  // dx2: the same gradient split at channel C1 into two tensors (a skip concatenation's parts),
  // bit for bit, the column sums unchanged; at every split point of these small C
  for (int C1 = 1; C1 < c.C; C1 += std::max(1, c.C / 5)) {
    SCOPED_TRACE(C1);
    GroupNormBwd split = sums;
    split.dx = d.poisoned({c.B, c.HW, 1, C1}), split.dx2 = d.poisoned({c.B, c.HW, 1, c.C - C1});
    split.dx_sums = d.poisoned({c.B, c.C}), split.dx_total = d.poisoned({c.C}), split.add_total = d.poisoned({c.C});
    d.run(split);
    const F a = d.get(split.dx), b = d.get(split.dx2);
    ASSERT_EQ(a.size() + b.size(), sdx.size());
    size_t mism = 0;
    for (size_t i = 0; i < sdx.size(); ++i) {
      const size_t r = i / c.C, ch = i % c.C;
      const float got = ch < (size_t)C1 ? a[r * C1 + ch] : b[r * (c.C - C1) + ch - C1];
      mism += !(got == sdx[i]);
    }
    EXPECT_EQ(mism, 0u);
    EXPECT_EQ(d.get(split.dx_sums), d.get(sums.dx_sums));
    EXPECT_EQ(d.get(split.dx_total), d.get(sums.dx_total));
    EXPECT_EQ(d.get(split.add_total), d.get(sums.add_total));
  }
  // add2: a second gradient added after add (f32, that order), not in add_total
  const V a2 = rnd(n);
  GroupNormBwd two = sums;
  two.dx = d.poisoned({c.B, c.HW, 1, c.C}), two.add2 = d.put(a2, {c.B, c.HW, 1, c.C});
  two.dx_sums = d.poisoned({c.B, c.C}), two.dx_total = d.poisoned({c.C}), two.add_total = d.poisoned({c.C});
  d.run(two);
  F want2 = want;
  for (size_t i = 0; i < want2.size(); ++i) want2[i] += (float)a2[i];
  EXPECT_EQ(d.get(two.dx), want2);
  EXPECT_EQ(d.get(two.add_total), d.get(sums.add_total));
  EXPECT_NE(d.get(two.dx_total), d.get(sums.dx_total));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupNorm,
                         ::testing::Values(GnCase{2, 6, 8, 4, false}, GnCase{2, 6, 8, 4, true},
                                           GnCase{1, 9, 6, 1, true}, GnCase{3, 5, 12, 12, false},
                                           GnCase{2, 16, 64, 32, true}));

// With scale-shift (the ResBlock's second norm under use_scale_shift_norm): forward against the
// formula, and every gradient (x, gamma, beta, ss) against finite differences.
TEST(GroupNormScaleShift, ForwardAndGradients) {
  for (bool silu : {true, false}) {
    SCOPED_TRACE(silu);
    const int B = 2, HW = 6, C = 8, G = 4;
    const size_t n = (size_t)B * HW * C;
    V x = rnd(n, -2, 2), gamma = rnd(C, 0.5, 1.5), beta = rnd(C), ss = rnd((size_t)B * 2 * C), dy = rnd(n);
    V y = nans(n), mean(B * G), rstd(B * G), plain(n);
    ref::groupnorm_ss_fwd<double>(x.data(), gamma.data(), beta.data(), ss.data(), y.data(), mean.data(),
                                  rstd.data(), B, HW, C, G, silu);
    ref::groupnorm_fwd<double>(x.data(), gamma.data(), beta.data(), plain.data(), mean.data(), rstd.data(), B,
                               HW, C, G, false);
    for (size_t i = 0; i < n; ++i) {
      const int c = (int)(i % C), b = (int)(i / ((size_t)HW * C));
      const double z = plain[i] * (1 + ss[(size_t)b * 2 * C + c]) + ss[(size_t)b * 2 * C + C + c];
      ASSERT_NEAR(y[i], silu ? z / (1 + std::exp(-z)) : z, 1e-13);
    }
    V dx = nans(n), dg = nans(C), db = nans(C), dss = nans(ss.size());
    ref::groupnorm_ss_bwd<double>(x.data(), gamma.data(), beta.data(), ss.data(), mean.data(), rstd.data(),
                                  dy.data(), dx.data(), dg.data(), db.data(), dss.data(), B, HW, C, G, silu);
    V m2(B * G), r2(B * G), y2(n);
    auto loss = [&] {
      ref::groupnorm_ss_fwd<double>(x.data(), gamma.data(), beta.data(), ss.data(), y2.data(), m2.data(),
                                    r2.data(), B, HW, C, G, silu);
      return dot(y2, dy);
    };
    gradcheck("dx", x, dx, loss);
    gradcheck("dgamma", gamma, dg, loss);
    gradcheck("dbeta", beta, db, loss);
    gradcheck("dss", ss, dss, loss);
  }
}

// GroupNormApply with the forward's statistics gives the forward's output.
TEST(GroupNormApply, EqualsTheForwardWithItsStatistics) {
  for (bool ss : {false, true})
    for (bool silu : {false, true}) {
      const int B = 2, H = 5, C = 12, G = 4;
      Dev d;
      Tensor X = d.put(rnd((size_t)B * H * H * C, -2, 3), {B, H, H, C}), Ga = d.put(rnd(C)),
             Be = d.put(rnd(C));
      Tensor SS = ss ? d.put(rnd((size_t)B * 2 * C), {B, 2 * C}) : Tensor{};
      Tensor Y = d.poisoned({B, H, H, C}), M = d.poisoned({B, G}), R = d.poisoned({B, G}),
             Y2 = d.poisoned({B, H, H, C});
      d.run(GroupNormFwd{X, Ga, Be, SS, Y, M, R, silu});
      d.run(GroupNormApply{X, Ga, Be, SS, M, R, Y2, silu});
      EXPECT_EQ(d.get(Y2), d.get(Y)) << ss << silu;
    }
}

// The input offset: GroupNorm of x with xbias [C] and xemb [B, C] is GroupNorm of x + xbias[c] +
// xemb[b, c] (f32 adds in that order), forward, apply and backward, bitwise (the default CPU
// variant, with scale-shift and without).
TEST(GroupNormOffset, NormalizesXPlusBiasAndEmbedding) {
  for (bool ss : {false, true}) {
    const int B = 2, H = 5, C = 12, G = 4;
    const size_t n = (size_t)B * H * H * C;
    Dev d;
    const V x = rnd(n, -2, 3), bias = rnd(C, -3, 3), emb = rnd((size_t)B * C, -2, 2);
    V shifted(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t c = i % C, b = i / ((size_t)H * H * C);
      shifted[i] = ((float)x[i] + (float)bias[c]) + (float)emb[b * C + c];
    }
    Tensor X = d.put(x, {B, H, H, C}), X2 = d.put(shifted, {B, H, H, C}), Bi = d.put(bias),
           Em = d.put(emb, {B, C}), Ga = d.put(rnd(C, 0.5, 1.5)), Be = d.put(rnd(C)), Dy = d.put(rnd(n), {B, H, H, C});
    Tensor SS = ss ? d.put(rnd((size_t)B * 2 * C), {B, 2 * C}) : Tensor{};
    auto fwd = [&](const Tensor& x_, bool off) {
      Tensor Y = d.poisoned({B, H, H, C}), M = d.poisoned({B, G}), R = d.poisoned({B, G}), Y2 = d.poisoned({B, H, H, C});
      Tensor Dx = d.poisoned({B, H, H, C}), Dg = d.poisoned({C}), Db = d.poisoned({C});
      const Tensor xb = off ? Bi : Tensor{}, xe = off ? Em : Tensor{};
      d.run(GroupNormFwd{x_, Ga, Be, SS, Y, M, R, true, xb, xe});
      d.run(GroupNormApply{x_, Ga, Be, SS, M, R, Y2, true, xb, xe});
      d.run(GroupNormBwd{x_, Ga, Be, SS, M, R, Dy, Dx, Dg, Db, {}, true, {}, {}, {}, {}, xb, xe});
      return std::vector<F>{d.get(Y), d.get(M), d.get(R), d.get(Y2), d.get(Dx), d.get(Dg), d.get(Db)};
    };
    const std::vector<F> a = fwd(X, true), b = fwd(X2, false);
    const char* names[] = {"y", "mean", "rstd", "apply", "dx", "dgamma", "dbeta"};
    for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k], b[k]) << names[k] << " ss " << ss;
    // and the offset matters: the same op without it differs
    EXPECT_NE(fwd(X, false)[0], a[0]);
  }
}

// ---- CUDA variants ----

// A GroupNormBwd over [B, H, W, C] in `act` (G groups; scale-shift, the added gradient, the
// column sums and the input offset optional).
GroupNormBwd gn_bwd_op(const Alloc& A, DType act, int B, int H, int W, int C, int G, bool ss, bool silu,
                       bool add, bool sums = false, bool off = false, int split = 0, bool add2 = false) {
  GroupNormBwd o{A(act, {B, H, W, C}),
                 A(DType::F32, {C}),
                 A(DType::F32, {C}),
                 ss ? A(DType::F32, {B, 2 * C}) : Tensor{},
                 A(DType::F32, {B, G}),
                 A(DType::F32, {B, G}),
                 A(act, {B, H, W, C}),
                 A(act, {B, H, W, C}),
                 A(DType::F32, {C}),
                 A(DType::F32, {C}),
                 ss ? A(DType::F32, {B, 2 * C}) : Tensor{},
                 silu,
                 {},
                 {},
                 {},
                 {}};
  if (add) o.add = A(act, {B, H, W, C});
  if (sums) {
    o.dx_sums = A(DType::F32, {B, C}), o.dx_total = A(DType::F32, {C});
    if (add) o.add_total = A(DType::F32, {C});
  }
  if (off) o.xbias = A(DType::F32, {C}), o.xemb = A(DType::F32, {B, C});
  if (split) o.dx = A(act, {B, H, W, split}), o.dx2 = A(act, {B, H, W, C - split});
  if (add2) o.add2 = A(act, {B, H, W, C});
  return o;
}

// add: the backward also adds a gradient arriving by another path (the residual skip) into dx.
// sums: with the column sums of dx and add (the neighbouring convs' bias gradients).
// off: with the input offset (xbias [C], xemb [B, C]: conv1's bias and embedding, added by GN2).
// split: dx as two tensors of split and C - split channels (a skip concatenation's parts).
// add2: a second added gradient (a skip's, arriving from the decoder).
void check_gn(const std::string& what, int B, int H, int C, bool ss, bool silu, bool add = false,
              bool sums = false, bool off = false, int split = 0, bool add2 = false) {
  const int G = 32 <= C && C % 32 == 0 ? 32 : (C % 4 == 0 ? 4 : 1);
  const std::string o_ = off ? " + offset" : "";
  check_variants<GroupNormFwd>(
      what + " fwd" + o_,
      [&](const Alloc& A, DType act) {
        GroupNormFwd o{A(act, {B, H, H, C}),  A(DType::F32, {C}),
                       A(DType::F32, {C}),    ss ? A(DType::F32, {B, 2 * C}) : Tensor{},
                       A(act, {B, H, H, C}),  A(DType::F32, {B, G}),
                       A(DType::F32, {B, G}), silu};
        if (off) o.xbias = A(DType::F32, {C}), o.xemb = A(DType::F32, {B, C});
        return o;
      },
      Tol{});
  if (off)  // (without the offset: the backward's setup below runs the same kernels)
    check_variants<GroupNormApply>(
        what + " apply" + o_,
        [&](const Alloc& A, DType act) {
          return GroupNormApply{A(act, {B, H, H, C}),  A(DType::F32, {C}),
                                A(DType::F32, {C}),    ss ? A(DType::F32, {B, 2 * C}) : Tensor{},
                                A(DType::F32, {B, G}), A(DType::F32, {B, G}),
                                A(act, {B, H, H, C}),  silu,
                                A(DType::F32, {C}),    A(DType::F32, {B, C})};
        },
        Tol{},
        [&](Engine& e, GroupNormApply& o) {
          Tensor y = e.alloc(o.x.dtype, {B, H, H, C});
          e.ops().run(GroupNormFwd{o.x, o.gamma, o.beta, o.ss, y, o.mean, o.rstd, silu, o.xbias, o.xemb});
        });
  // Backward from the statistics of a forward pass over the same x.
  check_variants<GroupNormBwd>(
      what + (add ? " bwd + add" : " bwd") + (sums ? " + sums" : "") + o_ +
          (split ? " split " + std::to_string(split) : "") + (add2 ? " + add2" : ""),
      [&](const Alloc& A, DType act) {
        return gn_bwd_op(A, act, B, H, H, C, G, ss, silu, add, sums, off, split, add2);
      },
      Tol{},
      [&](Engine& e, GroupNormBwd& o) {
        Tensor y = e.alloc(o.x.dtype, {B, H, H, C});
        e.ops().run(GroupNormFwd{o.x, o.gamma, o.beta, o.ss, y, o.mean, o.rstd, silu, o.xbias, o.xemb});
      });
}

TEST(GroupNormVariants, SmallShapes) {
  SKIP_WITHOUT_GPU();
  check_gn("odd", 2, 5, 12, false, true);
  check_gn("odd ss", 3, 3, 12, true, true);
  check_gn("no silu", 2, 4, 64, false, false);
  check_gn("ss no silu", 2, 4, 64, true, false);
  check_gn("odd", 2, 5, 12, false, true, true);
  check_gn("ss", 2, 4, 64, true, true, true);
  check_gn("no silu", 2, 4, 64, false, false, true);
  check_gn("odd", 2, 5, 12, false, true, true, true);
  check_gn("odd", 3, 7, 20, false, true, false, true);
  check_gn("ss", 2, 4, 64, true, true, false, true);
  check_gn("no silu", 2, 4, 64, false, false, true, true);
  check_gn("odd", 2, 5, 12, false, true, false, false, true);
  check_gn("odd ss", 3, 3, 12, true, true, false, true, true);
  check_gn("no silu", 2, 4, 64, false, false, false, true, true);
  // dx split in two: at a 16-byte boundary (vector path) and off it (scalar path)
  check_gn("split", 2, 4, 64, false, true, true, false, false, 24);
  check_gn("odd split", 2, 5, 12, false, true, true, true, false, 5);
  check_gn("ss split", 2, 4, 64, true, true, false, true, false, 40);
  check_gn("add2", 2, 4, 64, false, true, true, true, false, 0, true);
  check_gn("odd add2", 2, 5, 12, false, true, true, false, false, 0, true);
}

// "fused"'s apply (and bf16's dx) stream each thread's rows through a ring of 16 (f32) / 8 (bf16)
// slots, 4 for bf16's dx: shapes where a thread walks more rows than its slots (the slots are
// refilled) and, at C = 2048 in f32, where a block's threads take two rounds of channel vectors
// (the ring restarts). (SmallShapes' maps give a thread one or two rows.)
TEST(GroupNormVariants, RowsPastTheRing) {
  SKIP_WITHOUT_GPU();
  check_gn("ring 64x64 C2048 + skip sums offset", 2, 64, 2048, false, true, true, true, true);
  check_gn("ring 128x128 ss + skip sums", 8, 128, 64, true, true, true, true);
}

TEST(GroupNormVariants, EverySeed64ShapeAtBatch32) {
  SKIP_WITHOUT_GPU();
  std::set<std::pair<int, int>> seen;
  each_seed64_layer([&](const Layer& l) {
    if (l.kind != Layer::Res && l.kind != Layer::Attn) return;
    for (auto rc : {std::pair{l.res, l.cin}, std::pair{l.res, l.cout}})
      if (seen.insert(rc).second)
        check_gn(l.prefix + " " + std::to_string(rc.first) + "x" + std::to_string(rc.second), 32, rc.first,
                 rc.second, false, true);
  });
  check_gn("seed64 ss", 32, 32, 128, true, true);
  // The residual blocks' first norms add the skip path's gradient (64x64 and 8x8: fused and smem).
  check_gn("seed64 + skip 64x64", 32, 64, 64, false, true, true);
  check_gn("seed64 + skip 8x8", 32, 8, 256, false, true, true);
  check_gn("seed64 attention + skip", 32, 16, 128, false, false, true);
  // The column sums: conv1's bias and embedding gradients from the second norm (dx), conv2's or
  // proj_out's bias gradient from the first (add), at the sizes of "fused" and "smem".
  check_gn("seed64 conv1 sums 64x64", 32, 64, 64, false, true, false, true);
  check_gn("seed64 conv1 sums 32x32 C192", 32, 32, 192, false, true, false, true);
  check_gn("seed64 conv1 sums 8x8", 32, 8, 256, false, true, false, true);
  check_gn("seed64 conv1 sums ss", 32, 16, 128, true, true, false, true);
  check_gn("seed64 + skip sums 64x64", 32, 64, 64, false, true, true, true);
  check_gn("seed64 + skip sums 8x8", 32, 8, 256, false, true, true, true);
  check_gn("seed64 attention + skip sums", 32, 16, 128, false, false, true, true);
  // conv1's bias and embedding added by GN2 (its forward, recompute and backward with the column
  // sums), every ResBlock width and map size ("fused" at 64x64/32x32, "smem" at 16x16/8x8)
  check_gn("seed64 GN2 offset 64x64", 32, 64, 64, false, true, false, true, true);
  check_gn("seed64 GN2 offset 32x32", 32, 32, 128, false, true, false, true, true);
  check_gn("seed64 GN2 offset 16x16", 32, 16, 192, false, true, false, true, true);
  check_gn("seed64 GN2 offset 8x8", 32, 8, 256, false, true, false, true, true);
  check_gn("seed64 GN2 offset ss", 32, 16, 128, true, true, false, true, true);
  // out_blocks' first norms write the skip concatenation's two gradients ("fused" at 64x64 and
  // 32x32, "smem" at 16x16 and 8x8)
  check_gn("seed64 concat 64x64", 32, 64, 192, false, true, true, false, false, 128);
  check_gn("seed64 concat 32x32", 32, 32, 320, false, true, true, false, false, 192);
  check_gn("seed64 concat 16x16", 32, 16, 448, false, true, true, false, false, 256);
  check_gn("seed64 concat 8x8", 32, 8, 512, false, true, true, false, false, 256);
  // the encoder ResBlocks after a skip's source also add the skip's gradient (add2), with the
  // residual (add) and conv2's bias gradient (add_total)
  check_gn("seed64 skip joins 64x64", 32, 64, 64, false, true, true, true, false, 0, true);
  check_gn("seed64 skip joins 32x32", 32, 32, 128, false, true, true, true, false, 0, true);
  check_gn("seed64 skip joins 8x8", 32, 8, 256, false, true, true, true, false, 0, true);
}

// ---- fast CPU variants vs the CPU reference ----

// shift: added to x (a mean far from 0 next to a unit spread: the variance's cancellation).
int check_gn_cpu(const std::string& what, int B, int H, int W, int C, int G, bool ss, bool silu,
                 std::vector<Precision> precs = {Precision::FP32, Precision::BF16}, float shift = 0,
                 bool add = false, bool sums = false, bool off = false, int split = 0, bool add2 = false) {
  auto offset = [&](const Alloc& A, auto& o) {
    if (off) o.xbias = A(DType::F32, {C}), o.xemb = A(DType::F32, {B, C});
  };
  auto shift_x = [shift](Engine& e, const Tensor& x) {
    if (shift == 0) return;
    std::vector<float> v = test::to_host(e, x);
    for (float& f : v) f += shift;
    test::from_host(e, x, v);
  };
  int n = check_cpu_variants<GroupNormFwd>(
      what + " fwd",
      [&](const Alloc& A, DType act) {
        GroupNormFwd o{A(act, {B, H, W, C}),  A(DType::F32, {C}),
                       A(DType::F32, {C}),    ss ? A(DType::F32, {B, 2 * C}) : Tensor{},
                       A(act, {B, H, W, C}),  A(DType::F32, {B, G}),
                       A(DType::F32, {B, G}), silu};
        offset(A, o);
        return o;
      },
      kCpuTol, [&](Engine& e, GroupNormFwd& o) { shift_x(e, o.x); }, precs);
  n += check_cpu_variants<GroupNormApply>(
      what + " apply",
      [&](const Alloc& A, DType act) {
        GroupNormApply o{A(act, {B, H, W, C}),  A(DType::F32, {C}),
                         A(DType::F32, {C}),    ss ? A(DType::F32, {B, 2 * C}) : Tensor{},
                         A(DType::F32, {B, G}), A(DType::F32, {B, G}),
                         A(act, {B, H, W, C}),  silu};
        offset(A, o);
        return o;
      },
      kCpuTol,
      [&](Engine& e, GroupNormApply& o) {  // statistics of x from the reference forward
        shift_x(e, o.x);
        Tensor y = e.alloc(o.x.dtype, {B, H, W, C});
        e.base_ops().run_variant(GroupNormFwd{o.x, o.gamma, o.beta, o.ss, y, o.mean, o.rstd, silu, o.xbias, o.xemb},
                                 "ref");
      },
      precs);
  n += check_cpu_variants<GroupNormBwd>(
      what + (add ? " bwd + add" : " bwd") + (sums ? " + sums" : ""),
      [&](const Alloc& A, DType act) {
        return gn_bwd_op(A, act, B, H, W, C, G, ss, silu, add, sums, off, split, add2);
      },
      kCpuTol,
      [&](Engine& e, GroupNormBwd& o) {  // statistics of x from the reference forward
        shift_x(e, o.x);
        Tensor y = e.alloc(o.x.dtype, {B, H, W, C});
        e.base_ops().run_variant(GroupNormFwd{o.x, o.gamma, o.beta, o.ss, y, o.mean, o.rstd, silu, o.xbias, o.xemb},
                                 "ref");
      },
      precs);
  return n;
}

TEST(GroupNormCpuVariants, SmallOddShapes) {
  int n = 0;
  for (bool ss : {false, true})
    for (bool silu : {false, true}) {
      const std::string k = std::string(ss ? " ss" : "") + (silu ? " silu" : "");
      n += check_gn_cpu("odd C12 G4" + k, 2, 5, 3, 12, 4, ss, silu);
      n += check_gn_cpu("odd C20 G5" + k, 3, 3, 4, 20, 5, ss, silu);
      n += check_gn_cpu("C3 G1" + k, 2, 1, 7, 3, 1, ss, silu);
      n += check_gn_cpu("C48 G16" + k, 1, 6, 5, 48, 16, ss, silu);
      n += check_gn_cpu("shifted C64 G32" + k, 2, 9, 9, 64, 32, ss, silu, {Precision::FP32, Precision::BF16},
                        40.0f);
      n += check_gn_cpu("C64 G32 + add" + k, 2, 5, 6, 64, 32, ss, silu, {Precision::FP32, Precision::BF16}, 0.f,
                        true);
      n += check_gn_cpu("C64 G32 + add + sums" + k, 2, 5, 6, 64, 32, ss, silu, {Precision::FP32}, 0.f, true,
                        true);
      n += check_gn_cpu("C64 G32 + offset + sums" + k, 2, 5, 6, 64, 32, ss, silu,
                        {Precision::FP32, Precision::BF16}, 0.f, false, true, true);
      n += check_gn_cpu("C64 G32 + add + sums, split 24" + k, 2, 5, 6, 64, 32, ss, silu,
                        {Precision::FP32, Precision::BF16}, 0.f, true, true, false, 24);
      n += check_gn_cpu("C64 G32 + add + add2 + sums" + k, 2, 5, 6, 64, 32, ss, silu,
                        {Precision::FP32, Precision::BF16}, 0.f, true, true, false, 0, true);
    }
  if (n == 0) GTEST_SKIP() << "no fast CPU variant on this CPU";
}

// ---- the input in two parts (GroupNormFwd's x2 / xcat: a skip concatenation read where its
// parts lie and written as read) ----

// A GroupNormFwd of [B, H, H, C1] ++ [B, H, H, C2] given as its two parts, writing the
// concatenation to xcat; y with SiLU or without.
GroupNormFwd gn_parts_op(const Alloc& A, DType act, int B, int H, int C1, int C2, int G, bool silu) {
  const int C = C1 + C2;
  GroupNormFwd o{A(act, {B, H, H, C1}), A(DType::F32, {C}),    A(DType::F32, {C}),    {},
                 A(act, {B, H, H, C}),  A(DType::F32, {B, G}), A(DType::F32, {B, G}), silu};
  o.x2 = A(act, {B, H, H, C2}), o.xcat = A(act, {B, H, H, C});
  return o;
}
struct PartsCase {
  int B, H, C1, C2, G;
  bool silu;
};
// 4-channel vectors in both parts, the second part's vectors odd, a first part not of whole
// vectors (one channel at a time), seed64's decoder shapes (whole 16-byte vectors, G 32 over a
// group that straddles the parts at C 192).
const PartsCase kPartsCases[] = {
    {2, 5, 8, 4, 4, true}, {3, 3, 6, 6, 4, false}, {2, 4, 64, 64, 32, true}, {2, 8, 128, 64, 32, true}};

// Each engine (the CPU's in fp32 and the bf16 emulation; each CUDA precision) and each of its
// variants that takes the two parts: bitwise what that variant gives on their concatenation
// (ConcatFwd first), and xcat bitwise that concatenation.
TEST(GroupNormParts, BitwiseTheConcatenationsNorm) {
  std::vector<Engine*> engines{&cpu_engine(Precision::FP32), &cpu_engine(Precision::BF16)};
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
    if (Engine* g = have_gpu() ? gpu_engine(p) : nullptr) engines.push_back(g);
  int checked = 0;
  for (const PartsCase& c : kPartsCases)
    for (Engine* e : engines) {
      const DType act = e->act_dtype();
      Alloc A = [&](DType t, std::initializer_list<int64_t> d) { return e->alloc(t, d); };
      GroupNormFwd parts = gn_parts_op(A, act, c.B, c.H, c.C1, c.C2, c.G, c.silu);
      randomize(*e, parts, test_seed() + 31 * (checked + 1));
      const ConcatFwd cat{parts.x, parts.x2, A(act, {c.B, c.H, c.H, c.C1 + c.C2})};
      e->ops().run(cat);
      GroupNormFwd whole = parts;
      whole.x = cat.y, whole.x2 = whole.xcat = Tensor{};
      whole.y = A(act, {c.B, c.H, c.H, c.C1 + c.C2}), whole.mean = A(DType::F32, {c.B, c.G}),
      whole.rstd = A(DType::F32, {c.B, c.G});
      const auto vs = e->base_ops().variants_for(parts);
      EXPECT_FALSE(vs.empty()) << "no variant takes the parts on " << precision_name(e->precision());
      for (const std::string& v : vs) {
        SCOPED_TRACE(describe(parts) + " " + precision_name(e->precision()) + " variant " + v);
        for (const Tensor* t :
             {&parts.y, &parts.mean, &parts.rstd, &parts.xcat, &whole.y, &whole.mean, &whole.rstd})
          poison(*e, *t);
        e->base_ops().run_variant(parts, v);
        e->base_ops().run_variant(whole, v);
        e->device().sync();
        EXPECT_EQ(raw(*e, parts.xcat), raw(*e, cat.y));
        EXPECT_EQ(raw(*e, parts.y), raw(*e, whole.y));
        EXPECT_EQ(raw(*e, parts.mean), raw(*e, whole.mean));
        EXPECT_EQ(raw(*e, parts.rstd), raw(*e, whole.rstd));
        ++checked;
      }
    }
  EXPECT_GE(checked, 8);
}

// Every CUDA variant that takes the parts against the CPU reference (y, statistics, xcat), and
// every fast CPU variant against "ref".
TEST(GroupNormParts, VariantsMatchTheReference) {
  int n = 0;
  for (const PartsCase& c : kPartsCases) {
    const std::string k = "parts " + std::to_string(c.C1) + "+" + std::to_string(c.C2);
    const auto build = [&](const Alloc& A, DType act) {
      return gn_parts_op(A, act, c.B, c.H, c.C1, c.C2, c.G, c.silu);
    };
    n += check_variants<GroupNormFwd>(k, build, Tol{});
    n += check_cpu_variants<GroupNormFwd>(k, build);
  }
  if (n == 0) GTEST_SKIP() << "no GPU and no fast CPU variant";
}

// Every GroupNorm of tiny32 at batch 16 (ResBlock norms with SiLU, the second one with scale-shift;
// attention norms without SiLU; the output norm).
TEST(GroupNormCpuVariants, EveryTiny32ShapeAtBatch16) {
  const Arch a = build_arch(preset("tiny32"));
  const std::vector<Precision> f32{Precision::FP32};  // (bf16: the odd shapes above)
  std::set<std::pair<int, int>> seen;
  int n = 0;
  each_layer(a, [&](const Layer& l) {
    if (l.kind != Layer::Res && l.kind != Layer::Attn) return;
    for (auto rc : {std::pair{l.res, l.cin}, std::pair{l.res, l.cout}})
      if (seen.insert(rc).second) {
        const std::string k = l.prefix + " " + std::to_string(rc.first) + "x" + std::to_string(rc.second);
        n += check_gn_cpu(k, 16, rc.first, rc.first, rc.second, 32, false, true, f32);
        n += check_gn_cpu(k + " ss", 16, rc.first, rc.first, rc.second, 32, true, true, f32);
        n += check_gn_cpu(k + " attn", 16, rc.first, rc.first, rc.second, 32, false, false, f32);
      }
  });
  n += check_gn_cpu("out", 16, 32, 32, a.out_cin, 32, false, true, f32);
  EXPECT_GE(seen.size(), 4u);
  if (n == 0) GTEST_SKIP() << "no fast CPU variant on this CPU";
}

}  // namespace
