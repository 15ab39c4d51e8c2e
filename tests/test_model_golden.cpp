// Parity with the PyTorch model (scripts/unet_torch.py, guided-diffusion's structure): forward
// output and every parameter gradient on golden files made by scripts/make_golden.py in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint.h"
#include "engine.h"
#include "h5.h"
#include "layout.h"
#include "model.h"
#include "testutil.h"

using namespace unet;

namespace {

std::vector<std::string> golden_files() {
  std::vector<std::string> v;
  std::string dir = test::source_dir() + "/testdata/golden";
  if (!std::filesystem::is_directory(dir)) return v;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".h5") v.push_back(e.path().string());
  std::sort(v.begin(), v.end());
  return v;
}

// Runs one golden file on a backend; returns (out rel err, worst grad rel err, its name).
struct Result {
  double out_err = 0, grad_err = 0;
  std::string worst;
};

Result run_golden(Engine& eng, const std::string& path) {
  h5::File f = h5::File::open(path);
  ModelConfig cfg = read_config(f);
  Model model(cfg, eng);
  const ParamTable& tab = model.table();
  std::vector<float> w = read_param_group(f, "model", tab);
  std::vector<float> gref = read_param_group(f, "grad", tab);
  auto xs = h5::shape(f, "x");
  const int B = (int)xs[0], C = (int)xs[1], H = (int)xs[2], W = (int)xs[3], Co = cfg.out_channels();
  auto x = nchw_to_nhwc(h5::read_f32(f, "x").data(), B, C, H, W);
  auto t = h5::read_f32(f, "t");
  auto dout = nchw_to_nhwc(h5::read_f32(f, "dout").data(), B, Co, H, W);
  auto out_ref = nchw_to_nhwc(h5::read_f32(f, "out").data(), B, Co, H, W);
  std::vector<int32_t> labels(B, 0);
  if (cfg.class_cond) {
    auto l = h5::read_i64(f, "labels");
    for (int i = 0; i < B; ++i) labels[i] = (int32_t)l[i];
  }
  model.plan(B, Mode::Train);
  eng.upload(model.params(), w.data());
  Tensor dx = eng.alloc(DType::F32, {B, H, W, C}), dt = eng.alloc(DType::F32, {B});
  Tensor dy = eng.alloc(DType::F32, {B, H, W, Co}), dd = eng.alloc(DType::F32, {B, H, W, Co});
  Tensor dl = eng.alloc(DType::I32, {B});
  eng.upload(dx, x.data());
  eng.upload(dt, t.data());
  eng.upload(dd, dout.data());
  eng.upload(dl, labels.data());
  eng.ops().run(Fill{dy, NAN});  // poison
  model.forward(dx, dt, dl, dy, true, 0);
  std::vector<float> out(out_ref.size());
  eng.download(out.data(), dy);
  Result r;
  r.out_err = test::rel_l2(out, out_ref);
  model.backward(dd);
  std::vector<float> g(tab.total);
  eng.download(g.data(), model.grads());
  for (auto& p : tab.params) {
    double e = test::rel_l2(g.data() + p.offset, gref.data() + p.offset, p.numel);
    if (!(e <= r.grad_err)) r.grad_err = e, r.worst = p.name;
  }
  return r;
}

}  // namespace

TEST(ModelGolden, CpuMatchesPyTorchFloat64) {
  auto files = golden_files();
  ASSERT_FALSE(files.empty()) << "no golden files in testdata/golden (scripts/make_golden.py makes them)";
  auto eng = make_cpu_engine();
  for (auto& path : files) {
    SCOPED_TRACE(path);
    Result r = run_golden(*eng, path);
    // fp32 vs float64 reference: SPEC §5 asks 1e-5 relative for the forward, 1e-4 for gradients.
    EXPECT_LT(r.out_err, 1e-5) << "forward";
    EXPECT_LT(r.grad_err, 1e-4) << "worst gradient: " << r.worst;
    std::printf("[golden] %s cpu: out %.2e, worst grad %.2e (%s)\n",
                std::filesystem::path(path).filename().c_str(), r.out_err, r.grad_err, r.worst.c_str());
  }
}

// The CPU engine's bf16 emulation against float64: the same tolerance the CUDA bf16 engine must
// meet (activations and GEMM inputs rounded to 8 mantissa bits).
TEST(ModelGolden, CpuBf16EmulationWithinBf16Tolerance) {
  auto eng = make_cpu_engine(Precision::BF16);
  for (auto& path : golden_files()) {
    SCOPED_TRACE(path);
    Result r = run_golden(*eng, path);
    EXPECT_LT(r.out_err, 3e-2) << "forward";
    EXPECT_LT(r.grad_err, 1e-1) << "worst gradient: " << r.worst;
    std::printf("[golden] %s cpu bf16: out %.2e, worst grad %.2e (%s)\n",
                std::filesystem::path(path).filename().c_str(), r.out_err, r.grad_err, r.worst.c_str());
  }
}

TEST(ModelGolden, CudaMatchesPyTorchFloat64) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device found";
  for (Precision prec : {Precision::FP32, Precision::TF32, Precision::BF16}) {
    std::string why;
    auto eng = make_cuda_engine(prec, &why);
    ASSERT_TRUE(eng) << why;
    for (auto& path : golden_files()) {
      SCOPED_TRACE(path);
      Result r = run_golden(*eng, path);
      const double to = prec == Precision::FP32 ? 1e-5 : prec == Precision::TF32 ? 1e-2 : 3e-2;
      const double tg = prec == Precision::FP32 ? 1e-4 : prec == Precision::TF32 ? 5e-2 : 1e-1;
      EXPECT_LT(r.out_err, to) << "forward " << precision_name(prec);
      EXPECT_LT(r.grad_err, tg) << precision_name(prec) << " worst gradient: " << r.worst;
      std::printf("[golden] %s %s: out %.2e, worst grad %.2e (%s)\n",
                  std::filesystem::path(path).filename().c_str(), precision_name(prec), r.out_err, r.grad_err,
                  r.worst.c_str());
    }
  }
}
