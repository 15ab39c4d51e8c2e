// The CUDA engine's shared pieces: the context every kernel variant runs with (stream, cuBLAS,
// precision, workspace, reduction scratch), error checks, launch sizing, and the element access
// helpers that let one kernel template serve f32 and bf16 storage (always computing in f32).
//
// Ground rules every variant follows:
//  * everything on ctx.stream, cuBLAS bound to it; no host synchronisation. (ctx.stream is the
//    stream of the lane in use, use_lane(): the side lane's ops see its own stream, handle,
//    workspace and scratch in the same fields);
//  * no cudaMalloc inside an op: the workspace is sized when memory is planned (prepare()),
//    the reduction scratch and cuBLAS's workspace at construction;
//  * deterministic: no atomics, every reduction in a fixed order that depends on shapes only.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine.h"

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

// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than needed,
// at most kGridCap (~16 blocks per SM on an H100, 132 SMs; loops cover the rest).
constexpr size_t kGridCap = 132 * 16;
inline unsigned grid_for(size_t n, int threads = kThreads) {
  size_t b = (n + threads - 1) / threads;
  if (b > kGridCap) b = kGridCap;
  return (unsigned)(b ? b : 1);
}

using bf16 = __nv_bfloat16;

// Replaces every memset node of a captured graph (cuDNN memsets its workspace before some of its
// kernels) by a kernel node doing the same, with the same edges (cuda_engine.cu says why).
void graph_memsets_as_kernels(cudaGraph_t g);
// Makes every programmatic edge between two kernels that are not unet's a full edge (cuDNN's
// kernels after a lane join; cuda_engine.cu says why). graph_end applies it to every capture.
void foreign_programmatic_edges_full(cudaGraph_t g);

// The first statement of every unet kernel. In the CUDA graphs (programmatic_edges() in
// cuda_engine.cu) an edge into a unet kernel lets it launch while its predecessor still runs
// (programmatic dependent launch, sm_90); this waits until the predecessor has completed and its
// writes are visible, so nothing of the kernel reads or writes memory before, and then lets the
// kernel's own successor launch early (its blocks wait the same way). Outside such an edge both
// are no-ops.
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A GEMM operand: row-major storage with leading dimension ld (elements) and, for batched
// products, a stride between matrices.
struct Mat {
  const void* p;
  DType t;
  int ld;
  long long stride = 0;
};

struct CudaCtx {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* cublas_ws = nullptr;  // cuBLAS's own workspace, bound to the handle
  Precision prec = Precision::TF32;
  std::string device_name;
  // Op workspace: need_workspace() at plan time grows ws_need; finalize() allocates it.
  void* ws = nullptr;
  size_t ws_bytes = 0, ws_need = 0;
  bool capturing = false;
  // Reduction scratch: partial sums of the column reductions (kPartialFloats) followed by a
  // small auxiliary area (kAuxFloats) for per-(sample, channel) intermediates.
  static constexpr size_t kPartialFloats = size_t(3) << 20;  // 12 MiB
  static constexpr size_t kAuxFloats = size_t(4) << 20;      // 16 MiB
  float* scratch = nullptr;
  float* partial() const { return scratch; }
  float* aux() const { return scratch + kPartialFloats; }
  // Integer tickets of the one-launch reductions (rowblock.cuh): zeroed at construction, and
  // every kernel that takes them puts them back to 0 before it ends.
  static constexpr size_t kTickets = 65536 + 1;
  unsigned* tickets = nullptr;

  void need_workspace(size_t bytes);  // grows now when not capturing a graph
  void alloc_workspace();             // to ws_need (outside a capture)

  // Lanes (Ops::lane/join). The fields above that a kernel launch uses (stream, cuBLAS handle,
  // workspace, reduction scratch, tickets) belong to the lane in use; the other lane's are kept
  // in `other` and swapped in by use_lane(), so variants need not know about lanes. The side
  // lane's stream, handle and memory are made at its first use (when memory is planned).
  struct Lane {
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;
    void* ws = nullptr;
    size_t ws_bytes = 0, ws_need = 0;
    float* scratch = nullptr;
    unsigned* tickets = nullptr;
    void* cublas_ws = nullptr;
  };
  Lane other;
  bool on_side = false;
  bool side_pending = false;  // work issued on the side lane since the last join
  cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
  void use_lane(bool side);
  void join_lanes();
  // The optimizer's stream (Ops::aside): a third stream for ops that use nothing of a lane but
  // its stream (elementwise maps) and sums over one tensor (reduce.cuh's full_sum, AdamW's gsq:
  // at most kGridCap double partials, in aside_scratch, swapped in for the lane's scratch while
  // on it), forked from both lanes by use_aside(true) and joined back by join_aside() only, so
  // the side lane's joins at every layer leave it running.
  static constexpr size_t kAsideScratchFloats = 2 * kGridCap;
  cudaStream_t aside_stream = nullptr, aside_saved = nullptr;
  float *aside_scratch = nullptr, *aside_saved_scratch = nullptr;
  // The side lane's stream priority (lower is more urgent; stream_priorities() in cuda_engine.cu).
  int prio_side = 0;
  cudaEvent_t aside_fork_ev = nullptr, aside_join_ev = nullptr, aside_side_ev = nullptr;
  bool on_aside = false, aside_pending = false;
  void use_aside(bool on);
  void join_aside();
  // The branch (Ops::branch/join_branch): a third lane with launch state of its own (a Lane, made
  // at its first use as the side lane's), forked from the main lane and joined by join_branch().
  Lane branch_lane;
  int prio_branch = 0;
  bool on_branch = false, branch_pending = false;
  cudaEvent_t branch_fork_ev = nullptr, branch_join_ev = nullptr;
  void use_branch(bool on);
  void join_branch();
  void join_all() {  // before the host reads, syncs or a capture begins or ends
    join_lanes();
    join_aside();
    join_branch();
  }
  void alloc_workspaces();    // alloc_workspace() for every lane (main, side, branch)
  size_t lane_bytes() const;  // every lane's op workspace and the side lane's and branch's own buffers
  void destroy_side();        // the side lane and the branch

  // Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C (op(A) = A^T reads A stored [K,M]),
  // `batch` products at the operands' strides. A and B share a dtype; C is f32 or that dtype.
  // Compute: f32 accumulate; f32 inputs use TF32 tensor cores unless the precision is fp32.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const Mat& A, const Mat& B, float beta,
            const Mat& C, int batch = 1);
};

using CudaOps = VariantOps<CudaCtx>;

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
// Bytes rounded up to 256: the size of a workspace piece, so that the next one starts aligned.
inline size_t round256(size_t n) { return (n + 255) / 256 * 256; }
// 4-element vector access: 16 bytes of f32, 8 of bf16.
template <class T>
inline bool vec4_ok(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T))) == 0;
}

// Whether a block may opt into `bytes` of shared memory on this device: its per-block opt-in limit
// (227 KB on Hopper, 99 KB on consumer Ampere / Ada / Blackwell; read once a process, as a process
// drives one GPU; cap_cuda_smem_optin lowers it for tests). A variant that asks for more than 48 KB
// tests its size in its `_ok`, so a smaller GPU falls back to another variant instead of failing
// the launch.
bool device_smem_fits(size_t bytes);

// A kernel's static shared memory plus `dynamic` bytes: what its launch takes (SIZE_MAX when the
// kernel cannot be read, which no device fits).
template <class K>
size_t kernel_smem(K kernel, size_t dynamic) {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
    cudaGetLastError();
    return SIZE_MAX;
  }
  return a.sharedSizeBytes + dynamic;
}

// Opts a kernel into more than 48 KiB of dynamic shared memory (the launchers call it once per
// instantiation, before its first launch).
template <class K>
void allow_dynamic_smem(K kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
// The same, only when `bytes` is more than `set` (what this kernel was allowed before, kept by the
// caller per kernel, starting at 0), which it then becomes. Not 48 KB to start: without the
// attribute a block's static and dynamic shared memory together stay within 48 KB, so a kernel
// with static shared memory fails its launch at exactly 48 KB of dynamic (GroupNorm's bf16 dx did).
template <class K>
void allow_dynamic_smem(K kernel, size_t bytes, size_t& set) {
  if (bytes <= set) return;
  allow_dynamic_smem(kernel, bytes);
  set = bytes;
}

// Typed device pointer of a tensor (T = float, bf16, int32_t), nullptr when absent.
template <class T>
T* dptr(const Tensor& t) {
  return static_cast<T*>(t.data);
}

// Calls f(T{}) with T = float or bf16 for an activation dtype.
template <class F>
void with_act(DType t, F&& f) {
  if (t == DType::BF16)
    f(bf16{});
  else if (t == DType::F32)
    f(float{});
  else
    throw std::logic_error("expected an f32 or bf16 tensor");
}

// ---- element access: load as float, store from float ----
__device__ __forceinline__ float ldf(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ldf(const bf16* p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void stf(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void stf(bf16* p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float4 ld4(const float* p, size_t j) {
  return reinterpret_cast<const float4*>(p)[j];
}
__device__ __forceinline__ float4 ld4(const bf16* p, size_t j) {
  const uint2 u = reinterpret_cast<const uint2*>(p)[j];
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void st4(float* p, size_t j, float4 v) { reinterpret_cast<float4*>(p)[j] = v; }
__device__ __forceinline__ void st4(bf16* p, size_t j, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  reinterpret_cast<uint2*>(p)[j] = u;
}

__device__ __forceinline__ float siluf_(float z) { return z / (1.0f + expf(-z)); }
__device__ __forceinline__ float silu_gradf_(float z) {
  const float s = 1.0f / (1.0f + expf(-z));
  return s * (1.0f + z * (1.0f - s));
}

// ---- vectorised elementwise map ----
// F provides  vec4(j): elements 4j..4j+3 (vector accesses),  scalar(i): element i.
template <class F>
__global__ void map_kernel(F f, size_t n4, size_t n) {
  pdl_entry();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (size_t j = tid; j < n4; j += stride) f.vec4(j);
  for (size_t i = 4 * n4 + tid; i < n; i += stride) f.scalar(i);
}

template <class F>
void launch_map(const F& f, size_t n, bool vec_ok, cudaStream_t s) {
  if (!n) return;
  const size_t n4 = vec_ok ? n / 4 : 0;
  const size_t items = n4 > n - 4 * n4 ? n4 : n - 4 * n4;
  map_kernel<<<grid_for(items), kThreads, 0, s>>>(f, n4, n);
  KERNEL_CHECK();
}

// One registration per op family (kernels/<family>/*.cu).
void register_conv_cuda(CudaOps& ops);  // kernels/conv/family.cu: the variants below, in order
void register_conv_narrow(CudaOps& ops);
void register_conv_simt(CudaOps& ops);
void register_conv_mma(CudaOps& ops);
void register_conv_pointwise(CudaOps& ops);
void register_conv_wgmma(CudaOps& ops);         // sm_90a builds only (UNET_HAVE_SM90A)
void register_conv_wgmma_first(CudaOps& ops);   // (the same)
void register_conv_cudnn_epi(CudaOps& ops);
void register_conv_cudnn_fused(CudaOps& ops);
void register_conv_cudnn(CudaOps& ops);
void register_conv_im2col(CudaOps& ops);
void destroy_cudnn(CudaCtx& ctx);  // the cuDNN handle and plans of an engine (kernels/conv/cudnn.cu)
void register_linear_cuda(CudaOps& ops);   // kernels/linear/cublas.cu; after register_linear_group
void register_linear_group(CudaOps& ops);  // the group ops' "tiled" (kernels/linear/group.cu)
void register_groupnorm_cuda(CudaOps& ops);  // kernels/groupnorm/family.cu: smem, fused, vec, threepass
void register_groupnorm_fused(CudaOps& ops);  // smem and fused (kernels/groupnorm/fused.cu)
void register_groupnorm_vec(CudaOps& ops);
// GroupNorm statistics (mean, rstd [B, G]) of x [B, H, W, C], as GroupNormFwd's "fused" variant
// computes them, for ops that also give the statistics of what they write (ConvFwd's mean/rstd);
// groupnorm_stats_fit: whether the shape fits its scratch (kernels/groupnorm/fused.cu).
bool groupnorm_stats_fit(const Tensor& x, const Tensor& mean);
void groupnorm_stats(CudaCtx& ctx, const Tensor& x, const Tensor& mean, const Tensor& rstd);
// For the variants of ops with optional output statistics (ConvFwd's and ConcatFwd's y, mean, rstd)
// that do not compute them themselves: Run, then groupnorm_stats over the y it wrote; and Ok plus
// whether that fits (any_op: no condition of its own).
template <class Op, void (*Run)(const Op&, CudaCtx&)>
void then_stats(const Op& o, CudaCtx& ctx) {
  Run(o, ctx);
  if (o.mean.defined()) groupnorm_stats(ctx, o.y, o.mean, o.rstd);
}
template <class Op>
bool any_op(const Op&, const CudaCtx&) {
  return true;
}
template <class Op, bool (*Ok)(const Op&, const CudaCtx&) = any_op<Op>>
bool stats_ok(const Op& o, const CudaCtx& c) {
  return (!o.mean.defined() || groupnorm_stats_fit(o.y, o.mean)) && Ok(o, c);
}
// Conv variants that do not apply a norm of their input (ConvFwd's / ConvBwdFilter's NormIn)
// decline ops with one (the model asks for it only where a variant does).
template <class Op, bool (*Ok)(const Op&, const CudaCtx&) = any_op<Op>>
bool no_norm(const Op& o, const CudaCtx& c) {
  return !o.norm.on() && Ok(o, c);
}
void register_groupnorm_threepass(CudaOps& ops);
void register_elementwise_cuda(CudaOps& ops);
void register_resample_cuda(CudaOps& ops);
void register_concat_cuda(CudaOps& ops);
void register_embedding_cuda(CudaOps& ops);
void register_attention_cuda(CudaOps& ops);
void register_pool_cuda(CudaOps& ops);
void register_dropout_cuda(CudaOps& ops);
void register_loss_cuda(CudaOps& ops);
void register_diffusion_cuda(CudaOps& ops);
void register_optimizer_cuda(CudaOps& ops);

// Shared epilogue pieces (kernels/linear/cublas.cu): y[r, c] += bias[c] over rows x C (y f32 or
// bf16); db[c] = sum_r dy[r, c] (deterministic column reduction, dy f32 or bf16).
void add_bias_rows(CudaCtx& ctx, const Tensor& y, const Tensor& bias, size_t rows, int C);
void bias_grad(CudaCtx& ctx, const Tensor& dy, const Tensor& db, int rows, int C);

}  // namespace unet
