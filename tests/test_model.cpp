// Whole-model gradient checks on the CPU reference: for tiny configurations covering every
// flag, the analytic gradient of L = sum(out * dout) w.r.t. each parameter tensor is compared
// with a central finite difference along a random direction in that tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>

#include "engine.h"
#include "model.h"
#include "planner.h"
#include "testutil.h"

using namespace unet;

namespace {

struct Case {
  const char* name;
  ModelConfig cfg;
};

ModelConfig tiny_base() {
  ModelConfig c;
  c.image_size = 8;
  c.num_channels = 32;
  c.channel_mult = {1, 2};
  c.num_res_blocks = 1;
  c.attention_resolutions = {4};
  c.num_head_channels = 16;
  c.diffusion_steps = 1000;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"plain", tiny_base()});
  ModelConfig a = tiny_base();
  a.use_scale_shift_norm = true;
  a.resblock_updown = true;
  a.use_new_attention_order = false;
  a.num_head_channels = -1;
  a.num_heads = 2;
  a.learn_sigma = true;
  a.class_cond = true;
  a.num_classes = 3;
  v.push_back({"all_flags", a});
  ModelConfig b = tiny_base();
  b.channel_mult = {1, 1, 2};
  b.attention_resolutions = {8, 2};
  b.use_scale_shift_norm = true;
  b.dropout = 0.3f;
  b.class_cond = true;
  b.num_classes = 4;
  v.push_back({"three_levels_dropout", b});
  return v;
}

struct Fixture {
  std::unique_ptr<Engine> eng;
  ModelConfig cfg;
  std::unique_ptr<Model> model;
  int B = 2;
  std::vector<float> x, t, dout, params;
  std::vector<int32_t> labels;
  Tensor dx, dt, dy, ddout, dl;
  size_t n_in = 0, n_out = 0;

  // before_plan: adjusts the model's blocks before planning (a planning choice to compare).
  explicit Fixture(const ModelConfig& c, Precision prec = Precision::FP32,
                   const std::function<void(Model&)>& before_plan = {})
      : eng(make_cpu_engine(prec)), cfg(c) {
    model = std::make_unique<Model>(cfg, *eng);
    if (before_plan) before_plan(*model);
    model->plan(B, Mode::Train);
    uint64_t s = test::test_seed();
    const ParamTable& tab = model->table();
    params = test::random_params(tab, s + 1);
    eng->upload(model->params(), params.data());
    const int64_t R = cfg.image_size;
    n_in = (size_t)B * R * R * cfg.in_channels;
    n_out = (size_t)B * R * R * cfg.out_channels();
    x = test::randn(n_in, s + 2);
    dout = test::randn(n_out, s + 3);
    t = {17.0f, 803.0f};
    labels = {1, 2};
    dx = eng->alloc(DType::F32, {B, R, R, cfg.in_channels});
    dt = eng->alloc(DType::F32, {B});
    dy = eng->alloc(DType::F32, {B, R, R, cfg.out_channels()});
    ddout = eng->alloc(DType::F32, {B, R, R, cfg.out_channels()});
    dl = eng->alloc(DType::I32, {B});
    eng->upload(dx, x.data());
    eng->upload(dt, t.data());
    eng->upload(ddout, dout.data());
    eng->upload(dl, labels.data());
  }

  std::vector<float> out(bool train = true) {
    model->forward(dx, dt, dl, dy, train, 1234);
    std::vector<float> y(n_out);
    eng->download(y.data(), dy);
    return y;
  }
  double loss(bool train = true) {
    std::vector<float> y = out(train);
    double l = 0;
    for (size_t i = 0; i < n_out; ++i) l += (double)y[i] * dout[i];
    return l;
  }
  std::vector<float> grads() {
    model->backward(ddout);
    std::vector<float> g(model->table().total);
    eng->download(g.data(), model->grads());
    return g;
  }
  // Overwrites parameter tensor p with q (host floats).
  void set_param(const ParamInfo& p, const float* q) {
    eng->upload(model->params().flat(p.offset, p.numel), q);
  }
};

class ModelGrad : public ::testing::TestWithParam<int> {};

TEST_P(ModelGrad, EveryTensorMatchesFiniteDifferences) {
  Case c = cases()[GetParam()];
  SCOPED_TRACE(c.name);
  Fixture f(c.cfg);
  const ParamTable& tab = f.model->table();
  f.loss();
  std::vector<float> g = f.grads();
  const uint64_t s = test::test_seed() + 99;
  int checked = 0, bad = 0;
  // Float32 rounding of L limits how small h can be; Richardson extrapolation of two central
  // differences (h, h/2) cancels the O(h^2) term so h can stay large. Every third tensor (offset
  // varies with the seed) keeps the run short; the PyTorch golden test covers every gradient.
  double l_abs = 0;
  {
    std::vector<float> y = f.out();
    for (size_t i = 0; i < f.n_out; ++i) l_abs += std::fabs((double)y[i] * f.dout[i]);
  }
  const size_t phase = s % 3;
  for (size_t k = 0; k < tab.params.size(); ++k) {
    const ParamInfo& p = tab.params[k];
    if (k % 3 != phase && p.name.find("label_emb") == std::string::npos) continue;
    auto dir = test::randn(p.numel, s + k);
    double scale = 0;
    for (size_t i = 0; i < p.numel; ++i) scale = std::max(scale, (double)std::fabs(f.params[p.offset + i]));
    // 5e-3: larger steps meet GroupNorm's curvature on 2x2 maps (few elements per group).
    const double h = 5e-3 * std::max(scale, 1e-2);
    double analytic = 0;
    for (size_t i = 0; i < p.numel; ++i) analytic += (double)g[p.offset + i] * dir[i];
    auto at = [&](double step) {
      std::vector<float> q(p.numel);
      for (size_t i = 0; i < p.numel; ++i) q[i] = (float)(f.params[p.offset + i] + step * dir[i]);
      f.set_param(p, q.data());
      double l = f.loss();
      f.set_param(p, f.params.data() + p.offset);
      return l;
    };
    auto slope = [&](double hh) { return (at(hh) - at(-hh)) / (2 * hh); };
    const double numeric = (4 * slope(h / 2) - slope(h)) / 3;
    const double err = std::fabs(numeric - analytic);
    const double tol = 2e-2 * std::fabs(analytic) + 50 * 1.2e-7 * l_abs / h;
    ++checked;
    if (!(err <= tol)) {
      ++bad;
      ADD_FAILURE() << p.name << ": analytic " << analytic << " numeric " << numeric << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << "of " << checked;
}

INSTANTIATE_TEST_SUITE_P(Configs, ModelGrad, ::testing::Range(0, 3));

TEST(Model, ForwardIsDeterministicAndEvalSkipsDropout) {
  Case c = cases()[2];
  Fixture f(c.cfg);
  double a = f.loss(true), b = f.loss(true);
  EXPECT_EQ(a, b);
  double e1 = f.loss(false), e2 = f.loss(false);
  EXPECT_EQ(e1, e2);
  EXPECT_NE(a, e1);  // dropout 0.3 changes the training-mode output
}

TEST(Model, OutputShapeAndGradientsAreFinite) {
  Case c = cases()[1];
  Fixture f(c.cfg);
  double l = f.loss();
  EXPECT_TRUE(std::isfinite(l));
  std::vector<float> g = f.grads();
  for (auto& p : f.model->table().params) {
    double n = 0;
    for (size_t i = 0; i < p.numel; ++i) n += std::fabs(g[p.offset + i]);
    EXPECT_TRUE(std::isfinite(n)) << p.name;
    EXPECT_GT(n, 0) << p.name << " got no gradient";
  }
}

// The bf16 engine on the CPU emulates the GPU's rounding points: its output and gradients stay
// within bf16's tolerance of the fp32 run (activations rounded to 8 mantissa bits through ~20
// layers: a few 1e-3 relative), and they differ from it (the emulation is not a no-op).
TEST(Model, Bf16EmulationTracksFp32) {
  for (int k : {0, 1}) {
    Case c = cases()[k];
    SCOPED_TRACE(c.name);
    Fixture f32(c.cfg), b16(c.cfg, Precision::BF16);
    b16.params = f32.params;
    b16.eng->upload(b16.model->params(), f32.params.data());
    b16.x = f32.x, b16.dout = f32.dout;
    b16.eng->upload(b16.dx, f32.x.data());
    b16.eng->upload(b16.ddout, f32.dout.data());
    const std::vector<float> ya = f32.out(), yb = b16.out();
    const double eo = test::rel_l2(yb, ya);
    EXPECT_LT(eo, 2e-2);
    EXPECT_GT(eo, 1e-5);
    const std::vector<float> ga = f32.grads(), gb = b16.grads();
    // all gradients: over 40 seeds 0.017-0.021 (plain) and 0.019-0.027 (all_flags), 0.0301 at
    // UNET_TEST_SEED=1864359070 (all_flags; it failed the 3e-2 this had): bf16 rounding's tail
    EXPECT_LT(test::rel_l2(gb, ga), 4e-2) << "all gradients";
    // Per tensor, where the gradient is not ~0 by construction (a bias followed by a GroupNorm
    // whose groups are single channels gets an exactly-zero gradient, plus rounding noise).
    double mean_norm = 0;  // the largest tensor gradient norm
    for (auto& p : f32.model->table().params) {
      std::vector<float> a(ga.begin() + p.offset, ga.begin() + p.offset + p.numel);
      std::vector<float> b(gb.begin() + p.offset, gb.begin() + p.offset + p.numel);
      double na = 0;
      for (float v : a) na += (double)v * v;
      mean_norm = std::max(mean_norm, std::sqrt(na));
    }
    for (auto& p : f32.model->table().params) {
      std::vector<float> a(ga.begin() + p.offset, ga.begin() + p.offset + p.numel);
      std::vector<float> b(gb.begin() + p.offset, gb.begin() + p.offset + p.numel);
      double na = 0;
      for (float v : a) na += (double)v * v;
      if (std::sqrt(na) < 1e-3 * mean_norm) continue;
      EXPECT_LT(test::rel_l2(b, a), 8e-2) << p.name;
    }
  }
}

// Sampling plans no gradient or saved-for-backward memory: its arena is far smaller than the
// training arena of the same batch, and training's packing reuses memory (arena < sum of buffers).
TEST(Model, SamplingPlansLessMemoryThanTraining) {
  Case c = cases()[1];
  auto eng = make_cpu_engine();
  Model train(c.cfg, *eng), sample(c.cfg, *eng);
  train.plan(4, Mode::Train);
  sample.plan(4, Mode::Sample);
  EXPECT_GT(train.activation_bytes(), 0u);
  EXPECT_LT(sample.activation_bytes() * 2, train.activation_bytes())
      << train.plan_report() << sample.plan_report();
  EXPECT_FALSE(sample.grads().defined());
  EXPECT_TRUE(train.grads().defined());
}

// Model::set_backward_joins: how often the backward joins its lanes changes only what may overlap
// on a GPU; the plan follows the count its planning traced. On the CPU (ops in issue order) the
// gradients are bitwise the same for every count, re-planned or not.
TEST(Model, BackwardJoinsChangeNoGradient) {
  Case c = cases()[1];
  Fixture ref(c.cfg);
  ref.out();
  const std::vector<float> g0 = ref.grads();
  EXPECT_GT(test::rel_l2(g0, std::vector<float>(g0.size(), 0.f)), 0.1);
  for (int every : {1, 2, 100}) {
    SCOPED_TRACE(every);
    Fixture f(c.cfg, Precision::FP32, [&](Model& m) { m.set_backward_joins(every); });
    f.out();
    EXPECT_EQ(f.grads(), g0);
    f.model->set_backward_joins(3);  // taken by the next plan only
    f.out();
    EXPECT_EQ(f.grads(), g0);
    f.model->plan(f.B, Mode::Train);
    f.eng->upload(f.model->params(), f.params.data());
    f.out();
    EXPECT_EQ(f.grads(), g0);
  }
  EXPECT_THROW(ref.model->set_backward_joins(0), std::logic_error);
}

// A sampling plan's forward takes the first decoder layers' GroupNorm statistics from the skip
// concatenations (one pass that copies and sums), a training plan's from the norms' own passes:
// the same outputs within the statistics' summation order (fp32), and within the bf16
// emulation's rounding of a statistic that differs in its last bits.
TEST(Model, SamplingPlanGivesTheTrainingPlansForward) {
  for (int k : {0, 1, 2}) {
    Case c = cases()[k];
    SCOPED_TRACE(c.name);
    for (Precision p : {Precision::FP32, Precision::BF16}) {
      SCOPED_TRACE(precision_name(p));
      Fixture f(c.cfg, p);
      const std::vector<float> ya = f.out(false);
      Model sample(c.cfg, *f.eng);
      sample.plan(f.B, Mode::Sample);
      f.eng->upload(sample.params(), f.params.data());
      sample.forward(f.dx, f.dt, f.dl, f.dy, false);
      std::vector<float> yb(f.n_out);
      f.eng->download(yb.data(), f.dy);
      EXPECT_GT(test::rel_l2(ya, std::vector<float>(ya.size(), 0.f)), 0.1);
      EXPECT_LT(test::rel_l2(yb, ya), p == Precision::FP32 ? 1e-5 : 2e-2);
    }
  }
}

// Model::hold_weights (what a sampler turns on for its steps): in bf16 the GEMMs read a bf16 copy
// of the weights; while held, only the first forward makes it, so GEMM weights changed meanwhile
// are not seen (by design: a sampler does not change them); released, every forward makes it
// again, and holding again starts afresh. fp32 reads the weights themselves: holding changes
// nothing.
TEST(Model, HeldWeightsAreCastOnceUntilReleased) {
  for (Precision p : {Precision::BF16, Precision::FP32}) {
    SCOPED_TRACE(precision_name(p));
    Fixture f(cases()[0].cfg, p);
    const std::vector<float> before = f.params;
    std::vector<float> after = before;
    for (float& v : after) v *= 1.5f;
    f.model->hold_weights(true);
    const std::vector<float> y0 = f.out(false);
    f.eng->upload(f.model->params(), after.data());
    const std::vector<float> y_held = f.out(false);
    f.model->hold_weights(false);
    const std::vector<float> y_new = f.out(false);
    f.model->hold_weights(true);
    const std::vector<float> y_again = f.out(false);
    EXPECT_NE(y_new, y0);       // the new weights change the output
    EXPECT_EQ(y_again, y_new);  // holding again: cast once more, then the same
    if (p == Precision::BF16)  // the convolutions' held copy is of the old weights (the f32 ones,
      EXPECT_NE(y_held, y_new);  // biases, norms and the embedding MLP, are read as they are now)
    else
      EXPECT_EQ(y_held, y_new);
    f.model->hold_weights(false);
  }
}

// plan_bytes: the arena plan() allocates, without allocating; every buffer scales with the batch
// (what `unet sample` relies on to choose its largest batch from plan_bytes(1)).
TEST(Model, PlanBytesPredictsThePlannedArena) {
  for (int k : {0, 1}) {
    const Mode m = Mode::Sample;
    Case c = cases()[k];
    auto eng = make_cpu_engine();
    Model model(c.cfg, *eng);
    const size_t one = model.plan_bytes(1, m), four = model.plan_bytes(4, m);
    EXPECT_GT(one, 0u);
    EXPECT_NEAR((double)four, 4.0 * one, 0.01 * four);
    model.plan(4, m);
    EXPECT_EQ(model.activation_bytes(), four);
    EXPECT_THROW(model.plan_bytes(1, m), std::logic_error);
  }
}

// Training keeps the forward's normalized conv inputs for the filter gradients; UNET_RECOMPUTE=1
// (what plan() falls back to when the kept buffers do not fit) recomputes them in backward: the
// same gradients (the same kernels on the same saved statistics: to rounding, here bitwise) for
// less planned memory, for every block kind (resample, scale-shift, dropout, attention).
TEST(Model, RecomputingNormalizedInputsGivesTheSameGradientsWithLessMemory) {
  for (int k : {1, 2}) {
    Case c = cases()[k];
    SCOPED_TRACE(c.name);
    Fixture kept(c.cfg);
    setenv("UNET_RECOMPUTE", "1", 1);
    Fixture recomputed(c.cfg);
    unsetenv("UNET_RECOMPUTE");
    EXPECT_LT(recomputed.model->activation_bytes(), kept.model->activation_bytes());
    EXPECT_NE(recomputed.model->plan_report().find("recomputes"), std::string::npos);
    EXPECT_EQ(kept.model->plan_report().find("recomputes"), std::string::npos);
    const std::vector<float> ya = kept.out(), yb = recomputed.out();
    EXPECT_EQ(ya, yb);
    const std::vector<float> ga = kept.grads(), gb = recomputed.grads();
    EXPECT_LT(test::rel_l2(gb, ga), 1e-6);
    double n = 0;
    for (float v : ga) n += std::fabs(v);
    EXPECT_GT(n, 0);
  }
}

// A planning choice of where the conv bias gradients come from, off and on (set(model, on)), for
// every block kind, in fp32 and the bf16 emulation: the plan report names it only when on, the
// outputs are the same, the gradients the same up to summation order.
void expect_bias_gradients_either_way(const std::function<void(Model&, bool)>& set, const char* report) {
  for (int k : {0, 1, 2}) {
    Case c = cases()[k];
    SCOPED_TRACE(c.name);
    for (Precision p : {Precision::FP32, Precision::BF16}) {
      SCOPED_TRACE(precision_name(p));
      Fixture off(c.cfg, p, [&](Model& m) { set(m, false); });
      Fixture on(c.cfg, p, [&](Model& m) { set(m, true); });
      EXPECT_EQ(off.model->plan_report().find(report), std::string::npos);
      EXPECT_NE(on.model->plan_report().find(report), std::string::npos) << on.model->plan_report();
      EXPECT_EQ(off.out(), on.out());
      const std::vector<float> ga = off.grads(), gb = on.grads();
      EXPECT_LT(test::rel_l2(gb, ga), p == Precision::FP32 ? 1e-6 : 1e-3);
      EXPECT_GT(test::rel_l2(ga, std::vector<float>(ga.size(), 0.f)), 0.1);
    }
  }
}

// The conv bias gradients that the next layer's norm backward writes as the column totals of its
// dx (Blocks::link_bias, on with bf16 activations) vs the side lane's own column sums.
TEST(Model, BiasGradientsFromTheNextNormAreTheColumnSums) {
  expect_bias_gradients_either_way([](Model& m, bool on) { m.set_bias_from_next_norm(on); },
                                   "bias gradients from the next layer's norm");
}

// A ResBlock's conv bias and embedding gradients from its filter gradients (Blocks::bias_in_filter,
// on where those run on "wgmma" in tf32; forced here on the CPU) vs from the norms' dx passes
// (resampling, scale-shift: the biases only, dropout, attention).
TEST(Model, BiasGradientsFromTheFilterGradientsAreTheNormsColumnSums) {
  expect_bias_gradients_either_way([](Model& m, bool on) { m.set_bias_from_filter_grads(on); },
                                   "from their filter gradients");
}

// UNET_CONV_STATS=1: the conv in front of a layer's first GroupNorm (from one layer to the next,
// and the last layer to the out norm; a skip concatenation) also gives the norm's statistics, and the norm
// runs as GroupNormApply. The same outputs and gradients up to the statistics' rounding, for
// every block kind: in fp32 within 1e-5 (the dropout case's gradients 1e-4). In bf16 a statistic
// that differs in its last bit can round an activation the other way, which this small random
// network carries to ~1% of the output and gradients, so there the two are compared within
// 2e-2 / 3e-2, and each with the fp32 run within the bf16 emulation's tolerance of it (as in
// Bf16EmulationTracksFp32). Bounds from UNET_TEST_SEED runs: 1002 seeds (3430 for the dropout
// case), maxima below; ~2% of seeds failed the 1e-5 / 2e-2 / 3e-2 this had.
TEST(Model, ConvGivenNormStatisticsGiveTheSameResults) {
  for (int k : {0, 1, 2}) {
    Case c = cases()[k];
    SCOPED_TRACE(c.name);
    Fixture ref(c.cfg);
    const std::vector<float> y32 = ref.out(), g32 = ref.grads();
    EXPECT_GT(test::rel_l2(y32, std::vector<float>(y32.size(), 0.f)), 0.1);
    for (Precision p : {Precision::FP32, Precision::BF16}) {
      SCOPED_TRACE(precision_name(p));
      Fixture plain(c.cfg, p);
      setenv("UNET_CONV_STATS", "1", 1);
      Fixture given(c.cfg, p);
      unsetenv("UNET_CONV_STATS");
      const std::vector<float> ya = plain.out(), yb = given.out();
      const std::vector<float> ga = plain.grads(), gb = given.grads();
      if (p == Precision::FP32) {
        // Outputs <= 1.3e-6 (dropout case 4.9e-6); gradients <= 2.4e-6, but the dropout case's
        // have a seed-dependent tail (median 3.3e-6, 99th percentile 1.1e-5, 4.7e-5 at
        // UNET_TEST_SEED=396869233): seeds whose dropped channels leave the early layers'
        // gradients amplified from small upstream ones carry any difference in the statistics'
        // summation order that far; the plain path with groupnorm=ref against the default variant
        // (no conv statistics) differs as much there (2.5e-5).
        EXPECT_LT(test::rel_l2(yb, ya), 1e-5);
        EXPECT_LT(test::rel_l2(gb, ga), k == 2 ? 1e-4 : 1e-5);
        continue;
      }
      // bf16: the two ways against each other (mostly bitwise; statistics summed in another order
      // flip a few roundings): outputs <= 9.9e-3, gradients <= 1.7e-2 (UNET_TEST_SEED=615106352)...
      EXPECT_LT(test::rel_l2(yb, ya), 2e-2);
      if (k != 2) {
        EXPECT_LT(test::rel_l2(gb, ga), 3e-2);
      } else {
        // ...the dropout case's gradients by how far this seed's network carries bf16's rounding:
        // within twice the plain run's distance from fp32 (the given run's is not the scale: an
        // error there would widen it). Measured up to 1.06 times that (0.0296 vs 0.028 at
        // UNET_TEST_SEED=1304050581); 0.098 at UNET_TEST_SEED=3754187132, where it is 0.48.
        EXPECT_LT(test::rel_l2(gb, ga), 2 * test::rel_l2(ga, g32));
      }
      // ...and each against the fp32 run. Outputs: <= 0.0153 (dropout case 0.0328, and 0.0438 at
      // UNET_TEST_SEED=3754187132). Gradients (not the dropout case): <= 0.0301; the dropout
      // case's reach 0.51 (same seed): its dropped channels leave small gradients that bf16's
      // rounding dominates, so there the comparison with each other above is the check.
      const double ytol = k == 2 ? 7e-2 : 2e-2;
      EXPECT_LT(test::rel_l2(ya, y32), ytol);
      EXPECT_LT(test::rel_l2(yb, y32), ytol);
      if (k != 2) {
        EXPECT_LT(test::rel_l2(ga, g32), 6e-2);
        EXPECT_LT(test::rel_l2(gb, g32), 6e-2);
      }
    }
  }
}

// UNET_CAT_NORM (default on): in training each skip concatenation in front of a ResBlock is
// written by that block's GN1 from its two parts (GroupNormFwd's x2 / xcat) instead of by a copy
// pass of its own. The same outputs and gradients bitwise (the CPU variants normalise the
// concatenation they write), every block kind, fp32 and the bf16 emulation; the plan says so.
TEST(Model, SkipConcatenationsWrittenByTheNormGiveTheSameResults) {
  for (int k : {0, 1, 2})
    for (Precision p : {Precision::FP32, Precision::BF16}) {
      Case c = cases()[k];
      SCOPED_TRACE(std::string(c.name) + " " + precision_name(p));
      setenv("UNET_CAT_NORM", "0", 1);
      Fixture plain(c.cfg, p);
      setenv("UNET_CAT_NORM", "1", 1);
      Fixture cat(c.cfg, p);
      unsetenv("UNET_CAT_NORM");
      EXPECT_EQ(plain.model->plan_report().find("skip concatenations written"), std::string::npos);
      // (every decoder block: after a concatenation, a ResBlock first)
      const size_t blocks = c.cfg.channel_mult.size() * (size_t)(c.cfg.num_res_blocks + 1);
      EXPECT_NE(cat.model->plan_report().find(std::to_string(blocks) + " skip concatenations written by the GroupNorm"),
                std::string::npos)
          << cat.model->plan_report();
      const std::vector<float> ya = plain.out(), yb = cat.out();
      const std::vector<float> ga = plain.grads(), gb = cat.grads();
      EXPECT_GT(test::rel_l2(ya, std::vector<float>(ya.size(), 0.f)), 0.1);
      EXPECT_EQ(yb, ya);
      EXPECT_EQ(gb, ga);
    }
}

// UNET_FUSE_NORM=1: a ResBlock's convs apply the GroupNorm + SiLU in front of them as they read
// their input (ConvFwd / ConvBwdFilter norm; on the CPU every variant materialises it with the
// reference apply first), so the normalised activations are neither written in the forward nor
// kept: conv1 where no resampling comes between, conv2 where no dropout does. The same outputs and
// gradients as the separate norm pass, for every block kind, with less activation memory; kept
// and recomputed plans alike. With the GroupNorm ops on "ref" (the fused path's statistics and
// apply are the reference's) bitwise, in fp32 and in the bf16 emulation; with the default (avx)
// GroupNorm variants in fp32 within 1e-5 (the statistics summed in another order; the dropout
// case's gradients 1e-4).
TEST(Model, NormAppliedByTheConvsGivesTheSameResults) {
  for (int k : {0, 1, 2}) {
    Case c = cases()[k];
    SCOPED_TRACE(c.name);
    for (int v = 0; v < 3; ++v) {
      const Precision p = v == 1 ? Precision::BF16 : Precision::FP32;
      const bool ref = v < 2;
      for (const char* recompute : {"0", "1"}) {
        SCOPED_TRACE(std::string(precision_name(p)) + (ref ? " groupnorm=ref" : "") + " recompute " + recompute);
        set_kernel_overrides(ref ? "groupnorm=ref" : "");
        setenv("UNET_RECOMPUTE", recompute, 1);
        setenv("UNET_FUSE_NORM", "0", 1);
        Fixture plain(c.cfg, p);
        setenv("UNET_FUSE_NORM", "1", 1);
        Fixture fused(c.cfg, p);
        unsetenv("UNET_FUSE_NORM");
        unsetenv("UNET_RECOMPUTE");
        EXPECT_EQ(plain.model->plan_report().find("apply their GroupNorm"), std::string::npos);
        // tiny_base's 8 ResBlocks (2 levels of 1 + 2, 2 in the middle): every conv1 without
        // resampling, every conv2 without dropout
        const std::string report = fused.model->plan_report();
        const size_t at = report.find(" ResBlock convs apply their GroupNorm");
        ASSERT_NE(at, std::string::npos) << report;
        const size_t line = report.rfind('\n', at);
        const int n = std::stoi(report.substr(line == std::string::npos ? 0 : line + 1));
        EXPECT_GE(n, k == 2 ? 6 : 10) << report;
        EXPECT_LT(fused.model->activation_bytes(), plain.model->activation_bytes());
        const std::vector<float> ya = plain.out(), yb = fused.out();
        const std::vector<float> ga = plain.grads(), gb = fused.grads();
        set_kernel_overrides("");
        EXPECT_GT(test::rel_l2(ya, std::vector<float>(ya.size(), 0.f)), 0.1);
        if (ref) {
          EXPECT_EQ(yb, ya);
          EXPECT_EQ(gb, ga);
        } else {
          // (the dropout case's gradients: the seed-dependent tail the conv-statistics test above
          // describes; 1.16e-5 at UNET_TEST_SEED=3177424819)
          EXPECT_LT(test::rel_l2(yb, ya), 1e-5);
          EXPECT_LT(test::rel_l2(gb, ga), k == 2 ? 1e-4 : 1e-5);
        }
      }
    }
  }
}

}  // namespace
