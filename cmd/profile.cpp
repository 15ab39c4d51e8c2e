// unet profile — per-kernel (nsys cuda_gpu_kern_sum style), per-layer and roofline breakdown of
// one layer or the full training step, from CUPTI activity records.
//
// The work runs through flops::CountingBackend, which counts each op's FLOPs and minimum bytes
// into the innermost open layer range (RangeTracker) while forwarding to the CUDA backend; the
// tracker pushes each range's id to CUPTI so the kernels it launches are attributed to it.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include "commands.h"
#include "flops.h"
#include "init.h"
#include "model.h"
#include "params.h"
#include "profile_report.h"
#include "profiler_cupti.h"
#include "util.h"
#if __has_include("checkpoint.h")
#include "checkpoint.h"
#define UNET_PROFILE_CHECKPOINT 1
#endif

namespace unet {

namespace {

constexpr int kGroups = 32;

struct ProfileArgs {
  std::string layer = "model", checkpoint, pass = "step", format = "table", trace, precision = "tf32";
  int batch = 32, resolution = 0, out_ch = 0, emb_ch = 0, iters = 20, warmup = 5;
  long long params = 0;
  bool measure_peaks = false, op_ranges = false, no_plain = false, no_graph = false;
  double peak_tflops = 0, peak_gbps = 0;
  ModelFlags model;
  CLI::Option* in_ch_opt = nullptr;
};

// Device buffers filled from a counter-based generator (fast for the 100 MB inputs of a big layer).
class Buffers {
 public:
  Buffers(Backend& be, uint64_t seed) : be_(be), seed_(seed) {}
  float* empty(size_t n) { return be_.alloc(n); }
  float* constant(size_t n, float v) {
    float* p = be_.alloc(n);
    be_.fill(p, v, n);
    return p;
  }
  float* uniform(size_t n, float scale) {
    std::vector<float> h(n);
    uint64_t s = ++seed_ * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; ++i) {
      uint64_t z = s + 0x9E3779B97F4A7C15ull * (i + 1);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      h[i] = scale * (2.0f * (float)(z >> 40) * (1.0f / 16777216.0f) - 1.0f);
    }
    float* p = be_.alloc(n);
    be_.upload(p, h.data(), n);
    return p;
  }
  // Weights as PyTorch initialises them: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  float* weight(size_t n, size_t fan_in) { return uniform(n, 1.0f / std::sqrt((float)fan_in)); }

 private:
  Backend& be_;
  uint64_t seed_;
};

// RAII layer range.
struct Range {
  Backend& be;
  Range(Backend& b, const char* name) : be(b) { be.range_push(name); }
  ~Range() { be.range_pop(); }
};

struct Workload {
  virtual ~Workload() = default;
  virtual void forward() = 0;
  virtual void backward() {}
  virtual void update() {}
  virtual bool has_backward() const { return true; }
  std::string describe;
};

// ---- single layers ---------------------------------------------------------------------------

struct ConvWork : Workload {
  Backend& be;
  int B, R, Ci, Co, k, stride, Ro;
  float *x, *w, *b, *y, *dy, *dx, *dw, *db;
  const char *fname, *bname;
  ConvWork(Backend& be_, Buffers& m, int B_, int R_, int Ci_, int Co_, int k_, int stride_, const char* fn,
           const char* bn)
      : be(be_), B(B_), R(R_), Ci(Ci_), Co(Co_), k(k_), stride(stride_), fname(fn), bname(bn) {
    Ro = (R + 2 * (k / 2) - k) / stride + 1;
    x = m.uniform((size_t)B * R * R * Ci, 1.0f);
    w = m.weight((size_t)Co * k * k * Ci, (size_t)k * k * Ci);
    b = m.weight(Co, (size_t)k * k * Ci);
    y = m.empty((size_t)B * Ro * Ro * Co);
    dy = m.uniform((size_t)B * Ro * Ro * Co, 1.0f);
    dx = m.empty((size_t)B * R * R * Ci);
    dw = m.empty((size_t)Co * k * k * Ci);
    db = m.empty(Co);
  }
  void forward() override {
    Range r(be, fname);
    be.conv2d_fwd(x, w, b, y, B, R, R, Ci, Co, k, stride);
  }
  void backward() override {
    Range r(be, bname);
    be.conv2d_bwd(x, w, dy, dx, dw, db, B, R, R, Ci, Co, k, stride);
  }
};

struct UpsampleWork : Workload {
  Backend& be;
  int B, R, Ci, Co;
  float *x, *u, *w, *b, *y, *dy, *du, *dx, *dw, *db;
  UpsampleWork(Backend& be_, Buffers& m, int B_, int R_, int Ci_, int Co_)
      : be(be_), B(B_), R(R_), Ci(Ci_), Co(Co_) {
    const size_t n2 = (size_t)B * 4 * R * R;
    x = m.uniform((size_t)B * R * R * Ci, 1.0f);
    u = m.empty(n2 * Ci);
    w = m.weight((size_t)Co * 9 * Ci, 9 * (size_t)Ci);
    b = m.weight(Co, 9 * (size_t)Ci);
    y = m.empty(n2 * Co);
    dy = m.uniform(n2 * Co, 1.0f);
    du = m.empty(n2 * Ci);
    dx = m.empty((size_t)B * R * R * Ci);
    dw = m.empty((size_t)Co * 9 * Ci);
    db = m.empty(Co);
  }
  void forward() override {
    Range r(be, "upsample fwd");
    {
      Range s(be, "nearest 2x");
      be.upsample2x_fwd(x, u, B, R, R, Ci);
    }
    Range s(be, "conv");
    be.conv2d_fwd(u, w, b, y, B, 2 * R, 2 * R, Ci, Co, 3, 1);
  }
  void backward() override {
    Range r(be, "upsample bwd");
    {
      Range s(be, "conv");
      be.conv2d_bwd(u, w, dy, du, dw, db, B, 2 * R, 2 * R, Ci, Co, 3, 1);
    }
    Range s(be, "nearest 2x");
    be.upsample2x_bwd(du, dx, B, R, R, Ci);
  }
};

struct GroupNormWork : Workload {
  Backend& be;
  int B, HW, C;
  float *x, *g, *b, *y, *mean, *rstd, *dy, *dx, *dg, *db;
  GroupNormWork(Backend& be_, Buffers& m, int B_, int R, int C_) : be(be_), B(B_), HW(R * R), C(C_) {
    const size_t n = (size_t)B * HW * C;
    x = m.uniform(n, 1.0f);
    g = m.constant(C, 1.0f);
    b = m.constant(C, 0.0f);
    y = m.empty(n);
    mean = m.empty((size_t)B * kGroups);
    rstd = m.empty((size_t)B * kGroups);
    dy = m.uniform(n, 1.0f);
    dx = m.empty(n);
    dg = m.empty(C);
    db = m.empty(C);
  }
  void forward() override {
    Range r(be, "groupnorm+silu fwd");
    be.groupnorm_fwd(x, g, b, y, mean, rstd, B, HW, C, kGroups, true);
  }
  void backward() override {
    Range r(be, "groupnorm+silu bwd");
    be.groupnorm_bwd(x, g, b, mean, rstd, dy, dx, dg, db, B, HW, C, kGroups, true);
  }
};

struct LinearWork : Workload {
  Backend& be;
  int N, I, O;
  float *x, *w, *b, *y, *dy, *dx, *dw, *db;
  LinearWork(Backend& be_, Buffers& m, int N_, int I_, int O_) : be(be_), N(N_), I(I_), O(O_) {
    x = m.uniform((size_t)N * I, 1.0f);
    w = m.weight((size_t)O * I, I);
    b = m.weight(O, I);
    y = m.empty((size_t)N * O);
    dy = m.uniform((size_t)N * O, 1.0f);
    dx = m.empty((size_t)N * I);
    dw = m.empty((size_t)O * I);
    db = m.empty(O);
  }
  void forward() override {
    Range r(be, "linear fwd");
    be.linear_fwd(x, w, b, y, N, I, O);
  }
  void backward() override {
    Range r(be, "linear bwd");
    be.linear_bwd(x, w, dy, dx, dw, db, N, I, O);
  }
};

// SPEC §3 AttentionBlock: GN, qkv 1x1 conv, QKV attention, proj_out 1x1 conv, residual add.
struct AttentionWork : Workload {
  Backend& be;
  int B, R, T, C, heads;
  bool legacy;
  float *x, *g, *gb, *n, *mean, *rstd, *wq, *bq, *qkv, *a, *attw, *wp, *bp, *p, *out;
  float *dout, *da, *dwp, *dbp, *dqkv, *dn, *dwq, *dbq, *dx, *dg, *dgb;
  AttentionWork(Backend& be_, Buffers& m, int B_, int R_, int C_, int heads_, bool legacy_)
      : be(be_), B(B_), R(R_), T(R_ * R_), C(C_), heads(heads_), legacy(legacy_) {
    const size_t nx = (size_t)B * T * C;
    x = m.uniform(nx, 1.0f);
    g = m.constant(C, 1.0f);
    gb = m.constant(C, 0.0f);
    n = m.empty(nx);
    mean = m.empty((size_t)B * kGroups);
    rstd = m.empty((size_t)B * kGroups);
    wq = m.weight((size_t)3 * C * C, C);
    bq = m.weight((size_t)3 * C, C);
    qkv = m.empty(3 * nx);
    a = m.empty(nx);
    attw = m.empty((size_t)B * heads * T * T);
    wp = m.weight((size_t)C * C, C);
    bp = m.weight(C, C);
    p = m.empty(nx);
    out = m.empty(nx);
    dout = m.uniform(nx, 1.0f);
    da = m.empty(nx);
    dwp = m.empty((size_t)C * C);
    dbp = m.empty(C);
    dqkv = m.empty(3 * nx);
    dn = m.empty(nx);
    dwq = m.empty((size_t)3 * C * C);
    dbq = m.empty((size_t)3 * C);
    dx = m.empty(nx);
    dg = m.empty(C);
    dgb = m.empty(C);
  }
  void forward() override {
    Range r(be, "attention fwd");
    {
      Range s(be, "norm");
      be.groupnorm_fwd(x, g, gb, n, mean, rstd, B, T, C, kGroups, false);
    }
    {
      Range s(be, "qkv");
      be.conv2d_fwd(n, wq, bq, qkv, B, R, R, C, 3 * C, 1, 1);
    }
    {
      Range s(be, "attention");
      be.attention_fwd(qkv, a, attw, B, T, C, heads, legacy);
    }
    {
      Range s(be, "proj_out");
      be.conv2d_fwd(a, wp, bp, p, B, R, R, C, C, 1, 1);
    }
    Range s(be, "residual add");
    be.add(x, p, out, (size_t)B * T * C);
  }
  void backward() override {
    Range r(be, "attention bwd");
    {
      Range s(be, "proj_out");
      be.conv2d_bwd(a, wp, dout, da, dwp, dbp, B, R, R, C, C, 1, 1);
    }
    {
      Range s(be, "attention");
      be.attention_bwd(qkv, attw, da, dqkv, B, T, C, heads, legacy);
    }
    {
      Range s(be, "qkv");
      be.conv2d_bwd(n, wq, dqkv, dn, dwq, dbq, B, R, R, C, 3 * C, 1, 1);
    }
    {
      Range s(be, "norm");
      be.groupnorm_bwd(x, g, gb, mean, rstd, dn, dx, dg, dgb, B, T, C, kGroups, false);
    }
    Range s(be, "residual add");
    be.add(dx, dout, dx, (size_t)B * T * C);
  }
};

// SPEC §3 ResBlock without up/down-sampling; dropout is skipped (p = 0 in the seed model).
struct ResBlockWork : Workload {
  Backend& be;
  int B, R, HW, Ci, Co, E, Eo;
  bool ss;
  float *x, *emb, *g1, *b1, *a1, *m1, *r1, *w1, *c1, *h1, *embs, *we, *ce, *e;
  float *g2, *b2, *n2 = nullptr, *n2s = nullptr, *a2, *m2, *r2, *w2, *c2, *h2, *ws = nullptr, *cs = nullptr,
                  *s = nullptr, *out;
  float *dout, *dxs = nullptr, *dws = nullptr, *dcs = nullptr, *da2, *dw2, *dc2, *dn2s = nullptr,
               *dn2 = nullptr, *dh1, *dg2, *db2, *de, *dembs, *dwe, *dce, *demb, *da1, *dw1, *dc1, *dx, *dg1,
               *db1;
  ResBlockWork(Backend& be_, Buffers& m, int B_, int R_, int Ci_, int Co_, int E_, bool ss_)
      : be(be_), B(B_), R(R_), HW(R_ * R_), Ci(Ci_), Co(Co_), E(E_), Eo(ss_ ? 2 * Co_ : Co_), ss(ss_) {
    const size_t ni = (size_t)B * HW * Ci, no = (size_t)B * HW * Co;
    x = m.uniform(ni, 1.0f);
    emb = m.uniform((size_t)B * E, 1.0f);
    g1 = m.constant(Ci, 1.0f);
    b1 = m.constant(Ci, 0.0f);
    a1 = m.empty(ni);
    m1 = m.empty((size_t)B * kGroups);
    r1 = m.empty((size_t)B * kGroups);
    w1 = m.weight((size_t)Co * 9 * Ci, 9 * (size_t)Ci);
    c1 = m.weight(Co, 9 * (size_t)Ci);
    h1 = m.empty(no);
    embs = m.empty((size_t)B * E);
    we = m.weight((size_t)Eo * E, E);
    ce = m.weight(Eo, E);
    e = m.empty((size_t)B * Eo);
    g2 = m.constant(Co, 1.0f);
    b2 = m.constant(Co, 0.0f);
    if (ss) n2 = m.empty(no), n2s = m.empty(no), dn2s = m.empty(no), dn2 = m.empty(no);
    a2 = m.empty(no);
    m2 = m.empty((size_t)B * kGroups);
    r2 = m.empty((size_t)B * kGroups);
    w2 = m.weight((size_t)Co * 9 * Co, 9 * (size_t)Co);
    c2 = m.weight(Co, 9 * (size_t)Co);
    h2 = m.empty(no);
    if (Ci != Co) {
      ws = m.weight((size_t)Co * Ci, Ci);
      cs = m.weight(Co, Ci);
      s = m.empty(no);
      dxs = m.empty(ni);
      dws = m.empty((size_t)Co * Ci);
      dcs = m.empty(Co);
    }
    out = m.empty(no);
    dout = m.uniform(no, 1.0f);
    da2 = m.empty(no);
    dw2 = m.empty((size_t)Co * 9 * Co);
    dc2 = m.empty(Co);
    dh1 = m.empty(no);
    dg2 = m.empty(Co);
    db2 = m.empty(Co);
    de = m.empty((size_t)B * Eo);
    dembs = m.empty((size_t)B * E);
    dwe = m.empty((size_t)Eo * E);
    dce = m.empty(Eo);
    demb = m.empty((size_t)B * E);
    da1 = m.empty(ni);
    dw1 = m.empty((size_t)Co * 9 * Ci);
    dc1 = m.empty(Co);
    dx = m.empty(ni);
    dg1 = m.empty(Ci);
    db1 = m.empty(Ci);
  }
  void forward() override {
    Range r(be, "resblock fwd");
    {
      Range q(be, "in_layers");
      be.groupnorm_fwd(x, g1, b1, a1, m1, r1, B, HW, Ci, kGroups, true);
      be.conv2d_fwd(a1, w1, c1, h1, B, R, R, Ci, Co, 3, 1);
    }
    {
      Range q(be, "emb_layers");
      be.silu_fwd(emb, embs, (size_t)B * E);
      be.linear_fwd(embs, we, ce, e, B, E, Eo);
      if (!ss) be.add_bcast_fwd(h1, e, B, HW, Co);  // h += emb_out[:, :, None, None]
    }
    {
      Range q(be, "out_layers");
      if (ss) {
        be.groupnorm_fwd(h1, g2, b2, n2, m2, r2, B, HW, Co, kGroups, false);
        be.scale_shift_fwd(n2, e, n2s, B, HW, Co);
        be.silu_fwd(n2s, a2, (size_t)B * HW * Co);
      } else {
        be.groupnorm_fwd(h1, g2, b2, a2, m2, r2, B, HW, Co, kGroups, true);
      }
      be.conv2d_fwd(a2, w2, c2, h2, B, R, R, Co, Co, 3, 1);
    }
    Range q(be, "skip_connection");
    if (Ci != Co) {
      be.conv2d_fwd(x, ws, cs, s, B, R, R, Ci, Co, 1, 1);
      be.add(s, h2, out, (size_t)B * HW * Co);
    } else {
      be.add(x, h2, out, (size_t)B * HW * Co);
    }
  }
  void backward() override {
    Range r(be, "resblock bwd");
    if (Ci != Co) {
      Range q(be, "skip_connection");
      be.conv2d_bwd(x, ws, dout, dxs, dws, dcs, B, R, R, Ci, Co, 1, 1);
    }
    {
      Range q(be, "out_layers");
      be.conv2d_bwd(a2, w2, dout, da2, dw2, dc2, B, R, R, Co, Co, 3, 1);
      if (ss) {
        be.silu_bwd(n2s, da2, dn2s, (size_t)B * HW * Co);
        be.scale_shift_bwd(n2, e, dn2s, dn2, de, B, HW, Co);
        be.groupnorm_bwd(h1, g2, b2, m2, r2, dn2, dh1, dg2, db2, B, HW, Co, kGroups, false);
      } else {
        be.groupnorm_bwd(h1, g2, b2, m2, r2, da2, dh1, dg2, db2, B, HW, Co, kGroups, true);
      }
    }
    {
      Range q(be, "emb_layers");
      if (!ss) be.add_bcast_bwd(dh1, de, B, HW, Co);
      be.linear_bwd(embs, we, de, dembs, dwe, dce, B, E, Eo);
      be.silu_bwd(emb, dembs, demb, (size_t)B * E);
    }
    {
      Range q(be, "in_layers");
      be.conv2d_bwd(a1, w1, dh1, da1, dw1, dc1, B, R, R, Ci, Co, 3, 1);
      be.groupnorm_bwd(x, g1, b1, m1, r1, da1, dx, dg1, db1, B, HW, Ci, kGroups, true);
    }
    Range q(be, "residual add");
    be.add(dx, Ci != Co ? dxs : dout, dx, (size_t)B * HW * Ci);
  }
};

// The optimizer part of a training step over a flat arena of n parameters.
struct Optimizer {
  Backend& be;
  size_t n;
  float *p, *g, *m, *v, *sumsq, *norm, *scale;
  Optimizer(Backend& be_, Buffers& mem, float* params, float* grads, size_t n_)
      : be(be_), n(n_), p(params), g(grads) {
    m = mem.constant(n, 0.0f);
    v = mem.constant(n, 0.0f);
    sumsq = mem.empty(1);
    norm = mem.empty(1);
    scale = mem.empty(1);
  }
  void step() {
    Range r(be, "optimizer");
    {
      Range q(be, "grad norm");
      be.sum_squares(g, sumsq, n);
      be.clip_scale(sumsq, 0.0f, norm, scale);  // `unet train` default: no clipping, norm logged
    }
    Range q(be, "adamw");
    be.adamw(p, g, m, v, n, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f - 0.9f, 1.0f - 0.999f, scale);
  }
};

struct AdamwWork : Workload {
  std::unique_ptr<Optimizer> opt;
  AdamwWork(Backend& be, Buffers& m, size_t n) {
    float* p = m.uniform(n, 0.05f);
    float* g = m.uniform(n, 0.01f);
    opt = std::make_unique<Optimizer>(be, m, p, g, n);
  }
  void forward() override { opt->step(); }
  bool has_backward() const override { return false; }
};

// ---- the full training step --------------------------------------------------------------------

struct ModelWork : Workload {
  Backend& be;
  Model model;
  int B;
  size_t n;
  float *x0, *noise, *xt, *t, *sab, *s1mab, *out, *dout, *loss, *target;
  size_t nout;
  int32_t* labels = nullptr;
  std::unique_ptr<Optimizer> opt;
  ModelWork(Backend& be_, Buffers& m, const ModelConfig& cfg, int B_, const std::vector<float>& weights)
      : be(be_), model(cfg, be_), B(B_) {
    model.plan(B);
    be.upload(model.params(), weights.data(), model.arena_floats());
    n = (size_t)B * cfg.image_size * cfg.image_size * cfg.in_channels;
    x0 = m.uniform(n, 1.0f);
    noise = m.uniform(n, 1.7f);  // roughly unit variance
    xt = m.empty(n);
    std::vector<float> ts(B), a(B), b(B);
    for (int i = 0; i < B; ++i) {
      ts[i] = (float)((i * 7919) % cfg.diffusion_steps);
      const double ab = std::exp(-5.0 * ts[i] / cfg.diffusion_steps);
      a[i] = (float)std::sqrt(ab);
      b[i] = (float)std::sqrt(1 - ab);
    }
    t = m.empty(B);
    sab = m.empty(B);
    s1mab = m.empty(B);
    be.upload(t, ts.data(), B);
    be.upload(sab, a.data(), B);
    be.upload(s1mab, b.data(), B);
    if (cfg.class_cond) {
      std::vector<int32_t> l(B);
      for (int i = 0; i < B; ++i) l[i] = (i * 31) % cfg.num_classes;
      labels = static_cast<int32_t*>(be.alloc_bytes(sizeof(int32_t) * B));
      be.upload_bytes(labels, l.data(), sizeof(int32_t) * B);
    }
    nout = (size_t)B * cfg.image_size * cfg.image_size * cfg.out_channels();
    out = m.empty(nout);
    dout = m.empty(nout);
    loss = m.empty(1);
    // Learned sigma doubles the output channels; an MSE over all of them costs the same as
    // guided-diffusion's eps MSE + variational term to within a few memory-bound kernels.
    target = nout == n ? noise : m.uniform(nout, 1.7f);
    opt = std::make_unique<Optimizer>(be, m, model.params(), model.grads(), model.arena_floats());
  }
  void forward() override {
    {
      Range r(be, "q_sample");
      be.q_sample(x0, noise, sab, s1mab, xt, B, n / B);
    }
    Range r(be, "forward");
    model.forward(xt, t, labels, out, B, true, 1234);
  }
  void backward() override {
    {
      Range r(be, "loss");
      be.mse_fwd_bwd(out, target, loss, dout, nout);
    }
    Range r(be, "backward");
    model.backward(dout, B);
  }
  void update() override { opt->step(); }
};

void need(bool ok, const std::string& msg) {
  if (!ok) throw UserError(msg);
}

int heads_for(const ModelConfig& cfg, int C) {
  const int h = cfg.heads_for(C);
  need(h >= 1 && C % h == 0,
       "--layer attention: " + std::to_string(C) + " channels do not split into heads (--num-head-channels " +
           std::to_string(cfg.num_head_channels) + ", --num-heads " + std::to_string(cfg.num_heads) + ")");
  return h;
}

std::string shape(int B, int R, int Ci, int Co) {
  char b[160];
  std::snprintf(b, sizeof b, "B=%d %dx%d %d->%d channels", B, R, R, Ci, Co);
  return b;
}

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

void run_profile(ProfileArgs& a) {
  need(a.batch >= 1, "--batch-size must be at least 1");
  need(a.iters >= 1, "--iters must be at least 1");
  need(a.warmup >= 0, "--warmup must not be negative");
  if (!a.trace.empty()) check_writable_dir_for(a.trace);
  if (!a.checkpoint.empty() && !file_exists(a.checkpoint)) throw UserError(a.checkpoint + ": no such file");

  // The model configuration: a checkpoint's, else preset + flags. It also gives the layer defaults.
  ModelConfig cfg;
  std::vector<float> ck_weights;
  std::string model_what = a.model.preset;
  if (!a.checkpoint.empty()) {
#ifdef UNET_PROFILE_CHECKPOINT
    if (a.layer == "model") {
      need(!a.model.any_given(),
           "profile: model flags cannot be combined with a checkpoint (" + a.checkpoint + ")");
      Checkpoint ck = load_checkpoint(a.checkpoint);
      cfg = ck.cfg;
      ck_weights = std::move(ck.model);
    } else {
      cfg = a.model.apply(read_checkpoint_config(a.checkpoint));
    }
    model_what = a.checkpoint;
#else
    throw UserError("profile: this build cannot read checkpoints");
#endif
  } else {
    cfg = a.model.resolve();
  }

  // A GPU is required; say so in one line.
  std::string why;
  std::unique_ptr<Backend> dev = make_cuda_backend(&why);
  if (!dev) throw UserError("profile needs a CUDA GPU (" + why + ")");
  std::unique_ptr<prof::GpuProfiler> gp = prof::make_gpu_profiler(&why);
  if (!gp) throw UserError("profile needs a CUDA GPU (" + why + ")");
  const Precision prec = parse_precision(a.precision);
  dev->set_precision(prec);

  prof::RangeTracker tracker([&gp] { return gp->timestamp(); });
  tracker.on_push = [&gp](uint64_t id) { gp->push_range(id); };
  tracker.on_pop = [&gp] { gp->pop_range(); };
  flops::CountingBackend be(
      *dev, [&tracker](const char*, const flops::Cost& c) { tracker.add_cost(c.flops, c.bytes); }, &tracker,
      a.op_ranges);
  be.set_counting(false);
  Buffers mem(be, 0x5eed);

  // Layer shapes: explicit flags, else the model configuration's.
  const int B = a.batch;
  const int Ci = a.in_ch_opt->count() ? cfg.in_channels : cfg.num_channels;
  const int Co = a.out_ch > 0 ? a.out_ch : Ci;
  int att_res = 0;
  for (int r : cfg.attention_resolutions) att_res = std::max(att_res, r);
  const int R = a.resolution > 0         ? a.resolution
                : a.layer == "attention" ? (att_res ? att_res : 16)
                : a.layer == "upsample" || a.layer == "downsample"
                    ? cfg.image_size / (a.layer == "upsample" ? 2 : 1)
                    : cfg.image_size;
  need(Ci >= 1 && Co >= 1 && R >= 1, "--in-channels, --out-channels and --resolution must be positive");
  auto need_groups = [&](int c, const char* what) {
    need(c % kGroups == 0,
         std::string(what) + " " + std::to_string(c) + " is not divisible by the 32 GroupNorm groups");
  };

  std::unique_ptr<Workload> w;
  if (a.layer == "model") {
    ParamTable table = build_param_table(cfg);
    if (ck_weights.empty()) ck_weights = init_params(table, 0);
    w = std::make_unique<ModelWork>(be, mem, cfg, B, ck_weights);
    char b[200];
    std::snprintf(b, sizeof b, "model %s (%.2f M parameters), B=%d %dx%d", model_what.c_str(),
                  table.count / 1e6, B, cfg.image_size, cfg.image_size);
    w->describe = b;
  } else if (a.layer == "resblock") {
    need_groups(Ci, "--in-channels");
    need_groups(Co, "--out-channels");
    const int E = a.emb_ch > 0 ? a.emb_ch : cfg.time_embed_dim();
    w = std::make_unique<ResBlockWork>(be, mem, B, R, Ci, Co, E, cfg.use_scale_shift_norm);
    w->describe = "resblock " + shape(B, R, Ci, Co) + ", emb " + std::to_string(E) +
                  (cfg.use_scale_shift_norm ? ", scale-shift norm" : "");
  } else if (a.layer == "attention") {
    need_groups(Ci, "--in-channels");
    const int h = heads_for(cfg, Ci);
    w = std::make_unique<AttentionWork>(be, mem, B, R, Ci, h, !cfg.use_new_attention_order);
    w->describe = "attention " + shape(B, R, Ci, Ci) + ", " + std::to_string(h) + " heads" +
                  (cfg.use_new_attention_order ? "" : " (legacy order)");
  } else if (a.layer == "conv3x3" || a.layer == "conv1x1") {
    const int k = a.layer == "conv3x3" ? 3 : 1;
    w = std::make_unique<ConvWork>(be, mem, B, R, Ci, Co, k, 1, k == 3 ? "conv3x3 fwd" : "conv1x1 fwd",
                                   k == 3 ? "conv3x3 bwd" : "conv1x1 bwd");
    w->describe = a.layer + " " + shape(B, R, Ci, Co);
  } else if (a.layer == "downsample") {
    need(R % 2 == 0, "--layer downsample: --resolution must be even");
    w = std::make_unique<ConvWork>(be, mem, B, R, Ci, Co, 3, 2, "downsample fwd", "downsample bwd");
    w->describe = "downsample (3x3 conv, stride 2) " + shape(B, R, Ci, Co);
  } else if (a.layer == "upsample") {
    w = std::make_unique<UpsampleWork>(be, mem, B, R, Ci, Co);
    w->describe = "upsample (nearest 2x + 3x3 conv) " + shape(B, R, Ci, Co);
  } else if (a.layer == "groupnorm") {
    need_groups(Ci, "--in-channels");
    w = std::make_unique<GroupNormWork>(be, mem, B, R, Ci);
    w->describe = "groupnorm+silu " + shape(B, R, Ci, Ci);
  } else if (a.layer == "linear") {
    w = std::make_unique<LinearWork>(be, mem, B, Ci, Co);
    w->describe = "linear N=" + std::to_string(B) + " " + std::to_string(Ci) + "->" + std::to_string(Co);
  } else if (a.layer == "adamw") {
    const size_t n = a.params > 0 ? (size_t)a.params : build_param_table(cfg).total;
    w = std::make_unique<AdamwWork>(be, mem, n);
    w->describe = "adamw over " + std::to_string(n) + " parameters (grad norm + update)";
  } else {
    throw UserError("--layer " + a.layer + ": unknown layer");
  }
  std::string pass = w->has_backward() ? a.pass : "step";
  be.sync();

  prof::Peaks peaks = a.measure_peaks ? gp->measure_peaks(prec) : prof::device_peaks(gp->device(), prec);
  if (a.peak_tflops > 0)
    peaks.tflops = a.peak_tflops, peaks.source = "--peak-tflops/--peak-gbps and " + peaks.source;
  if (a.peak_gbps > 0)
    peaks.gbps = a.peak_gbps, peaks.source = "--peak-tflops/--peak-gbps and " + peaks.source;

  auto once = [&] {
    if (pass == "forward") {
      w->forward();
    } else if (pass == "backward") {
      w->backward();
    } else {
      w->forward();
      w->backward();
      w->update();
    }
  };
  if (pass == "backward") w->forward();  // saved activations for the backward-only loop

  // CUDA graphs: the timed kernels are replays of one captured iteration, as `unet train` runs
  // its step. Ranges (external correlation ids) only tag eager launches, so the layer table
  // comes from an eager pass of the same iterations first.
  const bool graph = !a.no_graph && dev->supports_graphs();
  std::fprintf(
      stderr, "unet: profiling %s, pass %s, precision %s on %s (%d warm-up + %d timed iterations%s)\n",
      w->describe.c_str(), pass.c_str(), precision_name(prec), gp->device().name.c_str(), a.warmup, a.iters,
      graph ? ", eager for the layer table, then as CUDA-graph replays" : ", eager launches");
  gp->start();
  for (int i = 0; i < a.warmup; ++i) once();
  gp->region_begin();
  tracker.clear();
  be.set_counting(true);
  for (int i = 0; i < a.iters; ++i) once();
  const double region_ms = gp->region_end();
  be.set_counting(false);
  std::vector<prof::Activity> acts = gp->take_activities();
  prof::assign_ranges_by_launch_time(acts, tracker.instances());

  prof::Report rep;
  rep.gpu = gp->device().name;
  rep.target = w->describe;
  rep.precision = precision_name(prec);
  rep.pass = pass;
  rep.iters = a.iters;
  rep.warmup = a.warmup;
  rep.peaks = peaks;
  rep.events_ms = region_ms;
  rep.dropped = gp->dropped();
  prof::build_report(rep, acts, tracker);
  rep.notes.push_back(
      "FLOPs count 2 per multiply-add (3x3 taps on padding included); bytes are the minimum traffic, each "
      "op's "
      "fp32 inputs read once and outputs written once");
  size_t outside = 0;
  for (const auto& x : acts) outside += x.range == 0;
  if (outside)
    rep.notes.push_back(std::to_string(outside) + " of " + std::to_string(acts.size()) +
                        " GPU activities ran outside any layer range");
  for (const auto& l : rep.layers)
    if (prof::roofline(l.flops, l.bytes, (double)l.time_ns, rep.peaks).peak_pct > 100) {
      rep.notes.push_back(
          "Peak (%) above 100: that range's data stayed in the L2 cache, which is faster than the "
          "DRAM roof");
      break;
    }
  // The trace shows the eager pass: there the kernels carry their layer ranges.
  if (!a.trace.empty()) {
    AtomicFile f(a.trace);
    {
      std::ofstream os(f.tmp_path());
      prof::write_chrome_trace(os, acts, tracker, rep.gpu);
      os.flush();
      if (!os) throw UserError(a.trace + ": write failed");
    }
    f.commit();
    rep.notes.push_back("trace written to " + a.trace + " (" + (graph ? "the eager pass, " : "") +
                        "open in https://ui.perfetto.dev or chrome://tracing)");
  }
  acts.clear();

  // Ranges are plain host calls from here on: no external ids, nothing the layer table counts.
  tracker.on_push = nullptr;
  tracker.on_pop = nullptr;
  if (graph) {
    try {
      dev->graph_begin();
      once();
      dev->graph_end();
    } catch (const std::exception& e) {
      throw UserError(std::string("profile: capturing the iteration as a CUDA graph failed (") + e.what() +
                      "); --no-graph profiles eager launches");
    }
    for (int i = 0; i < std::max(1, a.warmup); ++i) dev->graph_launch();  // upload + warm-up
    gp->region_begin();
    for (int i = 0; i < a.iters; ++i) dev->graph_launch();
    const double graph_ms = gp->region_end();
    std::vector<prof::Activity> gacts = gp->take_activities();
    prof::use_graph_replays(rep, gacts, graph_ms);
    rep.dropped += gp->dropped();
    rep.notes.push_back(
        "kernel table, kernel sum and CUDA events: " + std::to_string(a.iters) +
        " replays of one iteration captured as a CUDA graph (as `unet train` runs its step); layer table "
        "and FLOPs: the eager pass before it (same iterations, one launch per kernel); --no-graph for "
        "eager only");
    uint64_t graph_records = 0;
    for (const auto& k : rep.kernels) graph_records += k.instances;
    for (const auto& k : rep.memops) graph_records += k.instances;
    if (graph_records != rep.eager.activities)
      rep.notes.push_back("the graph replays ran " + std::to_string(graph_records) +
                          " GPU activities, the eager pass " + std::to_string(rep.eager.activities) +
                          " (the driver may turn memsets into kernels)");
    if (a.layer == "model" && cfg.dropout > 0)
      rep.notes.push_back(
          "dropout: its seed is fixed (captured in the graph), so every iteration uses the "
          "same mask");
  }
  gp->stop();
  if (rep.difference_pct() > 10) {
    char b[300];
    std::snprintf(b, sizeof b,
                  "the GPU sat idle %.3f ms/iter between kernels: launch latency or a host that cannot issue "
                  "kernels as fast as they run (small kernels)%s",
                  rep.idle_ms_per_iter(), graph ? "" : "; CUDA graphs (the default) remove most of it");
    rep.notes.push_back(b);
  }

  if (!a.no_plain) {
    // The same iterations with CUPTI detached: what the profiler itself costs.
    rep.plain_events_ms = gp->time_ms([&] {
      for (int i = 0; i < a.iters; ++i) graph ? dev->graph_launch() : once();
    });
  }

  std::string text = a.format == "json"  ? prof::format_json(rep)
                     : a.format == "csv" ? prof::format_csv(rep)
                                         : prof::format_table(rep);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void register_profile(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  auto* sub = app.add_subcommand("profile", "per-kernel, per-layer and roofline GPU time breakdown (CUPTI)");
  sub->add_option("checkpoint", a->checkpoint, "checkpoint whose model (and weights) to profile (optional)");
  sub->add_option(
         "--layer", a->layer,
         "what to run: model (the full training step; default) or one layer alone: resblock, attention, "
         "conv3x3, conv1x1, groupnorm, linear, upsample, downsample, adamw")
      ->check(CLI::IsMember({"model", "resblock", "attention", "conv3x3", "conv1x1", "groupnorm", "linear",
                             "upsample", "downsample", "adamw"}));
  sub->add_option("--pass", a->pass,
                  "forward, backward or step (forward+backward, + AdamW for the model; default)")
      ->check(CLI::IsMember({"forward", "backward", "step"}));
  sub->add_option("--batch-size", a->batch, "batch size (default 32)");
  sub->add_option(
      "--resolution", a->resolution,
      "layer input size R (RxR feature maps; default: --image-size, 16 for attention, half for upsample)");
  sub->add_option("--out-channels", a->out_ch, "layer output channels (default: = input channels)");
  sub->add_option("--emb-channels", a->emb_ch,
                  "resblock timestep-embedding width (default 4 x --num-channels)");
  sub->add_option("--params", a->params, "adamw: number of parameters (default: the model's)");
  sub->add_option("--iters", a->iters, "timed iterations (default 20)");
  sub->add_option("--warmup", a->warmup, "untimed warm-up iterations first (default 5)");
  sub->add_option("--precision", a->precision, "fp32, tf32 (default) or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  sub->add_option("--format", a->format, "table (default), csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}));
  sub->add_option("--trace", a->trace, "write a Chrome trace-event JSON (Perfetto, chrome://tracing) here");
  sub->add_flag("--ops", a->op_ranges,
                "also mark every backend op as a range (finer roofline, more host overhead)");
  sub->add_flag(
      "--measure-peaks", a->measure_peaks,
      "measure the peaks (1 GiB device copy, 8192^3 cuBLAS GEMM) instead of datasheet/device values");
  sub->add_option("--peak-tflops", a->peak_tflops, "override the peak TFLOP/s of the roofline");
  sub->add_option("--peak-gbps", a->peak_gbps, "override the peak GB/s of the roofline");
  sub->add_flag("--no-plain-timing", a->no_plain, "skip the extra timing run without the profiler attached");
  sub->add_flag("--no-graph", a->no_graph,
                "time eager launches (one per kernel) instead of CUDA-graph replays of a captured iteration");
  a->model.add(sub);
  a->in_ch_opt = sub->get_option("--in-channels");
  a->in_ch_opt->description(
      "layer input channels (default --num-channels); with --layer model: image channels (default 3)");
  sub->footer(
      "Kernel times are CUPTI activity records (GPU start/end), summed like `nsys stats --report\n"
      "cuda_gpu_kern_sum`; layer ranges are the model's range_push/pop names (also emitted as NVTX).\n"
      "The timed iterations replay one captured iteration as a CUDA graph (as `unet train` does);\n"
      "the layer table comes from an eager pass of the same iterations before it (--no-graph: eager only).\n"
      "Layer FLOPs count 2 per multiply-add; bytes are each op's inputs read and outputs written once.\n"
      "Examples:\n"
      "  unet profile --layer model --batch-size 32\n"
      "  unet profile --layer resblock --batch-size 32 --resolution 64 --in-channels 192 --out-channels 64\n"
      "  unet profile --layer attention --resolution 16 --in-channels 256 --format json --trace att.json");
  sub->callback([a] { run_profile(*a); });
}

}  // namespace unet
