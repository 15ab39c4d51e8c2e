// FLOPs and minimum bytes moved per op, from shapes alone — the two axes of the roofline.
//
// Conventions (stated in `unet profile --help` and the report):
//  * GEMM-shaped work (convolutions, linear, attention matmuls) counts 2 FLOP per multiply-add,
//    including the taps of a 3x3 convolution that fall on zero padding (an implicit GEMM does
//    that work too). Bias adds count 1 FLOP per output element.
//  * Memory-bound ops count a small fixed number of FLOP per element (listed in flops.cpp); they
//    never matter for the compute axis but keep totals honest.
//  * Minimum bytes = every input read once + every output written once, 4 bytes per float
//    (the op interface is float32 throughout; bf16 only changes the arithmetic inside kernels).
//    Outputs skipped with nullptr are not counted. Fusion across ops can go below this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "backend.h"
#include "profile_hooks.h"

namespace unet::flops {

struct Cost {
  double flops = 0;
  double bytes = 0;
  Cost& operator+=(const Cost& o) {
    flops += o.flops;
    bytes += o.bytes;
    return *this;
  }
};
inline Cost operator+(Cost a, const Cost& b) { return a += b; }

// Convolution, kernel k, stride s, padding k/2 (Backend::conv2d_*).
Cost conv2d_fwd(int B, int H, int W, int Ci, int Co, int k, int stride, bool bias);
Cost conv2d_bwd(int B, int H, int W, int Ci, int Co, int k, int stride, bool dx, bool dw, bool db);
Cost linear_fwd(int N, int I, int O, bool bias);
Cost linear_bwd(int N, int I, int O, bool dx, bool dw, bool db);
Cost groupnorm_fwd(int B, int HW, int C, int G, bool silu);
Cost groupnorm_bwd(int B, int HW, int C, int G, bool silu, bool dx, bool dgamma, bool dbeta);
// n elements, `fpe` FLOP each, `reads` input arrays and `writes` output arrays of n floats.
Cost elementwise(double n, double fpe, int reads, int writes);
Cost attention_fwd(int B, int T, int C, int heads);
Cost attention_bwd(int B, int T, int C, int heads);
Cost adamw(size_t n);

// A Backend that forwards every call to `inner` and reports each op's cost (and name) to `sink`
// first. Layer ranges go to `inner` (NVTX and the profiler hook of the CUDA backend) and to
// `ranges` when set. With op_ranges, every op is also wrapped in a range named after it, so a
// profile resolves down to single ops (one more range push/pop per op on the host).
class CountingBackend final : public Backend {
 public:
  using Sink = std::function<void(const char* op, const Cost& c)>;
  CountingBackend(Backend& inner, Sink sink, RangeListener* ranges = nullptr, bool op_ranges = false)
      : in_(inner), sink_(std::move(sink)), ranges_(ranges), op_ranges_(op_ranges) {}
  void set_counting(bool on) { counting_ = on; }
  Backend& inner() { return in_; }

  bool is_cuda() const override { return in_.is_cuda(); }
  std::string name() const override { return in_.name(); }
  void set_precision(Precision p) override { in_.set_precision(p); }
  Precision precision() const override { return in_.precision(); }
  float* alloc(size_t n) override { return in_.alloc(n); }
  void* alloc_bytes(size_t bytes) override { return in_.alloc_bytes(bytes); }
  void upload(float* dst, const float* src, size_t n) override;
  void download(float* dst, const float* src, size_t n) override;
  void upload_bytes(void* dst, const void* src, size_t bytes) override;
  void copy(float* dst, const float* src, size_t n) override;
  void fill(float* x, float v, size_t n) override;
  void sync() override { in_.sync(); }
  size_t peak_bytes() const override { return in_.peak_bytes(); }
  void* alloc_host(size_t bytes) override { return in_.alloc_host(bytes); }
  uint64_t fence() override { return in_.fence(); }
  void fence_wait(uint64_t id) override { in_.fence_wait(id); }
  bool supports_graphs() const override { return in_.supports_graphs(); }
  void graph_begin() override { in_.graph_begin(); }
  void graph_end() override { in_.graph_end(); }
  void graph_launch() override { in_.graph_launch(); }
  void range_push(const char* name) override;
  void range_pop() override;

  void conv2d_fwd(const float* x, const float* w, const float* bias, float* y, int B, int H, int W, int Ci,
                  int Co, int k, int stride) override;
  void conv2d_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int B,
                  int H, int W, int Ci, int Co, int k, int stride) override;
  void linear_fwd(const float* x, const float* w, const float* b, float* y, int N, int I, int O) override;
  void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int N,
                  int I, int O) override;
  void groupnorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                     float* rstd, int B, int HW, int C, int G, bool silu) override;
  void groupnorm_bwd(const float* x, const float* gamma, const float* beta, const float* mean,
                     const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta, int B,
                     int HW, int C, int G, bool silu) override;
  void silu_fwd(const float* x, float* y, size_t n) override;
  void silu_bwd(const float* x, const float* dy, float* dx, size_t n) override;
  void add(const float* a, const float* b, float* y, size_t n) override;
  void scale(float* x, float s, size_t n) override;
  void add_bcast_fwd(float* h, const float* e, int B, int HW, int C) override;
  void add_bcast_bwd(const float* dh, float* de, int B, int HW, int C) override;
  void scale_shift_fwd(const float* x, const float* ss, float* y, int B, int HW, int C) override;
  void scale_shift_bwd(const float* x, const float* ss, const float* dy, float* dx, float* dss, int B, int HW,
                       int C) override;
  void upsample2x_fwd(const float* x, float* y, int B, int H, int W, int C) override;
  void upsample2x_bwd(const float* dy, float* dx, int B, int H, int W, int C) override;
  void avgpool2x2_fwd(const float* x, float* y, int B, int H, int W, int C) override;
  void avgpool2x2_bwd(const float* dy, float* dx, int B, int H, int W, int C) override;
  void concat_fwd(const float* a, const float* b, float* y, int B, int HW, int Ca, int Cb) override;
  void concat_bwd(const float* dy, float* da, float* db, int B, int HW, int Ca, int Cb) override;
  void timestep_embedding(const float* t, float* y, int B, int dim) override;
  void embedding_add_fwd(const int32_t* labels, const float* table, float* y, int B, int D) override;
  void embedding_bwd(const int32_t* labels, const float* dy, float* dtable, int B, int K, int D) override;
  void attention_fwd(const float* qkv, float* out, float* attn, int B, int T, int C, int heads,
                     bool legacy) override;
  void attention_bwd(const float* qkv, const float* attn, const float* dout, float* dqkv, int B, int T, int C,
                     int heads, bool legacy) override;
  void dropout_fwd(const float* x, float* y, size_t n, float p, uint64_t seed) override;
  void dropout_bwd(const float* dy, float* dx, size_t n, float p, uint64_t seed) override;
  void mse_fwd_bwd(const float* pred, const float* target, float* loss, float* dpred, size_t n) override;
  void q_sample(const float* x0, const float* noise, const float* sqrt_ab, const float* sqrt_1mab, float* xt,
                int B, size_t n_per) override;
  void axpbypcz(float a, const float* x, float b, float* y, float c, const float* z, size_t n) override;
  void clamp(float* x, float lo, float hi, size_t n) override;
  void sum_squares(const float* x, float* out, size_t n) override;
  void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
             float eps, float wd, float bc1, float bc2, const float* grad_scale) override;
  void adamw_dev(float* p, const float* g, float* m, float* v, size_t n, const float* hyper, float beta1,
                 float beta2, float eps, const float* grad_scale) override;
  void clip_scale(const float* sumsq, float clip, float* norm, float* grad_scale) override;
  void ema(float* ema, const float* p, float rate, size_t n) override;

 private:
  // Reports the op and, with op_ranges, opens its range; the matching end() closes it.
  void begin(const char* op, const Cost& c);
  void end();
  Backend& in_;
  Sink sink_;
  RangeListener* ranges_;
  bool op_ranges_;
  bool counting_ = true;
};

}  // namespace unet::flops
