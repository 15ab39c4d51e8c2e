// CPU reference engine (lib/ops/*): every op of lib/backend.h.
//  * forward vs independent naive formulas (written here in PyTorch's NCHW / [B, C, T] indexing);
//  * backward vs central finite differences of sum(y * dy), in double (the op templates
//    instantiated for double), for every input and parameter;
//  * the float CpuBackend (what the model uses) vs the double template, outputs poisoned with
//    NaN first, nullptr gradient outputs skipped without disturbing the others;
//  * results bitwise independent of the OpenMP thread count (bit-exact resume relies on it).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "ops/ref.h"
#include "testutil.h"

// The float engine vs the float64 reference: rounding of long fp32 dot products (K up to a few
// hundred, random signs) reaches ~1e-5 relative on unlucky draws; bugs show up orders above it.
constexpr double kF32Tol = 3e-5;

namespace {

using V = std::vector<double>;
using F = std::vector<float>;
namespace ref = unet::ref;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

uint64_t next_seed() {
  static uint64_t k = 0;
  return unet::test::test_seed() * 1000003ull + 7919ull * (++k);
}
V rnd(size_t n, double lo = -1, double hi = 1) {
  F f = unet::test::randu(n, next_seed(), (float)lo, (float)hi);
  return V(f.begin(), f.end());
}
V nans(size_t n) { return V(n, kNaN); }
F tof(const V& v) { return F(v.begin(), v.end()); }
double dot(const V& a, const V& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
double rel(const V& a, const V& b) {  // ||a-b|| / ||b||, inf on NaN
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    n += (a[i] - b[i]) * (a[i] - b[i]);
    d += b[i] * b[i];
  }
  return d == 0 ? (n == 0 ? 0 : INFINITY) : std::sqrt(n / d);
}
double rel(const F& a, const V& b) { return rel(V(a.begin(), a.end()), b); }

// Central differences of loss() w.r.t. x (all elements, or max_n random ones) against ana.
void gradcheck(const std::string& what, V& x, const V& ana, const std::function<double()>& loss,
               size_t max_n = 250) {
  ASSERT_EQ(x.size(), ana.size()) << what;
  std::vector<size_t> idx;
  if (x.size() <= max_n) {
    for (size_t i = 0; i < x.size(); ++i) idx.push_back(i);
  } else {
    std::mt19937_64 g(next_seed());
    for (size_t i = 0; i < max_n; ++i) idx.push_back(g() % x.size());
  }
  // Thousands of tiny forward calls: one thread (thread teams cost more than they save here;
  // multi-threaded results are covered by the Determinism test).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double eps = 1e-6;
  double err = 0, nrm = 0, worst = 0;
  size_t worst_i = 0;
  for (size_t i : idx) {
    const double save = x[i];
    x[i] = save + eps;
    const double lp = loss();
    x[i] = save - eps;
    const double lm = loss();
    x[i] = save;
    const double num = (lp - lm) / (2 * eps), e = std::fabs(num - ana[i]);
    if (!(e <= worst)) worst = e, worst_i = i;
    err += e * e;
    nrm += ana[i] * ana[i];
  }
  omp_set_num_threads(threads);
  EXPECT_GT(nrm, 0) << what << ": gradient is all zero (vacuous check)";
  EXPECT_LT(std::sqrt(err / nrm), 1e-6)
      << what << ": worst element " << worst_i << " off by " << worst << " (analytic " << ana[worst_i] << ")";
}

// The float engine as the model sees it, with helpers to move vectors in and out.
struct Dev {
  std::unique_ptr<unet::Backend> be = unet::make_cpu_backend();
  float* put(const V& v) {
    float* p = be->alloc(v.size());
    F f = tof(v);
    be->upload(p, f.data(), f.size());
    return p;
  }
  float* alloc_zero(size_t n) { return be->alloc(n); }  // alloc() zero-fills
  float* poisoned(size_t n) {
    float* p = be->alloc(n);
    be->fill(p, NAN, n);
    return p;
  }
  F get(const float* p, size_t n) {
    F f(n);
    be->download(f.data(), p, n);
    return f;
  }
};

// ---- layout helpers (PyTorch NCHW <-> engine NHWC) ----
V nchw_to_nhwc(const V& t, int B, int C, int H, int W) {
  V e(t.size());
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x)
          e[(((size_t)b * H + y) * W + x) * C + c] = t[(((size_t)b * C + c) * H + y) * W + x];
  return e;
}

// =============================== memory ===============================

TEST(CpuBackendMemory, AllocAlignedZeroedCountedAndCopies) {
  auto be = unet::make_cpu_backend();
  EXPECT_FALSE(be->is_cuda());
  EXPECT_EQ(be->name(), "cpu");
  const size_t before = be->peak_bytes();
  float* a = be->alloc(1000);
  float* b = be->alloc(3);
  void* c = be->alloc_bytes(17);
  for (void* p : {(void*)a, (void*)b, c}) EXPECT_EQ((uintptr_t)p % 256, 0u);
  EXPECT_GE(be->peak_bytes() - before, 1000 * 4 + 3 * 4 + 17);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a[i], 0.0f);
  F src = unet::test::randn(1000, next_seed());
  be->upload(a, src.data(), 1000);
  F back(1000, NAN);
  be->download(back.data(), a, 1000);
  EXPECT_EQ(0, std::memcmp(back.data(), src.data(), 4000));
  float* d = be->alloc(1000);
  be->copy(d, a, 1000);
  be->download(back.data(), d, 1000);
  EXPECT_EQ(0, std::memcmp(back.data(), src.data(), 4000));
  be->fill(d, 2.5f, 1000);
  be->download(back.data(), d, 1000);
  for (float v : back) ASSERT_EQ(v, 2.5f);
  int32_t lab[3] = {4, -1, 7};
  be->upload_bytes(c, lab, sizeof lab);
  EXPECT_EQ(0, std::memcmp(c, lab, sizeof lab));
  be->sync();
  be->set_precision(unet::Precision::TF32);
  EXPECT_EQ(be->precision(), unet::Precision::TF32);
}

// =============================== conv2d ===============================

struct ConvCase {
  int B, H, W, Ci, Co, k, s;
};
std::ostream& operator<<(std::ostream& o, const ConvCase& c) {
  return o << "B" << c.B << " " << c.H << "x" << c.W << " Ci" << c.Ci << " Co" << c.Co << " k" << c.k << " s"
           << c.s;
}
class Conv : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv, ForwardMatchesDirectConvolutionInTorchLayout) {
  const ConvCase c = GetParam();
  const int p = c.k / 2, Ho = (c.H + 2 * p - c.k) / c.s + 1, Wo = (c.W + 2 * p - c.k) / c.s + 1;
  V xt = rnd((size_t)c.B * c.Ci * c.H * c.W), wt = rnd((size_t)c.Co * c.Ci * c.k * c.k), bias = rnd(c.Co);
  // Direct 7-loop convolution, PyTorch indexing: x [B,Ci,H,W], w [Co,Ci,k,k], y [B,Co,Ho,Wo].
  V yt((size_t)c.B * c.Co * Ho * Wo);
  for (int b = 0; b < c.B; ++b)
    for (int co = 0; co < c.Co; ++co)
      for (int oy = 0; oy < Ho; ++oy)
        for (int ox = 0; ox < Wo; ++ox) {
          double s = bias[co];
          for (int ci = 0; ci < c.Ci; ++ci)
            for (int ky = 0; ky < c.k; ++ky)
              for (int kx = 0; kx < c.k; ++kx) {
                const int iy = oy * c.s - p + ky, ix = ox * c.s - p + kx;
                if (iy < 0 || iy >= c.H || ix < 0 || ix >= c.W) continue;
                s += wt[((co * c.Ci + ci) * c.k + ky) * c.k + kx] *
                     xt[(((size_t)b * c.Ci + ci) * c.H + iy) * c.W + ix];
              }
          yt[(((size_t)b * c.Co + co) * Ho + oy) * Wo + ox] = s;
        }
  // Engine layouts: x NHWC, w [Co,k,k,Ci].
  V x = nchw_to_nhwc(xt, c.B, c.Ci, c.H, c.W), y_expect = nchw_to_nhwc(yt, c.B, c.Co, Ho, Wo);
  V w(wt.size());
  for (int co = 0; co < c.Co; ++co)
    for (int ci = 0; ci < c.Ci; ++ci)
      for (int t = 0; t < c.k * c.k; ++t)
        w[((size_t)co * c.k * c.k + t) * c.Ci + ci] = wt[((size_t)co * c.Ci + ci) * c.k * c.k + t];
  V y = nans(y_expect.size());
  ref::conv2d_fwd<double>(x.data(), w.data(), bias.data(), y.data(), c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
  EXPECT_LT(rel(y, y_expect), 1e-13);

  Dev d;  // float engine, with and without bias
  float* yd = d.poisoned(y.size());
  d.be->conv2d_fwd(d.put(x), d.put(w), d.put(bias), yd, c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
  EXPECT_LT(rel(d.get(yd, y.size()), y_expect), kF32Tol);
  V y0 = nans(y.size()), zero(c.Co, 0.0), y0_expect = nans(y.size());
  ref::conv2d_fwd<double>(x.data(), w.data(), zero.data(), y0_expect.data(), c.B, c.H, c.W, c.Ci, c.Co, c.k,
                          c.s);
  d.be->fill(yd, NAN, y.size());
  d.be->conv2d_fwd(d.put(x), d.put(w), nullptr, yd, c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
  EXPECT_LT(rel(d.get(yd, y.size()), y0_expect), kF32Tol);
}

TEST_P(Conv, GradientsMatchFiniteDifferences) {
  const ConvCase c = GetParam();
  const int p = c.k / 2, Ho = (c.H + 2 * p - c.k) / c.s + 1, Wo = (c.W + 2 * p - c.k) / c.s + 1;
  const size_t nx = (size_t)c.B * c.H * c.W * c.Ci, nw = (size_t)c.Co * c.k * c.k * c.Ci,
               ny = (size_t)c.B * Ho * Wo * c.Co;
  V x = rnd(nx), w = rnd(nw), b = rnd(c.Co), dy = rnd(ny);
  V dx = nans(nx), dw = nans(nw), db = nans(c.Co);
  ref::conv2d_bwd<double>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), c.B, c.H, c.W, c.Ci,
                          c.Co, c.k, c.s);
  V y(ny);
  auto loss = [&] {
    ref::conv2d_fwd<double>(x.data(), w.data(), b.data(), y.data(), c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
    return dot(y, dy);
  };
  gradcheck("dx", x, dx, loss);
  gradcheck("dw", w, dw, loss);
  gradcheck("db", b, db, loss);

  // Float engine agrees, and nullptr outputs skip just that gradient.
  Dev d;
  float *X = d.put(x), *Wt = d.put(w), *DY = d.put(dy);
  float *DX = d.poisoned(nx), *DW = d.poisoned(nw), *DB = d.poisoned(c.Co);
  d.be->conv2d_bwd(X, Wt, DY, DX, DW, DB, c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
  EXPECT_LT(rel(d.get(DX, nx), dx), kF32Tol);
  EXPECT_LT(rel(d.get(DW, nw), dw), kF32Tol);
  EXPECT_LT(rel(d.get(DB, c.Co), db), kF32Tol);
  const F fdx = d.get(DX, nx), fdw = d.get(DW, nw), fdb = d.get(DB, c.Co);
  d.be->fill(DX, NAN, nx);
  d.be->conv2d_bwd(X, Wt, DY, DX, nullptr, nullptr, c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
  EXPECT_EQ(d.get(DX, nx), fdx);
  d.be->fill(DW, NAN, nw);
  d.be->fill(DB, NAN, c.Co);
  d.be->conv2d_bwd(X, Wt, DY, nullptr, DW, DB, c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
  EXPECT_EQ(d.get(DW, nw), fdw);
  EXPECT_EQ(d.get(DB, c.Co), fdb);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Conv,
                         ::testing::Values(ConvCase{2, 5, 6, 3, 4, 3, 1}, ConvCase{2, 5, 6, 3, 4, 3, 2},
                                           ConvCase{2, 7, 7, 5, 6, 3, 2}, ConvCase{1, 6, 7, 5, 6, 1, 1},
                                           ConvCase{2, 6, 5, 4, 3, 1, 2}, ConvCase{1, 1, 1, 2, 3, 3, 1},
                                           // wide enough for the GEMM's full 4x16 register tiles
                                           ConvCase{2, 9, 8, 20, 17, 3, 1}, ConvCase{1, 8, 9, 18, 33, 3, 2},
                                           ConvCase{1, 8, 8, 35, 70, 1, 1}));

// =============================== linear ===============================

TEST(Linear, ForwardBackwardFloatAndNulls) {
  for (auto [N, I, O] : {std::tuple{3, 5, 4}, std::tuple{8, 33, 70}, std::tuple{1, 7, 1}}) {
    SCOPED_TRACE(std::to_string(N) + "x" + std::to_string(I) + "->" + std::to_string(O));
    V x = rnd((size_t)N * I), w = rnd((size_t)O * I), b = rnd(O), dy = rnd((size_t)N * O);
    V y = nans((size_t)N * O), expect((size_t)N * O);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < O; ++o) {
        double s = b[o];
        for (int i = 0; i < I; ++i) s += x[n * I + i] * w[o * I + i];
        expect[n * O + o] = s;
      }
    ref::linear_fwd<double>(x.data(), w.data(), b.data(), y.data(), N, I, O);
    EXPECT_LT(rel(y, expect), 1e-13);
    V dx = nans(x.size()), dw = nans(w.size()), db = nans(O);
    ref::linear_bwd<double>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), N, I, O);
    auto loss = [&] {
      ref::linear_fwd<double>(x.data(), w.data(), b.data(), y.data(), N, I, O);
      return dot(y, dy);
    };
    gradcheck("dx", x, dx, loss);
    gradcheck("dw", w, dw, loss);
    gradcheck("db", b, db, loss);

    Dev d;
    float *X = d.put(x), *W = d.put(w), *DY = d.put(dy), *Y = d.poisoned(y.size());
    d.be->linear_fwd(X, W, d.put(b), Y, N, I, O);
    EXPECT_LT(rel(d.get(Y, y.size()), expect), kF32Tol);
    d.be->fill(Y, NAN, y.size());
    d.be->linear_fwd(X, W, nullptr, Y, N, I, O);  // no bias
    F yn = d.get(Y, y.size());
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < O; ++o) expect[n * O + o] -= b[o];
    EXPECT_LT(rel(yn, expect), kF32Tol);
    float *DX = d.poisoned(dx.size()), *DW = d.poisoned(dw.size()), *DB = d.poisoned(O);
    d.be->linear_bwd(X, W, DY, DX, nullptr, nullptr, N, I, O);
    EXPECT_LT(rel(d.get(DX, dx.size()), dx), kF32Tol);
    d.be->linear_bwd(X, W, DY, nullptr, DW, DB, N, I, O);
    EXPECT_LT(rel(d.get(DW, dw.size()), dw), kF32Tol);
    EXPECT_LT(rel(d.get(DB, O), db), kF32Tol);
  }
}

// =============================== groupnorm ===============================

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
  float *Y = d.poisoned(y.size()), *M = d.poisoned(mean.size()), *R = d.poisoned(mean.size());
  d.be->groupnorm_fwd(d.put(x), d.put(gamma), d.put(beta), Y, M, R, c.B, c.HW, c.C, c.G, c.silu);
  EXPECT_LT(rel(d.get(Y, y.size()), expect), 2e-6);
  EXPECT_LT(rel(d.get(M, mean.size()), emean), 1e-7);
  EXPECT_LT(rel(d.get(R, mean.size()), erstd), 1e-7);
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
  float *X = d.put(x), *Ga = d.put(gamma), *Be = d.put(beta), *DY = d.put(dy);
  float *Y = d.poisoned(n), *M = d.poisoned(mean.size()), *R = d.poisoned(mean.size());
  d.be->groupnorm_fwd(X, Ga, Be, Y, M, R, c.B, c.HW, c.C, c.G, c.silu);
  float *DX = d.poisoned(n), *DG = d.poisoned(c.C), *DB = d.poisoned(c.C);
  d.be->groupnorm_bwd(X, Ga, Be, M, R, DY, DX, DG, DB, c.B, c.HW, c.C, c.G, c.silu);
  EXPECT_LT(rel(d.get(DX, n), dx), kF32Tol);
  EXPECT_LT(rel(d.get(DG, c.C), dg), kF32Tol);
  EXPECT_LT(rel(d.get(DB, c.C), dbt), kF32Tol);
  const F fdx = d.get(DX, n), fdg = d.get(DG, c.C), fdb = d.get(DB, c.C);
  d.be->fill(DX, NAN, n);
  d.be->groupnorm_bwd(X, Ga, Be, M, R, DY, DX, nullptr, nullptr, c.B, c.HW, c.C, c.G, c.silu);
  EXPECT_EQ(d.get(DX, n), fdx);
  d.be->fill(DG, NAN, c.C);
  d.be->fill(DB, NAN, c.C);
  d.be->groupnorm_bwd(X, Ga, Be, M, R, DY, nullptr, DG, DB, c.B, c.HW, c.C, c.G, c.silu);
  EXPECT_EQ(d.get(DG, c.C), fdg);
  EXPECT_EQ(d.get(DB, c.C), fdb);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupNorm,
                         ::testing::Values(GnCase{2, 6, 8, 4, false}, GnCase{2, 6, 8, 4, true},
                                           GnCase{1, 9, 6, 1, true}, GnCase{3, 5, 12, 12, false},
                                           GnCase{2, 16, 64, 32, true}));

// =============================== elementwise ===============================

TEST(Elementwise, SiluAddScale) {
  const size_t n = 333;
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
  float *X = d.put(x), *Y = d.poisoned(n), *DX = d.poisoned(n);
  d.be->silu_fwd(X, Y, n);
  ref::silu_fwd<double>(x.data(), y.data(), n);
  EXPECT_LT(rel(d.get(Y, n), y), 1e-6);
  d.be->silu_bwd(X, d.put(dy), DX, n);
  EXPECT_LT(rel(d.get(DX, n), dx), 1e-6);

  V a = rnd(n), b = rnd(n);
  F fa = tof(a), fb = tof(b);
  float *A = d.put(a), *B = d.put(b), *S = d.poisoned(n);
  d.be->add(A, B, S, n);
  F s = d.get(S, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(s[i], fa[i] + fb[i]);
  d.be->add(A, B, A, n);  // y aliasing a
  EXPECT_EQ(d.get(A, n), s);
  d.be->scale(B, -0.75f, n);
  F sb = d.get(B, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(sb[i], fb[i] * -0.75f);
}

TEST(Elementwise, BroadcastAddAndItsBackward) {
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
  Dev d;
  float* H = d.put(h);
  d.be->add_bcast_fwd(H, d.put(e), B, HW, C);
  y = h;
  ref::add_bcast_fwd<double>(y.data(), e.data(), B, HW, C);
  EXPECT_LT(rel(d.get(H, h.size()), y), 3e-7);
  float* DE = d.poisoned(e.size());
  d.be->add_bcast_bwd(d.put(dh), DE, B, HW, C);
  EXPECT_LT(rel(d.get(DE, e.size()), de), 1e-6);
}

TEST(Elementwise, ScaleShift) {
  const int B = 2, HW = 6, C = 7;
  const size_t n = (size_t)B * HW * C;
  V x = rnd(n), ss = rnd((size_t)B * 2 * C), dy = rnd(n), y = nans(n);
  ref::scale_shift_fwd<double>(x.data(), ss.data(), y.data(), B, HW, C);
  for (int b = 0; b < B; ++b)
    for (int hw = 0; hw < HW; ++hw)
      for (int c = 0; c < C; ++c) {
        const size_t i = ((size_t)b * HW + hw) * C + c;
        ASSERT_NEAR(y[i], x[i] * (1 + ss[b * 2 * C + c]) + ss[b * 2 * C + C + c], 1e-15);
      }
  V dx = nans(n), dss = nans(ss.size());
  ref::scale_shift_bwd<double>(x.data(), ss.data(), dy.data(), dx.data(), dss.data(), B, HW, C);
  auto loss = [&] {
    ref::scale_shift_fwd<double>(x.data(), ss.data(), y.data(), B, HW, C);
    return dot(y, dy);
  };
  gradcheck("dx", x, dx, loss);
  gradcheck("dss", ss, dss, loss);
  Dev d;
  float *X = d.put(x), *SS = d.put(ss), *DY = d.put(dy), *DX = d.poisoned(n), *DSS = d.poisoned(ss.size());
  float* Y = d.poisoned(n);
  d.be->scale_shift_fwd(X, SS, Y, B, HW, C);
  ref::scale_shift_fwd<double>(x.data(), ss.data(), y.data(), B, HW, C);
  EXPECT_LT(rel(d.get(Y, n), y), 1e-6);
  d.be->scale_shift_fwd(X, SS, X, B, HW, C);  // in place
  EXPECT_EQ(d.get(X, n), d.get(Y, n));
  X = d.put(x);
  d.be->scale_shift_bwd(X, SS, DY, DX, nullptr, B, HW, C);
  EXPECT_LT(rel(d.get(DX, n), dx), 1e-6);
  d.be->scale_shift_bwd(X, SS, DY, nullptr, DSS, B, HW, C);
  EXPECT_LT(rel(d.get(DSS, ss.size()), dss), 1e-6);
}

// =============================== resampling, concat ===============================

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
  float *Y = d.poisoned(y.size()), *DX = d.poisoned(x.size());
  d.be->upsample2x_fwd(d.put(x), Y, B, H, W, C);
  EXPECT_EQ(d.get(Y, y.size()), tof(expect));
  d.be->upsample2x_bwd(d.put(dy), DX, B, H, W, C);
  EXPECT_LT(rel(d.get(DX, x.size()), dx), 1e-6);
}

TEST(Resample, AvgPool2x2IncludingOddSizes) {
  for (auto [H, W] : {std::pair{4, 6}, std::pair{5, 7}}) {
    const int B = 2, C = 3, Ho = H / 2, Wo = W / 2;
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
    float *Y = d.poisoned(y.size()), *DX = d.poisoned(x.size());
    d.be->avgpool2x2_fwd(d.put(x), Y, B, H, W, C);
    EXPECT_LT(rel(d.get(Y, y.size()), expect), 1e-6);
    d.be->avgpool2x2_bwd(d.put(dy), DX, B, H, W, C);
    EXPECT_LT(rel(d.get(DX, x.size()), dx), 3e-7);
  }
}

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
  float *Y = d.poisoned(y.size()), *DA = d.poisoned(a.size()), *DB = d.poisoned(b.size()), *DY = d.put(dy);
  d.be->concat_fwd(d.put(a), d.put(b), Y, B, HW, Ca, Cb);
  ref::concat_fwd<double>(a.data(), b.data(), y.data(), B, HW, Ca, Cb);  // y after gradcheck is stale
  EXPECT_EQ(d.get(Y, y.size()), tof(y));                                 // pure copies: exact
  d.be->concat_bwd(DY, DA, nullptr, B, HW, Ca, Cb);
  EXPECT_EQ(d.get(DA, a.size()), tof(da));
  d.be->concat_bwd(DY, nullptr, DB, B, HW, Ca, Cb);
  EXPECT_EQ(d.get(DB, b.size()), tof(db));
}

// =============================== embeddings ===============================

TEST(Embedding, TimestepClosedFormEvenAndOdd) {
  for (int dim : {32, 7, 1}) {
    SCOPED_TRACE(dim);
    const int B = 4, half = dim / 2;
    V t = {0, 1, 517, 999}, y = nans((size_t)B * dim), expect((size_t)B * dim, 0.0);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < half; ++i) {
        const double a = t[b] * std::exp(-std::log(10000.0) * i / half);
        expect[b * dim + i] = std::cos(a);  // cos first
        expect[b * dim + half + i] = std::sin(a);
      }
    ref::timestep_embedding<double>(t.data(), y.data(), B, dim);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], expect[i], 1e-12) << i;
    Dev d;
    float* Y = d.poisoned(y.size());
    d.be->timestep_embedding(d.put(t), Y, B, dim);
    F fy = d.get(Y, y.size());
    // float arguments t*f carry ~1e-7 relative error, i.e. up to ~1e-4 absolute at t = 999.
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(fy[i], expect[i], 5e-4) << i;
    if (dim % 2) {
      for (int b = 0; b < B; ++b) EXPECT_EQ(fy[b * dim + dim - 1], 0.0f);
    }
  }
}

TEST(Embedding, LabelTableAddAndScatterBackward) {
  const int B = 5, K = 4, D = 6;
  std::vector<int32_t> labels = {2, 0, 2, 3, 2};  // repeats must accumulate; label 1 unused
  V table = rnd((size_t)K * D), y0 = rnd((size_t)B * D), dy = rnd(y0.size());
  V y = y0;
  ref::embedding_add_fwd<double>(labels.data(), table.data(), y.data(), B, D);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < D; ++i) ASSERT_EQ(y[b * D + i], y0[b * D + i] + table[labels[b] * D + i]);
  V dt = nans(table.size());
  ref::embedding_bwd<double>(labels.data(), dy.data(), dt.data(), B, K, D);
  for (int i = 0; i < D; ++i) EXPECT_EQ(dt[1 * D + i], 0.0);
  gradcheck("dtable", table, dt, [&] {
    y = y0;
    ref::embedding_add_fwd<double>(labels.data(), table.data(), y.data(), B, D);
    return dot(y, dy);
  });
  Dev d;
  auto* L = static_cast<int32_t*>(d.be->alloc_bytes(B * sizeof(int32_t)));
  d.be->upload_bytes(L, labels.data(), B * sizeof(int32_t));
  float *Y = d.put(y0), *DT = d.poisoned(table.size());
  d.be->embedding_add_fwd(L, d.put(table), Y, B, D);
  y = y0;
  ref::embedding_add_fwd<double>(labels.data(), table.data(), y.data(), B, D);
  EXPECT_LT(rel(d.get(Y, y.size()), y), 3e-7);
  d.be->embedding_bwd(L, d.put(dy), DT, B, K, D);
  EXPECT_LT(rel(d.get(DT, dt.size()), dt), 1e-6);
}

// =============================== attention ===============================

struct AttnCase {
  int B, T, C, heads;
  bool legacy;
};
class Attention : public ::testing::TestWithParam<AttnCase> {};

// guided-diffusion's QKVAttention / QKVAttentionLegacy, literally, on qkv in torch layout [B, 3C, T].
V attention_torch(const V& qkv_t, int B, int T, int C, int H, bool legacy) {
  const int d = C / H;
  const double scale = 1 / std::sqrt(std::sqrt((double)d));
  V out_t((size_t)B * C * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      // new: q, k, v = qkv.chunk(3, dim=1), each .view(B*H, d, T)
      // legacy: qkv.reshape(B*H, 3d, T).split(d, dim=1)
      auto at = [&](int which, int c, int t) {
        const int ch = legacy ? h * 3 * d + which * d + c : which * C + h * d + c;
        return qkv_t[((size_t)b * 3 * C + ch) * T + t];
      };
      std::vector<V> w(T, V(T));
      for (int t = 0; t < T; ++t) {  // weight = einsum("bct,bcs->bts", q*scale, k*scale).softmax(-1)
        double mx = -INFINITY;
        for (int s = 0; s < T; ++s) {
          double z = 0;
          for (int c = 0; c < d; ++c) z += at(0, c, t) * scale * (at(1, c, s) * scale);
          w[t][s] = z;
          mx = std::max(mx, z);
        }
        double sum = 0;
        for (int s = 0; s < T; ++s) sum += (w[t][s] = std::exp(w[t][s] - mx));
        for (int s = 0; s < T; ++s) w[t][s] /= sum;
      }
      for (int c = 0; c < d; ++c)  // a = einsum("bts,bcs->bct", weight, v); reshape(B, C, T)
        for (int t = 0; t < T; ++t) {
          double a = 0;
          for (int s = 0; s < T; ++s) a += w[t][s] * at(2, c, s);
          out_t[((size_t)b * C + h * d + c) * T + t] = a;
        }
    }
  return out_t;
}

TEST_P(Attention, ForwardMatchesGuidedDiffusionFormula) {
  const AttnCase c = GetParam();
  V qkv_t = rnd((size_t)c.B * 3 * c.C * c.T, -2, 2);
  V out_t = attention_torch(qkv_t, c.B, c.T, c.C, c.heads, c.legacy);
  V qkv((size_t)c.B * c.T * 3 * c.C), expect((size_t)c.B * c.T * c.C);  // [B, T, ch] engine layout
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t) {
      for (int ch = 0; ch < 3 * c.C; ++ch)
        qkv[((size_t)b * c.T + t) * 3 * c.C + ch] = qkv_t[((size_t)b * 3 * c.C + ch) * c.T + t];
      for (int ch = 0; ch < c.C; ++ch)
        expect[((size_t)b * c.T + t) * c.C + ch] = out_t[((size_t)b * c.C + ch) * c.T + t];
    }
  V out = nans(expect.size()), attn = nans((size_t)c.B * c.heads * c.T * c.T);
  ref::attention_fwd<double>(qkv.data(), out.data(), attn.data(), c.B, c.T, c.C, c.heads, c.legacy);
  EXPECT_LT(rel(out, expect), 1e-13);
  for (int r = 0; r < c.B * c.heads * c.T; ++r) {  // saved weights: rows are distributions
    double s = 0;
    for (int u = 0; u < c.T; ++u) s += attn[(size_t)r * c.T + u];
    ASSERT_NEAR(s, 1.0, 1e-12);
  }
  Dev d;
  float *O = d.poisoned(out.size()), *A = d.poisoned(attn.size());
  d.be->attention_fwd(d.put(qkv), O, A, c.B, c.T, c.C, c.heads, c.legacy);
  EXPECT_LT(rel(d.get(O, out.size()), expect), kF32Tol);
  EXPECT_LT(rel(d.get(A, attn.size()), attn), kF32Tol);
}

TEST_P(Attention, GradientMatchesFiniteDifferences) {
  const AttnCase c = GetParam();
  const size_t nq = (size_t)c.B * c.T * 3 * c.C, no = (size_t)c.B * c.T * c.C,
               na = (size_t)c.B * c.heads * c.T * c.T;
  V qkv = rnd(nq, -2, 2), dout = rnd(no), out(no), attn(na);
  ref::attention_fwd<double>(qkv.data(), out.data(), attn.data(), c.B, c.T, c.C, c.heads, c.legacy);
  V dqkv = nans(nq);
  ref::attention_bwd<double>(qkv.data(), attn.data(), dout.data(), dqkv.data(), c.B, c.T, c.C, c.heads,
                             c.legacy);
  V a2(na);
  gradcheck("dqkv", qkv, dqkv, [&] {
    ref::attention_fwd<double>(qkv.data(), out.data(), a2.data(), c.B, c.T, c.C, c.heads, c.legacy);
    return dot(out, dout);
  });
  Dev d;
  float *Q = d.put(qkv), *O = d.poisoned(no), *A = d.poisoned(na), *DQ = d.poisoned(nq);
  d.be->attention_fwd(Q, O, A, c.B, c.T, c.C, c.heads, c.legacy);
  d.be->attention_bwd(Q, A, d.put(dout), DQ, c.B, c.T, c.C, c.heads, c.legacy);
  EXPECT_LT(rel(d.get(DQ, nq), dqkv), kF32Tol);
}

INSTANTIATE_TEST_SUITE_P(Orders, Attention,
                         ::testing::Values(AttnCase{2, 5, 8, 2, false}, AttnCase{2, 5, 8, 2, true},
                                           AttnCase{1, 7, 12, 3, false}, AttnCase{1, 7, 12, 3, true},
                                           AttnCase{2, 6, 4, 1, false}, AttnCase{2, 6, 4, 1, true},
                                           AttnCase{1, 20, 32, 2, false}, AttnCase{2, 18, 32, 2, true}));

// =============================== dropout, loss ===============================

TEST(Dropout, HashMaskScaleAndBackward) {
  const size_t n = 200000;
  const float p = 0.3f;
  const uint64_t seed = next_seed();
  Dev d;
  V x = rnd(n, 0.5, 1.5);  // nonzero, so a zero output means "dropped"
  F fx = tof(x);
  float *X = d.put(x), *Y = d.poisoned(n), *DX = d.poisoned(n);
  d.be->dropout_fwd(X, Y, n, p, seed);
  F y = d.get(Y, n);
  const float s = 1.0f / (1.0f - p);
  size_t dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool keep = unet::dropout_uniform(seed, i) >= p;
    ASSERT_EQ(y[i], keep ? fx[i] * s : 0.0f) << i;
    dropped += !keep;
  }
  EXPECT_NEAR((double)dropped / n, p, 0.01);
  d.be->dropout_bwd(X, DX, n, p, seed);  // dy = x: same mask, same scale
  EXPECT_EQ(d.get(DX, n), y);
  d.be->dropout_fwd(X, Y, n, 0.0f, seed);  // p = 0 is the identity
  EXPECT_EQ(d.get(Y, n), fx);
  d.be->dropout_fwd(X, Y, n, 0.3f, seed + 1);  // another seed, another mask
  EXPECT_NE(d.get(Y, n), y);

  const size_t m = 300;  // gradient check in double
  V xs = rnd(m), dy = rnd(m), ys(m), dxs = nans(m);
  ref::dropout_bwd<double>(dy.data(), dxs.data(), m, 0.4f, seed);
  gradcheck("dropout dx", xs, dxs, [&] {
    ref::dropout_fwd<double>(xs.data(), ys.data(), m, 0.4f, seed);
    return dot(ys, dy);
  });
}

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
  float *P = d.put(pred), *Tg = d.put(target), *L = d.poisoned(1), *DP = d.poisoned(n);
  d.be->mse_fwd_bwd(P, Tg, L, DP, n);
  EXPECT_NEAR(d.get(L, 1)[0], expect, 1e-6 * expect);
  EXPECT_LT(rel(d.get(DP, n), dpred), 1e-6);
}

// =============================== diffusion helpers ===============================

TEST(DiffusionOps, QSampleAxpbypczClamp) {
  const int B = 3;
  const size_t np = 50, n = B * np;
  V x0 = rnd(n), noise = rnd(n), sab = rnd(B, 0, 1), s1 = rnd(B, 0, 1);
  Dev d;
  float* XT = d.poisoned(n);
  d.be->q_sample(d.put(x0), d.put(noise), d.put(sab), d.put(s1), XT, B, np);
  F xt = d.get(XT, n);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(xt[i], sab[i / np] * x0[i] + s1[i / np] * noise[i], 1e-6);

  V x = rnd(n), y = rnd(n), z = rnd(n);
  float *Y = d.put(y), *X = d.put(x), *Z = d.put(z);
  d.be->axpbypcz(0.5f, X, -1.25f, Y, 2.0f, Z, n);
  F fy = d.get(Y, n);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(fy[i], 0.5 * x[i] - 1.25 * y[i] + 2 * z[i], 1e-6);
  Y = d.put(y);
  d.be->axpbypcz(0.5f, X, -1.25f, Y, 0.0f, nullptr, n);
  fy = d.get(Y, n);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(fy[i], 0.5 * x[i] - 1.25 * y[i], 1e-6);

  V c = rnd(n, -3, 3);
  float* Cc = d.put(c);
  d.be->clamp(Cc, -1.0f, 1.0f, n);
  F fc = d.get(Cc, n);
  size_t clipped = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(fc[i], (float)std::min(1.0, std::max(-1.0, (double)(float)c[i])));
    clipped += std::fabs(c[i]) > 1;
  }
  EXPECT_GT(clipped, 0u);
}

// =============================== optimizer ===============================

TEST(Optimizer, SumSquaresAndClipScale) {
  const size_t n = 100003;
  V x = rnd(n);
  double expect = 0;
  for (double v : x) expect += v * v;
  Dev d;
  float *S = d.poisoned(1), *N = d.poisoned(1), *G = d.poisoned(1);
  d.be->sum_squares(d.put(x), S, n);
  EXPECT_NEAR(d.get(S, 1)[0], expect, 1e-6 * expect);
  float* s16 = d.put({16.0});
  d.be->clip_scale(s16, 1.0f, N, G);
  EXPECT_FLOAT_EQ(d.get(N, 1)[0], 4.0f);
  EXPECT_FLOAT_EQ(d.get(G, 1)[0], 1.0f / (4.0f + 1e-6f));
  d.be->clip_scale(s16, 10.0f, N, G);
  EXPECT_EQ(d.get(G, 1)[0], 1.0f);
  d.be->clip_scale(s16, 0.0f, N, G);  // clipping off
  EXPECT_EQ(d.get(G, 1)[0], 1.0f);
  EXPECT_FLOAT_EQ(d.get(N, 1)[0], 4.0f);
}

TEST(Optimizer, AdamWTwoStepsMatchTorch) {
  // torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01) in float64,
  // with p.grad = g * 0.5 (the grad_scale), two steps; values printed by PyTorch 1.13.
  const V g1 = {0.2, -1.0, 0.0, 3.0}, g2 = {-0.4, 0.5, 1e-3, 3.0};
  const V p1 = {0.39950000999999902, -0.19970000199999993, 1.998, -0.099999999333333339};
  const V m1 = {0.0099999999999999985, -0.049999999999999989, 0, 0.14999999999999997};
  const V v1 = {1.0000000000000011e-05, 0.00025000000000000022, 0, 0.002250000000000002};
  const V p2 = {0.43571086037848888, -0.17286659870584631, 1.9215904217943287, -0.19989999866733266};
  const V m2 = {-0.010999999999999998, -0.019999999999999997, 4.9999999999999989e-05, 0.28499999999999992};
  const V v2 = {4.9990000000000055e-05, 0.0003122500000000003, 2.5000000000000027e-10, 0.0044977500000000035};
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, gs = 0.5;
  {  // double template: exact up to rounding
    V p = {0.5, -0.3, 2.0, 0.0}, m(4, 0.0), v(4, 0.0);
    ref::adamw<double>(p.data(), g1.data(), m.data(), v.data(), 4, lr, b1, b2, eps, wd, 1 - b1, 1 - b2, &gs);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(p[i], p1[i], 1e-12);
      EXPECT_NEAR(m[i], m1[i], 1e-15);
      EXPECT_NEAR(v[i], v1[i], 1e-15);
    }
    ref::adamw<double>(p.data(), g2.data(), m.data(), v.data(), 4, lr, b1, b2, eps, wd, 1 - b1 * b1,
                       1 - b2 * b2, &gs);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(p[i], p2[i], 1e-12);
      EXPECT_NEAR(m[i], m2[i], 1e-15);
      EXPECT_NEAR(v[i], v2[i], 1e-15);
    }
  }
  Dev d;  // float engine, grad_scale as a device scalar
  float *P = d.put({0.5, -0.3, 2.0, 0.0}), *M = d.alloc_zero(4), *Vv = d.alloc_zero(4), *GS = d.put({gs});
  d.be->adamw(P, d.put(g1), M, Vv, 4, lr, b1, b2, eps, wd, 1 - 0.9f, 1 - 0.999f, GS);
  d.be->adamw(P, d.put(g2), M, Vv, 4, lr, b1, b2, eps, wd, 1 - 0.9f * 0.9f, 1 - 0.999f * 0.999f, GS);
  // float: 1 - 0.999f is 0.00099998713..., so v carries ~1e-5 relative error
  EXPECT_LT(rel(d.get(P, 4), p2), kF32Tol);
  EXPECT_LT(rel(d.get(M, 4), m2), kF32Tol);
  EXPECT_LT(rel(d.get(Vv, 4), v2), 1e-4);
}

TEST(Optimizer, Ema) {
  const size_t n = 77;
  V e = rnd(n), p = rnd(n);
  Dev d;
  float* E = d.put(e);
  d.be->ema(E, d.put(p), 0.99f, n);
  F fe = d.get(E, n);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(fe[i], 0.99 * e[i] + 0.01 * p[i], 1e-6);
}

// =============================== determinism ===============================

// Every op with a reduction, run with 1, 2 and 3 threads: results must be bitwise identical.
TEST(Determinism, BitwiseIndependentOfThreadCount) {
  const int B = 3, H = 12, W = 10, Ci = 32, Co = 48, G = 8, T = 40, C = 32, heads = 2;
  const size_t nx = (size_t)B * H * W * Ci, ny = (size_t)B * H * W * Co;
  V x = rnd(nx), w = rnd((size_t)Co * 9 * Ci), bias = rnd(Co), dy = rnd(ny), gamma = rnd(Ci), beta = rnd(Ci);
  V wl = rnd((size_t)Co * Ci), qkv = rnd((size_t)B * T * 3 * C), dout = rnd((size_t)B * T * C);
  V big = rnd(300000), big2 = rnd(300000), ss = rnd((size_t)B * 2 * Ci);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Dev d;
    std::vector<F> r;
    float *X = d.put(x), *Wt = d.put(w), *DY = d.put(dy);
    for (int s : {1, 2}) {
      const int Ho = (H - 1) / s + 1, Wo = (W - 1) / s + 1;
      float *Y = d.poisoned((size_t)B * Ho * Wo * Co), *DX = d.poisoned(nx), *DW = d.poisoned(w.size()),
            *DB = d.poisoned(Co);
      d.be->conv2d_fwd(X, Wt, d.put(bias), Y, B, H, W, Ci, Co, 3, s);
      d.be->conv2d_bwd(X, Wt, DY, DX, DW, DB, B, H, W, Ci, Co, 3, s);
      r.push_back(d.get(Y, (size_t)B * Ho * Wo * Co));
      for (auto [p, n] : {std::pair{DX, nx}, std::pair{DW, w.size()}, std::pair{DB, (size_t)Co}})
        r.push_back(d.get(p, n));
    }
    float *Y = d.poisoned(nx), *M = d.poisoned(B * G), *R = d.poisoned(B * G), *DX = d.poisoned(nx),
          *DG = d.poisoned(Ci), *DBt = d.poisoned(Ci), *Ga = d.put(gamma), *Be = d.put(beta);
    d.be->groupnorm_fwd(X, Ga, Be, Y, M, R, B, H * W, Ci, G, true);
    d.be->groupnorm_bwd(X, Ga, Be, M, R, DY, DX, DG, DBt, B, H * W, Ci, G, true);
    for (auto [p, n] : {std::pair{Y, nx}, std::pair{M, (size_t)B * G}, std::pair{R, (size_t)B * G},
                        std::pair{DX, nx}, std::pair{DG, (size_t)Ci}, std::pair{DBt, (size_t)Ci}})
      r.push_back(d.get(p, n));
    const int N = B * H * W;  // linear over every pixel (a 1x1 conv as a GEMM)
    float *LY = d.poisoned((size_t)N * Co), *LDX = d.poisoned(nx), *LDW = d.poisoned(wl.size()),
          *LDB = d.poisoned(Co);
    float* WL = d.put(wl);
    d.be->linear_fwd(X, WL, d.put(bias), LY, N, Ci, Co);
    d.be->linear_bwd(X, WL, DY, LDX, LDW, LDB, N, Ci, Co);
    for (auto [p, n] : {std::pair{LY, (size_t)N * Co}, std::pair{LDX, nx}, std::pair{LDW, wl.size()},
                        std::pair{LDB, (size_t)Co}})
      r.push_back(d.get(p, n));
    float *Q = d.put(qkv), *O = d.poisoned(dout.size()), *A = d.poisoned((size_t)B * heads * T * T),
          *DQ = d.poisoned(qkv.size());
    d.be->attention_fwd(Q, O, A, B, T, C, heads, false);
    d.be->attention_bwd(Q, A, d.put(dout), DQ, B, T, C, heads, false);
    r.push_back(d.get(O, dout.size()));
    r.push_back(d.get(DQ, qkv.size()));
    float *S = d.poisoned(1), *L = d.poisoned(1), *DP = d.poisoned(big.size()), *BIG = d.put(big);
    d.be->sum_squares(BIG, S, big.size());
    d.be->mse_fwd_bwd(BIG, d.put(big2), L, DP, big.size());
    r.push_back(d.get(S, 1));
    r.push_back(d.get(L, 1));
    float *DE = d.poisoned((size_t)B * Ci), *DSS = d.poisoned((size_t)B * 2 * Ci);
    d.be->add_bcast_bwd(X, DE, B, H * W, Ci);
    d.be->scale_shift_bwd(X, d.put(ss), X, DX, DSS, B, H * W, Ci);
    r.push_back(d.get(DE, (size_t)B * Ci));
    r.push_back(d.get(DSS, (size_t)B * 2 * Ci));
    return r;
  };
  const int saved = omp_get_max_threads();
  const auto r1 = run(1), r2 = run(2), r3 = run(3);
  omp_set_num_threads(saved);
  ASSERT_EQ(r1.size(), r2.size());
  for (size_t i = 0; i < r1.size(); ++i) {
    ASSERT_EQ(r1[i].size(), r2[i].size());
    EXPECT_EQ(0, std::memcmp(r1[i].data(), r2[i].data(), r1[i].size() * 4))
        << "result " << i << " (1 vs 2 threads)";
    EXPECT_EQ(0, std::memcmp(r1[i].data(), r3[i].data(), r1[i].size() * 4))
        << "result " << i << " (1 vs 3 threads)";
  }
}

}  // namespace
