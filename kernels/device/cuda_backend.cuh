// The CUDA engine: class CudaBackend (declared here, defined across kernels/*.cu, one file per op
// family) plus the helpers those files share: error checks, launch sizing, vector-access tests.
//
// Ground rules every op follows:
//  * one stream (stream_) for everything, cuBLAS bound to it; no host synchronisation except in
//    download()/sync()/fence_wait();
//  * no cudaMalloc inside an op: the op workspace (ws_), the reduction scratch (scratch_) and
//    cuBLAS's workspace are allocated once at construction;
//  * deterministic: no atomics, every reduction runs in a fixed order that depends on the shapes
//    only, cuBLAS with a fixed workspace on one stream.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"

namespace unet {

[[noreturn]] void cuda_fail(const char* what, const char* file, int line);

#define CUDA_CHECK(expr)                                                                                     \
  do {                                                                                                       \
    cudaError_t err_ = (expr);                                                                               \
    if (err_ != cudaSuccess)                                                                                 \
      ::unet::cuda_fail((std::string(#expr) + ": " + cudaGetErrorString(err_)).c_str(), __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                              \
    cublasStatus_t st_ = (expr);                                                                    \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                               \
      ::unet::cuda_fail((std::string(#expr) + ": " + cublasGetStatusString(st_)).c_str(), __FILE__, \
                        __LINE__);                                                                  \
  } while (0)

// After every kernel launch: catches bad launch configurations (and earlier asynchronous errors).
#define KERNEL_CHECK() CUDA_CHECK(cudaGetLastError())

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than needed.
inline unsigned grid_for(size_t n, int threads = kThreads) {
  size_t b = (n + threads - 1) / threads;
  const size_t cap = 132 * 16;  // ~16 blocks per SM on an H100 (132 SMs); loops cover the rest
  if (b > cap) b = cap;
  return (unsigned)(b ? b : 1);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(size_t workspace_bytes);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  bool is_cuda() const override { return true; }
  std::string name() const override { return "cuda (" + device_name_ + ")"; }
  void set_precision(Precision p) override;
  Precision precision() const override { return prec_; }

  float* alloc(size_t n) override;
  void* alloc_bytes(size_t bytes) override;
  void upload(float* dst, const float* host_src, size_t n) override;
  void download(float* host_dst, const float* src, size_t n) override;
  void upload_bytes(void* dst, const void* host_src, size_t bytes) override;
  void copy(float* dst, const float* src, size_t n) override;
  void fill(float* x, float v, size_t n) override;
  void sync() override;
  size_t peak_bytes() const override { return bytes_ + fixed_bytes_; }  // planned + fixed workspaces
  void* alloc_host(size_t bytes) override;
  uint64_t fence() override;
  void fence_wait(uint64_t id) override;
  bool supports_graphs() const override { return true; }
  void graph_begin() override;
  void graph_end() override;
  void graph_launch() override;
  void adamw_dev(float* p, const float* g, float* m, float* v, size_t n, const float* hyper, float beta1,
                 float beta2, float eps, const float* grad_scale) override;
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
  void clip_scale(const float* sumsq, float clip, float* norm, float* grad_scale) override;
  void ema(float* ema, const float* p, float rate, size_t n) override;

  // ---- shared by the op files ----
  cudaStream_t stream() const { return stream_; }
  size_t fixed_bytes() const { return fixed_bytes_; }

  // Row-major GEMM: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, leading dimensions
  // in elements of the row-major storage (op(A) = A^T reads A stored [K,M]). Runs on cuBLAS
  // in the current precision (FP32: CUBLAS_COMPUTE_32F on CUDA cores; TF32: tensor cores).
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
            int ldb, float beta, float* C, int ldc);
  // The same for `batch` independent products at fixed element strides.
  void gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, long long sA,
                    const float* B, int ldb, long long sB, float beta, float* C, int ldc, long long sC,
                    int batch);

  // Op workspace (floats): one op at a time uses it, in stream order.
  float* ws() const { return ws_; }
  size_t ws_floats() const { return ws_floats_; }
  // Reduction scratch: partial sums of the column reductions (kPartialFloats) followed by a small
  // auxiliary area (kAuxFloats) for per-(sample, channel) intermediates.
  static constexpr size_t kPartialFloats = size_t(3) << 20;  // 12 MiB
  static constexpr size_t kAuxFloats = size_t(1) << 20;      // 4 MiB
  float* partial() const { return scratch_; }
  float* aux() const { return scratch_ + kPartialFloats; }

 private:
  void release();
  std::string device_name_;
  Precision prec_ = Precision::FP32;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_ws_ = nullptr;
  float* ws_ = nullptr;
  size_t ws_floats_ = 0;
  float* scratch_ = nullptr;
  size_t fixed_bytes_ = 0;
  std::vector<void*> blocks_;       // alloc / alloc_bytes
  std::vector<void*> host_blocks_;  // alloc_host (pinned)
  size_t bytes_ = 0;
  static constexpr int kFences = 64;
  cudaEvent_t fences_[kFences] = {};
  uint64_t fence_id_ = 0;
  cudaGraphExec_t graph_ = nullptr;
};

// Shared epilogues (kernels/linear.cu): y[r, c] += bias[c] over rows x C; db[c] = sum_r dy[r, c]
// (deterministic column reduction).
void add_bias_rows(CudaBackend& be, float* y, const float* bias, size_t rows, int C);
void bias_grad(CudaBackend& be, const float* dy, float* db, int rows, int C);

}  // namespace unet
