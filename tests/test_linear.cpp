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

    Dev d;
    Tensor X = d.put(x, {N, I}), W = d.put(w, {O, I}), DY = d.put(dy, {N, O}), Y = d.poisoned({N, O});
    d.run(LinearFwd{X, W, d.put(b), Y});
    EXPECT_LT(rel(d.get(Y), expect), kF32Tol);
    Y = d.poisoned({N, O});
    d.run(LinearFwd{X, W, {}, Y});  // no bias
    F yn = d.get(Y);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < O; ++o) expect[n * O + o] -= b[o];
    EXPECT_LT(rel(yn, expect), kF32Tol);
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

}  // namespace
