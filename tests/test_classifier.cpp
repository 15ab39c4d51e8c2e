// guided-diffusion's noisy-image classifier (lib/model/classifier.h: EncoderUNetModel with the
// attention pool, built from the UNet's blocks):
//  * parameter names and shapes against scripts/classifier_torch.py's EncoderUNetModel for every
//    preset (strict state_dict equality);
//  * forward logits, every parameter gradient, the input gradient and the guidance gradient
//    (cond_fn: S * d log softmax(logits)[y] / dx) against the PyTorch transcription in float64, on
//    golden values made at test time from a fresh seed (three configurations covering scale-shift
//    on/off, ResBlock/conv downsampling, 1 and 3 input channels, fractional channel_mult, 1 to 4
//    heads, with and without attention resolutions; CPU fp32 and the bf16 emulation, CUDA when
//    present). Skips without python3 + torch + h5py;
//  * central finite differences of the float engine along random directions: of sum(logits * dout)
//    in the input and the weights, and of the guidance objective in the input;
//  * Mode::InputGrad (guidance: no parameter gradients) gives the input gradient of Mode::Train,
//    bitwise;
//  * CUDA (fp32, tf32, bf16) against the CPU engine on random weights (skips without a GPU).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>

#include "checkpoint.h"
#include "classifier.h"
#include "engine.h"
#include "h5.h"
#include "init.h"
#include "layout.h"
#include "testutil.h"

using namespace unet;
using test::rel_l2;

namespace {

using test::have_torch;
using test::run_python;
std::string script() { return test::source_dir() + "/scripts/classifier_torch.py"; }

// Golden configurations (classifier_torch.py flags). Every feature map has >= 64 channels (two
// per GroupNorm group; see scripts/make_golden.py).
const std::map<std::string, std::string> kGolden = {
    // scale-shift, ResBlock downsampling, attention at both resolutions; 2 heads in the blocks of
    // 64 channels, 4 in the pool; 10 classes.
    {"ss_updown",
     "--batch 2 --image-size 16 --classifier-width 64 --classifier-depth 1 --classifier-channel-mult 1,2 "
     "--classifier-attention-resolutions 16,8 --classifier-use-scale-shift-norm 1 "
     "--classifier-resblock-updown 1 "
     "--classifier-num-head-channels 32 --num-classes 10"},
    // plain ResBlocks (the embedding added), conv downsampling, 3 levels, one input channel,
    // 2 ResBlocks per level, attention at 8x8 only; 7 classes.
    {"plain_1ch",
     "--batch 3 --image-size 16 --in-channels 1 --classifier-width 64 --classifier-depth 2 "
     "--classifier-channel-mult 1,1,2 --classifier-attention-resolutions 8 --classifier-use-scale-shift-norm "
     "0 "
     "--classifier-resblock-updown 0 --classifier-num-head-channels 64 --num-classes 7"},
    // fractional multiplier (0.5 x 128 = 64), 192 channels in 3 heads, no attention resolutions (the
    // middle block's only), 1000 classes.
    {"frac_3heads",
     "--batch 2 --image-size 8 --classifier-width 128 --classifier-depth 1 --classifier-channel-mult 0.5,1.5 "
     "--classifier-attention-resolutions '' --classifier-use-scale-shift-norm 1 --classifier-resblock-updown "
     "1 "
     "--classifier-num-head-channels 64 --num-classes 1000"},
};

// Makes the golden file of a configuration (fresh seed); "" when python/torch is missing.
std::string make_golden(const std::string& name) {
  const std::string dir = test::temp_dir("classifier-golden");
  const std::string out = dir + "/" + name + ".h5";
  const uint64_t seed = test::test_seed() % 1000003;
  const std::string args =
      script() + " golden " + out + " --seed " + std::to_string(seed) + " --scale 2.5 " + kGolden.at(name);
  if (run_python(args) != 0) {
    ADD_FAILURE() << "classifier_torch.py golden failed: " << args;
    return "";
  }
  return out;
}

struct Golden {
  ClassifierConfig cfg;
  int B = 0;
  std::vector<float> w, gref, x, t, dout, logits, dx, guide;
  std::vector<int32_t> y;
  float scale = 0;
};

Golden read_golden(const std::string& path) {
  h5::File f = h5::File::open(path);
  Golden g;
  g.cfg = read_classifier_config(f);
  const ParamTable tab = build_param_table(g.cfg);
  g.w = read_param_group(f, "model", tab);  // strict: names and shapes of the PyTorch model
  g.gref = read_param_group(f, "grad", tab);
  auto xs = h5::shape(f, "x");
  g.B = (int)xs[0];
  const int C = (int)xs[1], H = (int)xs[2], W = (int)xs[3];
  auto nhwc = [&](const std::string& n) { return nchw_to_nhwc(h5::read_f32(f, n).data(), g.B, C, H, W); };
  g.x = nhwc("x"), g.dx = nhwc("dx"), g.guide = nhwc("guide");
  g.t = h5::read_f32(f, "t");
  g.dout = h5::read_f32(f, "dout");
  g.logits = h5::read_f32(f, "logits");
  for (int64_t v : h5::read_i64(f, "guide_y")) g.y.push_back((int32_t)v);
  g.scale = (float)h5::get_attr_f64(f, "/", "guide_scale");
  return g;
}

// One forward (+ backward of dout, or of the guidance objective when y is given) on an engine.
struct Outs {
  std::vector<float> logits, grads, dx;
};
Outs run(Engine& eng, const ClassifierConfig& cfg, const std::vector<float>& w, const std::vector<float>& x,
         const std::vector<float>& t, const std::vector<float>& dout, Mode mode,
         const std::vector<int32_t>* y = nullptr, float scale = 0) {
  Classifier c(cfg, eng);
  const int B = (int)t.size(), S = cfg.image_size, K = cfg.num_classes;
  c.plan(B, mode);
  eng.upload(c.params(), w.data());
  Tensor X = eng.alloc(DType::F32, {B, S, S, cfg.in_channels}), T = eng.alloc(DType::F32, {B});
  Tensor L = eng.alloc(DType::F32, {B, K}), D = eng.alloc(DType::F32, {B, K});
  eng.upload(X, x.data());
  eng.upload(T, t.data());
  eng.ops().run(Fill{L, NAN});
  c.forward(X, T, L);
  Outs r;
  r.logits.resize((size_t)B * K);
  eng.download(r.logits.data(), L);
  if (mode == Mode::Sample) return r;
  if (y) {
    Tensor Y = eng.alloc(DType::I32, {B});
    eng.upload(Y, y->data());
    eng.ops().run(CrossEntropy{L, Y, {}, D, -scale});  // S * d log softmax(l)[y] / dl
  } else {
    eng.upload(D, dout.data());
  }
  c.backward(D);
  r.dx.resize(x.size());
  eng.download(r.dx.data(), c.input_grad());
  if (mode == Mode::Train) {
    r.grads.resize(c.arena_floats());
    eng.download(r.grads.data(), c.grads());
  }
  return r;
}

struct Errs {
  double logits = 0, grad = 0, dx = 0, guide = 0;
  std::string worst;
};
Errs compare(Engine& eng, const Golden& g) {
  Errs e;
  const ParamTable tab = build_param_table(g.cfg);
  Outs r = run(eng, g.cfg, g.w, g.x, g.t, g.dout, Mode::Train);
  e.logits = rel_l2(r.logits, g.logits);
  e.dx = rel_l2(r.dx, g.dx);
  for (auto& p : tab.params) {
    const double v = rel_l2(r.grads.data() + p.offset, g.gref.data() + p.offset, p.numel);
    if (!(v <= e.grad)) e.grad = v, e.worst = p.name;
  }
  Outs gd = run(eng, g.cfg, g.w, g.x, g.t, {}, Mode::InputGrad, &g.y, g.scale);
  e.guide = rel_l2(gd.dx, g.guide);
  return e;
}

// Random weights everywhere (zero-initialised modules and GroupNorm affine too).
std::vector<float> random_weights(const ParamTable& tab, uint64_t seed) {
  std::vector<float> w = init_params(tab, seed);
  std::vector<float> n = test::randn(tab.total, seed + 17, 1.0f);
  for (auto& p : tab.params) {
    const bool norm = p.init == InitRule::Ones || (p.init == InitRule::Zeros && p.shape.size() == 1 &&
                                                   p.name.find(".out_layers.3.") == std::string::npos &&
                                                   p.name.find(".proj_out.") == std::string::npos);
    for (size_t i = 0; i < p.numel; ++i) {
      float& v = w[p.offset + i];
      if (p.init == InitRule::Ones)
        v = 1.0f + 0.2f * n[p.offset + i];
      else if (norm)
        v = 0.2f * n[p.offset + i];
      else if (p.init == InitRule::Zeros)
        v = 0.5f * n[p.offset + i] / std::sqrt((float)std::max<int64_t>(1, p.fan_in));
    }
  }
  return w;
}

ClassifierConfig small_config() {
  ClassifierConfig c;
  c.image_size = 8;
  c.width = 64;
  c.depth = 1;
  c.channel_mult = {1, 2};
  c.attention_resolutions = {8};
  c.num_head_channels = 32;
  c.num_classes = 6;
  return c;
}

}  // namespace

TEST(Classifier, ParamNamesAndShapesAreGuidedDiffusions) {
  if (!have_torch()) GTEST_SKIP() << "python3 with torch and h5py is not available";
  const std::string out = test::temp_dir("classifier-shapes") + "/shapes.txt";
  // One python run lists every preset's state_dict: "# preset" then "name shape" lines.
  ASSERT_EQ(
      run_python(
          "-c \"import sys; sys.path.insert(0, '" + test::source_dir() +
          "/scripts'); import classifier_torch as c\n"
          "for p in c.CLASSIFIER_PRESETS:\n"
          "    print('#', p)\n"
          "    [print(k, 'x'.join(map(str, s))) for k, s in c.classifier_state_dict_shapes(preset=p)]\" > " +
          out),
      0);
  std::ostringstream want;
  for (const std::string& preset : classifier_preset_names()) {
    want << "# " << preset << "\n";
    for (auto& p : build_param_table(classifier_preset(preset)).params) {
      std::string shape;
      for (size_t i = 0; i < p.shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(p.shape[i]);
      want << p.name << " " << shape << "\n";
    }
  }
  FILE* f = std::fopen(out.c_str(), "r");
  ASSERT_TRUE(f);
  std::string got;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) got.append(buf, n);
  std::fclose(f);
  EXPECT_EQ(got, want.str());
}

TEST(Classifier, CpuMatchesPyTorchFloat64) {
  if (!have_torch()) GTEST_SKIP() << "python3 with torch and h5py is not available";
  auto eng = make_cpu_engine();
  for (auto& [name, flags] : kGolden) {
    SCOPED_TRACE(name);
    const std::string path = make_golden(name);
    if (path.empty()) continue;
    const Golden g = read_golden(path);
    const Errs e = compare(*eng, g);
    // SPEC §5: fp32 forward within 1e-5 of PyTorch (relative L2), gradients within 1e-4.
    EXPECT_LT(e.logits, 1e-5) << "logits";
    EXPECT_LT(e.grad, 1e-4) << "worst parameter gradient: " << e.worst;
    EXPECT_LT(e.dx, 1e-4) << "input gradient";
    EXPECT_LT(e.guide, 1e-4) << "guidance gradient (cond_fn)";
    std::printf("[classifier golden] %s cpu: logits %.2e, worst grad %.2e (%s), dx %.2e, guide %.2e\n",
                name.c_str(), e.logits, e.grad, e.worst.c_str(), e.dx, e.guide);
  }
}

TEST(Classifier, CpuBf16EmulationWithinBf16Tolerance) {
  if (!have_torch()) GTEST_SKIP() << "python3 with torch and h5py is not available";
  auto eng = make_cpu_engine(Precision::BF16);
  const std::string path = make_golden("ss_updown");
  ASSERT_FALSE(path.empty());
  const Errs e = compare(*eng, read_golden(path));
  EXPECT_LT(e.logits, 3e-2);
  EXPECT_LT(e.grad, 1e-1) << e.worst;
  EXPECT_LT(e.dx, 1e-1);
  EXPECT_LT(e.guide, 1e-1);
  std::printf(
      "[classifier golden] ss_updown cpu bf16: logits %.2e, worst grad %.2e (%s), dx %.2e, guide %.2e\n",
      e.logits, e.grad, e.worst.c_str(), e.dx, e.guide);
}

// Central differences of the float engine along random directions (float32 forward: h ~ 1e-2 of
// the values keeps rounding ~1e-5 and truncation ~1e-4 of the derivative).
TEST(Classifier, GradientsMatchFiniteDifferences) {
  auto eng = make_cpu_engine();
  const ClassifierConfig cfg = small_config();
  const ParamTable tab = build_param_table(cfg);
  const uint64_t seed = test::test_seed();
  const std::vector<float> w = random_weights(tab, seed);
  const int B = 2, S = cfg.image_size, K = cfg.num_classes;
  const std::vector<float> x = test::randn((size_t)B * S * S * 3, seed + 1);
  const std::vector<float> t = {17.0f, 803.0f};
  const std::vector<float> dout = test::randn((size_t)B * K, seed + 2);
  const std::vector<int32_t> y = {(int32_t)(seed % K), (int32_t)((seed / 7) % K)};
  const float scale = 3.0f;
  auto L = [&](const std::vector<float>& ww, const std::vector<float>& xx) {
    Outs r = run(*eng, cfg, ww, xx, t, dout, Mode::Sample);
    double s = 0;
    for (size_t i = 0; i < r.logits.size(); ++i) s += (double)r.logits[i] * dout[i];
    return s;
  };
  auto J = [&](const std::vector<float>& xx) {  // guidance: S * sum_b log softmax(logits_b)[y_b]
    Outs r = run(*eng, cfg, w, xx, t, dout, Mode::Sample);
    double s = 0;
    for (int b = 0; b < B; ++b) {
      const float* l = r.logits.data() + (size_t)b * K;
      double mx = l[0], z = 0;
      for (int k = 1; k < K; ++k) mx = std::max(mx, (double)l[k]);
      for (int k = 0; k < K; ++k) z += std::exp((double)l[k] - mx);
      s += (double)l[y[b]] - mx - std::log(z);
    }
    return scale * s;
  };
  const Outs g = run(*eng, cfg, w, x, t, dout, Mode::Train);
  const Outs gg = run(*eng, cfg, w, x, t, dout, Mode::InputGrad, &y, scale);
  auto dot = [](const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += (double)a[i] * b[i];
    return s;
  };
  auto along = [](const std::vector<float>& v, const std::vector<float>& d, double h) {
    std::vector<float> o(v);
    for (size_t i = 0; i < v.size(); ++i) o[i] += (float)(h * d[i]);
    return o;
  };
  // Central differences at h and h/2 combined (Richardson, as test_model.cpp): the h^2 term
  // cancels. A joint step of every weight reaches the network's curvature (GroupNorm over 64
  // values, the attention softmax) enough that the plain central difference at h = 1e-2 missed by a
  // few percent for some seeds; smaller steps drown in the float32 forward's rounding instead. The
  // limit: 1% of the slope plus that rounding's floor, ~5 float32 ulps of the sum of |terms| of the
  // function over h (measured: ~1e-5 for J), plus the estimate's own truncation error, taken as
  // its change from step h to h/2 (compared at h/2): a direction almost orthogonal to the gradient
  // has a slope near the higher-order terms (UNET_TEST_SEED=1802208636, weights, direction 1:
  // slope 1.79e-3, the estimate at h = 1e-2 off by 5.8e-5, at 5e-3 by 1.2e-5).
  auto fd = [](const std::function<double(double)>& f, double h) {
    const double d1 = (f(h) - f(-h)) / (2 * h), d2 = (f(h / 2) - f(-h / 2)) / h;
    return (4 * d2 - d1) / 3;
  };
  double l_abs = 0, j_abs = 0;
  for (size_t i = 0; i < g.logits.size(); ++i)
    l_abs += std::fabs((double)g.logits[i] * dout[i]), j_abs += scale * std::fabs((double)g.logits[i]);
  auto check = [&](const std::function<double(double)>& f, double h, double analytic, double abs, const char* what) {
    const double coarse = fd(f, h), fine = fd(f, h / 2);
    const double lim = 1e-2 * std::fabs(fine) + 5 * 1.2e-7 * abs / (h / 2) + std::fabs(coarse - fine);
    EXPECT_NEAR(fine, analytic, lim) << what << " (estimate at h: " << coarse << ")";
  };
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE("direction " + std::to_string(k));
    // input
    const std::vector<float> vx = test::randn(x.size(), seed + 100 + k);
    const double hx = 1e-2;
    check([&](double h) { return L(w, along(x, vx, h)); }, hx, dot(g.dx, vx), l_abs, "d sum(logits*dout) / dx");
    check([&](double h) { return J(along(x, vx, h)); }, hx, dot(gg.dx, vx), j_abs, "guidance gradient");
    // weights: a direction scaled to each tensor's size (padding stays zero)
    std::vector<float> vw(tab.total, 0.0f);
    const std::vector<float> n = test::randn(tab.total, seed + 200 + k);
    for (auto& p : tab.params) {
      double ss = 0;
      for (size_t i = 0; i < p.numel; ++i) ss += (double)w[p.offset + i] * w[p.offset + i];
      const double rms = std::sqrt(ss / p.numel) + 1e-3;
      for (size_t i = 0; i < p.numel; ++i) vw[p.offset + i] = (float)(rms * n[p.offset + i]);
    }
    check([&](double h) { return L(along(w, vw, h), x); }, 1e-2, dot(g.grads, vw), l_abs,
          "d sum(logits*dout) / dweights");
  }
}

TEST(Classifier, InputGradModeEqualsTrainMode) {
  auto eng = make_cpu_engine();
  const ClassifierConfig cfg = small_config();
  const uint64_t seed = test::test_seed() + 5;
  const std::vector<float> w = random_weights(build_param_table(cfg), seed);
  const std::vector<float> x = test::randn((size_t)3 * 8 * 8 * 3, seed + 1), t = {0.f, 500.f, 999.f};
  const std::vector<float> dout = test::randn((size_t)3 * cfg.num_classes, seed + 2);
  const Outs a = run(*eng, cfg, w, x, t, dout, Mode::Train),
             b = run(*eng, cfg, w, x, t, dout, Mode::InputGrad);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.dx, b.dx);
  const Outs c = run(*eng, cfg, w, x, t, dout, Mode::Sample);
  EXPECT_EQ(a.logits, c.logits);
}

TEST(Classifier, CudaMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device found";
  auto cpu = make_cpu_engine();
  ClassifierConfig cfg = classifier_preset("tiny32");
  cfg.width = 64;  // >= 64 channels everywhere
  const uint64_t seed = test::test_seed() + 9;
  const std::vector<float> w = random_weights(build_param_table(cfg), seed);
  const int B = 4, S = cfg.image_size, K = cfg.num_classes;
  const std::vector<float> x = test::randn((size_t)B * S * S * 3, seed + 1), t = {3.f, 250.f, 640.f, 999.f};
  const std::vector<float> dout = test::randn((size_t)B * K, seed + 2);
  const std::vector<int32_t> y = {1, 4, 7, 9};
  const Outs ref = run(*cpu, cfg, w, x, t, dout, Mode::Train);
  const Outs refg = run(*cpu, cfg, w, x, t, dout, Mode::InputGrad, &y, 2.0f);
  for (Precision prec : {Precision::FP32, Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(prec));
    std::string why;
    auto eng = make_cuda_engine(prec, &why);
    ASSERT_TRUE(eng) << why;
    const Outs r = run(*eng, cfg, w, x, t, dout, Mode::Train);
    const Outs rg = run(*eng, cfg, w, x, t, dout, Mode::InputGrad, &y, 2.0f);
    const double to = prec == Precision::FP32 ? 1e-5 : prec == Precision::TF32 ? 1e-2 : 3e-2;
    const double tg = prec == Precision::FP32 ? 1e-4 : prec == Precision::TF32 ? 5e-2 : 1e-1;
    const double el = rel_l2(r.logits, ref.logits), eg = rel_l2(r.grads, ref.grads),
                 ex = rel_l2(r.dx, ref.dx), eq = rel_l2(rg.dx, refg.dx);
    EXPECT_LT(el, to) << "logits";
    EXPECT_LT(eg, tg) << "parameter gradients";
    EXPECT_LT(ex, tg) << "input gradient";
    EXPECT_LT(eq, tg) << "guidance gradient";
    std::printf("[classifier cuda vs cpu] %s: logits %.2e, grads %.2e, dx %.2e, guide %.2e\n",
                precision_name(prec), el, eg, ex, eq);
  }
}

TEST(Classifier, CudaMatchesPyTorchFloat64) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device found";
  if (!have_torch()) GTEST_SKIP() << "python3 with torch and h5py is not available";
  for (auto& [name, flags] : kGolden) {
    const std::string path = make_golden(name);
    if (path.empty()) continue;
    const Golden g = read_golden(path);
    for (Precision prec : {Precision::FP32, Precision::TF32}) {
      SCOPED_TRACE(name + " " + precision_name(prec));
      std::string why;
      auto eng = make_cuda_engine(prec, &why);
      ASSERT_TRUE(eng) << why;
      const Errs e = compare(*eng, g);
      const double to = prec == Precision::FP32 ? 1e-5 : 1e-2, tg = prec == Precision::FP32 ? 1e-4 : 5e-2;
      EXPECT_LT(e.logits, to);
      EXPECT_LT(e.grad, tg) << e.worst;
      EXPECT_LT(e.dx, tg);
      EXPECT_LT(e.guide, tg);
      std::printf("[classifier golden] %s %s: logits %.2e, worst grad %.2e (%s), dx %.2e, guide %.2e\n",
                  name.c_str(), precision_name(prec), e.logits, e.grad, e.worst.c_str(), e.dx, e.guide);
    }
  }
}

// plan_bytes for guidance's plan (InputGrad): what plan() then allocates, and linear in the batch
// (`unet sample` sizes its batch with the classifier's bytes per image).
TEST(Classifier, PlanBytesPredictsTheInputGradArena) {
  auto eng = make_cpu_engine();
  Classifier c(small_config(), *eng);
  const size_t one = c.plan_bytes(1, Mode::InputGrad), three = c.plan_bytes(3, Mode::InputGrad);
  EXPECT_GT(one, 0u);
  EXPECT_NEAR((double)three, 3.0 * one, 0.01 * three);
  c.plan(3, Mode::InputGrad);
  EXPECT_EQ(c.activation_bytes(), three);
}
