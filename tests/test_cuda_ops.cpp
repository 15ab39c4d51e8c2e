// CUDA engine (kernels/*.cu, class CudaBackend) against the CPU reference (make_cpu_backend()).
//
//  * every op, forward and backward, on fresh random inputs at small/odd shapes (scalar tails,
//    misaligned pointers, nullptr outputs) and at EVERY distinct layer shape of the seed64 model
//    at batch 32 (enumerated from build_arch(preset("seed64")));
//  * outputs are poisoned with NaN before each op, so anything left unwritten fails;
//  * fp32 and tf32 for the GEMM-based ops (conv, linear, attention);
//  * determinism: the same inputs give bitwise-identical outputs, run to run and across two
//    backend instances (bit-exact resume relies on it).
//
// Tolerances (relative L2 error, ||gpu - cpu|| / ||cpu||):
//  * fp32: 1e-5 (IEEE fp32 on both sides; only summation order differs);
//  * tf32: 1e-3 for one tensor-core GEMM (10-bit mantissa inputs, ~5e-4 each), 3e-3 where two
//    TF32 GEMMs are chained (attention: logits then attn*v; backward dP then dq/dk);
//  * the timestep embedding: 1e-4 — its fp32 argument t*f reaches 1e3, where a one-ulp
//    difference between CPU and GPU exp() moves the argument by ~6e-5;
//  * bitwise equality where both sides do the same arithmetic in the same order (dropout,
//    embedding scatter, concat, resampling, dpred of the loss).
// Cost control: the CPU side of the batch-32 convolutions and attention runs on two samples
// (0 and 31) and is compared with those samples of the GPU's batch-32 result; the batch-32 dW is
// checked through the adjoint identity <dW, V> = <dy, conv(x, V)> (GPU forward, itself checked),
// db against a double-precision host sum. Without a CUDA device every test is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "arch.h"
#include "backend.h"
#include "config.h"
#include "profile_hooks.h"
#include "testutil.h"
#include "util.h"
#ifdef UNET_HAVE_CUDA
#include "cuda_backend.h"
#endif

namespace {

using F = std::vector<float>;
using unet::Backend;
using unet::Precision;
namespace tu = unet::test;

constexpr double kFp32 = 1e-5;
constexpr double kTf32 = 1e-3;
constexpr double kTf32Chain = 3e-3;
constexpr double kTimestep = 1e-4;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

double tol(Precision p, bool chained = false) {
  return p == Precision::FP32 ? kFp32 : (chained ? kTf32Chain : kTf32);
}
const char* pname(Precision p) { return unet::precision_name(p); }

uint64_t next_seed() {
  static uint64_t k = 0;
  return tu::test_seed() * 1000003ull + 7919ull * (++k);
}
F rnd(size_t n, float lo = -1.f, float hi = 1.f) { return tu::randu(n, next_seed(), lo, hi); }
F rndn(size_t n, float scale = 1.f) { return tu::randn(n, next_seed(), scale); }

// ---- the GPU side: one shared backend and a bump arena carved from one alloc ----------------
struct Gpu {
  std::unique_ptr<Backend> be;
  std::string why;
  float* pool = nullptr;
  size_t cap = 0, used = 0;
  static Gpu& get() {
    static Gpu g;
    return g;
  }

 private:
  Gpu() {
    be = unet::make_cuda_backend(&why);
    if (be) {
      cap = size_t(448) << 20;  // floats (1.75 GiB): the largest test needs ~0.5 GiB
      pool = be->alloc(cap);
    }
  }
};

Backend& gpu() { return *Gpu::get().be; }
Backend& cpu() {
  static std::unique_ptr<Backend> c = unet::make_cpu_backend();
  return *c;
}

float* dalloc(size_t n) {
  Gpu& g = Gpu::get();
  const size_t r = (n + 63) / 64 * 64 + 64;  // 256-byte aligned slots
  if (g.used + r > g.cap) throw std::runtime_error("test arena exhausted");
  float* p = g.pool + g.used;
  g.used += r;
  return p;
}
float* dup(const F& h) {
  float* d = dalloc(h.size());
  gpu().upload(d, h.data(), h.size());
  return d;
}
float* dnan(size_t n) {
  float* d = dalloc(n);
  gpu().fill(d, kNaN, n);
  return d;
}
F dget(const float* d, size_t n) {
  F h(n);
  gpu().download(h.data(), d, n);
  return h;
}
int32_t* dup_labels(const std::vector<int32_t>& l) {
  auto* d = reinterpret_cast<int32_t*>(dalloc(l.size()));
  gpu().upload_bytes(d, l.data(), l.size() * sizeof(int32_t));
  return d;
}

// Samples `which` of a batch of `per`-element samples.
F take(const F& v, size_t per, const std::vector<int>& which) {
  F out;
  out.reserve(per * which.size());
  for (int b : which) out.insert(out.end(), v.begin() + b * per, v.begin() + (b + 1) * per);
  return out;
}

// UNET_TEST_VERBOSE=1 prints every comparison's error next to its tolerance (margins).
bool verbose() {
  static const bool v = std::getenv("UNET_TEST_VERBOSE") != nullptr;
  return v;
}

#define EXPECT_CLOSE(got, want, tolerance, what)                                                    \
  do {                                                                                              \
    const F& g_ = (got);                                                                            \
    const F& w_ = (want);                                                                           \
    ASSERT_EQ(g_.size(), w_.size()) << (what);                                                      \
    ASSERT_FALSE(g_.empty()) << (what);                                                             \
    const double r_ = tu::rel_l2(g_, w_);                                                           \
    if (verbose())                                                                                  \
      std::printf("  %-70s %.2e (tol %.0e)\n", std::string(what).c_str(), r_, (double)(tolerance)); \
    EXPECT_LE(r_, (tolerance)) << (what) << ": relative L2 error " << r_ << " (max abs "            \
                               << tu::max_abs_diff(g_, w_) << ")";                                  \
  } while (0)

#define EXPECT_BITWISE(got, want, what)                                            \
  do {                                                                             \
    const F& g_ = (got);                                                           \
    const F& w_ = (want);                                                          \
    ASSERT_EQ(g_.size(), w_.size()) << (what);                                     \
    EXPECT_TRUE(std::memcmp(g_.data(), w_.data(), g_.size() * sizeof(float)) == 0) \
        << (what) << ": not bitwise equal (rel L2 " << tu::rel_l2(g_, w_) << ")";  \
  } while (0)

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    Gpu& g = Gpu::get();
    if (!g.be) GTEST_SKIP() << "no CUDA backend: " << g.why;
    g.used = 0;
    g.be->set_precision(Precision::FP32);
  }
  void TearDown() override {
    if (Gpu::get().be) Gpu::get().be->set_precision(Precision::FP32);
  }
};

// ---- the seed64 model's distinct layer shapes ----------------------------------------------
struct ConvShape {
  int Ci, Co, H, k, s;
  bool operator<(const ConvShape& o) const {
    return std::tie(Ci, Co, H, k, s) < std::tie(o.Ci, o.Co, o.H, o.k, o.s);
  }
};
struct AttnShape {
  int T, C, heads;
  bool operator<(const AttnShape& o) const { return std::tie(T, C, heads) < std::tie(o.T, o.C, o.heads); }
};
struct Shapes {
  std::set<ConvShape> conv;
  std::set<std::pair<int, int>> gn;  // (HW, C)
  std::set<AttnShape> attn;
  std::set<std::pair<int, int>> lin;        // (I, O)
  std::set<std::tuple<int, int, int>> cat;  // (HW, Ca, Cb)
  std::set<std::pair<int, int>> up, pool;   // (input res, C)
  std::set<std::pair<int, int>> bcast, ss;  // (HW, C)
  bool legacy = false;
};

Shapes model_shapes(const std::string& preset) {
  const unet::ModelConfig cfg = unet::preset(preset);
  const unet::Arch a = unet::build_arch(cfg);
  const int E = cfg.time_embed_dim();
  Shapes s;
  s.legacy = !cfg.use_new_attention_order;
  s.lin.insert({cfg.num_channels, E});
  s.lin.insert({E, E});
  int ch = 0;
  auto visit = [&](const unet::Layer& l) {
    const int r = l.res;
    switch (l.kind) {
      case unet::Layer::Conv:
        s.conv.insert({l.cin, l.cout, r, 3, 1});
        break;
      case unet::Layer::Down:
        s.conv.insert({l.cin, l.cout, r, 3, 2});
        break;
      case unet::Layer::Up:
        s.up.insert({r, l.cin});
        s.conv.insert({l.cin, l.cout, 2 * r, 3, 1});
        break;
      case unet::Layer::Attn:
        s.gn.insert({r * r, l.cin});
        s.conv.insert({l.cin, 3 * l.cin, r, 1, 1});
        s.attn.insert({r * r, l.cin, l.heads});
        s.conv.insert({l.cin, l.cin, r, 1, 1});
        break;
      case unet::Layer::Res: {
        const int ro = l.updown < 0 ? r / 2 : l.updown > 0 ? 2 * r : r;
        s.gn.insert({r * r, l.cin});
        if (l.updown < 0) s.pool.insert({r, l.cin});
        if (l.updown > 0) s.up.insert({r, l.cin});
        s.conv.insert({l.cin, l.cout, ro, 3, 1});
        s.lin.insert({E, cfg.use_scale_shift_norm ? 2 * l.cout : l.cout});
        if (cfg.use_scale_shift_norm)
          s.ss.insert({ro * ro, l.cout});
        else
          s.bcast.insert({ro * ro, l.cout});
        s.gn.insert({ro * ro, l.cout});
        s.conv.insert({l.cout, l.cout, ro, 3, 1});
        if (l.cin != l.cout) s.conv.insert({l.cin, l.cout, ro, 1, 1});
        break;
      }
    }
    ch = l.cout;
  };
  for (auto& blk : a.input_blocks)
    for (auto& l : blk) visit(l);
  for (auto& l : a.middle) visit(l);
  for (auto& blk : a.output_blocks) {
    const unet::Layer& l0 = blk.front();
    s.cat.insert({l0.res * l0.res, ch, l0.cin - ch});
    for (auto& l : blk) visit(l);
  }
  s.gn.insert({cfg.image_size * cfg.image_size, a.out_cin});
  s.conv.insert({a.out_cin, cfg.out_channels(), cfg.image_size, 3, 1});
  return s;
}

std::string conv_name(const ConvShape& c, int B) {
  std::ostringstream o;
  o << "conv k" << c.k << " s" << c.s << " B" << B << " " << c.H << "x" << c.H << " " << c.Ci << "->" << c.Co;
  return o.str();
}
int conv_out(int n, int k, int s) { return (n + 2 * (k / 2) - k) / s + 1; }

// ================================ basics ======================================================

TEST(CudaBackendNoDevice, ReportsWhy) {
  if (unet::cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  std::string why;
  auto b = unet::make_cuda_backend(&why);
  EXPECT_EQ(b, nullptr);
  EXPECT_TRUE(why.find("no CUDA device found") != std::string::npos ||
              why.find("without CUDA") != std::string::npos)
      << why;
}

TEST_F(CudaOps, Basics) {
  Backend& g = gpu();
  EXPECT_TRUE(g.is_cuda());
  EXPECT_EQ(g.name().rfind("cuda (", 0), 0u) << g.name();
  EXPECT_THROW(g.set_precision(Precision::BF16), unet::UserError);
  g.set_precision(Precision::TF32);
  EXPECT_EQ(g.precision(), Precision::TF32);
  g.set_precision(Precision::FP32);
  EXPECT_EQ(g.precision(), Precision::FP32);
  const size_t before = g.peak_bytes();
  float* p = g.alloc(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_GE(g.peak_bytes(), before + 4000);

  // upload / copy / fill / download, and a pinned staging buffer with a fence
  F h = rnd(1000);
  g.upload(p, h.data(), h.size());
  float* q = dnan(1000);
  g.copy(q, p, 1000);
  EXPECT_BITWISE(dget(q, 1000), h, "copy");
  g.fill(q, 2.5f, 1000);
  EXPECT_BITWISE(dget(q, 1000), F(1000, 2.5f), "fill");
  g.fill(q, 0.f, 1000);
  EXPECT_BITWISE(dget(q, 1000), F(1000, 0.f), "fill 0");
  auto* pinned = static_cast<float*>(g.alloc_host(1000 * sizeof(float)));
  std::copy(h.begin(), h.end(), pinned);
  g.upload(q, pinned, 1000);
  const uint64_t f = g.fence();
  g.fence_wait(f);
  std::fill(pinned, pinned + 1000, 0.f);  // safe: the copy is done
  EXPECT_BITWISE(dget(q, 1000), h, "pinned upload");
}

struct Recorder : unet::RangeListener {
  std::vector<std::string> ev;
  void push(const char* n) override { ev.push_back(std::string("+") + n); }
  void pop() override { ev.push_back("-"); }
};

TEST_F(CudaOps, RangesReachTheListener) {
  Recorder r;
  unet::set_range_listener(&r);
  gpu().range_push("block");
  gpu().range_push("conv");
  gpu().range_pop();
  gpu().range_pop();
  unet::set_range_listener(nullptr);
  gpu().range_push("unheard");
  gpu().range_pop();
  EXPECT_EQ(r.ev, (std::vector<std::string>{"+block", "+conv", "-", "-"}));
}

// ================================ convolution =================================================

struct ConvRef {
  F y, dx, dw, db;
};
ConvRef cpu_conv(const F& x, const F& w, const F* bias, const F& dy, int B, const ConvShape& c) {
  const int Ho = conv_out(c.H, c.k, c.s);
  ConvRef r;
  r.y.assign((size_t)B * Ho * Ho * c.Co, kNaN);
  r.dx.assign(x.size(), kNaN);
  r.dw.assign(w.size(), kNaN);
  r.db.assign(c.Co, kNaN);
  cpu().conv2d_fwd(x.data(), w.data(), bias ? bias->data() : nullptr, r.y.data(), B, c.H, c.H, c.Ci, c.Co,
                   c.k, c.s);
  cpu().conv2d_bwd(x.data(), w.data(), dy.data(), r.dx.data(), r.dw.data(), r.db.data(), B, c.H, c.H, c.Ci,
                   c.Co, c.k, c.s);
  return r;
}

// Full comparison at a small batch: y (with and without bias), dx, dw, db, and nullptr outputs.
void check_conv_small(int B, int H, int W, const ConvShape& c) {
  const int Ho = conv_out(H, c.k, c.s), Wo = conv_out(W, c.k, c.s);
  const size_t nx = (size_t)B * H * W * c.Ci, ny = (size_t)B * Ho * Wo * c.Co;
  const size_t nw = (size_t)c.Co * c.k * c.k * c.Ci;
  F x = rnd(nx), w = rnd(nw), bias = rnd(c.Co), dy = rnd(ny);
  F y(ny), y0(ny), dx(nx), dw(nw), db(c.Co);
  cpu().conv2d_fwd(x.data(), w.data(), bias.data(), y.data(), B, H, W, c.Ci, c.Co, c.k, c.s);
  cpu().conv2d_fwd(x.data(), w.data(), nullptr, y0.data(), B, H, W, c.Ci, c.Co, c.k, c.s);
  cpu().conv2d_bwd(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), B, H, W, c.Ci, c.Co, c.k,
                   c.s);
  float *gx = dup(x), *gw = dup(w), *gb = dup(bias), *gdy = dup(dy);
  for (Precision p : {Precision::FP32, Precision::TF32}) {
    gpu().set_precision(p);
    std::ostringstream nm;
    nm << "conv k" << c.k << " s" << c.s << " B" << B << " " << H << "x" << W << " " << c.Ci << "->" << c.Co
       << " " << pname(p);
    const std::string n = nm.str();
    float* gy = dnan(ny);
    gpu().conv2d_fwd(gx, gw, gb, gy, B, H, W, c.Ci, c.Co, c.k, c.s);
    EXPECT_CLOSE(dget(gy, ny), y, tol(p), n + " y");
    gpu().fill(gy, kNaN, ny);
    gpu().conv2d_fwd(gx, gw, nullptr, gy, B, H, W, c.Ci, c.Co, c.k, c.s);
    EXPECT_CLOSE(dget(gy, ny), y0, tol(p), n + " y (no bias)");
    float *gdx = dnan(nx), *gdw = dnan(nw), *gdb = dnan(c.Co);
    gpu().conv2d_bwd(gx, gw, gdy, gdx, gdw, gdb, B, H, W, c.Ci, c.Co, c.k, c.s);
    EXPECT_CLOSE(dget(gdx, nx), dx, tol(p), n + " dx");
    EXPECT_CLOSE(dget(gdw, nw), dw, tol(p), n + " dw");
    EXPECT_CLOSE(dget(gdb, c.Co), db, kFp32, n + " db");
    // each gradient alone
    gpu().fill(gdx, kNaN, nx);
    gpu().conv2d_bwd(gx, gw, gdy, gdx, nullptr, nullptr, B, H, W, c.Ci, c.Co, c.k, c.s);
    EXPECT_CLOSE(dget(gdx, nx), dx, tol(p), n + " dx alone");
    gpu().fill(gdw, kNaN, nw);
    gpu().conv2d_bwd(gx, gw, gdy, nullptr, gdw, nullptr, B, H, W, c.Ci, c.Co, c.k, c.s);
    EXPECT_CLOSE(dget(gdw, nw), dw, tol(p), n + " dw alone");
    gpu().fill(gdb, kNaN, c.Co);
    gpu().conv2d_bwd(gx, gw, gdy, nullptr, nullptr, gdb, B, H, W, c.Ci, c.Co, c.k, c.s);
    EXPECT_CLOSE(dget(gdb, c.Co), db, kFp32, n + " db alone");
  }
}

TEST_F(CudaOps, ConvSmallAndOddShapes) {
  check_conv_small(2, 8, 8, {8, 16, 8, 3, 1});
  check_conv_small(2, 8, 8, {8, 16, 8, 3, 2});
  check_conv_small(3, 7, 5, {4, 8, 7, 3, 2});   // odd H, W with stride 2
  check_conv_small(2, 9, 9, {3, 5, 9, 3, 1});   // Ci = 3, Co = 5: scalar paths
  check_conv_small(2, 6, 6, {8, 12, 6, 1, 1});  // 1x1: plain GEMM
  check_conv_small(2, 7, 7, {8, 4, 7, 1, 2});   // 1x1 stride 2 (im2col path)
  check_conv_small(1, 4, 4, {64, 3, 4, 3, 1});  // like the output conv
}

// The batch split into several workspace-sized chunks (dW accumulated with beta = 1).
TEST_F(CudaOps, ConvChunkedWorkspace) {
#ifdef UNET_HAVE_CUDA
  const ConvShape shapes[] = {{32, 16, 16, 3, 1}, {24, 8, 15, 3, 2}};
  for (const ConvShape& c : shapes) {
    const int B = 5, Ho = conv_out(c.H, c.k, c.s);
    const size_t per_sample = (size_t)Ho * Ho * c.k * c.k * c.Ci * sizeof(float);
    std::string why;
    // Room for two samples: chunks of 2, 2, 1.
    auto small = unet::make_cuda_backend_with_workspace(per_sample * 2 + 100, &why);
    ASSERT_TRUE(small) << why;
    const size_t nx = (size_t)B * c.H * c.H * c.Ci, ny = (size_t)B * Ho * Ho * c.Co,
                 nw = (size_t)c.Co * 9 * c.Ci;
    F x = rnd(nx), w = rnd(nw), bias = rnd(c.Co), dy = rnd(ny);
    ConvRef r = cpu_conv(x, w, &bias, dy, B, c);
    auto put = [&](const F& h) {
      float* d = small->alloc(h.size());
      small->upload(d, h.data(), h.size());
      return d;
    };
    auto get = [&](const float* d, size_t n) {
      F h(n);
      small->download(h.data(), d, n);
      return h;
    };
    float *gx = put(x), *gw = put(w), *gb = put(bias), *gdy = put(dy);
    float *gy = put(F(ny, kNaN)), *gdx = put(F(nx, kNaN)), *gdw = put(F(nw, kNaN)), *gdb = put(F(c.Co, kNaN));
    small->conv2d_fwd(gx, gw, gb, gy, B, c.H, c.H, c.Ci, c.Co, c.k, c.s);
    small->conv2d_bwd(gx, gw, gdy, gdx, gdw, gdb, B, c.H, c.H, c.Ci, c.Co, c.k, c.s);
    const std::string n = conv_name(c, B) + " chunked";
    EXPECT_CLOSE(get(gy, ny), r.y, kFp32, n + " y");
    EXPECT_CLOSE(get(gdx, nx), r.dx, kFp32, n + " dx");
    EXPECT_CLOSE(get(gdw, nw), r.dw, kFp32, n + " dw");
    EXPECT_CLOSE(get(gdb, c.Co), r.db, kFp32, n + " db");
    // A workspace smaller than one sample's patch matrix is an error, not a silent overrun.
    auto tiny = unet::make_cuda_backend_with_workspace(per_sample / 2, &why);
    ASSERT_TRUE(tiny) << why;
    float* ty = tiny->alloc(ny);
    float* tx = tiny->alloc(nx);
    float* tw = tiny->alloc(nw);
    EXPECT_THROW(tiny->conv2d_fwd(tx, tw, nullptr, ty, B, c.H, c.H, c.Ci, c.Co, c.k, c.s),
                 std::runtime_error);
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Every distinct convolution of seed64 at batch 32.
TEST_F(CudaOps, ConvSeed64Shapes) {
  const int B = 32;
  const std::vector<int> probe = {0, B - 1};
  const Shapes s = model_shapes("seed64");
  for (const ConvShape& c : s.conv) {
    Gpu::get().used = 0;
    const int Ho = conv_out(c.H, c.k, c.s);
    const size_t px = (size_t)c.H * c.H * c.Ci, py = (size_t)Ho * Ho * c.Co;
    const size_t nw = (size_t)c.Co * c.k * c.k * c.Ci;
    const std::string base = conv_name(c, B);
    F x = rnd(B * px), w = rnd(nw, -0.1f, 0.1f), bias = rnd(c.Co), dy = rnd(B * py);
    F x2 = take(x, px, probe), dy2 = take(dy, py, probe);
    ConvRef r = cpu_conv(x2, w, &bias, dy2, 2, c);
    // db of the whole batch, in double on the host
    F db_full(c.Co);
    {
      std::vector<double> acc(c.Co, 0.0);
      for (size_t i = 0; i < dy.size(); ++i) acc[i % c.Co] += dy[i];
      for (int co = 0; co < c.Co; ++co) db_full[co] = (float)acc[co];
    }
    float *gx = dup(x), *gw = dup(w), *gb = dup(bias), *gdy = dup(dy), *gx2 = dup(x2), *gdy2 = dup(dy2);
    F V = rnd(nw);
    float* gV = dup(V);
    for (Precision p : {Precision::FP32, Precision::TF32}) {
      gpu().set_precision(p);
      const std::string n = base + " " + pname(p);
      float* gy = dnan(B * py);
      gpu().conv2d_fwd(gx, gw, gb, gy, B, c.H, c.H, c.Ci, c.Co, c.k, c.s);
      EXPECT_CLOSE(take(dget(gy, B * py), py, probe), r.y, tol(p), n + " y (samples 0, 31)");
      float *gdx = dnan(B * px), *gdw = dnan(nw), *gdb = dnan(c.Co);
      gpu().conv2d_bwd(gx, gw, gdy, gdx, gdw, gdb, B, c.H, c.H, c.Ci, c.Co, c.k, c.s);
      EXPECT_CLOSE(take(dget(gdx, B * px), px, probe), r.dx, tol(p), n + " dx (samples 0, 31)");
      EXPECT_CLOSE(dget(gdb, c.Co), db_full, kFp32, n + " db (batch 32)");
      // dW of the batch: <dW, V> = <dy, conv(x, V)>
      {
        F dw = dget(gdw, nw);
        float* gz = dnan(B * py);
        gpu().conv2d_fwd(gx, gV, nullptr, gz, B, c.H, c.H, c.Ci, c.Co, c.k, c.s);
        F z = dget(gz, B * py);
        double lhs = 0, rhs = 0, scale = 0;
        bool finite = true;
        for (size_t i = 0; i < nw; ++i) {
          lhs += (double)dw[i] * V[i];
          scale += std::fabs((double)dw[i] * V[i]);
          finite = finite && std::isfinite(dw[i]);
        }
        for (size_t i = 0; i < z.size(); ++i) rhs += (double)dy[i] * z[i];
        EXPECT_TRUE(finite) << n << " dw has non-finite values";
        EXPECT_LE(std::fabs(lhs - rhs), tol(p) * scale)
            << n << " dw (batch 32) fails <dW,V> = <dy,conv(x,V)>: " << lhs << " vs " << rhs;
      }
      // dW and db of the two probe samples against the CPU
      gpu().fill(gdw, kNaN, nw);
      gpu().fill(gdb, kNaN, c.Co);
      gpu().conv2d_bwd(gx2, gw, gdy2, nullptr, gdw, gdb, 2, c.H, c.H, c.Ci, c.Co, c.k, c.s);
      EXPECT_CLOSE(dget(gdw, nw), r.dw, tol(p), n + " dw (samples 0, 31)");
      EXPECT_CLOSE(dget(gdb, c.Co), r.db, kFp32, n + " db (samples 0, 31)");
    }
  }
}

// ================================ linear ======================================================

void check_linear(int N, int I, int O) {
  F x = rnd((size_t)N * I), w = rnd((size_t)O * I), b = rnd(O), dy = rnd((size_t)N * O);
  F y(N * (size_t)O), y0(N * (size_t)O), dx(x.size()), dw(w.size()), db(O);
  cpu().linear_fwd(x.data(), w.data(), b.data(), y.data(), N, I, O);
  cpu().linear_fwd(x.data(), w.data(), nullptr, y0.data(), N, I, O);
  cpu().linear_bwd(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), N, I, O);
  float *gx = dup(x), *gw = dup(w), *gb = dup(b), *gdy = dup(dy);
  for (Precision p : {Precision::FP32, Precision::TF32}) {
    gpu().set_precision(p);
    const std::string n =
        "linear " + std::to_string(N) + "x" + std::to_string(I) + "->" + std::to_string(O) + " " + pname(p);
    float* gy = dnan(y.size());
    gpu().linear_fwd(gx, gw, gb, gy, N, I, O);
    EXPECT_CLOSE(dget(gy, y.size()), y, tol(p), n + " y");
    gpu().fill(gy, kNaN, y.size());
    gpu().linear_fwd(gx, gw, nullptr, gy, N, I, O);
    EXPECT_CLOSE(dget(gy, y.size()), y0, tol(p), n + " y (no bias)");
    float *gdx = dnan(dx.size()), *gdw = dnan(dw.size()), *gdb = dnan(O);
    gpu().linear_bwd(gx, gw, gdy, gdx, gdw, gdb, N, I, O);
    EXPECT_CLOSE(dget(gdx, dx.size()), dx, tol(p), n + " dx");
    EXPECT_CLOSE(dget(gdw, dw.size()), dw, tol(p), n + " dw");
    EXPECT_CLOSE(dget(gdb, O), db, kFp32, n + " db");
    gpu().fill(gdw, kNaN, dw.size());
    gpu().linear_bwd(gx, gw, gdy, nullptr, gdw, nullptr, N, I, O);
    EXPECT_CLOSE(dget(gdw, dw.size()), dw, tol(p), n + " dw alone");
  }
}

TEST_F(CudaOps, Linear) {
  check_linear(5, 7, 3);
  check_linear(3, 64, 33);
  for (auto [I, O] : model_shapes("seed64").lin) check_linear(32, I, O);
}

// ================================ GroupNorm ===================================================

void check_groupnorm(int B, int HW, int C, int G, float offset = 0.f) {
  const size_t n = (size_t)B * HW * C;
  F x = rnd(n, offset - 2.f, offset + 2.f), gamma = rnd(C, 0.5f, 1.5f), beta = rnd(C), dy = rnd(n);
  float *gx = dup(x), *gg = dup(gamma), *gbt = dup(beta), *gdy = dup(dy);
  for (bool silu : {false, true}) {
    std::ostringstream nm;
    nm << "groupnorm B" << B << " HW" << HW << " C" << C << " G" << G << (silu ? " +silu" : "")
       << (offset != 0.f ? " mean " + std::to_string(offset) : "");
    const std::string name = nm.str();
    F y(n), mean(B * G), rstd(B * G), dx(n), dgm(C), dbt(C);
    cpu().groupnorm_fwd(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), B, HW, C, G,
                        silu);
    cpu().groupnorm_bwd(x.data(), gamma.data(), beta.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                        dgm.data(), dbt.data(), B, HW, C, G, silu);
    float *gy = dnan(n), *gm = dnan(B * G), *gr = dnan(B * G);
    gpu().groupnorm_fwd(gx, gg, gbt, gy, gm, gr, B, HW, C, G, silu);
    EXPECT_CLOSE(dget(gy, n), y, kFp32, name + " y");
    EXPECT_CLOSE(dget(gm, B * G), mean, kFp32, name + " mean");
    EXPECT_CLOSE(dget(gr, B * G), rstd, kFp32, name + " rstd");
    // backward from the CPU's saved statistics, so only the backward is under test
    float *cm = dup(mean), *cr = dup(rstd);
    float *gdx = dnan(n), *gdg = dnan(C), *gdb = dnan(C);
    gpu().groupnorm_bwd(gx, gg, gbt, cm, cr, gdy, gdx, gdg, gdb, B, HW, C, G, silu);
    EXPECT_CLOSE(dget(gdx, n), dx, kFp32, name + " dx");
    EXPECT_CLOSE(dget(gdg, C), dgm, kFp32, name + " dgamma");
    EXPECT_CLOSE(dget(gdb, C), dbt, kFp32, name + " dbeta");
    gpu().fill(gdx, kNaN, n);
    gpu().groupnorm_bwd(gx, gg, gbt, cm, cr, gdy, gdx, nullptr, nullptr, B, HW, C, G, silu);
    EXPECT_CLOSE(dget(gdx, n), dx, kFp32, name + " dx alone");
    gpu().fill(gdg, kNaN, C);
    gpu().groupnorm_bwd(gx, gg, gbt, cm, cr, gdy, nullptr, gdg, nullptr, B, HW, C, G, silu);
    EXPECT_CLOSE(dget(gdg, C), dgm, kFp32, name + " dgamma alone");
  }
}

TEST_F(CudaOps, GroupNormSmallAndOdd) {
  check_groupnorm(3, 5, 96, 32);          // 3 channels per group: vectors straddle groups
  check_groupnorm(2, 7, 64, 8);           // 8 channels per group
  check_groupnorm(2, 9, 6, 1);            // one group
  check_groupnorm(2, 300, 64, 32, 50.f);  // |mean| >> std: the shifted sums must hold up
}

TEST_F(CudaOps, GroupNormSeed64Shapes) {
  for (auto [HW, C] : model_shapes("seed64").gn) {
    Gpu::get().used = 0;
    check_groupnorm(32, HW, C, 32);
  }
}

// ================================ attention ===================================================

void check_attention(int B, int T, int C, int heads, bool legacy, const std::vector<int>& probe) {
  const size_t pq = (size_t)T * 3 * C, po = (size_t)T * C, pa = (size_t)heads * T * T;
  F qkv = rndn(B * pq, 1.5f), dout = rnd(B * po);
  F q2 = take(qkv, pq, probe), do2 = take(dout, po, probe);
  const int P = (int)probe.size();
  F out(P * po), attn(P * pa), dqkv(P * pq);
  cpu().attention_fwd(q2.data(), out.data(), attn.data(), P, T, C, heads, legacy);
  cpu().attention_bwd(q2.data(), attn.data(), do2.data(), dqkv.data(), P, T, C, heads, legacy);
  float *gq = dup(qkv), *gdo = dup(dout);
  for (Precision p : {Precision::FP32, Precision::TF32}) {
    gpu().set_precision(p);
    std::ostringstream nm;
    nm << "attention B" << B << " T" << T << " C" << C << " heads" << heads
       << (legacy ? " legacy" : " new-order") << " " << pname(p);
    const std::string n = nm.str();
    float *go = dnan(B * po), *ga = dnan(B * pa), *gdq = dnan(B * pq);
    gpu().attention_fwd(gq, go, ga, B, T, C, heads, legacy);
    gpu().attention_bwd(gq, ga, gdo, gdq, B, T, C, heads, legacy);
    const double t = tol(p, true);
    EXPECT_CLOSE(take(dget(go, B * po), po, probe), out, t, n + " out");
    EXPECT_CLOSE(take(dget(ga, B * pa), pa, probe), attn, t, n + " attn");
    EXPECT_CLOSE(take(dget(gdq, B * pq), pq, probe), dqkv, t, n + " dqkv");
  }
}

TEST_F(CudaOps, AttentionSmallAndOdd) {
  for (bool legacy : {false, true}) {
    check_attention(2, 5, 8, 2, legacy, {0, 1});
    check_attention(3, 33, 12, 3, legacy, {0, 1, 2});  // T not a multiple of 32, d = 4
    check_attention(2, 64, 64, 1, legacy, {0, 1});
  }
}

TEST_F(CudaOps, AttentionSeed64Shapes) {
  const Shapes s = model_shapes("seed64");
  for (const AttnShape& a : s.attn)
    for (bool legacy : {false, true}) {  // the model uses one order; both are cheap to cover
      Gpu::get().used = 0;
      check_attention(32, a.T, a.C, a.heads, legacy, {0, 31});
    }
}

// ================================ elementwise and friends =====================================

TEST_F(CudaOps, SiluAddScale) {
  for (size_t n : {size_t(1000003), size_t(32) * 4096 * 64}) {
    for (size_t off : {size_t(0), size_t(1)}) {  // off = 1: misaligned, scalar path
      const std::string tag = " n" + std::to_string(n) + " offset " + std::to_string(off);
      F x = rndn(n, 3.f), dy = rnd(n), b = rnd(n);
      F y(n), dx(n), s(n);
      cpu().silu_fwd(x.data(), y.data(), n);
      cpu().silu_bwd(x.data(), dy.data(), dx.data(), n);
      cpu().add(x.data(), b.data(), s.data(), n);
      float *gx = dalloc(n + 1) + off, *gdy = dalloc(n + 1) + off, *gb = dalloc(n + 1) + off;
      gpu().upload(gx, x.data(), n);
      gpu().upload(gdy, dy.data(), n);
      gpu().upload(gb, b.data(), n);
      float* gy = dalloc(n + 1) + off;
      gpu().fill(gy, kNaN, n);
      gpu().silu_fwd(gx, gy, n);
      EXPECT_CLOSE(dget(gy, n), y, 1e-6, "silu" + tag);
      gpu().fill(gy, kNaN, n);
      gpu().silu_bwd(gx, gdy, gy, n);
      EXPECT_CLOSE(dget(gy, n), dx, 1e-6, "silu_bwd" + tag);
      gpu().fill(gy, kNaN, n);
      gpu().add(gx, gb, gy, n);
      EXPECT_BITWISE(dget(gy, n), s, "add" + tag);
      gpu().add(gx, gb, gx, n);  // y aliases a
      EXPECT_BITWISE(dget(gx, n), s, "add in place" + tag);
      gpu().scale(gb, 0.37f, n);
      F sb = b;
      cpu().scale(sb.data(), 0.37f, n);
      EXPECT_BITWISE(dget(gb, n), sb, "scale" + tag);
      Gpu::get().used = 0;
    }
  }
}

void check_bcast_ss(int B, int HW, int C) {
  const size_t n = (size_t)B * HW * C;
  const std::string tag = " B" + std::to_string(B) + " HW" + std::to_string(HW) + " C" + std::to_string(C);
  F h = rnd(n), e = rnd((size_t)B * C), ss = rnd((size_t)B * 2 * C), dy = rnd(n);
  // add_bcast
  F h2 = h, de(B * C);
  cpu().add_bcast_fwd(h2.data(), e.data(), B, HW, C);
  cpu().add_bcast_bwd(dy.data(), de.data(), B, HW, C);
  float *gh = dup(h), *ge = dup(e), *gdy = dup(dy), *gde = dnan(B * C);
  gpu().add_bcast_fwd(gh, ge, B, HW, C);
  EXPECT_BITWISE(dget(gh, n), h2, "add_bcast_fwd" + tag);
  gpu().add_bcast_bwd(gdy, gde, B, HW, C);
  EXPECT_CLOSE(dget(gde, B * C), de, kFp32, "add_bcast_bwd" + tag);
  // scale_shift
  F y(n), dx(n), dss(B * 2 * C);
  cpu().scale_shift_fwd(h.data(), ss.data(), y.data(), B, HW, C);
  cpu().scale_shift_bwd(h.data(), ss.data(), dy.data(), dx.data(), dss.data(), B, HW, C);
  float *gx = dup(h), *gss = dup(ss), *gy = dnan(n), *gdx = dnan(n), *gdss = dnan(B * 2 * C);
  gpu().scale_shift_fwd(gx, gss, gy, B, HW, C);
  EXPECT_CLOSE(dget(gy, n), y, 1e-6, "scale_shift_fwd" + tag);
  gpu().scale_shift_bwd(gx, gss, gdy, gdx, gdss, B, HW, C);
  EXPECT_CLOSE(dget(gdx, n), dx, 1e-6, "scale_shift_bwd dx" + tag);
  EXPECT_CLOSE(dget(gdss, B * 2 * C), dss, kFp32, "scale_shift_bwd dss" + tag);
  gpu().fill(gdss, kNaN, B * 2 * C);
  gpu().scale_shift_bwd(gx, gss, gdy, nullptr, gdss, B, HW, C);
  EXPECT_CLOSE(dget(gdss, B * 2 * C), dss, kFp32, "scale_shift_bwd dss alone" + tag);
  gpu().fill(gdx, kNaN, n);
  gpu().scale_shift_bwd(gx, gss, gdy, gdx, nullptr, B, HW, C);
  EXPECT_CLOSE(dget(gdx, n), dx, 1e-6, "scale_shift_bwd dx alone" + tag);
  gpu().scale_shift_fwd(gx, gss, gx, B, HW, C);  // in place
  EXPECT_CLOSE(dget(gx, n), y, 1e-6, "scale_shift_fwd in place" + tag);
}

TEST_F(CudaOps, BroadcastAddAndScaleShift) {
  check_bcast_ss(3, 5, 7);
  check_bcast_ss(2, 3, 12);
  const Shapes s = model_shapes("seed64");
  std::set<std::pair<int, int>> all = s.bcast;
  all.insert(s.ss.begin(), s.ss.end());
  for (auto [HW, C] : all) {
    Gpu::get().used = 0;
    check_bcast_ss(32, HW, C);
  }
}

void check_resample(int B, int H, int W, int C) {
  const std::string tag =
      " B" + std::to_string(B) + " " + std::to_string(H) + "x" + std::to_string(W) + " C" + std::to_string(C);
  const size_t n = (size_t)B * H * W * C, nu = 4 * n, np = (size_t)B * (H / 2) * (W / 2) * C;
  F x = rnd(n), dyu = rnd(nu), dyp = rnd(np);
  F yu(nu), dxu(n), yp(np), dxp(n);
  cpu().upsample2x_fwd(x.data(), yu.data(), B, H, W, C);
  cpu().upsample2x_bwd(dyu.data(), dxu.data(), B, H, W, C);
  cpu().avgpool2x2_fwd(x.data(), yp.data(), B, H, W, C);
  cpu().avgpool2x2_bwd(dyp.data(), dxp.data(), B, H, W, C);
  float *gx = dup(x), *gdyu = dup(dyu), *gdyp = dup(dyp);
  float *gyu = dnan(nu), *gdxu = dnan(n), *gyp = dnan(np), *gdxp = dnan(n);
  gpu().upsample2x_fwd(gx, gyu, B, H, W, C);
  gpu().upsample2x_bwd(gdyu, gdxu, B, H, W, C);
  gpu().avgpool2x2_fwd(gx, gyp, B, H, W, C);
  gpu().avgpool2x2_bwd(gdyp, gdxp, B, H, W, C);
  EXPECT_BITWISE(dget(gyu, nu), yu, "upsample2x_fwd" + tag);
  EXPECT_BITWISE(dget(gdxu, n), dxu, "upsample2x_bwd" + tag);
  EXPECT_BITWISE(dget(gyp, np), yp, "avgpool2x2_fwd" + tag);
  EXPECT_BITWISE(dget(gdxp, n), dxp, "avgpool2x2_bwd" + tag);
}

TEST_F(CudaOps, Resample) {
  check_resample(2, 5, 7, 3);  // odd sizes: pooling drops the last row/column
  check_resample(2, 4, 6, 8);
  const Shapes s = model_shapes("seed64");
  std::set<std::pair<int, int>> all = s.up;
  all.insert(s.pool.begin(), s.pool.end());
  for (auto [r, C] : all) {
    Gpu::get().used = 0;
    check_resample(32, r, r, C);
  }
}

void check_concat(int B, int HW, int Ca, int Cb) {
  const std::string tag = " B" + std::to_string(B) + " HW" + std::to_string(HW) + " " + std::to_string(Ca) +
                          "+" + std::to_string(Cb);
  const size_t na = (size_t)B * HW * Ca, nb = (size_t)B * HW * Cb, n = na + nb;
  F a = rnd(na), b = rnd(nb), dy = rnd(n);
  F y(n), da(na), db(nb);
  cpu().concat_fwd(a.data(), b.data(), y.data(), B, HW, Ca, Cb);
  cpu().concat_bwd(dy.data(), da.data(), db.data(), B, HW, Ca, Cb);
  float *ga = dup(a), *gb = dup(b), *gdy = dup(dy), *gy = dnan(n), *gda = dnan(na), *gdb = dnan(nb);
  gpu().concat_fwd(ga, gb, gy, B, HW, Ca, Cb);
  EXPECT_BITWISE(dget(gy, n), y, "concat_fwd" + tag);
  gpu().concat_bwd(gdy, gda, gdb, B, HW, Ca, Cb);
  EXPECT_BITWISE(dget(gda, na), da, "concat_bwd da" + tag);
  EXPECT_BITWISE(dget(gdb, nb), db, "concat_bwd db" + tag);
  gpu().fill(gda, kNaN, na);
  gpu().fill(gdb, 7.f, nb);
  gpu().concat_bwd(gdy, gda, nullptr, B, HW, Ca, Cb);
  EXPECT_BITWISE(dget(gda, na), da, "concat_bwd da alone" + tag);
  EXPECT_BITWISE(dget(gdb, nb), F(nb, 7.f), "concat_bwd leaves db alone" + tag);
  gpu().fill(gdb, kNaN, nb);
  gpu().concat_bwd(gdy, nullptr, gdb, B, HW, Ca, Cb);
  EXPECT_BITWISE(dget(gdb, nb), db, "concat_bwd db alone" + tag);
}

TEST_F(CudaOps, Concat) {
  check_concat(2, 5, 3, 5);
  check_concat(2, 6, 8, 4);
  for (auto [HW, Ca, Cb] : model_shapes("seed64").cat) {
    Gpu::get().used = 0;
    check_concat(32, HW, Ca, Cb);
  }
}

TEST_F(CudaOps, Embeddings) {
  for (int dim : {64, 7, 256}) {
    const int B = 32;
    F t(B);
    for (int b = 0; b < B; ++b) t[b] = (float)((next_seed() >> 7) % 1000);
    t[0] = 0.f;
    t[1] = 999.f;
    F y(B * dim);
    cpu().timestep_embedding(t.data(), y.data(), B, dim);
    float *gt = dup(t), *gy = dnan(B * dim);
    gpu().timestep_embedding(gt, gy, B, dim);
    EXPECT_CLOSE(dget(gy, B * dim), y, kTimestep, "timestep_embedding dim " + std::to_string(dim));
  }
  const int B = 32, K = 10, D = 256;
  std::vector<int32_t> labels(B);
  for (int b = 0; b < B; ++b) labels[b] = (int32_t)((next_seed() >> 11) % (K - 2));  // 2 unused
  F table = rndn((size_t)K * D), y = rnd((size_t)B * D), dy = rnd((size_t)B * D);
  F y2 = y, dt((size_t)K * D);
  cpu().embedding_add_fwd(labels.data(), table.data(), y2.data(), B, D);
  cpu().embedding_bwd(labels.data(), dy.data(), dt.data(), B, K, D);
  int32_t* gl = dup_labels(labels);
  float *gtab = dup(table), *gy = dup(y), *gdy = dup(dy), *gdt = dnan((size_t)K * D);
  gpu().embedding_add_fwd(gl, gtab, gy, B, D);
  EXPECT_BITWISE(dget(gy, y.size()), y2, "embedding_add_fwd");
  gpu().embedding_bwd(gl, gdy, gdt, B, K, D);
  EXPECT_BITWISE(dget(gdt, dt.size()), dt, "embedding_bwd");
}

TEST_F(CudaOps, Dropout) {
  const size_t n = 1000003;
  for (float p : {0.1f, 0.0f, 0.5f, 1.0f}) {
    for (size_t off : {size_t(0), size_t(1)}) {
      const uint64_t seed = next_seed();
      F x = rnd(n), y(n), dx(n);
      cpu().dropout_fwd(x.data(), y.data(), n, p, seed);
      cpu().dropout_bwd(x.data(), dx.data(), n, p, seed);
      float* gx = dalloc(n + 1) + off;
      float* gy = dalloc(n + 1) + off;
      gpu().upload(gx, x.data(), n);
      gpu().fill(gy, kNaN, n);
      gpu().dropout_fwd(gx, gy, n, p, seed);
      const std::string tag = " p=" + std::to_string(p) + " offset " + std::to_string(off);
      EXPECT_BITWISE(dget(gy, n), y, "dropout_fwd" + tag);
      gpu().fill(gy, kNaN, n);
      gpu().dropout_bwd(gx, gy, n, p, seed);
      EXPECT_BITWISE(dget(gy, n), dx, "dropout_bwd" + tag);
      Gpu::get().used = 0;
    }
  }
}

TEST_F(CudaOps, LossAndDiffusionHelpers) {
  for (size_t n : {size_t(32) * 3 * 64 * 64, size_t(1001)}) {
    const std::string tag = " n" + std::to_string(n);
    F pred = rndn(n), target = rndn(n), loss(1), dpred(n);
    cpu().mse_fwd_bwd(pred.data(), target.data(), loss.data(), dpred.data(), n);
    float *gp = dup(pred), *gt = dup(target), *gl = dnan(1), *gd = dnan(n);
    gpu().mse_fwd_bwd(gp, gt, gl, gd, n);
    EXPECT_CLOSE(dget(gl, 1), loss, 1e-6, "mse loss" + tag);
    EXPECT_BITWISE(dget(gd, n), dpred, "mse dpred" + tag);
    gpu().fill(gd, kNaN, n);
    gpu().mse_fwd_bwd(gp, gt, nullptr, gd, n);
    EXPECT_BITWISE(dget(gd, n), dpred, "mse dpred without loss" + tag);
    gpu().fill(gl, kNaN, 1);
    gpu().mse_fwd_bwd(gp, gt, gl, nullptr, n);
    EXPECT_CLOSE(dget(gl, 1), loss, 1e-6, "mse loss without dpred" + tag);
  }
  {  // odd offsets: scalar path of the loss
    const size_t n = 777;
    F pred = rndn(n), target = rndn(n), loss(1), dpred(n);
    cpu().mse_fwd_bwd(pred.data(), target.data(), loss.data(), dpred.data(), n);
    float* gp = dalloc(n + 1) + 1;
    float* gt = dalloc(n + 1) + 3;
    gpu().upload(gp, pred.data(), n);
    gpu().upload(gt, target.data(), n);
    float *gl = dnan(1), *gd = dnan(n);
    gpu().mse_fwd_bwd(gp, gt, gl, gd, n);
    EXPECT_CLOSE(dget(gl, 1), loss, 1e-6, "mse loss misaligned");
    EXPECT_BITWISE(dget(gd, n), dpred, "mse dpred misaligned");
  }
  {  // q_sample
    const int B = 32;
    const size_t per = 3 * 64 * 64;
    F x0 = rnd(B * per), noise = rndn(B * per), sa = rnd(B, 0.f, 1.f), s1 = rnd(B, 0.f, 1.f);
    F xt(B * per);
    cpu().q_sample(x0.data(), noise.data(), sa.data(), s1.data(), xt.data(), B, per);
    float* gxt = dnan(B * per);
    gpu().q_sample(dup(x0), dup(noise), dup(sa), dup(s1), gxt, B, per);
    EXPECT_CLOSE(dget(gxt, B * per), xt, 1e-6, "q_sample");
    F xt3(3 * 7);
    cpu().q_sample(x0.data(), noise.data(), sa.data(), s1.data(), xt3.data(), 3, 7);
    gpu().q_sample(dup(F(x0.begin(), x0.begin() + 21)), dup(F(noise.begin(), noise.begin() + 21)), dup(sa),
                   dup(s1), gxt, 3, 7);
    EXPECT_CLOSE(dget(gxt, 21), xt3, 1e-6, "q_sample odd");
  }
  {  // axpbypcz (null x or z count as zero), clamp
    const size_t n = 100003;
    F x = rnd(n), y = rnd(n), z = rnd(n);
    struct Case {
      bool hx, hz;
    };
    for (Case cs : {Case{true, true}, Case{false, true}, Case{true, false}}) {
      F yc = y;
      cpu().axpbypcz(0.3f, cs.hx ? x.data() : nullptr, -1.7f, yc.data(), 2.1f, cs.hz ? z.data() : nullptr, n);
      float* gy = dup(y);
      gpu().axpbypcz(0.3f, cs.hx ? dup(x) : nullptr, -1.7f, gy, 2.1f, cs.hz ? dup(z) : nullptr, n);
      EXPECT_CLOSE(dget(gy, n), yc, 1e-6,
                   std::string("axpbypcz") + (cs.hx ? "" : " (no x)") + (cs.hz ? "" : " (no z)"));
    }
    F c = rndn(n, 2.f), cc = c;
    cpu().clamp(cc.data(), -1.f, 1.f, n);
    float* gc = dup(c);
    gpu().clamp(gc, -1.f, 1.f, n);
    EXPECT_BITWISE(dget(gc, n), cc, "clamp");
  }
}

TEST_F(CudaOps, Optimizer) {
  for (size_t n : {size_t(22080323), size_t(1000003)}) {  // seed64's parameter count; odd
    const std::string tag = " n" + std::to_string(n);
    F g = rndn(n, 0.01f), p = rndn(n, 0.1f), m = rndn(n, 0.001f), v = rnd(n, 0.f, 1e-5f);
    F ss(1);
    cpu().sum_squares(g.data(), ss.data(), n);
    float *gg = dup(g), *gss = dnan(1);
    gpu().sum_squares(gg, gss, n);
    EXPECT_CLOSE(dget(gss, 1), ss, 1e-6, "sum_squares" + tag);
    gpu().sum_squares(gg + 1, gss, n - 1);  // misaligned
    F ss1(1);
    cpu().sum_squares(g.data() + 1, ss1.data(), n - 1);
    EXPECT_CLOSE(dget(gss, 1), ss1, 1e-6, "sum_squares misaligned" + tag);
    // clip_scale: clipping active, inactive, disabled; norm nullable
    const float norm = std::sqrt(ss[0]);
    for (float clip : {norm * 0.5f, norm * 2.f, 0.f}) {
      F cn(1), cs(1);
      cpu().clip_scale(ss.data(), clip, cn.data(), cs.data());
      float *gn = dnan(1), *gs = dnan(1);
      float* gs_in = dup(ss);
      gpu().clip_scale(gs_in, clip, gn, gs);
      EXPECT_CLOSE(dget(gn, 1), cn, 1e-6, "clip_scale norm");
      EXPECT_CLOSE(dget(gs, 1), cs, 1e-6, "clip_scale scale clip=" + std::to_string(clip));
      gpu().fill(gs, kNaN, 1);
      gpu().clip_scale(gs_in, clip, nullptr, gs);
      EXPECT_CLOSE(dget(gs, 1), cs, 1e-6, "clip_scale without norm");
    }
    // AdamW at step 3 with a clip scale, and without one
    const float lr = 1e-4f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    const float bc1 = 1.f - std::pow(b1, 3.f), bc2 = 1.f - std::pow(b2, 3.f);
    for (bool with_scale : {true, false}) {
      F scale = {0.7f};
      F p2 = p, m2 = m, v2 = v;
      cpu().adamw(p2.data(), g.data(), m2.data(), v2.data(), n, lr, b1, b2, eps, wd, bc1, bc2,
                  with_scale ? scale.data() : nullptr);
      float *gp = dup(p), *gm = dup(m), *gv = dup(v);
      gpu().adamw(gp, gg, gm, gv, n, lr, b1, b2, eps, wd, bc1, bc2, with_scale ? dup(scale) : nullptr);
      const std::string t2 = tag + (with_scale ? " grad_scale 0.7" : " no grad_scale");
      EXPECT_CLOSE(dget(gp, n), p2, 1e-6, "adamw p" + t2);
      EXPECT_CLOSE(dget(gm, n), m2, 1e-6, "adamw m" + t2);
      EXPECT_CLOSE(dget(gv, n), v2, 1e-6, "adamw v" + t2);
    }
    // EMA
    F e = rndn(n, 0.1f), e2 = e;
    cpu().ema(e2.data(), p.data(), 0.9999f, n);
    float *ge = dup(e), *gp = dup(p);
    gpu().ema(ge, gp, 0.9999f, n);
    EXPECT_CLOSE(dget(ge, n), e2, 1e-6, "ema" + tag);
    Gpu::get().used = 0;
  }
}

// ================================ determinism =================================================

// Runs a fixed set of ops on backend `be` over the given inputs and returns every output.
std::vector<F> run_suite(Backend& be, Precision p, const std::map<std::string, F>& in) {
  be.set_precision(p);
  auto put = [&](const F& h) {
    float* d = be.alloc(h.size());
    be.upload(d, h.data(), h.size());
    return d;
  };
  auto out = [&](size_t n) {
    float* d = be.alloc(n);
    be.fill(d, kNaN, n);
    return d;
  };
  std::vector<F> res;
  auto get = [&](const float* d, size_t n) {
    F h(n);
    be.download(h.data(), d, n);
    res.push_back(std::move(h));
  };
  const int B = 8, H = 32, C = 64;
  const size_t n = (size_t)B * H * H * C;
  float *x = put(in.at("x")), *w3 = put(in.at("w3")), *w1 = put(in.at("w1")), *bias = put(in.at("bias")),
        *bias256 = put(in.at("bias256")), *dy = put(in.at("dy")), *dy2 = put(in.at("dy2"));
  for (auto [k, s] : {std::pair{3, 1}, std::pair{3, 2}, std::pair{1, 1}}) {
    const int Ho = conv_out(H, k, s);
    const size_t ny = (size_t)B * Ho * Ho * C;
    float *y = out(ny), *dx = out(n), *dw = out((size_t)C * k * k * C), *db = out(C);
    be.conv2d_fwd(x, k == 3 ? w3 : w1, bias, y, B, H, H, C, C, k, s);
    be.conv2d_bwd(x, k == 3 ? w3 : w1, s == 2 ? dy2 : dy, dx, dw, db, B, H, H, C, C, k, s);
    get(y, ny), get(dx, n), get(dw, (size_t)C * k * k * C), get(db, C);
  }
  {
    float *y = out(n), *m = out(B * 32), *r = out(B * 32), *dx = out(n), *dg = out(C), *dbt = out(C);
    be.groupnorm_fwd(x, bias, bias, y, m, r, B, H * H, C, 32, true);
    be.groupnorm_bwd(x, bias, bias, m, r, dy, dx, dg, dbt, B, H * H, C, 32, true);
    get(y, n), get(m, B * 32), get(r, B * 32), get(dx, n), get(dg, C), get(dbt, C);
  }
  {
    const int T = 256, Ca = 96, heads = 3;
    float* qkv = put(in.at("qkv"));
    float *o = out((size_t)B * T * Ca), *a = out((size_t)B * heads * T * T),
          *dq = out((size_t)B * T * 3 * Ca);
    be.attention_fwd(qkv, o, a, B, T, Ca, heads, false);
    be.attention_bwd(qkv, a, x, dq, B, T, Ca, heads, false);  // x doubles as dout
    get(o, (size_t)B * T * Ca), get(dq, (size_t)B * T * 3 * Ca);
  }
  {
    float *y = out((size_t)B * 256), *dx = out((size_t)B * 64), *dw = out(256 * 64), *db = out(256);
    be.linear_fwd(x, w3, bias256, y, B, 64, 256);
    be.linear_bwd(x, w3, dy, dx, dw, db, B, 64, 256);
    get(y, (size_t)B * 256), get(dx, (size_t)B * 64), get(dw, 256 * 64), get(db, 256);
  }
  {
    float *de = out((size_t)B * C), *dss = out((size_t)B * 2 * C), *l = out(1), *dp = out(n), *ss = out(1);
    be.add_bcast_bwd(dy, de, B, H * H, C);
    be.scale_shift_bwd(x, dy, dy, nullptr, dss, B, H * H, C);
    be.mse_fwd_bwd(x, dy, l, dp, n);
    be.sum_squares(dy, ss, n);
    get(de, (size_t)B * C), get(dss, (size_t)B * 2 * C), get(l, 1), get(ss, 1);
  }
  return res;
}

TEST_F(CudaOps, DeterministicRunToRunAndAcrossInstances) {
  const int B = 8, H = 32, C = 64;
  const size_t n = (size_t)B * H * H * C;
  std::map<std::string, F> in = {{"x", rnd(n)},
                                 {"w3", rnd((size_t)C * 9 * C)},
                                 {"w1", rnd((size_t)C * C)},
                                 {"bias", rnd(C)},
                                 {"bias256", rnd(256)},
                                 {"dy", rnd(n)},
                                 {"dy2", rnd(n / 4)},
                                 {"qkv", rndn((size_t)B * 256 * 3 * 96)}};
  for (Precision p : {Precision::FP32, Precision::TF32}) {
    std::string why;
    auto b1 = unet::make_cuda_backend(&why);
    auto b2 = unet::make_cuda_backend(&why);
    ASSERT_TRUE(b1 && b2) << why;
    std::vector<F> r1 = run_suite(*b1, p, in);
    std::vector<F> r2 = run_suite(*b1, p, in);
    std::vector<F> r3 = run_suite(*b2, p, in);
    ASSERT_EQ(r1.size(), r2.size());
    ASSERT_EQ(r1.size(), r3.size());
    for (size_t i = 0; i < r1.size(); ++i) {
      const std::string what = std::string(pname(p)) + " output #" + std::to_string(i);
      bool finite = true;
      for (float v : r1[i]) finite = finite && std::isfinite(v);
      EXPECT_TRUE(finite) << what << " has non-finite values";
      EXPECT_BITWISE(r2[i], r1[i], what + " run to run");
      EXPECT_BITWISE(r3[i], r1[i], what + " across backend instances");
    }
  }
}

}  // namespace
