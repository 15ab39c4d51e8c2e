// FLOP and minimum-byte counts per op (conventions in flops.h) and the counting Backend.
#include "flops.h"

namespace unet::flops {

namespace {
constexpr double kF = 4.0;  // bytes per float

// Per-element FLOP of the memory-bound ops. Transcendentals (exp, cos, rsqrt) count 1, as in
// most FLOP counters; the exact values are conventions and only shift the compute axis slightly.
constexpr double kGnFwd = 7;    // sum, sum of squares (3) + (x-mean)*rstd*gamma+beta (4)
constexpr double kGnBwd = 8;    // two reductions (4) + dx formula (4)
constexpr double kSiluFwd = 4;  // exp, add, div, mul
constexpr double kSiluBwd = 6;  // recompute sigmoid (3) + dy*s*(1+x*(1-s)) (3)
constexpr double kAdamw = 16;   // grad scale, two moments, bias corrections, sqrt, div, decay, update

int out_size(int n, int k, int stride) { return (n + 2 * (k / 2) - k) / stride + 1; }
}  // namespace

Cost conv2d_fwd(int B, int H, int W, int Ci, int Co, int k, int stride, bool bias) {
  const double Ho = out_size(H, k, stride), Wo = out_size(W, k, stride);
  const double M = (double)B * Ho * Wo, K = (double)k * k * Ci;
  Cost c;
  c.flops = 2.0 * M * Co * K + (bias ? M * Co : 0.0);
  c.bytes = kF * ((double)B * H * W * Ci + Co * K + (bias ? Co : 0) + M * Co);
  return c;
}

Cost conv2d_bwd(int B, int H, int W, int Ci, int Co, int k, int stride, bool dx, bool dw, bool db) {
  const double Ho = out_size(H, k, stride), Wo = out_size(W, k, stride);
  const double M = (double)B * Ho * Wo, K = (double)k * k * Ci, X = (double)B * H * W * Ci;
  Cost c;
  // dx is the transposed convolution: the same multiply-adds as the forward, whatever the stride.
  if (dx) c.flops += 2.0 * M * Co * K, c.bytes += kF * (Co * K + X);
  if (dw) c.flops += 2.0 * M * Co * K, c.bytes += kF * (X + Co * K);
  if (db) c.flops += M * Co, c.bytes += kF * Co;
  if (dx || dw || db) c.bytes += kF * M * Co;  // dy read once
  return c;
}

Cost linear_fwd(int N, int I, int O, bool bias) {
  Cost c;
  c.flops = 2.0 * N * I * O + (bias ? (double)N * O : 0.0);
  c.bytes = kF * ((double)N * I + (double)O * I + (bias ? O : 0) + (double)N * O);
  return c;
}

Cost linear_bwd(int N, int I, int O, bool dx, bool dw, bool db) {
  Cost c;
  if (dx) c.flops += 2.0 * N * I * O, c.bytes += kF * ((double)O * I + (double)N * I);
  if (dw) c.flops += 2.0 * N * I * O, c.bytes += kF * ((double)N * I + (double)O * I);
  if (db) c.flops += (double)N * O, c.bytes += kF * O;
  if (dx || dw || db) c.bytes += kF * (double)N * O;
  return c;
}

Cost groupnorm_fwd(int B, int HW, int C, int G, bool silu) {
  const double n = (double)B * HW * C;
  Cost c;
  c.flops = n * (kGnFwd + (silu ? kSiluFwd : 0));
  c.bytes = kF * (2 * n + 2.0 * C + 2.0 * B * G);  // x, y, gamma, beta, mean, rstd
  return c;
}

Cost groupnorm_bwd(int B, int HW, int C, int G, bool silu, bool dx, bool dgamma, bool dbeta) {
  const double n = (double)B * HW * C;
  Cost c;
  c.flops = n * (kGnBwd + (silu ? kSiluBwd : 0));
  // reads x, dy, gamma, beta, mean, rstd; writes the requested gradients
  c.bytes = kF * (2 * n + 2.0 * C + 2.0 * B * G + (dx ? n : 0) + (dgamma ? C : 0) + (dbeta ? C : 0));
  return c;
}

Cost elementwise(double n, double fpe, int reads, int writes) {
  Cost c;
  c.flops = n * fpe;
  c.bytes = kF * n * (reads + writes);
  return c;
}

Cost attention_fwd(int B, int T, int C, int heads) {
  const double T2 = (double)T * T;
  Cost c;
  // per head of width d: q.k^T 2*T*T*d, softmax ~5*T*T (max, sub, exp, sum, div), w.v 2*T*T*d
  c.flops = (double)B * (4.0 * T2 * C + 5.0 * heads * T2);
  // qkv read, out written, softmax weights saved for backward (part of the op's contract)
  c.bytes = kF * ((double)B * T * 3 * C + (double)B * T * C + (double)B * heads * T2);
  return c;
}

Cost attention_bwd(int B, int T, int C, int heads) {
  const double T2 = (double)T * T;
  Cost c;
  // dV = W^T dO, dW = dO V^T, dQ = dS K, dK = dS^T Q (2*T*T*d each), softmax backward ~4*T*T
  c.flops = (double)B * (8.0 * T2 * C + 4.0 * heads * T2);
  c.bytes = kF * ((double)B * T * 3 * C + (double)B * heads * T2 + (double)B * T * C + (double)B * T * 3 * C);
  return c;
}

Cost adamw(size_t n) { return elementwise((double)n, kAdamw, 4, 3); }  // reads p,g,m,v; writes p,m,v

// ---- CountingBackend ----

void CountingBackend::begin(const char* op, const Cost& c) {
  if (op_ranges_) range_push(op);  // first, so the cost lands in the op's own range
  if (counting_ && sink_) sink_(op, c);
}
void CountingBackend::end() {
  if (op_ranges_) range_pop();
}
void CountingBackend::range_push(const char* name) {
  in_.range_push(name);
  if (ranges_) ranges_->push(name);
}
void CountingBackend::range_pop() {
  if (ranges_) ranges_->pop();
  in_.range_pop();
}

void CountingBackend::upload(float* dst, const float* src, size_t n) {
  begin("upload", elementwise((double)n, 0, 0, 1));
  in_.upload(dst, src, n);
  end();
}
void CountingBackend::download(float* dst, const float* src, size_t n) {
  begin("download", elementwise((double)n, 0, 1, 0));
  in_.download(dst, src, n);
  end();
}
void CountingBackend::upload_bytes(void* dst, const void* src, size_t bytes) {
  begin("upload", Cost{0, (double)bytes});
  in_.upload_bytes(dst, src, bytes);
  end();
}
void CountingBackend::copy(float* dst, const float* src, size_t n) {
  begin("copy", elementwise((double)n, 0, 1, 1));
  in_.copy(dst, src, n);
  end();
}
void CountingBackend::fill(float* x, float v, size_t n) {
  begin("fill", elementwise((double)n, 0, 0, 1));
  in_.fill(x, v, n);
  end();
}

void CountingBackend::conv2d_fwd(const float* x, const float* w, const float* bias, float* y, int B, int H,
                                 int W, int Ci, int Co, int k, int stride) {
  begin(k == 1 ? "conv1x1_fwd" : "conv3x3_fwd",
        flops::conv2d_fwd(B, H, W, Ci, Co, k, stride, bias != nullptr));
  in_.conv2d_fwd(x, w, bias, y, B, H, W, Ci, Co, k, stride);
  end();
}
void CountingBackend::conv2d_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw,
                                 float* db, int B, int H, int W, int Ci, int Co, int k, int stride) {
  begin(k == 1 ? "conv1x1_bwd" : "conv3x3_bwd",
        flops::conv2d_bwd(B, H, W, Ci, Co, k, stride, dx != nullptr, dw != nullptr, db != nullptr));
  in_.conv2d_bwd(x, w, dy, dx, dw, db, B, H, W, Ci, Co, k, stride);
  end();
}
void CountingBackend::linear_fwd(const float* x, const float* w, const float* b, float* y, int N, int I,
                                 int O) {
  begin("linear_fwd", flops::linear_fwd(N, I, O, b != nullptr));
  in_.linear_fwd(x, w, b, y, N, I, O);
  end();
}
void CountingBackend::linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw,
                                 float* db, int N, int I, int O) {
  begin("linear_bwd", flops::linear_bwd(N, I, O, dx != nullptr, dw != nullptr, db != nullptr));
  in_.linear_bwd(x, w, dy, dx, dw, db, N, I, O);
  end();
}
void CountingBackend::groupnorm_fwd(const float* x, const float* gamma, const float* beta, float* y,
                                    float* mean, float* rstd, int B, int HW, int C, int G, bool silu) {
  begin(silu ? "groupnorm_silu_fwd" : "groupnorm_fwd", flops::groupnorm_fwd(B, HW, C, G, silu));
  in_.groupnorm_fwd(x, gamma, beta, y, mean, rstd, B, HW, C, G, silu);
  end();
}
void CountingBackend::groupnorm_bwd(const float* x, const float* gamma, const float* beta, const float* mean,
                                    const float* rstd, const float* dy, float* dx, float* dgamma,
                                    float* dbeta, int B, int HW, int C, int G, bool silu) {
  begin(silu ? "groupnorm_silu_bwd" : "groupnorm_bwd",
        flops::groupnorm_bwd(B, HW, C, G, silu, dx != nullptr, dgamma != nullptr, dbeta != nullptr));
  in_.groupnorm_bwd(x, gamma, beta, mean, rstd, dy, dx, dgamma, dbeta, B, HW, C, G, silu);
  end();
}
void CountingBackend::silu_fwd(const float* x, float* y, size_t n) {
  begin("silu_fwd", elementwise((double)n, kSiluFwd, 1, 1));
  in_.silu_fwd(x, y, n);
  end();
}
void CountingBackend::silu_bwd(const float* x, const float* dy, float* dx, size_t n) {
  begin("silu_bwd", elementwise((double)n, kSiluBwd, 2, 1));
  in_.silu_bwd(x, dy, dx, n);
  end();
}
void CountingBackend::add(const float* a, const float* b, float* y, size_t n) {
  begin("add", elementwise((double)n, 1, 2, 1));
  in_.add(a, b, y, n);
  end();
}
void CountingBackend::scale(float* x, float s, size_t n) {
  begin("scale", elementwise((double)n, 1, 1, 1));
  in_.scale(x, s, n);
  end();
}
void CountingBackend::add_bcast_fwd(float* h, const float* e, int B, int HW, int C) {
  Cost c = elementwise((double)B * HW * C, 1, 1, 1);
  c.bytes += kF * B * C;
  begin("add_bcast_fwd", c);
  in_.add_bcast_fwd(h, e, B, HW, C);
  end();
}
void CountingBackend::add_bcast_bwd(const float* dh, float* de, int B, int HW, int C) {
  Cost c = elementwise((double)B * HW * C, 1, 1, 0);
  c.bytes += kF * B * C;
  begin("add_bcast_bwd", c);
  in_.add_bcast_bwd(dh, de, B, HW, C);
  end();
}
void CountingBackend::scale_shift_fwd(const float* x, const float* ss, float* y, int B, int HW, int C) {
  Cost c = elementwise((double)B * HW * C, 2, 1, 1);
  c.bytes += kF * 2.0 * B * C;
  begin("scale_shift_fwd", c);
  in_.scale_shift_fwd(x, ss, y, B, HW, C);
  end();
}
void CountingBackend::scale_shift_bwd(const float* x, const float* ss, const float* dy, float* dx, float* dss,
                                      int B, int HW, int C) {
  Cost c = elementwise((double)B * HW * C, 5, 2, dx ? 1 : 0);
  c.bytes += kF * 2.0 * B * C * (dss ? 2 : 1);
  begin("scale_shift_bwd", c);
  in_.scale_shift_bwd(x, ss, dy, dx, dss, B, HW, C);
  end();
}
void CountingBackend::upsample2x_fwd(const float* x, float* y, int B, int H, int W, int C) {
  const double n = (double)B * H * W * C;
  begin("upsample2x_fwd", Cost{0, kF * (n + 4 * n)});
  in_.upsample2x_fwd(x, y, B, H, W, C);
  end();
}
void CountingBackend::upsample2x_bwd(const float* dy, float* dx, int B, int H, int W, int C) {
  const double n = (double)B * H * W * C;
  begin("upsample2x_bwd", Cost{3 * n, kF * (4 * n + n)});
  in_.upsample2x_bwd(dy, dx, B, H, W, C);
  end();
}
void CountingBackend::avgpool2x2_fwd(const float* x, float* y, int B, int H, int W, int C) {
  const double n = (double)B * H * W * C;
  begin("avgpool2x2_fwd", Cost{n, kF * (n + n / 4)});
  in_.avgpool2x2_fwd(x, y, B, H, W, C);
  end();
}
void CountingBackend::avgpool2x2_bwd(const float* dy, float* dx, int B, int H, int W, int C) {
  const double n = (double)B * H * W * C;
  begin("avgpool2x2_bwd", Cost{n, kF * (n / 4 + n)});
  in_.avgpool2x2_bwd(dy, dx, B, H, W, C);
  end();
}
void CountingBackend::concat_fwd(const float* a, const float* b, float* y, int B, int HW, int Ca, int Cb) {
  begin("concat_fwd", elementwise((double)B * HW * (Ca + Cb), 0, 1, 1));
  in_.concat_fwd(a, b, y, B, HW, Ca, Cb);
  end();
}
void CountingBackend::concat_bwd(const float* dy, float* da, float* db, int B, int HW, int Ca, int Cb) {
  const double n = (double)B * HW;
  begin("concat_bwd", Cost{0, kF * (n * (Ca + Cb) + (da ? n * Ca : 0) + (db ? n * Cb : 0))});
  in_.concat_bwd(dy, da, db, B, HW, Ca, Cb);
  end();
}
void CountingBackend::timestep_embedding(const float* t, float* y, int B, int dim) {
  begin("timestep_embedding", Cost{(double)B * dim * 4, kF * ((double)B + (double)B * dim)});
  in_.timestep_embedding(t, y, B, dim);
  end();
}
void CountingBackend::embedding_add_fwd(const int32_t* labels, const float* table, float* y, int B, int D) {
  begin("embedding_add_fwd", Cost{(double)B * D, kF * ((double)B + 3.0 * B * D)});
  in_.embedding_add_fwd(labels, table, y, B, D);
  end();
}
void CountingBackend::embedding_bwd(const int32_t* labels, const float* dy, float* dtable, int B, int K,
                                    int D) {
  begin("embedding_bwd", Cost{(double)B * D, kF * ((double)B + (double)B * D + (double)K * D)});
  in_.embedding_bwd(labels, dy, dtable, B, K, D);
  end();
}
void CountingBackend::attention_fwd(const float* qkv, float* out, float* attn, int B, int T, int C, int heads,
                                    bool legacy) {
  begin("attention_fwd", flops::attention_fwd(B, T, C, heads));
  in_.attention_fwd(qkv, out, attn, B, T, C, heads, legacy);
  end();
}
void CountingBackend::attention_bwd(const float* qkv, const float* attn, const float* dout, float* dqkv,
                                    int B, int T, int C, int heads, bool legacy) {
  begin("attention_bwd", flops::attention_bwd(B, T, C, heads));
  in_.attention_bwd(qkv, attn, dout, dqkv, B, T, C, heads, legacy);
  end();
}
void CountingBackend::dropout_fwd(const float* x, float* y, size_t n, float p, uint64_t seed) {
  begin("dropout_fwd", elementwise((double)n, 2, 1, 1));
  in_.dropout_fwd(x, y, n, p, seed);
  end();
}
void CountingBackend::dropout_bwd(const float* dy, float* dx, size_t n, float p, uint64_t seed) {
  begin("dropout_bwd", elementwise((double)n, 2, 1, 1));
  in_.dropout_bwd(dy, dx, n, p, seed);
  end();
}
void CountingBackend::mse_fwd_bwd(const float* pred, const float* target, float* loss, float* dpred,
                                  size_t n) {
  begin("mse_fwd_bwd", elementwise((double)n, 4, 2, 1));
  in_.mse_fwd_bwd(pred, target, loss, dpred, n);
  end();
}
void CountingBackend::q_sample(const float* x0, const float* noise, const float* sqrt_ab,
                               const float* sqrt_1mab, float* xt, int B, size_t n_per) {
  begin("q_sample", elementwise((double)B * n_per, 3, 2, 1));
  in_.q_sample(x0, noise, sqrt_ab, sqrt_1mab, xt, B, n_per);
  end();
}
void CountingBackend::axpbypcz(float a, const float* x, float b, float* y, float c, const float* z,
                               size_t n) {
  begin("axpbypcz", elementwise((double)n, 5, z ? 3 : 2, 1));
  in_.axpbypcz(a, x, b, y, c, z, n);
  end();
}
void CountingBackend::clamp(float* x, float lo, float hi, size_t n) {
  begin("clamp", elementwise((double)n, 2, 1, 1));
  in_.clamp(x, lo, hi, n);
  end();
}
void CountingBackend::sum_squares(const float* x, float* out, size_t n) {
  begin("sum_squares", elementwise((double)n, 2, 1, 0));
  in_.sum_squares(x, out, n);
  end();
}
void CountingBackend::adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                            float beta2, float eps, float wd, float bc1, float bc2, const float* grad_scale) {
  begin("adamw", flops::adamw(n));
  in_.adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale);
  end();
}
void CountingBackend::adamw_dev(float* p, const float* g, float* m, float* v, size_t n, const float* hyper,
                                float beta1, float beta2, float eps, const float* grad_scale) {
  begin("adamw", flops::adamw(n));
  in_.adamw_dev(p, g, m, v, n, hyper, beta1, beta2, eps, grad_scale);
  end();
}
void CountingBackend::clip_scale(const float* sumsq, float clip, float* norm, float* grad_scale) {
  begin("clip_scale", Cost{4, kF * 3});
  in_.clip_scale(sumsq, clip, norm, grad_scale);
  end();
}
void CountingBackend::ema(float* ema, const float* p, float rate, size_t n) {
  begin("ema", elementwise((double)n, 3, 2, 1));
  in_.ema(ema, p, rate, n);
  end();
}

}  // namespace unet::flops
