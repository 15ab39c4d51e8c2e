// attention family: guided-diffusion's QKVAttention / QKVAttentionLegacy — lib/ops/attention.h,
// lib/ops/attention.cpp (CPU), kernels/attention/ (CUDA). The forward saves the log-sum-exp of
// each query's logits; the backward recomputes the weights from it.
#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

struct AttnCase {
  int B, T, C, heads;
  bool legacy;
};
class Attention : public ::testing::TestWithParam<AttnCase> {};

// guided-diffusion's QKVAttention / QKVAttentionLegacy, literally, on qkv in torch layout [B, 3C, T];
// also returns each row's log-sum-exp of the scaled logits.
V attention_torch(const V& qkv_t, int B, int T, int C, int H, bool legacy, V* lse) {
  const int d = C / H;
  const double scale = 1 / std::sqrt(std::sqrt((double)d));
  V out_t((size_t)B * C * T);
  lse->assign((size_t)B * H * T, 0.0);
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
        (*lse)[((size_t)b * H + h) * T + t] = mx + std::log(sum);
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
  V qkv_t = rnd((size_t)c.B * 3 * c.C * c.T, -2, 2), lse_expect;
  V out_t = attention_torch(qkv_t, c.B, c.T, c.C, c.heads, c.legacy, &lse_expect);
  V qkv((size_t)c.B * c.T * 3 * c.C), expect((size_t)c.B * c.T * c.C);  // [B, T, ch] engine layout
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t) {
      for (int ch = 0; ch < 3 * c.C; ++ch)
        qkv[((size_t)b * c.T + t) * 3 * c.C + ch] = qkv_t[((size_t)b * 3 * c.C + ch) * c.T + t];
      for (int ch = 0; ch < c.C; ++ch)
        expect[((size_t)b * c.T + t) * c.C + ch] = out_t[((size_t)b * c.C + ch) * c.T + t];
    }
  V out = nans(expect.size()), lse = nans((size_t)c.B * c.heads * c.T);
  ref::attention_fwd<double>(qkv.data(), out.data(), lse.data(), c.B, c.T, c.C, c.heads, c.legacy);
  EXPECT_LT(rel(out, expect), 1e-13);
  EXPECT_LT(rel(lse, lse_expect), 1e-13);
  Dev d;
  Tensor O = d.poisoned({c.B, c.T, 1, c.C}), L = d.poisoned({c.B, c.heads, c.T});
  d.run(AttentionFwd{d.put(qkv, {c.B, c.T, 1, 3 * c.C}), O, L, c.legacy});
  EXPECT_LT(rel(d.get(O), expect), kF32Tol);
  EXPECT_LT(rel(d.get(L), lse), kF32Tol);
}

TEST_P(Attention, GradientMatchesFiniteDifferences) {
  const AttnCase c = GetParam();
  const size_t nq = (size_t)c.B * c.T * 3 * c.C, no = (size_t)c.B * c.T * c.C,
               nl = (size_t)c.B * c.heads * c.T;
  V qkv = rnd(nq, -2, 2), dout = rnd(no), out(no), lse(nl);
  ref::attention_fwd<double>(qkv.data(), out.data(), lse.data(), c.B, c.T, c.C, c.heads, c.legacy);
  V dqkv = nans(nq);
  ref::attention_bwd<double>(qkv.data(), lse.data(), dout.data(), dqkv.data(), c.B, c.T, c.C, c.heads,
                             c.legacy);
  V l2(nl);
  gradcheck("dqkv", qkv, dqkv, [&] {
    ref::attention_fwd<double>(qkv.data(), out.data(), l2.data(), c.B, c.T, c.C, c.heads, c.legacy);
    return dot(out, dout);
  });
  Dev d;
  Tensor Q = d.put(qkv, {c.B, c.T, 1, 3 * c.C}), O = d.poisoned({c.B, c.T, 1, c.C}),
         L = d.poisoned({c.B, c.heads, c.T});
  Tensor DQ = d.poisoned({c.B, c.T, 1, 3 * c.C});
  d.run(AttentionFwd{Q, O, L, c.legacy});
  d.run(AttentionBwd{Q, O, L, d.put(dout, {c.B, c.T, 1, c.C}), DQ, c.legacy});
  EXPECT_LT(rel(d.get(DQ), dqkv), kF32Tol);
}

INSTANTIATE_TEST_SUITE_P(Orders, Attention,
                         ::testing::Values(AttnCase{2, 5, 8, 2, false}, AttnCase{2, 5, 8, 2, true},
                                           AttnCase{1, 7, 12, 3, false}, AttnCase{1, 7, 12, 3, true},
                                           AttnCase{2, 6, 4, 1, false}, AttnCase{2, 6, 4, 1, true},
                                           AttnCase{1, 20, 32, 2, false}, AttnCase{2, 18, 32, 2, true}));

// ---- CUDA variants: two chained GEMMs per pass ----

void check_attn(const std::string& what, int B, int H, int C, int heads, bool legacy) {
  const int T = H * H;
  const Tol tol{1e-5, 3e-3, 2e-2};
  // Inputs of a realistic scale (qkv of a normalised activation through a 1x1 conv).
  auto scale = [](Engine& e, Tensor& t) {
    std::vector<float> v = test::randn(t.numel(), test::test_seed() + 5, 0.5f);
    test::from_host(e, t, v);
  };
  check_variants<AttentionFwd>(
      what + " fwd",
      [&](const Alloc& A, DType act) {
        return AttentionFwd{A(act, {B, H, H, 3 * C}), A(act, {B, H, H, C}), A(DType::F32, {B, heads, T}),
                            legacy};
      },
      tol, [&](Engine& e, AttentionFwd& o) { scale(e, o.qkv); });
  check_variants<AttentionBwd>(
      what + " bwd",
      [&](const Alloc& A, DType act) {
        return AttentionBwd{A(act, {B, H, H, 3 * C}), A(act, {B, H, H, C}),     A(DType::F32, {B, heads, T}),
                            A(act, {B, H, H, C}),     A(act, {B, H, H, 3 * C}), legacy};
      },
      tol,
      [&](Engine& e, AttentionBwd& o) {
        scale(e, o.qkv);
        e.ops().run(AttentionFwd{o.qkv, o.out, o.lse, legacy});
      });
}

TEST(AttentionVariants, SmallAndSeed64Shapes) {
  SKIP_WITHOUT_GPU();
  check_attn("odd new", 2, 3, 12, 3, false);
  check_attn("odd legacy", 2, 3, 12, 3, true);
  std::set<std::string> seen;
  each_seed64_layer([&](const Layer& l) {
    if (l.kind != Layer::Attn) return;
    const std::string k = std::to_string(l.res) + "_" + std::to_string(l.cin) + "_" + std::to_string(l.heads);
    if (seen.insert(k).second) check_attn(l.prefix + " " + k, 32, l.res, l.cin, l.heads, false);
  });
  EXPECT_GE(seen.size(), 2u);
}

// ---- fast CPU variants vs the CPU reference ----

int check_attn_cpu(const std::string& what, int B, int H, int W, int C, int heads, bool legacy,
                   std::vector<Precision> precs = {Precision::FP32, Precision::BF16}, float mag = 0.5f,
                   Tol tol = kCpuTol) {
  const int T = H * W;
  auto scale = [mag](Engine& e, Tensor& t) {
    std::vector<float> v = test::randn(t.numel(), test::test_seed() + 5, mag);
    test::from_host(e, t, v);
  };
  int n = check_cpu_variants<AttentionFwd>(
      what + " fwd",
      [&](const Alloc& A, DType act) {
        return AttentionFwd{A(act, {B, H, W, 3 * C}), A(act, {B, H, W, C}), A(DType::F32, {B, heads, T}),
                            legacy};
      },
      tol, [&](Engine& e, AttentionFwd& o) { scale(e, o.qkv); }, precs);
  n += check_cpu_variants<AttentionBwd>(
      what + " bwd",
      [&](const Alloc& A, DType act) {
        return AttentionBwd{A(act, {B, H, W, 3 * C}), A(act, {B, H, W, C}),     A(DType::F32, {B, heads, T}),
                            A(act, {B, H, W, C}),     A(act, {B, H, W, 3 * C}), legacy};
      },
      tol,
      [&](Engine& e, AttentionBwd& o) {
        scale(e, o.qkv);
        e.base_ops().run_variant(AttentionFwd{o.qkv, o.out, o.lse, legacy}, "ref");
      },
      precs);
  return n;
}

TEST(AttentionCpuVariants, SmallOddShapes) {
  int n = 0;
  for (bool legacy : {false, true}) {
    const std::string k = legacy ? " legacy" : " new";
    n += check_attn_cpu("T9 d4" + k, 2, 3, 3, 12, 3, legacy);
    n += check_attn_cpu("T1 d8" + k, 3, 1, 1, 8, 1, legacy);
    n += check_attn_cpu("T17 d24" + k, 2, 17, 1, 48, 2, legacy);
    n += check_attn_cpu("T40 d16" + k, 1, 5, 8, 32, 2, legacy);
    n += check_attn_cpu("T70 d5" + k, 1, 7, 10, 15, 3, legacy);
    // logits of a few hundred: most softmax weights underflow to 0 (and to denormals); a logit's
    // rounding (~1e-7 of a few hundred) moves its weight by ~1e-5, so the gradient's tolerance is 5e-5
    n += check_attn_cpu("T33 d64 peaked" + k, 1, 3, 11, 128, 2, legacy, {Precision::FP32, Precision::BF16},
                        4.0f, Tol{5e-5, 5e-5, 2e-3});
  }
  if (n == 0) GTEST_SKIP() << "no fast CPU variant on this CPU";
}

TEST(AttentionCpuVariants, EveryTiny32ShapeAtBatch16) {
  const ModelConfig cfg = preset("tiny32");
  std::set<std::string> seen;
  int n = 0;
  each_layer(build_arch(cfg), [&](const Layer& l) {
    if (l.kind != Layer::Attn) return;
    const std::string k = std::to_string(l.res) + "_" + std::to_string(l.cin) + "_" + std::to_string(l.heads);
    if (seen.insert(k).second)
      for (bool legacy : {false, true})
        n += check_attn_cpu(l.prefix + " " + k, 16, l.res, l.res, l.cin, l.heads, legacy, {Precision::FP32});
  });
  EXPECT_GE(seen.size(), 1u);
  if (n == 0) GTEST_SKIP() << "no fast CPU variant on this CPU";
}

}  // namespace
