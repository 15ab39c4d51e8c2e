// CPU reference engine: plain, obviously-correct loops (OpenMP where free). One file per op
// family in lib/ops/ (conv.cpp, linear.cpp, groupnorm.cpp, ...), mirroring kernels/*.cu; the
// kernels themselves are templates in lib/ops/<family>.h (all included by lib/ops/ref.h), called
// here for float and by the tests for double. Results are bitwise independent of the number of
// OpenMP threads (fixed-order reductions).
#pragma once
#include <cstdlib>
#include <memory>
#include <vector>

#include "backend.h"

namespace unet {

class CpuBackend final : public Backend {
 public:
  bool is_cuda() const override;
  std::string name() const override;
  void set_precision(Precision p) override;
  Precision precision() const override;
  float* alloc(size_t n) override;
  void* alloc_bytes(size_t bytes) override;
  void upload(float* dst, const float* host_src, size_t n) override;
  void download(float* host_dst, const float* src, size_t n) override;
  void upload_bytes(void* dst, const void* host_src, size_t bytes) override;
  void copy(float* dst, const float* src, size_t n) override;
  void fill(float* x, float v, size_t n) override;
  void sync() override;
  size_t peak_bytes() const override;
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
  void clip_scale(const float* sumsq, float clip, float* norm, float* grad_scale) override;
  void ema(float* ema, const float* p, float rate, size_t n) override;

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<void, Free>> blocks_;  // every alloc*, freed with the backend
  size_t bytes_ = 0;
  Precision prec_ = Precision::FP32;
};

}  // namespace unet
