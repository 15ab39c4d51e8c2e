// embedding family: the sinusoidal timestep embedding and the label embedding — lib/ops/embedding.h,
// lib/ops/embedding.cpp (CPU), kernels/embedding/ (CUDA).
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

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
    if (dim % 2) continue;  // the op takes even widths (the model's is 4 x num_channels)
    Dev d;
    Tensor Y = d.poisoned({B, dim});
    d.run(TimestepEmbedding{d.put(t), Y});
    F fy = d.get(Y);
    // float arguments t*f carry ~1e-7 relative error, i.e. up to ~1e-4 absolute at t = 999.
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(fy[i], expect[i], 5e-4) << i;
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
  Tensor L = d.labels(labels), Y = d.put(y0, {B, D}), DT = d.poisoned({K, D});
  d.run(EmbeddingAdd{L, d.put(table, {K, D}), Y});
  y = y0;
  ref::embedding_add_fwd<double>(labels.data(), table.data(), y.data(), B, D);
  EXPECT_LT(rel(d.get(Y), y), 3e-7);
  d.run(EmbeddingBwd{L, d.put(dy, {B, D}), DT});
  EXPECT_LT(rel(d.get(DT), dt), 1e-6);
}

TEST(EmbeddingVariants, Shapes) {
  SKIP_WITHOUT_GPU();
  for (auto [B, D, K] : {std::tuple{3, 8, 4}, std::tuple{32, 256, 10}, std::tuple{32, 768, 1000}}) {
    const std::string w = std::to_string(B) + "x" + std::to_string(D);
    auto labels = [B = B, K = K](Engine& e, const Tensor& l) {
      std::vector<int32_t> v(B);
      for (int i = 0; i < B; ++i) v[i] = (int32_t)((i * 7 + 3) % K);  // repeats when B > K
      e.upload(l, v.data());
    };
    // Time steps up to 999: the fp32 argument reaches 1e3, where the CPU's and GPU's cosf/sinf
    // may differ by an ulp of the argument (~6e-5 absolute).
    check_variants<TimestepEmbedding>(
        "timestep " + w,
        [B = B, D = D](const Alloc& A, DType) {
          return TimestepEmbedding{A(DType::F32, {B}), A(DType::F32, {B, D})};
        },
        Tol{1e-4, 1e-4, 1e-4},
        [](Engine& e, TimestepEmbedding& o) {
          std::vector<float> t(o.t.numel());
          for (size_t i = 0; i < t.size(); ++i) t[i] = (float)((i * 397) % 1000);
          e.upload(o.t, t.data());
        });
    check_variants<EmbeddingAdd>(
        "label add " + w,
        [B = B, D = D, K = K](const Alloc& A, DType) {
          return EmbeddingAdd{A(DType::I32, {B}), A(DType::F32, {K, D}), A(DType::F32, {B, D})};
        },
        Tol{0, 0, 0}, [&](Engine& e, EmbeddingAdd& o) { labels(e, o.labels); });
    // Both sum the rows of a label in batch order, from zero: bitwise equal.
    check_variants<EmbeddingBwd>(
        "label bwd " + w,
        [B = B, D = D, K = K](const Alloc& A, DType) {
          return EmbeddingBwd{A(DType::I32, {B}), A(DType::F32, {B, D}), A(DType::F32, {K, D})};
        },
        Tol{0, 0, 0}, [&](Engine& e, EmbeddingBwd& o) { labels(e, o.labels); });
  }
}

}  // namespace
