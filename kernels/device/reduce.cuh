// Deterministic reductions and the vectorised elementwise map shared by the op files.
//
// No atomics anywhere: every sum runs in a fixed order that depends only on the shapes, so the
// same inputs give bitwise-identical outputs run to run (bit-exact resume relies on it).
#pragma once
#include <algorithm>

#include "cuda_engine.cuh"

namespace unet {

// ---- column sums: out[b, c] = sum_r f(b, r, c) over a [Bt, R, C] view, two sums at once ----
// Stage 1: block (32 columns x 8 row lanes) sums rows [s*rps, (s+1)*rps) of split s; the 8 lanes
// are combined in lane order. Stage 2: splits are added in split order (in double).
// Cost: one coalesced read of the view (a warp reads 32 consecutive channels).
template <class F>
__global__ void colsum2_partial_kernel(F f, int R, int C, int rps, float2* partial) {
  pdl_entry();
  __shared__ float2 sm[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const int s = blockIdx.y, b = blockIdx.z, S = gridDim.y;
  const int r0 = s * rps, r1 = min(R, r0 + rps);
  float2 acc = make_float2(0.f, 0.f);
  if (c < C)
    for (int r = r0 + ty; r < r1; r += 8) {
      const float2 v = f(b, r, c);
      acc.x += v.x;
      acc.y += v.y;
    }
  sm[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < C) {
    float2 t = sm[0][tx];
    for (int i = 1; i < 8; ++i) {
      t.x += sm[i][tx].x;
      t.y += sm[i][tx].y;
    }
    partial[((size_t)b * S + s) * C + c] = t;
  }
}

// G: g(b, c, sum_x, sum_y) consumes the totals.
template <class G>
__global__ void colsum2_final_kernel(const float2* partial, int Bt, int S, int C, G g) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= Bt * C) return;
  const int b = i / C, c = i % C;
  double x = 0, y = 0;
  for (int s = 0; s < S; ++s) {
    const float2 v = partial[((size_t)b * S + s) * C + c];
    x += v.x;
    y += v.y;
  }
  g(b, c, x, y);
}

template <class F, class G>
void colsum2(CudaCtx& ctx, const F& f, const G& g, int Bt, int R, int C) {
  if (Bt <= 0 || C <= 0) return;
  const long long cap = (long long)(CudaCtx::kPartialFloats / 2) / ((long long)Bt * C);
  if (cap < 1) throw std::runtime_error("colsum2: reduction too wide for the scratch buffer");
  long long S = std::max(1, (R + 127) / 128);
  S = std::min<long long>({S, 256, cap});
  const int rps = std::max(1, (int)((R + S - 1) / S));
  const int Sn = std::max(1, (R + rps - 1) / rps);  // no empty splits
  float2* partial = reinterpret_cast<float2*>(ctx.partial());
  dim3 grid((C + 31) / 32, Sn, Bt), block(32, 8);
  colsum2_partial_kernel<<<grid, block, 0, ctx.stream>>>(f, R, C, rps, partial);
  KERNEL_CHECK();
  const int n = Bt * C;
  colsum2_final_kernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(partial, Bt, Sn, C, g);
  KERNEL_CHECK();
}

// ---- full sums: out = sum_i f(i) over `items` (double accumulation) -----------------------
// Stage 1: a grid of at most 1024 blocks (count set by `items` alone) strides over the items;
// each block reduces with a fixed tree. Stage 2: one block adds the block sums, fixed order.
// The block's stage 1: every thread's acc added in a fixed tree into partial[blockIdx.x] (kThreads
// threads, all of them calling).
__device__ __forceinline__ void block_sum_to(double acc, double* partial) {
  __shared__ double sm[kThreads];
  sm[threadIdx.x] = acc;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h >>= 1) {
    if ((int)threadIdx.x < h) sm[threadIdx.x] += sm[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sm[0];
}
template <class F>
__global__ void sum_partial_kernel(F f, size_t items, double* partial) {
  pdl_entry();
  double acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < items;
       i += (size_t)gridDim.x * blockDim.x)
    acc += f(i);
  block_sum_to(acc, partial);
}

// out[0] = (float)(scale * total). (A template so each translation unit has its own copy.)
template <int kUnused = 0>
__global__ void sum_final_kernel(const double* partial, int nb, double scale, float* out) {
  pdl_entry();
  __shared__ double sm[kThreads];
  double acc = 0;
  for (int i = threadIdx.x; i < nb; i += kThreads) acc += partial[i];
  sm[threadIdx.x] = acc;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h >>= 1) {
    if ((int)threadIdx.x < h) sm[threadIdx.x] += sm[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = (float)(sm[0] * scale);
}

inline int sum_blocks(size_t items) {
  size_t nb = (items + kThreads * 4 - 1) / (kThreads * 4);
  return (int)std::max<size_t>(1, std::min<size_t>(nb, 1024));
}

template <class F>
void full_sum(CudaCtx& ctx, const F& f, size_t items, double scale, float* out) {
  double* partial = reinterpret_cast<double*>(ctx.partial());
  const int nb = sum_blocks(items);
  sum_partial_kernel<<<nb, kThreads, 0, ctx.stream>>>(f, items, partial);
  KERNEL_CHECK();
  sum_final_kernel<0><<<1, kThreads, 0, ctx.stream>>>(partial, nb, scale, out);
  KERNEL_CHECK();
}

}  // namespace unet
