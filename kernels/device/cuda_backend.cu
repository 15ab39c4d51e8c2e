// CudaBackend: construction, memory, precision, the cuBLAS GEMM wrappers, profiler ranges.
#include <nvtx3/nvToolsExt.h>

#include <cstring>

#include "cuda_backend.cuh"
#include "cuda_backend.h"
#include "profile_hooks.h"
#include "util.h"

namespace unet {

void cuda_fail(const char* what, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  throw std::runtime_error(std::string("CUDA error at ") + (base ? base + 1 : file) + ":" +
                           std::to_string(line) + ": " + what);
}

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

__global__ void fill_kernel(float* x, float v, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = v;
}

std::string no_device_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  cudaGetLastError();  // clear the sticky-free error so later calls start clean
  if (e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
    return "no CUDA device found";
  return std::string("no CUDA device found (") + cudaGetErrorString(e) + ")";
}

}  // namespace

bool cuda_available() { return no_device_reason().empty(); }

std::unique_ptr<Backend> make_cuda_backend_with_workspace(size_t workspace_bytes, std::string* why_not) {
  std::string why = no_device_reason();
  if (!why.empty()) {
    if (why_not) *why_not = why;
    return nullptr;
  }
  try {
    return std::make_unique<CudaBackend>(workspace_bytes);
  } catch (const std::exception& e) {
    if (why_not) *why_not = std::string("CUDA initialisation failed: ") + e.what();
    return nullptr;
  }
}

std::unique_ptr<Backend> make_cuda_backend(std::string* why_not) {
  return make_cuda_backend_with_workspace(kCudaDefaultWorkspaceBytes, why_not);
}

void* cuda_backend_stream(Backend* b) {
  auto* c = dynamic_cast<CudaBackend*>(b);
  return c ? (void*)c->stream() : nullptr;
}

size_t cuda_backend_fixed_bytes(const Backend* b) {
  auto* c = dynamic_cast<const CudaBackend*>(b);
  return c ? c->fixed_bytes() : 0;
}

CudaBackend::CudaBackend(size_t workspace_bytes) {
  try {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    device_name_ = prop.name;
    CUDA_CHECK(cudaStreamCreate(&stream_));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    // Order matters: cublasSetStream resets the workspace to cuBLAS's own pool.
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspaceBytes));
    CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspaceBytes));
    CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));  // TF32 only when asked
    CUBLAS_CHECK(cublasSetAtomicsMode(cublas_, CUBLAS_ATOMICS_NOT_ALLOWED));
    ws_floats_ = workspace_bytes / sizeof(float);
    if (ws_floats_ < 64) ws_floats_ = 64;
    CUDA_CHECK(cudaMalloc(&ws_, ws_floats_ * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&scratch_, (kPartialFloats + kAuxFloats) * sizeof(float)));
    fixed_bytes_ = kCublasWorkspaceBytes + ws_floats_ * sizeof(float) + (kPartialFloats + kAuxFloats) * 4;
    for (auto& e : fences_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } catch (...) {
    release();  // a throwing constructor runs no destructor
    throw;
  }
}

CudaBackend::~CudaBackend() { release(); }

void CudaBackend::release() {
  // No throwing here: errors on teardown are ignored.
  if (stream_) cudaStreamSynchronize(stream_);
  if (graph_) cudaGraphExecDestroy(graph_), graph_ = nullptr;
  for (auto& e : fences_)
    if (e) cudaEventDestroy(e), e = nullptr;
  for (void* p : blocks_) cudaFree(p);
  blocks_.clear();
  for (void* p : host_blocks_) cudaFreeHost(p);
  host_blocks_.clear();
  if (cublas_) cublasDestroy(cublas_), cublas_ = nullptr;
  if (cublas_ws_) cudaFree(cublas_ws_), cublas_ws_ = nullptr;
  if (ws_) cudaFree(ws_), ws_ = nullptr;
  if (scratch_) cudaFree(scratch_), scratch_ = nullptr;
  if (stream_) cudaStreamDestroy(stream_), stream_ = nullptr;
}

void CudaBackend::set_precision(Precision p) {
  if (p == Precision::BF16) throw UserError("bf16 is not implemented yet");
  prec_ = p;
}

// ---- memory --------------------------------------------------------------------------------

void* CudaBackend::alloc_bytes(size_t bytes) {
  if (bytes == 0) bytes = 256;
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);  // 256-byte aligned
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error("CUDA out of memory allocating " + std::to_string(bytes >> 20) + " MiB (" +
                             std::to_string(bytes_ >> 20) + " MiB already planned)");
  }
  blocks_.push_back(p);
  bytes_ += bytes;
  return p;
}

float* CudaBackend::alloc(size_t n) { return (float*)alloc_bytes(n * sizeof(float)); }

void* CudaBackend::alloc_host(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
  host_blocks_.push_back(p);
  return p;
}

void CudaBackend::upload(float* dst, const float* host_src, size_t n) {
  upload_bytes(dst, host_src, n * sizeof(float));
}

void CudaBackend::upload_bytes(void* dst, const void* host_src, size_t bytes) {
  if (!bytes) return;
  // Pageable sources are staged by the driver before this returns; pinned ones (alloc_host) are
  // truly asynchronous and the caller fences before reusing them.
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::download(float* host_dst, const float* src, size_t n) {
  if (n) CUDA_CHECK(cudaMemcpyAsync(host_dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(float* dst, const float* src, size_t n) {
  if (!n || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill(float* x, float v, size_t n) {
  if (!n) return;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (bits == 0) {
    CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream_));
    return;
  }
  fill_kernel<<<grid_for(n), kThreads, 0, stream_>>>(x, v, n);
  KERNEL_CHECK();
}

void CudaBackend::graph_begin() {
  // Thread-local mode: other threads (the data loader) may use the CUDA API meanwhile.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
}

void CudaBackend::graph_end() {
  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
  if (graph_) {
    CUDA_CHECK(cudaGraphExecDestroy(graph_));
    graph_ = nullptr;
  }
  CUDA_CHECK(cudaGraphInstantiate(&graph_, g, 0));
  CUDA_CHECK(cudaGraphDestroy(g));
}

void CudaBackend::graph_launch() {
  if (!graph_) throw std::logic_error("graph_launch without a captured graph");
  CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
}

void CudaBackend::sync() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

uint64_t CudaBackend::fence() {
  ++fence_id_;
  CUDA_CHECK(cudaEventRecord(fences_[fence_id_ % kFences], stream_));
  return fence_id_;
}

void CudaBackend::fence_wait(uint64_t id) {
  if (id == 0 || id > fence_id_) return;
  // If the slot has been re-recorded by a later fence, waiting for that one is still correct
  // (it comes after), just later than necessary.
  CUDA_CHECK(cudaEventSynchronize(fences_[id % kFences]));
}

void CudaBackend::range_push(const char* name) {
  nvtxRangePushA(name);
  if (RangeListener* l = range_listener()) l->push(name);
}

void CudaBackend::range_pop() {
  nvtxRangePop();
  if (RangeListener* l = range_listener()) l->pop();
}

// ---- GEMM ----------------------------------------------------------------------------------
// cuBLAS is column-major; a row-major X[r,c] is the column-major X^T. So row-major
// C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: swap the operands and the
// M/N roles, keep each operand's transpose flag.

namespace {
cublasComputeType_t compute_type(Precision p) {
  return p == Precision::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}
}  // namespace

void CudaBackend::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                       const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  CUBLAS_CHECK(cublasGemmEx(cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                            &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                            compute_type(prec_), CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                               long long sA, const float* B, int ldb, long long sB, float beta, float* C,
                               int ldc, long long sC, int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F, ldb,
                                          sB, A, CUDA_R_32F, lda, sA, &beta, C, CUDA_R_32F, ldc, sC, batch,
                                          compute_type(prec_), CUBLAS_GEMM_DEFAULT));
}

}  // namespace unet
