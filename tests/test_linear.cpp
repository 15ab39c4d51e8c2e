// linear family: lib/ops/linear.h (reference), lib/ops/linear.cpp (CPU), kernels/linear/ (CUDA).
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Linear, ForwardBackwardFloatAndAbsentOutputs) {
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

    // The float outputs' error against the terms' magnitudes (sum |x w|, plus |b| with the bias):
    // at 1x7->1 an output can be a near-cancelling sum (UNET_TEST_SEED=1485193842 without the
    // bias: 5.1e-5 relative to the output itself), which no float dot product resolves better.
    auto rel_to_terms = [&](const F& got, bool bias) {
      double e2 = 0, m2 = 0;
      for (int n = 0; n < N; ++n)
        for (int o = 0; o < O; ++o) {
          double m = bias ? std::fabs(b[o]) : 0.0, want = bias ? b[o] : 0.0;
          for (int i = 0; i < I; ++i)
            m += std::fabs(x[n * I + i] * w[o * I + i]), want += x[n * I + i] * w[o * I + i];
          e2 += (got[n * O + o] - want) * (got[n * O + o] - want);
          m2 += m * m;
        }
      return std::sqrt(e2 / m2);
    };
    Dev d;
    Tensor X = d.put(x, {N, I}), W = d.put(w, {O, I}), DY = d.put(dy, {N, O}), Y = d.poisoned({N, O});
    d.run(LinearFwd{X, W, d.put(b), Y});
    EXPECT_LT(rel_to_terms(d.get(Y), true), kF32Tol);
    Y = d.poisoned({N, O});
    d.run(LinearFwd{X, W, {}, Y});  // no bias
    EXPECT_LT(rel_to_terms(d.get(Y), false), kF32Tol);
    Tensor DX = d.poisoned({N, I}), DW = d.poisoned({O, I}), DB = d.poisoned({O});
    d.run(LinearBwd{X, W, DY, DX, {}, {}});
    EXPECT_LT(rel(d.get(DX), dx), kF32Tol);
    d.run(LinearBwd{X, W, DY, {}, DW, DB});
    EXPECT_LT(rel(d.get(DW), dw), kF32Tol);
    EXPECT_LT(rel(d.get(DB), db), kF32Tol);
  }
}

// The model's linears are the f32 embedding MLP ([B, 4 num_channels]) and the ResBlocks' embedding
// projections; checked in f32 in every precision (tf32 GEMMs where the engine uses them).
TEST(LinearVariants, EmbeddingShapes) {
  SKIP_WITHOUT_GPU();
  for (auto [N, I, O] :
       {std::tuple{3, 5, 7}, std::tuple{32, 64, 256}, std::tuple{32, 256, 256}, std::tuple{32, 256, 384}}) {
    const std::string what =
        "linear " + std::to_string(N) + "x" + std::to_string(I) + "->" + std::to_string(O);
    check_variants<LinearFwd>(
        what + " fwd",
        [&, N = N, I = I, O = O](const Alloc& A, DType) {
          return LinearFwd{A(DType::F32, {N, I}), A(DType::F32, {O, I}), A(DType::F32, {O}),
                           A(DType::F32, {N, O})};
        },
        Tol{});
    check_variants<LinearBwd>(
        what + " bwd",
        [&, N = N, I = I, O = O](const Alloc& A, DType) {
          return LinearBwd{A(DType::F32, {N, I}), A(DType::F32, {O, I}), A(DType::F32, {N, O}),
                           A(DType::F32, {N, I}), A(DType::F32, {O, I}), A(DType::F32, {O})};
        },
        Tol{});
  }
}

// ---- linear groups ----

struct GroupCase {
  int N, I;
  std::vector<int> O;
};

// LinearGroupFwd/Bwd against the linears computed one by one in double, with dx_in separate from
// dx and dx_in aliasing dx (the running sum over several groups).
TEST(LinearGroup, MatchesItsLinearsOneByOne) {
  for (const GroupCase& c : {GroupCase{3, 5, {4, 1, 33}}, GroupCase{7, 40, {70, 32, 3, 64}}, GroupCase{1, 1, {1}}}) {
    SCOPED_TRACE(std::to_string(c.N) + "x" + std::to_string(c.I));
    const int N = c.N, I = c.I, n = (int)c.O.size();
    Dev d;
    const V x = rnd((size_t)N * I), din = rnd((size_t)N * I);
    const Tensor X = d.put(x, {N, I});
    LinearGroupFwd f{};
    LinearGroupBwd b{};
    f.x = b.x = X;
    V edx = din;
    std::vector<V> ey(n), edw(n), edb(n);
    for (int k = 0; k < n; ++k) {
      const int O = c.O[k];
      const V w = rnd((size_t)O * I), bias = rnd(O), dy = rnd((size_t)N * O);
      f.w[k] = b.w[k] = d.put(w, {O, I});
      f.b[k] = d.put(bias), f.y[k] = d.poisoned({N, O});
      b.dy[k] = d.put(dy, {N, O}), b.dw[k] = d.poisoned({O, I}), b.db[k] = d.poisoned({O});
      ey[k].assign((size_t)N * O, 0.0), edw[k].assign((size_t)O * I, 0.0), edb[k].assign(O, 0.0);
      for (int r = 0; r < N; ++r)
        for (int o = 0; o < O; ++o) {
          double s = bias[o];
          for (int i = 0; i < I; ++i) {
            s += x[(size_t)r * I + i] * w[(size_t)o * I + i];
            edx[(size_t)r * I + i] += dy[(size_t)r * O + o] * w[(size_t)o * I + i];
            edw[k][(size_t)o * I + i] += dy[(size_t)r * O + o] * x[(size_t)r * I + i];
          }
          ey[k][(size_t)r * O + o] = s;
          edb[k][o] += dy[(size_t)r * O + o];
        }
    }
    d.run(f);
    b.dx_in = d.put(din, {N, I}), b.dx = d.poisoned({N, I});
    d.run(b);
    for (int k = 0; k < n; ++k) {
      EXPECT_LT(rel(d.get(f.y[k]), ey[k]), kF32Tol) << k;
      EXPECT_LT(rel(d.get(b.dw[k]), edw[k]), kF32Tol) << k;
      EXPECT_LT(rel(d.get(b.db[k]), edb[k]), kF32Tol) << k;
    }
    EXPECT_LT(rel(d.get(b.dx), edx), kF32Tol);
    const F separate = d.get(b.dx);
    b.dx = b.dx_in = d.put(din, {N, I});  // in place
    d.run(b);
    EXPECT_EQ(d.get(b.dx), separate);
  }
}

// The CUDA variants ("tiled": one launch per pass; "cublas": a GEMM per linear) against the CPU
// engine: odd sizes (partial tiles everywhere), seed64's 22 embedding projections at batch 32,
// several row tiles with imagenet64's embedding width.
TEST(LinearGroupVariants, EmbeddingShapes) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> seed64{64,  64,  128, 128, 192, 192, 256, 256, 256, 256, 256,
                                256, 256, 192, 192, 192, 128, 128, 128, 64,  64,  64};
  for (const GroupCase& c : {GroupCase{3, 5, {7, 1, 40}}, GroupCase{32, 256, seed64},
                             GroupCase{70, 768, {384, 768, 100}}}) {
    const std::string what = "linear group " + std::to_string(c.N) + "x" + std::to_string(c.I) + " x" +
                             std::to_string(c.O.size());
    check_variants<LinearGroupFwd>(
        what + " fwd",
        [&](const Alloc& A, DType) {
          LinearGroupFwd f{};
          f.x = A(DType::F32, {c.N, c.I});
          for (size_t k = 0; k < c.O.size(); ++k)
            f.w[k] = A(DType::F32, {c.O[k], c.I}), f.b[k] = A(DType::F32, {c.O[k]}),
            f.y[k] = A(DType::F32, {c.N, c.O[k]});
          return f;
        },
        Tol{});
    check_variants<LinearGroupBwd>(
        what + " bwd",
        [&](const Alloc& A, DType) {
          LinearGroupBwd b{};
          b.x = A(DType::F32, {c.N, c.I}), b.dx_in = A(DType::F32, {c.N, c.I}), b.dx = A(DType::F32, {c.N, c.I});
          for (size_t k = 0; k < c.O.size(); ++k)
            b.w[k] = A(DType::F32, {c.O[k], c.I}), b.dy[k] = A(DType::F32, {c.N, c.O[k]}),
            b.dw[k] = A(DType::F32, {c.O[k], c.I}), b.db[k] = A(DType::F32, {c.O[k]});
          return b;
        },
        Tol{});
  }
}

}  // namespace
