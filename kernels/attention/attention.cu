// Attention variant "cublas": guided-diffusion's QKVAttention (new order) and QKVAttentionLegacy on
// the fused qkv tensor [B, T, 3C], f32 or bf16. Per head and batch chunk: strided-batched cuBLAS
// GEMMs read Q, K, V in place (row stride 3C — no gather) and an f32 row softmax of our own; the
// [T, T] scores live only in the workspace (f32 logits, probabilities in the storage dtype, as
// flash attention feeds its second GEMM).
//
//   S = (q k^T) / sqrt(d)   (= (q d^-1/4)(k d^-1/4)^T of the reference)
//   P = softmax(S) over keys; lse = log-sum-exp of each row (saved for backward)
//   out = P v               (written into the head's channels of [B, T, C])
// Backward recomputes S and P = exp(S - lse), then dV = P^T dO, dP = dO V^T,
// dS = P (dP - rowsum(P dP)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d).
//
// Cost: the scores go through memory several times per pass. The fused variant "flash" (flash.cu)
// comes first where it runs the shape; this one covers the rest (head widths other than 32, 64, 128).
#include <cmath>
#include <string>

#include "cuda_engine.cuh"

namespace unet {

namespace {

constexpr size_t kChunkBytes = size_t(64) << 20;

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

// Rows of S [nb*T, T] -> P (softmax) and lse[(b0 + b) * heads + h][t]; one warp per row.
template <class TP>
__global__ void softmax_fwd_kernel(const float* S, TP* P, float* lse, int nb, int T, int heads, int h,
                                   int b0) {
  pdl_entry();
  const int lane = threadIdx.x & 31;
  const size_t rows = (size_t)nb * T;
  const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
  for (size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; row < rows; row += nwarps) {
    const float* r = S + row * T;
    float mx = -INFINITY;
    for (int j = lane; j < T; j += 32) mx = fmaxf(mx, r[j]);
    mx = warp_max(mx);
    float s = 0.f;
    for (int j = lane; j < T; j += 32) s += expf(r[j] - mx);
    s = warp_sum(s);
    const float inv = 1.0f / s;
    TP* p = P + row * T;
    for (int j = lane; j < T; j += 32) stf(p, j, expf(r[j] - mx) * inv);
    if (lane == 0) {
      const size_t b = row / T, t = row % T;
      lse[((b0 + b) * heads + h) * (size_t)T + t] = mx + logf(s);
    }
  }
}

// P = exp(S - lse) for the rows of a chunk.
template <class TP>
__global__ void softmax_recompute_kernel(const float* S, TP* P, const float* lse, int nb, int T, int heads,
                                         int h, int b0) {
  pdl_entry();
  const size_t n = (size_t)nb * T * T;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t row = i / T, b = row / T, t = row % T;
    stf(P, i, expf(S[i] - lse[((b0 + b) * heads + h) * (size_t)T + t]));
  }
}

// dS = P (dP - sum_j P dP), written over P; one warp per row.
template <class TP>
__global__ void softmax_bwd_kernel(TP* P, const float* dP, int nb, int T) {
  pdl_entry();
  const int lane = threadIdx.x & 31;
  const size_t rows = (size_t)nb * T;
  const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
  for (size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; row < rows; row += nwarps) {
    TP* p = P + row * T;
    const float* g = dP + row * T;
    float dot = 0.f;
    for (int j = lane; j < T; j += 32) dot += ldf(p, j) * g[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) stf(p, j, ldf(p, j) * (g[j] - dot));
  }
}

unsigned warp_grid(size_t rows) { return grid_for(rows * 32); }  // a warp per row, grid-stride

struct Geo {
  int B, T, C, heads, d, ld;
  size_t esz;
  int chunk;
};
Geo geo(const Tensor& qkv, const Tensor& out, const Tensor& lse) {
  Geo g;
  g.B = (int)qkv.dim[0], g.T = (int)(qkv.dim[1] * qkv.dim[2]), g.C = (int)out.dim[3],
  g.heads = (int)lse.dim[1];
  g.d = g.C / g.heads, g.ld = 3 * g.C, g.esz = dtype_size(qkv.dtype);
  const size_t per = (size_t)g.T * g.T * (4 + g.esz);
  g.chunk = (int)std::max<size_t>(1, std::min<size_t>((size_t)g.B, kChunkBytes / per));
  return g;
}
size_t ws_for(const Geo& g) { return (size_t)g.chunk * g.T * g.T * (4 + g.esz); }

template <class T>
void fwd(const AttentionFwd& o, CudaCtx& ctx, const Geo& g) {
  const DType t = o.qkv.dtype;
  const float alpha = (float)(1.0 / std::sqrt((double)g.d));
  const long long sQKV = (long long)g.T * g.ld, sS = (long long)g.T * g.T, sOut = (long long)g.T * g.C;
  float* S = static_cast<float*>(ctx.ws);
  T* P = reinterpret_cast<T*>(S + (size_t)g.chunk * sS);
  const T* qkv = dptr<T>(o.qkv);
  T* out = dptr<T>(o.out);
  for (int h = 0; h < g.heads; ++h) {
    const HeadOffsets of = head_offsets(h, g.C, g.d, o.legacy);
    for (int b0 = 0; b0 < g.B; b0 += g.chunk) {
      const int nb = std::min(g.chunk, g.B - b0);
      const T* base = qkv + (size_t)b0 * sQKV;
      ctx.gemm(false, true, g.T, g.T, g.d, alpha, {base + of.q, t, g.ld, sQKV}, {base + of.k, t, g.ld, sQKV},
               0.f, {S, DType::F32, g.T, sS}, nb);
      softmax_fwd_kernel<T><<<warp_grid((size_t)nb * g.T), kThreads, 0, ctx.stream>>>(
          S, P, dptr<float>(o.lse), nb, g.T, g.heads, h, b0);
      KERNEL_CHECK();
      ctx.gemm(false, false, g.T, g.d, g.T, 1.f, {P, t, g.T, sS}, {base + of.v, t, g.ld, sQKV}, 0.f,
               {out + (size_t)b0 * sOut + (size_t)h * g.d, t, g.C, sOut}, nb);
    }
  }
}

template <class T>
void bwd(const AttentionBwd& o, CudaCtx& ctx, const Geo& g) {
  const DType t = o.qkv.dtype;
  const float alpha = (float)(1.0 / std::sqrt((double)g.d));
  const long long sQKV = (long long)g.T * g.ld, sS = (long long)g.T * g.T, sOut = (long long)g.T * g.C;
  float* S = static_cast<float*>(ctx.ws);
  T* P = reinterpret_cast<T*>(S + (size_t)g.chunk * sS);
  const T* qkv = dptr<T>(o.qkv);
  const T* dout = dptr<T>(o.dout);
  T* dqkv = dptr<T>(o.dqkv);
  for (int h = 0; h < g.heads; ++h) {
    const HeadOffsets of = head_offsets(h, g.C, g.d, o.legacy);
    for (int b0 = 0; b0 < g.B; b0 += g.chunk) {
      const int nb = std::min(g.chunk, g.B - b0);
      const T* base = qkv + (size_t)b0 * sQKV;
      T* dbase = dqkv + (size_t)b0 * sQKV;
      const T* dO = dout + (size_t)b0 * sOut + (size_t)h * g.d;
      ctx.gemm(false, true, g.T, g.T, g.d, alpha, {base + of.q, t, g.ld, sQKV}, {base + of.k, t, g.ld, sQKV},
               0.f, {S, DType::F32, g.T, sS}, nb);
      const size_t n = (size_t)nb * sS;
      softmax_recompute_kernel<T>
          <<<grid_for(n), kThreads, 0, ctx.stream>>>(S, P, dptr<float>(o.lse), nb, g.T, g.heads, h, b0);
      KERNEL_CHECK();
      // dV[u, i] = sum_t P[t, u] dO[t, i]
      ctx.gemm(true, false, g.T, g.d, g.T, 1.f, {P, t, g.T, sS}, {dO, t, g.C, sOut}, 0.f,
               {dbase + of.v, t, g.ld, sQKV}, nb);
      // dP[t, u] = sum_i dO[t, i] v[u, i]  (over S, no longer needed)
      ctx.gemm(false, true, g.T, g.T, g.d, 1.f, {dO, t, g.C, sOut}, {base + of.v, t, g.ld, sQKV}, 0.f,
               {S, DType::F32, g.T, sS}, nb);
      softmax_bwd_kernel<T><<<warp_grid((size_t)nb * g.T), kThreads, 0, ctx.stream>>>(P, S, nb, g.T);
      KERNEL_CHECK();
      // dq = alpha dS k;  dk = alpha dS^T q
      ctx.gemm(false, false, g.T, g.d, g.T, alpha, {P, t, g.T, sS}, {base + of.k, t, g.ld, sQKV}, 0.f,
               {dbase + of.q, t, g.ld, sQKV}, nb);
      ctx.gemm(true, false, g.T, g.d, g.T, alpha, {P, t, g.T, sS}, {base + of.q, t, g.ld, sQKV}, 0.f,
               {dbase + of.k, t, g.ld, sQKV}, nb);
    }
  }
}

void attn_fwd(const AttentionFwd& o, CudaCtx& ctx) {
  const Geo g = geo(o.qkv, o.out, o.lse);
  with_act(o.qkv.dtype, [&](auto tag) { fwd<decltype(tag)>(o, ctx, g); });
}
void attn_bwd(const AttentionBwd& o, CudaCtx& ctx) {
  const Geo g = geo(o.qkv, o.out, o.lse);
  with_act(o.qkv.dtype, [&](auto tag) { bwd<decltype(tag)>(o, ctx, g); });
}
size_t fwd_ws(const AttentionFwd& o, const CudaCtx&) { return ws_for(geo(o.qkv, o.out, o.lse)); }
size_t bwd_ws(const AttentionBwd& o, const CudaCtx&) { return ws_for(geo(o.qkv, o.out, o.lse)); }

}  // namespace

void register_attention_flash(CudaOps& ops);  // flash.cu

void register_attention_cuda(CudaOps& ops) {
  register_attention_flash(ops);  // first: the default wherever it supports the op
  ops.variants<AttentionFwd>().push_back({"cublas", nullptr, attn_fwd, fwd_ws});
  ops.variants<AttentionBwd>().push_back({"cublas", nullptr, attn_bwd, bwd_ws});
}

}  // namespace unet
