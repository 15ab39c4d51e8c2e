// Multi-head self-attention on the fused qkv tensor [B, T, 3C] (guided-diffusion's QKVAttention,
// new order, and QKVAttentionLegacy). Per head: strided-batched cuBLAS GEMMs over the batch
// (Q, K, V are read in place with row stride 3C — no gather), an fp32 row softmax of our own.
//
//   logits = (q k^T) / sqrt(d)      (= (q d^-1/4)(k d^-1/4)^T of the reference)
//   attn   = softmax over keys      (saved [B*heads, T, T] for backward)
//   out    = attn v                 (written into the head's channels of [B, T, C])
// Backward: dv = attn^T dout; dattn = dout v^T; dlogit = attn * (dattn - rowsum(attn*dattn));
// dq = dlogit k / sqrt(d); dk = dlogit^T q / sqrt(d). dlogit lives in the workspace, a batch chunk
// at a time.
//
// Cost: the T x T score matrices go through memory three times forward (GEMM write, softmax
// read+write, GEMM read) and more in backward; a fused (flash-style) kernel is the speed step.
#include <cmath>
#include <string>

#include "cuda_backend.cuh"

namespace unet {

namespace {

struct HeadOffsets {
  int q, k, v;  // channel offsets of head h's q, k, v inside a qkv row of 3C
};
HeadOffsets head_offsets(int h, int C, int d, bool legacy) {
  if (legacy) return {3 * h * d, 3 * h * d + d, 3 * h * d + 2 * d};
  return {h * d, C + h * d, 2 * C + h * d};
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// In-place softmax of `rows` rows of length T; one warp per row (fixed lane order: deterministic).
__global__ void softmax_rows_kernel(float* p, size_t rows, int T) {
  const int lane = threadIdx.x & 31;
  const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
  for (size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; row < rows; row += nwarps) {
    float* r = p + row * T;
    float mx = -INFINITY;
    for (int j = lane; j < T; j += 32) mx = fmaxf(mx, r[j]);
    mx = warp_max(mx);
    float s = 0.f;
    for (int j = lane; j < T; j += 32) {
      const float e = expf(r[j] - mx);
      r[j] = e;
      s += e;
    }
    const float inv = 1.0f / warp_sum(s);
    for (int j = lane; j < T; j += 32) r[j] *= inv;
  }
}

// dS = P * (dP - sum_j P dP), in place on dS [nb, T, T]; P row (j, t) at P + j*p_stride + t*T.
__global__ void softmax_bwd_kernel(const float* P, long long p_stride, float* dS, int nb, int T) {
  const int lane = threadIdx.x & 31;
  const size_t rows = (size_t)nb * T;
  const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
  for (size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; row < rows; row += nwarps) {
    const float* pr = P + (long long)(row / T) * p_stride + (long long)(row % T) * T;
    float* g = dS + row * T;
    float dot = 0.f;
    for (int j = lane; j < T; j += 32) dot += pr[j] * g[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) g[j] = pr[j] * (g[j] - dot);
  }
}

unsigned warp_grid(size_t rows) { return grid_for(rows * 32); }  // a warp per row, grid-stride

void check_attn(int C, int heads) {
  if (heads <= 0 || C % heads != 0)
    throw std::invalid_argument("attention: " + std::to_string(heads) + " heads do not divide " +
                                std::to_string(C) + " channels");
}

}  // namespace

void CudaBackend::attention_fwd(const float* qkv, float* out, float* attn, int B, int T, int C, int heads,
                                bool legacy) {
  check_attn(C, heads);
  if (B <= 0 || T <= 0) return;
  const int d = C / heads, ld = 3 * C;
  const float alpha = (float)(1.0 / std::sqrt((double)d));
  const long long sQKV = (long long)T * ld, sAttn = (long long)heads * T * T;
  for (int h = 0; h < heads; ++h) {
    const HeadOffsets o = head_offsets(h, C, d, legacy);
    gemm_batched(false, true, T, T, d, alpha, qkv + o.q, ld, sQKV, qkv + o.k, ld, sQKV, 0.f,
                 attn + (size_t)h * T * T, T, sAttn, B);
  }
  const size_t rows = (size_t)B * heads * T;
  softmax_rows_kernel<<<warp_grid(rows), kThreads, 0, stream_>>>(attn, rows, T);
  KERNEL_CHECK();
  for (int h = 0; h < heads; ++h) {
    const HeadOffsets o = head_offsets(h, C, d, legacy);
    gemm_batched(false, false, T, d, T, 1.f, attn + (size_t)h * T * T, T, sAttn, qkv + o.v, ld, sQKV, 0.f,
                 out + (size_t)h * d, C, (long long)T * C, B);
  }
}

void CudaBackend::attention_bwd(const float* qkv, const float* attn, const float* dout, float* dqkv, int B,
                                int T, int C, int heads, bool legacy) {
  check_attn(C, heads);
  if (B <= 0 || T <= 0 || !dqkv) return;
  const int d = C / heads, ld = 3 * C;
  const float alpha = (float)(1.0 / std::sqrt((double)d));
  const long long sQKV = (long long)T * ld, sAttn = (long long)heads * T * T, sOut = (long long)T * C;
  const size_t tt = (size_t)T * T;
  const size_t bc = ws_floats_ / tt;
  if (bc == 0)
    throw std::runtime_error("attention: a " + std::to_string(T) + "x" + std::to_string(T) +
                             " score matrix exceeds the CUDA workspace");
  const int Bc = (int)std::min<size_t>(bc, (size_t)B);
  for (int h = 0; h < heads; ++h) {
    const HeadOffsets o = head_offsets(h, C, d, legacy);
    const float* P = attn + (size_t)h * tt;
    // dv[s, i] = sum_t P[t, s] dout[t, i]
    gemm_batched(true, false, T, d, T, 1.f, P, T, sAttn, dout + (size_t)h * d, C, sOut, 0.f, dqkv + o.v, ld,
                 sQKV, B);
    for (int b0 = 0; b0 < B; b0 += Bc) {
      const int nb = std::min(Bc, B - b0);
      const size_t q0 = (size_t)b0 * T * ld;
      // dP[t, s] = sum_i dout[t, i] v[s, i]
      gemm_batched(false, true, T, T, d, 1.f, dout + (size_t)b0 * T * C + (size_t)h * d, C, sOut,
                   qkv + q0 + o.v, ld, sQKV, 0.f, ws_, T, (long long)tt, nb);
      const size_t rows = (size_t)nb * T;
      softmax_bwd_kernel<<<warp_grid(rows), kThreads, 0, stream_>>>(P + (size_t)b0 * sAttn, sAttn, ws_, nb,
                                                                    T);
      KERNEL_CHECK();
      // dq = alpha dS k;  dk = alpha dS^T q
      gemm_batched(false, false, T, d, T, alpha, ws_, T, (long long)tt, qkv + q0 + o.k, ld, sQKV, 0.f,
                   dqkv + q0 + o.q, ld, sQKV, nb);
      gemm_batched(true, false, T, d, T, alpha, ws_, T, (long long)tt, qkv + q0 + o.q, ld, sQKV, 0.f,
                   dqkv + q0 + o.k, ld, sQKV, nb);
    }
  }
}

}  // namespace unet
