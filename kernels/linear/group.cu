// Linear-group variant "tiled": every linear of a LinearGroupFwd / LinearGroupBwd in one launch
// (the backward's data gradient in two: per-split partial sums, then their fixed-order sum). The
// group is the ResBlocks' timestep-embedding projections: N = batch rows, I = the embedding width,
// O_k = a block's channels (x2 with scale-shift). As one cuBLAS GEMM each they were ~150 launches
// of 1-20 us per training step (seed64, H100: 0.46 ms of 10.5); the work itself is a few MFLOP.
//
// Shared-memory tiles in plain f32 (FMA on CUDA cores: exact f32 in every precision mode): a block
// computes a 64 x 32 tile of one output, 32-wide chunks of the reduction staged in shared memory
// (rows padded to 33 floats: no bank conflicts), each thread 8 (or 4) outputs in registers.
// Output tiles of all the linears are numbered consecutively (tile0 = prefix sums), so one grid
// covers the group. Every sum has a fixed order: bitwise reproducible.
#include <algorithm>

#include "cuda_engine.cuh"

namespace unet {

namespace {

constexpr int TN = 64, TC = 32, TK = 32, kNt = 256;  // tile rows, tile columns, reduction chunk

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The group's pointers and sizes, passed by value (a few KB of kernel parameters).
struct Group {
  int n = 0, N = 0, I = 0;
  int O[kLinearGroup];
  int tile0[kLinearGroup + 1];  // first column tile (of TC outputs, or TC rows of dw) of linear k
  const float* w[kLinearGroup];
  const float* b[kLinearGroup];  // forward: bias
  float* y[kLinearGroup];        // forward: y; backward: unused
  const float* dy[kLinearGroup];
  float* dw[kLinearGroup];
  float* db[kLinearGroup];
};

__device__ __forceinline__ int linear_of(const Group& g, int tile) {
  int k = 0;
  while (tile >= g.tile0[k + 1]) ++k;
  return k;
}

// s[r][c] = src[(r0 + r) * ld + c0 + c] for the R x C tile at (r0, c0) of a rows x cols matrix,
// 0 outside it; the block's threads load it together (coalesced along c).
template <int R, int C>
__device__ __forceinline__ void load_tile(float (*s)[C + 1], const float* __restrict__ src, int ld, int r0, int c0,
                                          int rows, int cols) {
#pragma unroll
  for (int j = 0; j < R * C / kNt; ++j) {
    const int e = threadIdx.x + kNt * j, r = e / C, c = e % C;
    s[r][c] = r0 + r < rows && c0 + c < cols ? src[(size_t)(r0 + r) * ld + c0 + c] : 0.f;
  }
}

// y[k][n, o] = sum_i x[n, i] w[k][o, i] + b[k][o]. Grid (column tiles of all k, row tiles).
__global__ void __launch_bounds__(kNt) group_fwd_kernel(const float* __restrict__ x, const __grid_constant__ Group g) {
  pdl_entry();
  __shared__ float xs[TN][TK + 1];
  __shared__ float ws[TC][TK + 1];
  const int k = linear_of(g, blockIdx.x), O = g.O[k];
  const int o0 = (blockIdx.x - g.tile0[k]) * TC, n0 = blockIdx.y * TN;
  const float* w = g.w[k];
  const int t = threadIdx.x, tx = t % TC, ty = t / TC;  // ty: rows ty*8 .. ty*8+7
  float acc[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) acc[r] = 0.f;
  for (int i0 = 0; i0 < g.I; i0 += TK) {
    load_tile<TN, TK>(xs, x, g.I, n0, i0, g.N, g.I);
    load_tile<TC, TK>(ws, w, g.I, o0, i0, O, g.I);
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < TK; ++c) {
      const float wv = ws[tx][c];
#pragma unroll
      for (int r = 0; r < 8; ++r) acc[r] = fmaf(xs[ty * 8 + r][c], wv, acc[r]);
    }
    __syncthreads();
  }
  const int o = o0 + tx;
  if (o >= O) return;
  const float bv = g.b[k] ? g.b[k][o] : 0.f;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int n = n0 + ty * 8 + r;
    if (n < g.N) g.y[k][(size_t)n * O + o] = acc[r] + bv;
  }
}

// Partial data gradients: split s sums dy[k][n, o] w[k][o, i] over its share of the column tiles
// (all k), into part[s][n][i]. Grid (row tiles, I tiles, splits).
__global__ void __launch_bounds__(kNt) group_dx_kernel(const __grid_constant__ Group g, float* __restrict__ part) {
  pdl_entry();
  __shared__ float ds[TN][TK + 1];
  __shared__ float ws[TK][TC + 1];
  const int n0 = blockIdx.x * TN, i0 = blockIdx.y * TC, s = blockIdx.z, S = gridDim.z;
  const int T = g.tile0[g.n], t0 = (int)((long long)T * s / S), t1 = (int)((long long)T * (s + 1) / S);
  const int t = threadIdx.x, tx = t % TC, ty = t / TC;
  float acc[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) acc[r] = 0.f;
  for (int tile = t0; tile < t1; ++tile) {
    const int k = linear_of(g, tile), O = g.O[k], o0 = (tile - g.tile0[k]) * TK;
    load_tile<TN, TK>(ds, g.dy[k], O, n0, o0, g.N, O);
    load_tile<TK, TC>(ws, g.w[k], g.I, o0, i0, O, g.I);
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < TK; ++c) {
      const float wv = ws[c][tx];
#pragma unroll
      for (int r = 0; r < 8; ++r) acc[r] = fmaf(ds[ty * 8 + r][c], wv, acc[r]);
    }
    __syncthreads();
  }
  const int i = i0 + tx;
  if (i >= g.I) return;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int n = n0 + ty * 8 + r;
    if (n < g.N) part[((size_t)s * g.N + n) * g.I + i] = acc[r];
  }
}

// dx = (dx_in +) the splits' partials, added in split order.
__global__ void group_dx_sum_kernel(const float* __restrict__ part, int S, size_t NI, const float* dx_in,
                                    float* dx) {
  pdl_entry();
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < NI; e += (size_t)gridDim.x * blockDim.x) {
    float v = dx_in ? dx_in[e] : 0.f;
    for (int s = 0; s < S; ++s) v += part[(size_t)s * NI + e];
    dx[e] = v;
  }
}

// dw[k][o, i] = sum_n dy[k][n, o] x[n, i]; the blocks of the first I tile also db[k][o] =
// sum_n dy[k][n, o]. Grid (row tiles of dw over all k, I tiles).
__global__ void __launch_bounds__(kNt) group_dw_kernel(const float* __restrict__ x, const __grid_constant__ Group g) {
  pdl_entry();
  __shared__ float ds[TK][TC + 1];  // [n][o]
  __shared__ float xs[TK][TC + 1];  // [n][i]
  const int k = linear_of(g, blockIdx.x), O = g.O[k];
  const int o0 = (blockIdx.x - g.tile0[k]) * TC, i0 = blockIdx.y * TC;
  const float* dy = g.dy[k];
  float *dw = g.dw[k], *db = blockIdx.y == 0 ? g.db[k] : nullptr;
  if (!dw && !db) return;
  const int t = threadIdx.x, tx = t % TC, ty = t / TC;  // ty: dw rows ty*4 .. ty*4+3
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, bacc = 0.f;
  for (int n0 = 0; n0 < g.N; n0 += TK) {
    load_tile<TK, TC>(ds, dy, O, n0, o0, g.N, O);
    load_tile<TK, TC>(xs, x, g.I, n0, i0, g.N, g.I);
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < TK; ++c) {
      const float xv = xs[c][tx];
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[r] = fmaf(ds[c][ty * 4 + r], xv, acc[r]);
      if (db && ty == 0) bacc += ds[c][tx];
    }
    __syncthreads();
  }
  if (dw && i0 + tx < g.I)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int o = o0 + ty * 4 + r;
      if (o < O) dw[(size_t)o * g.I + i0 + tx] = acc[r];
    }
  if (db && ty == 0 && o0 + tx < O) db[o0 + tx] = bacc;
}

// The group's sizes and column tiles (tiles of TC outputs; TC == TK, so the backward's
// reduction chunks over o use the same numbering).
Group group_of(const Tensor& x, int n, const Tensor* w) {
  Group g{};
  g.n = n, g.N = (int)x.dim[0], g.I = (int)x.dim[1];
  g.tile0[0] = 0;
  for (int k = 0; k < n; ++k) {
    g.O[k] = (int)w[k].dim[0];
    g.w[k] = w[k].f32();
    g.tile0[k + 1] = g.tile0[k] + ceil_div(g.O[k], TC);
  }
  for (int k = n; k < kLinearGroup; ++k) g.tile0[k + 1] = g.tile0[n];
  return g;
}

void group_fwd(const LinearGroupFwd& o, CudaCtx& ctx) {
  const int n = o.count();
  Group g = group_of(o.x, n, o.w);
  for (int k = 0; k < n; ++k) g.b[k] = dptr<float>(o.b[k]), g.y[k] = o.y[k].f32();
  group_fwd_kernel<<<dim3((unsigned)g.tile0[n], (unsigned)ceil_div(g.N, TN)), kNt, 0, ctx.stream>>>(o.x.f32(), g);
  KERNEL_CHECK();
}

// Splits of the data gradient: about two blocks per SM in all, within the partials' room.
int dx_splits(const Group& g) {
  const long long tiles = (long long)ceil_div(g.N, TN) * ceil_div(g.I, TC);
  const long long room = (long long)CudaCtx::kPartialFloats / std::max(1LL, (long long)g.N * g.I);
  return (int)std::max(1LL, std::min({(264 + tiles - 1) / tiles, (long long)g.tile0[g.n], room}));
}

void group_bwd(const LinearGroupBwd& o, CudaCtx& ctx) {
  const int n = o.count();
  Group g = group_of(o.x, n, o.w);
  bool any_w = false;
  for (int k = 0; k < n; ++k) {
    g.dy[k] = o.dy[k].f32(), g.dw[k] = dptr<float>(o.dw[k]), g.db[k] = dptr<float>(o.db[k]);
    any_w = any_w || o.dw[k].defined() || o.db[k].defined();
  }
  if (o.dx.defined()) {
    const int S = dx_splits(g);
    float* part = ctx.partial();
    group_dx_kernel<<<dim3((unsigned)ceil_div(g.N, TN), (unsigned)ceil_div(g.I, TC), (unsigned)S), kNt, 0,
                      ctx.stream>>>(g, part);
    KERNEL_CHECK();
    const size_t NI = (size_t)g.N * g.I;
    group_dx_sum_kernel<<<(unsigned)std::min<size_t>((NI + 255) / 256, 1024), 256, 0, ctx.stream>>>(
        part, S, NI, dptr<float>(o.dx_in), o.dx.f32());
    KERNEL_CHECK();
  }
  if (any_w) {
    group_dw_kernel<<<dim3((unsigned)g.tile0[n], (unsigned)ceil_div(g.I, TC)), kNt, 0, ctx.stream>>>(o.x.f32(), g);
    KERNEL_CHECK();
  }
}

// The grid's limits (x: 2^31 - 1 tiles; y, z: 65535).
bool fwd_ok(const LinearGroupFwd& o, const CudaCtx&) { return ceil_div((int)o.x.dim[0], TN) < 65536; }
bool bwd_ok(const LinearGroupBwd& o, const CudaCtx&) {
  return ceil_div((int)o.x.dim[0], TN) < 65536 && ceil_div((int)o.x.dim[1], TC) < 65536;
}

}  // namespace

void register_linear_group(CudaOps& ops) {
  ops.variants<LinearGroupFwd>().push_back({"tiled", fwd_ok, group_fwd, nullptr});
  ops.variants<LinearGroupBwd>().push_back({"tiled", bwd_ok, group_bwd, nullptr});
}

}  // namespace unet
