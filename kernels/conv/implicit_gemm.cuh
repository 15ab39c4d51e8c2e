// Pieces the implicit-GEMM convolution variants share (simt.cu, mma.cu, wgmma.cu): a conv's
// geometry in the forward's terms, the data gradient's rotated filter, the shape checks, and the
// alignment their 16-byte accesses need.
#pragma once
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "cuda_engine.cuh"
#include "mma_sync.cuh"

namespace unet {
namespace igemm {

// x [B, H, W, Ci] -> y [B, H, W, Co] with a KS x KS filter (stride 1, padding KS / 2).
struct Geo {
  int B, H, W, Ci, Co, KS;
  long long M() const { return (long long)B * H * W; }  // the GEMM's rows: output pixels
};
inline Geo fwd_geo(const ConvFwd& o) {
  return {(int)o.x.dim[0], (int)o.x.dim[1], (int)o.x.dim[2], (int)o.x.dim[3], (int)o.w.dim[0], (int)o.w.dim[1]};
}
inline Geo data_geo(const ConvBwdData& o) {  // in the forward's terms
  return {(int)o.dx.dim[0], (int)o.dx.dim[1], (int)o.dx.dim[2], (int)o.dx.dim[3], (int)o.w.dim[0], (int)o.w.dim[1]};
}
inline Geo filter_geo(const ConvBwdFilter& o) {
  return {(int)o.x.dim[0], (int)o.x.dim[1], (int)o.x.dim[2], (int)o.x.dim[3], (int)o.dw.dim[0], (int)o.dw.dim[1]};
}
// The data gradient as a forward: input dy (Co channels), output dx (Ci).
inline Geo as_forward(const Geo& g) { return {g.B, g.H, g.W, g.Co, g.Ci, g.KS}; }

__device__ __forceinline__ float tf32_rna(float v) { return __uint_as_float(tf32_bits(v)); }
// The data gradient as a forward runs on the filter rotated by 180 degrees, axes swapped:
// wt[ci][tap'][co] = w[co][KK - 1 - tap'][ci], as 32 x 32 transposes through shared memory (grid: Ci/32, Co/32, taps), coalesced both ways.
// TF32: each value rounded to tf32 (to nearest, ties away: cvt.rna) for kernels whose tensor cores
// would otherwise truncate it. (A template: one definition for every file that launches it.)
template <bool TF32 = false>
__global__ void flip_kernel(const float* __restrict__ w, float* __restrict__ wt, int Co, int KK, int Ci) {
  pdl_entry();
  __shared__ float tile[32][33];
  const int ci0 = blockIdx.x * 32, co0 = blockIdx.y * 32, tp = blockIdx.z, tx = threadIdx.x;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {  // read rows co, columns ci
    const int co = co0 + r, ci = ci0 + tx;
    if (co < Co && ci < Ci) tile[r][tx] = w[((size_t)co * KK + (KK - 1 - tp)) * Ci + ci];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {  // write rows ci, columns co
    const int ci = ci0 + r, co = co0 + tx;
    if (co < Co && ci < Ci) wt[((size_t)ci * KK + tp) * Co + co] = TF32 ? tf32_rna(tile[tx][r]) : tile[tx][r];
  }
}
// Its bytes, rounded up for the next workspace region.
inline size_t flip_bytes(const Geo& g) { return round256((size_t)g.Co * g.KS * g.KS * g.Ci * 4); }
// wt = g's filter w [Co, KS, KS, Ci] rotated and transposed (flip_kernel) on stream s.
template <bool TF32 = false>
inline void flip_filter(cudaStream_t s, const float* w, float* wt, const Geo& g) {
  const int KK = g.KS * g.KS;
  flip_kernel<TF32><<<dim3((g.Ci + 31) / 32, (g.Co + 31) / 32, KK), dim3(32, 8), 0, s>>>(w, wt, g.Co, KK, g.Ci);
  KERNEL_CHECK();
}

__device__ __forceinline__ float4 ldg4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
// v += bias[n..n+4] + emb[b, n..n+4] + res[o..o+4] (each optional), in that order (the other
// variants' epilogue order).
__device__ __forceinline__ void add_terms(float4& v, const float* bias, const float* emb, const float* res, int n,
                                          size_t b, int N, size_t o) {
  auto add = [&](const float4 q) { v.x += q.x, v.y += q.y, v.z += q.z, v.w += q.w; };
  if (bias) add(ldg4(bias + n));
  if (emb) add(ldg4(emb + b * N + n));
  if (res) add(ldg4(res + o));
}
// Slice sums: the float4 j of part [S][n4 * 4] summed over the S slices in order (deterministic), 8
// slices' loads in flight at a time (the same additions in the same order as one at a time: the
// finishing launches of the split-K filter gradients had waited out ~S / 4 L2 round trips each).
__device__ __forceinline__ float4 sum_slices(const float* __restrict__ part, int S, size_t n4, size_t j) {
  float4 v = ldg4(part + 4 * j);
  int z = 1;
  for (; z + 8 <= S; z += 8) {
    float4 q[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) q[u] = ldg4(part + (size_t)(z + u) * n4 * 4 + 4 * j);
#pragma unroll
    for (int u = 0; u < 8; ++u) v.x += q[u].x, v.y += q[u].y, v.z += q[u].z, v.w += q[u].w;
  }
  for (; z < S; ++z) {
    const float4 q = ldg4(part + (size_t)z * n4 * 4 + 4 * j);
    v.x += q.x, v.y += q.y, v.z += q.z, v.w += q.w;
  }
  return v;
}
// out[i] = sum over z of part[z][i] (z in order: deterministic), with TERMS + bias[n] + emb[b, n] +
// res[i] when given (i = m N + n, b = m / HW): the split-K variants' final pass (forwards, filter
// gradients). n4 = elements / 4 per slice; slices n4 * 4 floats apart.
template <bool TERMS>
__global__ void splitsum_kernel(const float* __restrict__ part, int S, size_t n4, float* __restrict__ out,
                                const float* __restrict__ bias, const float* __restrict__ emb,
                                const float* __restrict__ res, int N, int HW) {
  pdl_entry();
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n4; j += (size_t)gridDim.x * blockDim.x) {
    float4 v = sum_slices(part, S, n4, j);
    if constexpr (TERMS) add_terms(v, bias, emb, res, (int)(4 * j % N), 4 * j / ((size_t)HW * N), N, 4 * j);
    reinterpret_cast<float4*>(out)[j] = v;
  }
}
// out [n] = the sum of S slices of part [S][n] (n a multiple of 4) on stream s.
inline void sum_splits(cudaStream_t s, const float* part, int S, size_t n, float* out) {
  const size_t n4 = n / 4;
  splitsum_kernel<false><<<grid_for(n4), kThreads, 0, s>>>(part, S, n4, out, nullptr, nullptr, nullptr, 1, 1);
  KERNEL_CHECK();
}

inline bool same_size(const Tensor& a, const Tensor& b) { return a.dim[1] == b.dim[1] && a.dim[2] == b.dim[2]; }

// Every planned buffer and parameter is 256-byte aligned (planner, parameter arena); the 16-byte
// accesses rely on it.
inline void need_aligned(const char* variant, std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (p && !aligned16(p)) throw std::logic_error(std::string("conv ") + variant + ": a tensor is not 16-byte aligned");
}

}  // namespace igemm
}  // namespace unet
