// optimizer family: gradient norm, clip scale, the AdamW schedule and update, EMA —
// lib/ops/optimizer.h (reference), lib/ops/adamw_schedule.h (per-step scalars, shared with the
// kernel), lib/ops/optimizer.cpp (CPU), kernels/optimizer/ (CUDA); and the trainer's Optimizer.
#include "ops_common.h"
#include "optim.h"

using namespace opt;
using namespace unet;

namespace {

TEST(Optimizer, SumSquaresAndClipScale) {
  const size_t n = 100003;
  V x = rnd(n);
  double expect = 0;
  for (double v : x) expect += v * v;
  Dev d;
  Tensor S = d.poisoned({1}), N = d.poisoned({1}), G = d.poisoned({1});
  d.run(SumSquares{d.put(x), S});
  EXPECT_NEAR(d.get(S)[0], expect, 1e-6 * expect);
  Tensor s16 = d.put({16.0});
  d.run(ClipScale{s16, N, G, 1.0f});
  EXPECT_FLOAT_EQ(d.get(N)[0], 4.0f);
  EXPECT_FLOAT_EQ(d.get(G)[0], 1.0f / (4.0f + 1e-6f));
  d.run(ClipScale{s16, N, G, 10.0f});
  EXPECT_EQ(d.get(G)[0], 1.0f);
  d.run(ClipScale{s16, N, G, 0.0f});  // clipping off
  EXPECT_EQ(d.get(G)[0], 1.0f);
  EXPECT_FLOAT_EQ(d.get(N)[0], 4.0f);
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
  {  // double template with the step's scalars as the schedule defines them: exact up to rounding
    V p = {0.5, -0.3, 2.0, 0.0}, m(4, 0.0), v(4, 0.0);
    for (int t : {1, 2}) {
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      const V hyper = {1 - lr * wd, lr / bc1, std::sqrt(bc2)};
      ref::adamw<double>(p.data(), (t == 1 ? g1 : g2).data(), m.data(), v.data(), 4, hyper.data(), b1, b2,
                         eps, &gs);
      const V &pe = t == 1 ? p1 : p2, &me = t == 1 ? m1 : m2, &ve = t == 1 ? v1 : v2;
      for (int i = 0; i < 4; ++i) {
        EXPECT_NEAR(p[i], pe[i], 1e-12);
        EXPECT_NEAR(m[i], me[i], 1e-15);
        EXPECT_NEAR(v[i], ve[i], 1e-15);
      }
    }
  }
  // The float engine through the schedule op: the step counter advances on the device.
  Dev d;
  Tensor P = d.put({0.5, -0.3, 2.0, 0.0}), M = d.put(V(4, 0.0)), Vv = d.put(V(4, 0.0)), GS = d.put({gs});
  Tensor step = d.eng->alloc(DType::I32, {1}), hyper = d.poisoned({4});
  d.run(Fill{step, 0.f});
  for (const V* g : {&g1, &g2}) {
    d.run(AdamWSchedule{step, hyper, lr, wd, b1, b2, 0});
    d.run(AdamW{P, d.put(*g), M, Vv, hyper, GS, 0.9f, 0.999f, 1e-8f, {}, 0.f});
  }
  int32_t steps = 0;
  d.eng->download(&steps, step);
  EXPECT_EQ(steps, 2);
  EXPECT_FLOAT_EQ(d.get(hyper)[3], 0.1f);  // lr of the last step
  // float: 1 - 0.999f is 0.00099998713..., so v carries ~1e-5 relative error
  EXPECT_LT(rel(d.get(P), p2), kF32Tol);
  EXPECT_LT(rel(d.get(M), m2), kF32Tol);
  EXPECT_LT(rel(d.get(Vv), v2), 1e-4);
}

TEST(Optimizer, ScheduleWarmupAndHostView) {
  float hyper[4];
  for (int64_t t : {1, 5, 10, 11, 1000}) {
    ref::adamw_hyper(t, 1e-3, 0.1, 0.9, 0.999, 10, 0, hyper);
    const double lr_t = 1e-3 * std::min(1.0, (double)t / 10);
    EXPECT_FLOAT_EQ(hyper[3], (float)lr_t) << t;
    EXPECT_FLOAT_EQ(hyper[0], 1.f - (float)lr_t * 0.1f) << t;
    EXPECT_FLOAT_EQ(hyper[1], (float)lr_t / (float)(1 - std::pow(0.9, (double)t))) << t;
  }
  // --lr-anneal-steps: guided-diffusion's _anneal_lr, lr (1 - step / N) at the 0-based step of the
  // update (t - 1 here), 0 from step N on; times the warmup's factor where both are on.
  for (int64_t t : {1, 2, 50, 100, 101, 150}) {
    ref::adamw_hyper(t, 2e-4, 0.0, 0.9, 0.999, 0, 100, hyper);
    const double step = (double)(t - 1), lr_t = step < 100 ? 2e-4 * (1.0 - step / 100.0) : 0.0;
    EXPECT_FLOAT_EQ(hyper[3], (float)lr_t) << t;
    EXPECT_FLOAT_EQ(hyper[1], (float)lr_t / (float)(1 - std::pow(0.9, (double)t))) << t;
  }
  ref::adamw_hyper(5, 2e-4, 0.0, 0.9, 0.999, 10, 100, hyper);
  EXPECT_FLOAT_EQ(hyper[3], (float)(2e-4 * 0.5 * 0.96));
  // The trainer's Optimizer reports the same schedule for logging: {warmup, anneal, step, lr}.
  auto e = make_cpu_engine();
  const struct {
    int64_t warmup, anneal, step;
    float lr;
  } cases[] = {{10, 0, 0, 1e-4f},  {10, 0, 9, 1e-3f},   {10, 0, 50, 1e-3f},
               {0, 40, 0, 1e-3f},  {0, 40, 10, 7.5e-4f}, {0, 40, 39, 2.5e-5f}, {0, 40, 40, 0.f}};
  for (const auto& c : cases) {
    OptimizerOptions o;
    o.lr = 1e-3, o.warmup = c.warmup, o.anneal = c.anneal;
    EXPECT_FLOAT_EQ((float)Optimizer(*e, 8, o).lr_at(c.step), c.lr) << c.warmup << " " << c.anneal << " " << c.step;
  }
}

// AdamW's EMA (the optimizer's, in the same pass): ema = rate ema + (1 - rate) p of the updated p,
// and p, m, v exactly those of AdamW without it.
TEST(Optimizer, AdamWEma) {
  const size_t n = 77;
  V p = rnd(n), g = rnd(n), e = rnd(n), m(n, 0.0), v(n, 0.0);
  Dev d;
  const V h = {0.999, 1e-3, 0.3, 1e-4};
  Tensor hyper = d.put(h);
  Tensor P1 = d.put(p), M1 = d.put(m), V1 = d.put(v), E = d.put(e);
  Tensor P2 = d.put(p), M2 = d.put(m), V2 = d.put(v);
  d.run(AdamW{P1, d.put(g), M1, V1, hyper, {}, 0.9f, 0.999f, 1e-8f, E, 0.99f});
  d.run(AdamW{P2, d.put(g), M2, V2, hyper, {}, 0.9f, 0.999f, 1e-8f, {}, 0.f});
  const F p1 = d.get(P1), p2 = d.get(P2), fe = d.get(E);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(d.get(M1), d.get(M2));
  EXPECT_EQ(d.get(V1), d.get(V2));
  double moved = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(fe[i], 0.99 * e[i] + 0.01 * p1[i], 1e-6);
    moved += std::fabs(p1[i] - p[i]);
  }
  EXPECT_GT(moved, 0.0);
}

// shadow: the updated weights rounded to bf16 in the same pass, bit for bit what Cast makes of them.
TEST(Optimizer, AdamWShadowIsTheCastOfTheUpdatedWeights) {
  const size_t n = 133;
  V p = rnd(n), g = rnd(n), m(n, 0.0), v(n, 0.0);
  Dev d;
  const V h = {0.999, 1e-3, 0.3, 1e-4};
  Tensor P = d.put(p), M = d.put(m), Vv = d.put(v);
  Tensor S = d.eng->alloc(DType::BF16, {(int64_t)n}), C = d.eng->alloc(DType::BF16, {(int64_t)n});
  d.eng->ops().run(Fill{S, NAN});
  d.run(AdamW{P, d.put(g), M, Vv, d.put(h), {}, 0.9f, 0.999f, 1e-8f, {}, 0.f, S});
  d.eng->ops().run(Cast{P, C});
  std::vector<uint16_t> s(n), c(n);
  d.eng->download(s.data(), S);
  d.eng->download(c.data(), C);
  EXPECT_EQ(s, c);
  const F pn = d.get(P);
  double moved = 0;
  for (size_t i = 0; i < n; ++i) moved += std::fabs(pn[i] - p[i]);
  EXPECT_GT(moved, 0.0);
}

TEST(OptimizerVariants, AllOps) {
  SKIP_WITHOUT_GPU();
  const Tol f32{1e-6, 1e-6, 1e-6};
  for (int64_t n : {7, 22080000}) {
    const std::string w = std::to_string(n);
    check_variants<SumSquares>(
        "sum_squares " + w,
        [n](const Alloc& A, DType) {
          return SumSquares{A(DType::F32, {n}), A(DType::F32, {1})};
        },
        f32);
    // with the EMA in the same pass (the optimizer's), the bf16 copy, and (mode 3) the sum of
    // squared gradients of the early updates
    for (int mode : {0, 1, 2, 3})
      check_variants<AdamW>(
          std::string(mode == 0   ? "adamw "
                      : mode == 1 ? "adamw + ema "
                      : mode == 2 ? "adamw + ema + shadow "
                                  : "adamw + ema + gsq ") +
              w,
          [n, mode](const Alloc& A, DType) {
            const bool ema = mode > 0;
            return AdamW{A(DType::F32, {n}),
                         A(DType::F32, {n}),
                         A(DType::F32, {n}),
                         A(DType::F32, {n}),
                         A(DType::F32, {4}),
                         A(DType::F32, {1}),
                         0.9f,
                         0.999f,
                         1e-8f,
                         ema ? A(DType::F32, {n}) : Tensor{},
                         0.995f,
                         mode == 2 ? A(DType::BF16, {n}) : Tensor{},
                         mode == 3 ? A(DType::F32, {1}) : Tensor{}};
          },
          f32, [](Engine& e, AdamW& o) {  // moments >= 0 and a sane schedule
            std::vector<float> v = test::to_host(e, o.v), h = {0.999f, 1e-3f, 0.3f, 1e-4f}, s = {0.7f};
            for (float& x : v) x = x * x;
            test::from_host(e, o.v, v);
            e.upload(o.hyper, h.data());
            e.upload(o.scale, s.data());
          });
  }
  // one sum, and the optimizer's ranges' sums (added in order), with the scale clipping in both
  for (const std::vector<float>& sums : {std::vector<float>{9.0f}, std::vector<float>{4.0f, 3.0f, 2.0f}}) {
    const int64_t k = (int64_t)sums.size();
    check_variants<ClipScale>(
        "clip of " + std::to_string(k) + " sums",
        [k](const Alloc& A, DType) {
          return ClipScale{A(DType::F32, {k}), A(DType::F32, {1}), A(DType::F32, {1}), k == 1 ? 0.5f : 2.f};
        },
        f32, [&sums](Engine& e, ClipScale& o) { e.upload(o.sumsq, sums.data()); });
  }
  check_variants<AdamWSchedule>(
      "schedule",
      [](const Alloc& A, DType) {
        return AdamWSchedule{A(DType::I32, {1}), A(DType::F32, {4}), 2e-4, 0.05, 0.9, 0.999, 100, 250};
      },
      f32,
      [](Engine& e, AdamWSchedule& o) {
        const int32_t s = 41;
        e.upload(o.step, &s);
      });
}

}  // namespace
