// Row-block kernels over an NHWC tensor viewed as [B, R, C] (R = H*W rows of C channels): the
// shape the memory-bound kernels of the training step share (GroupNorm, conv epilogues, bias
// gradients), measured on the H100 to be limited by per-element index and coefficient work
// rather than by memory when written as flat elementwise maps.
//
//  * Block (s, b) covers rows [s*rps, (s+1)*rps) of sample b. Its threads are L row lanes x Cl
//    channel lanes; a thread owns one channel vector of V channels (16 bytes where C and the
//    pointers allow, else V = 1) and walks its rows with stride L, so per-channel coefficients
//    live in registers and the row loop is load, a few FMAs, store.
//  * Reductions over rows (column sums) write per-(b, split, c) partials to fixed slots; the last
//    block of a sample to finish (an integer ticket: the only atomic, and it decides who adds,
//    never the order) adds them in split order in double. A second ticket over the samples lets
//    the last of those add across the batch. So a reduction and what follows it is one launch,
//    and the result is bitwise the same whichever block finishes last.
//  * Tickets live in CudaCtx::tickets (zeroed once); each finishing block puts its ticket back to
//    0, so graph replays find them zeroed.
#pragma once
#include <algorithm>
#include <type_traits>

#include "cuda_engine.cuh"
#include "mma_sync.cuh"

namespace unet {
namespace rowblock {

// ---- V-channel vectors: V = 16 bytes of the type, or 1 ----
template <class T, int V>
struct Vec;
// Raw: the vector as loaded (ld), unpacked to floats later (unpack): a loop that keeps several
// rows in flight holds them packed (bf16: 4 registers a row instead of 8).
template <class T>
struct Vec<T, 1> {
  using Raw = T;
  __device__ static Raw ld(const T* p) { return *p; }
  __device__ static void unpack(const Raw& u, float* v) { v[0] = ldf(&u, 0); }
  __device__ static void load(const T* p, float* v) { v[0] = ldf(p, 0); }
  __device__ static void store(T* p, const float* v) { stf(p, 0, v[0]); }
};
template <>
struct Vec<float, 4> {
  using Raw = float4;
  __device__ static Raw ld(const float* p) { return *reinterpret_cast<const float4*>(p); }
  __device__ static void unpack(const Raw& u, float* v) { v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w; }
  __device__ static void load(const float* p, float* v) { unpack(ld(p), v); }
  __device__ static void store(float* p, const float* v) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
};
template <>
struct Vec<bf16, 8> {
  using Raw = uint4;
  __device__ static Raw ld(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }
  __device__ static void load(const bf16* p, float* v) { unpack(ld(p), v); }
  __device__ static void unpack(const Raw& u, float* v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
      v[2 * k] = f.x, v[2 * k + 1] = f.y;
    }
  }
  __device__ static void store(bf16* p, const float* v) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      w[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};
template <class T>
constexpr int kWide = 16 / (int)sizeof(T);

// v rounded as a T stores it (bf16: to the nearest bf16), back in f32: what a later read sees.
template <class T>
__device__ __forceinline__ float as_stored(float v) {
  if constexpr (std::is_same_v<T, bf16>)
    return __bfloat162float(__float2bfloat16_rn(v));
  else
    return v;
}

// Whether the 16-byte path applies: C a multiple of the vector and every pointer 16-byte aligned.
template <class T>
bool wide_ok(int C, std::initializer_list<const void*> ptrs) {
  if (C % kWide<T>) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

// Launch geometry of a row-block kernel.
struct Plan {
  int B = 0, R = 0, C = 0, V = 1;
  int Cv = 0, Cl = 0, L = 0, nt = 0;  // channel vectors, channel lanes, row lanes, threads
  int S = 0, rps = 0;                 // splits per sample, rows per split
  dim3 grid() const { return dim3((unsigned)S, (unsigned)B); }
};

// SMs the split counts are sized for: the H100's, fixed rather than queried so that the
// partial sums' order (and so every bit of the results) depends on the shapes and the build only.
constexpr int kNominalSMs = 132;

// Blocks of nt threads of `kernel` resident at once on kNominalSMs SMs (its registers and
// shared memory decide how many per SM).
template <class K>
int resident_blocks(K* kernel, int nt, size_t smem = 0) {
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, nt, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    occ = 1;
  }
  return kNominalSMs * std::max(1, occ);
}

// The geometry for `kernel`: as many splits per sample as fill one wave of resident blocks (all
// blocks start together and none waits for a second wave: measured, a 1.4-wave grid cost a third
// more), at least rows_per_thread rows per thread (its loop's unroll), at most max_splits (the
// partials' room); with wave_div, as many as fill 1 / wave_div of that wave.
template <class K>
Plan plan(K* kernel, int B, int R, int C, int V, int rows_per_thread, long long max_splits = 1 << 20,
          size_t smem = 0, int wave_div = 1) {
  Plan p;
  p.B = B, p.R = R, p.C = C, p.V = V;
  p.Cv = C / V;
  p.Cl = std::max(1, std::min(p.Cv, kThreads));
  p.L = kThreads / p.Cl;
  p.nt = p.L * p.Cl;
  const long long want = resident_blocks(kernel, p.nt, smem) / std::max(1, wave_div) / std::max(1, B);
  const long long most = std::max(1LL, ((long long)R + (long long)p.L * rows_per_thread - 1) /
                                           ((long long)p.L * rows_per_thread));
  const long long S = std::max(1LL, std::min({want, most, max_splits}));
  p.rps = std::max(1, (int)((R + S - 1) / S));
  p.S = std::max(1, (R + p.rps - 1) / p.rps);  // no empty split
  return p;
}

// A thread's walk over its rows rf, rf + step, ... below r1: n iterations from `first` by `step`,
// backwards with rev (a pass that follows another over the same rows starts where that one
// ended, on the rows most likely still in L2).
struct Walk {
  int first, step, n;
};
__device__ __forceinline__ Walk walk(int rf, int r1, int step, bool rev) {
  const int n = rf < r1 ? (r1 - rf + step - 1) / step : 0;
  return rev && n > 0 ? Walk{rf + (n - 1) * step, -step, n} : Walk{rf, step, n};
}

// Rows streamed through shared memory: each thread copies (cp.async, 16 bytes) the vectors it will
// read itself, D - 1 rows ahead of the one it reads, into its own D slots of NIN vectors (slot-
// major, threads adjacent: conflict-free), so the bytes in flight take shared memory, not
// registers. Only its own copies are waited for (cp.async.wait_group), so no block barrier; a
// slot is refilled one row after it was read.
template <int D>
struct Ring {
  static_assert((D & (D - 1)) == 0, "D a power of two");
  uint32_t s0;
  int nt, nin;
  static size_t bytes(int nt, int nin) { return (size_t)D * nin * nt * 16; }
  __device__ Ring(void* smem, int nin)
      : s0((uint32_t)__cvta_generic_to_shared(smem) + threadIdx.x * 16), nt(blockDim.x), nin(nin) {}
  __device__ uint32_t at(int slot, int in) const {
    return s0 + (uint32_t)(((slot & (D - 1)) * nin + in) * nt) * 16;
  }
  __device__ void copy(int slot, int in, const void* g) const { cp16(at(slot, in), g); }
  __device__ static void commit() { cp_commit(); }
  // row i's copies landed, given D - 1 groups committed up front and one per row since
  __device__ static void wait() { cp_wait<D - 2>(); }
  template <class Raw>
  __device__ Raw get(int slot, int in) const {
    static_assert(sizeof(Raw) == 16, "16-byte vectors");
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(at(slot, in))
                 : "memory");
    return *reinterpret_cast<const Raw*>(&v);
  }
};

// The dynamic shared memory of kernel K's Ring<D> over nin inputs (none for D = 0), K allowed it.
template <int D, auto K>
size_t ring_smem(int nin) {
  if constexpr (D == 0) {
    return 0;
  } else {
    const size_t bytes = Ring<D>::bytes(kThreads, nin);
    static size_t set = 0;  // (per kernel)
    allow_dynamic_smem(K, bytes, set);
    return bytes;
  }
}

// f(raw, r) for a thread's rows r = rf, rf + L, ... below r1 (backwards with rev) of NIN tensors
// at element offset col of each row (rows of C; a null tensor is skipped, its raw[] unset; nin:
// the slots' inputs, NIN or fewer where the last are null),
// streamed through a Ring of D slots in shared memory `ring`; pre() runs once the first copies
// are in flight.
template <class T, int V, int D, int NIN, class Pre, class F>
__device__ __forceinline__ void ring_rows(const T* const (&src)[NIN], size_t col, int C, int rf, int r1,
                                          int L, bool rev, void* ring, Pre pre, F f, int nin = NIN) {
  using Raw = typename Vec<T, V>::Raw;
  const Walk wk = walk(rf, r1, L, rev);
  const Ring<D> rg(ring, nin);
  const auto fetch = [&](int i) {
    const size_t o = col + (size_t)(wk.first + i * wk.step) * C;
#pragma unroll
    for (int q = 0; q < NIN; ++q)
      if (src[q]) rg.copy(i, q, src[q] + o);
  };
#pragma unroll
  for (int k = 0; k < D - 1; ++k) {
    if (k < wk.n) fetch(k);
    rg.commit();
  }
  pre();
  for (int i = 0; i < wk.n; ++i) {
    rg.wait();
    Raw raw[NIN];
#pragma unroll
    for (int q = 0; q < NIN; ++q)
      if (src[q]) raw[q] = rg.template get<Raw>(i, q);
    if (i + D - 1 < wk.n) fetch(i + D - 1);
    rg.commit();
    f(raw, wk.first + i * wk.step);
  }
}

// Sums rows 0..n-1 of a [n][w] float2 array in shared memory into row 0, pairwise halving
// (row i += row i + h): the order depends on (n, w) only. Callers sync before; it syncs after.
__device__ __forceinline__ void fold_rows(float2* a, int n, int w) {
  while (n > 1) {
    const int h = (n + 1) / 2;
    for (int e = threadIdx.x; e < (n - h) * w; e += blockDim.x) {
      const float2 u = a[e + h * w];
      a[e].x += u.x, a[e].y += u.y;
    }
    __syncthreads();
    n = h;
  }
}

// Takes a ticket on *counter after the block's global writes; true in the block that took the
// last of n (that block may then read what every other block wrote, through L2: __ldcg).
__device__ __forceinline__ bool last_block(unsigned* counter, unsigned n) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == n - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// f(i, v) for i = 0 .. n-1 in order, v the value at p + i stride, loaded U at a time: the
// finishing blocks sit on the critical path, and one dependent L2 round trip per value was measured
// to cost microseconds per launch.
template <int U, class T, class F>
__device__ __forceinline__ void each_run(const T* p, int n, size_t stride, F f) {
  int i = 0;
  for (; i + U <= n; i += U) {
    T v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = __ldcg(p + (size_t)(i + u) * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) f(i + u, v[u]);
  }
  for (; i < n; ++i) f(i, __ldcg(p + (size_t)i * stride));
}

// Sum in order of n values at p, p + stride, ... (double), 16 loads in flight. 16 instead of 8
// (same order, same bits): H100 bf16 step 8.824 / 8.834 / 8.842 -> 8.803 / 8.810 / 8.815 ms, tf32
// within noise (2026-11-24, same run); 32 spills.
constexpr int kSumRunLoads = 16;
template <class T2>
__device__ __forceinline__ double2 sum_run(const T2* p, int n, size_t stride) {
  double x = 0, y = 0;
  each_run<kSumRunLoads>(p, n, stride, [&](int, const T2& v) { x += v.x, y += v.y; });
  return make_double2(x, y);
}

// stats_rows_kernel's finishing block reads its float4 partials kRunLoads at a time (each_run):
// H200, seed64 sampling's forward at batch 64, same run (2026-11-28), bf16 its sum 0.332 -> 0.312
// ms, the forward 3.950 / 3.951 -> 3.925 / 3.925 ms; f32 unchanged (0.507 ms: there nvcc had kept
// the loads in flight already).
constexpr int kRunLoads = 8;

// out(c, total) for c < C with total = the n terms term(i, c) ... in order: P = threads per
// channel take contiguous runs of i, then the P parts are added in order (the order depends on
// the shapes only). run(c, i0, i1) sums terms [i0, i1) of channel c. tmp: kThreads double2.
template <class Run, class Out>
__device__ __forceinline__ void finish_columns(int n, int C, double2* tmp, Run run, Out out) {
  const int t = threadIdx.x, nt = blockDim.x;
  const int P = C >= nt ? 1 : min(n, nt / C);
  if (P == 1) {
    for (int c = t; c < C; c += nt) out(c, run(c, 0, n));
  } else {
    if (t < C * P) {
      const int c = t % C, q = t / C;
      tmp[t] = run(c, (int)((long long)n * q / P), (int)((long long)n * (q + 1) / P));
    }
    __syncthreads();
    if (t < C) {
      double2 a = tmp[t];
      for (int q = 1; q < P; ++q) a.x += tmp[q * C + t].x, a.y += tmp[q * C + t].y;
      out(t, a);
    }
  }
  __syncthreads();  // what out() wrote is visible to the whole block
}

// Per-(b, c) totals of one sample from its S partials [B, S, C] float2, in double, into
// sums[b*C + c].
__device__ __forceinline__ void finish_sample(const float2* partial, int b, int S, int C, double2* sums,
                                              double2* tmp) {
  const float2* pb = partial + (size_t)b * S * C;
  finish_columns(
      S, C, tmp, [&](int c, int i0, int i1) { return sum_run(pb + (size_t)i0 * C + c, i1 - i0, (size_t)C); },
      [&](int c, double2 v) { sums[(size_t)b * C + c] = v; });
}

// Calls go(std::integral_constant<int, V>{}) with V the 16-byte width of T where it applies, else 1.
template <class T, class F>
void with_width(bool wide, F&& go) {
  if (wide)
    go(std::integral_constant<int, kWide<T>>{});
  else
    go(std::integral_constant<int, 1>{});
}

// Column sums of y [B, R, C]: per_sample[b*C + c] = sum_r y[b, r, c] and total[c] = sum_b of
// those (each optional), in one launch: f32 within a block, double from the partials on.
// partial: [B, S, C] float2 (.y unused), sums: [B, C] double2.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    colsum_kernel(const T* __restrict__ y, int R, int C, int Cl, int L, int rps, float2* partial, double2* sums,
                  unsigned* tickets, float* per_sample, float* total) {
  pdl_entry();
  __shared__ float2 red[kThreads * V];
  __shared__ double2 tmp[kThreads];
  const int t = threadIdx.x, cl = t % Cl, rl = t / Cl, nt = blockDim.x;
  const int s = blockIdx.x, b = blockIdx.y, S = gridDim.x, B = gridDim.y, Cv = C / V, w = Cl * V;
  const int r0 = s * rps, r1 = min(R, r0 + rps);
  constexpr int U = 4;
  const T* yb = y + (size_t)b * R * C;
  for (int j0 = 0; j0 < Cv; j0 += Cl) {  // trip count uniform over the block (it syncs inside)
    const int j = j0 + cl;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    if (j < Cv)
      for (int r = r0 + rl; r < r1; r += U * L) {
        float v[U][V];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (r + u * L < r1) Vec<T, V>::load(yb + (size_t)(r + u * L) * C + j * V, v[u]);
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (r + u * L < r1)
#pragma unroll
            for (int k = 0; k < V; ++k) acc[k] += v[u][k];
      }
#pragma unroll
    for (int k = 0; k < V; ++k) red[rl * w + cl * V + k] = make_float2(acc[k], 0.f);
    __syncthreads();
    fold_rows(red, L, w);
    for (int e = t; e < w && j0 * V + e < C; e += nt) partial[((size_t)b * S + s) * C + j0 * V + e] = red[e];
    __syncthreads();
  }
  if (!last_block(tickets + 1 + b, S)) return;
  if (t == 0) tickets[1 + b] = 0;
  finish_sample(partial, b, S, C, sums, tmp);
  if (per_sample)
    for (int c = t; c < C; c += nt) per_sample[(size_t)b * C + c] = (float)sums[(size_t)b * C + c].x;
  if (!total || !last_block(tickets, B)) return;
  finish_columns(
      B, C, tmp, [&](int c, int i0, int i1) { return sum_run(sums + (size_t)i0 * C + c, i1 - i0, (size_t)C); },
      [&](int c, double2 v) { total[c] = (float)v.x; });
  if (t == 0) tickets[0] = 0;
}

// Host side: per_sample [B, C] and total [C] (f32, each optional) of y [B, H, W, C] in one launch
// of colsum_kernel on ctx's stream (the partials' room decides the splits).
inline void column_sums(CudaCtx& ctx, const Tensor& y, const Tensor& per_sample, const Tensor& total) {
  if (!per_sample.defined() && !total.defined()) return;
  const int B = (int)y.dim[0], R = (int)(y.dim[1] * y.dim[2]), C = (int)y.dim[3];
  const long long max_splits = (long long)(CudaCtx::kPartialFloats / 2) / ((long long)B * C);
  with_act(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    with_width<T>(wide_ok<T>(C, {y.data}), [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      const Plan p = plan(colsum_kernel<T, V>, B, R, C, V, 4, max_splits);
      colsum_kernel<T, V><<<p.grid(), p.nt, 0, ctx.stream>>>(
          dptr<T>(y), R, C, p.Cl, p.L, p.rps, reinterpret_cast<float2*>(ctx.partial()),
          reinterpret_cast<double2*>(ctx.aux()), ctx.tickets, dptr<float>(per_sample), dptr<float>(total));
      KERNEL_CHECK();
    });
  });
}

// Whether column_sums' one-launch reduction fits ctx's scratch for y [B, H, W, C]: the batch
// within the tickets and the grid, one split per sample within the partials' room, the per-(b, c)
// sums within the auxiliary scratch.
inline bool column_sums_fit(const Tensor& y) {
  const long long B = y.dim[0], C = y.dim[3];
  return B >= 1 && B < 65536 && (size_t)B + 1 <= CudaCtx::kTickets &&
         (size_t)(2 * B * C) <= CudaCtx::kPartialFloats && (size_t)(B * C * 16) <= CudaCtx::kAuxFloats * 4;
}

// GroupNormBwd's optional column sums (dx_sums, dx_total from dx; add_total from add) as separate
// passes, for the GroupNorm variants that do not fold them into their dx kernel.
inline void gn_bwd_column_sums(CudaCtx& ctx, const GroupNormBwd& o) {
  column_sums(ctx, o.dx, o.dx_sums, o.dx_total);
  column_sums(ctx, o.add, {}, o.add_total);
}
inline bool gn_bwd_column_sums_fit(const GroupNormBwd& o) {
  return (!o.dx_sums.defined() && !o.dx_total.defined() && !o.add_total.defined()) || column_sums_fit(o.x);
}

// ---- a row pass that also gives GroupNorm statistics ----
// A source's Ring slots (Src::kRing, 0 without it): with D > 0 its rows are streamed through
// shared memory (ring_rows, from Src::col / Src::pitch of a channel) instead of registers.
template <class S, class = void>
struct src_ring : std::integral_constant<int, 0> {};
template <class S>
struct src_ring<S, std::void_t<decltype(S::kRing)>> : std::integral_constant<int, S::kRing> {};

// Writes y [B, R, C] from a source (src.load(ch, b R + r, j, v): the V values of channel vector j
// of row r, ch = src.chan(b, j) its per-thread constants; e.g. a conv's epilogue, in place, or a
// concatenation) and the GroupNorm statistics of y as stored (mean, rstd [B, G]), for the norm
// that follows, without a pass of its own over y. Block (s, b) sums d = y - K and d^2 per channel
// in f32, K the channel's value at the split's first row (computed by every thread before any row
// is written, so the block's sums share it); partials (s1, s2, K) per (b, split, c). The last
// block of sample b merges them in double: per channel the sum n K + s1 and the squared
// deviations about the split's mean s2 - s1^2 / n, per group the mean, then the splits' spread
// about it n (mean_split - mean)^2 (exact, every term non-negative). Fixed slots and orders:
// deterministic. partial: [B, S, C] float4; sums: [B, C] double2.
template <class T, int V, class Src>
__global__ void __launch_bounds__(kThreads)
    stats_rows_kernel(Src src, T* __restrict__ y, int R, int C, int G, int Cl, int L, int rps, float4* partial,
                      double2* sums, unsigned* tickets, float* __restrict__ mean, float* __restrict__ rstd) {
  pdl_entry();
  __shared__ float2 red[kThreads * V];
  __shared__ float ks[kThreads * V];
  __shared__ double2 tmp[kThreads];
  extern __shared__ uint4 ring[];
  constexpr int D = src_ring<Src>::value;
  const int t = threadIdx.x, cl = t % Cl, rl = t / Cl, nt = blockDim.x;
  const int s = blockIdx.x, b = blockIdx.y, S = gridDim.x, Cv = C / V, w = Cl * V, Cg = C / G;
  const int r0 = s * rps, r1 = min(R, r0 + rps);
  const size_t row0 = (size_t)b * R;
  // Rows in flight per thread: 8 of f32, 4 of bf16 (at 2 the skip concatenations' pass cost the
  // seed64 tf32 step 0.12 ms over copy + statistics passes, at 8 0.05; H100, 2026-11-25).
  constexpr int U = sizeof(T) == 4 ? 8 : 4;
  for (int j0 = 0; j0 < Cv; j0 += Cl) {  // trip count uniform over the block (it syncs inside)
    const int j = j0 + cl;
    typename Src::Chan ch{};
    float K[V], s1[V], s2[V];
#pragma unroll
    for (int k = 0; k < V; ++k) s1[k] = 0.f, s2[k] = 0.f, K[k] = 0.f;
    if (j < Cv) {
      ch = src.chan(b, j);
      float v[V];
      src.load(ch, row0 + r0, j, v);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        K[k] = as_stored<T>(v[k]);
        if (rl == 0) ks[cl * V + k] = K[k];
      }
    }
    __syncthreads();  // row r0 is read by all before it is written (the source may be y)
    if constexpr (D > 0) {
      if (j < Cv) {
        const T* const col[1] = {src.col(ch) + row0 * (size_t)src.pitch(ch)};  // the sample's first row
        ring_rows<T, V, D, 1>(
            col, 0, src.pitch(ch), r0 + rl, r1, L, false, ring, [] {},
            [&](const typename Vec<T, V>::Raw(&raw)[1], int r) {
              float v[V];
              Vec<T, V>::unpack(raw[0], v);
#pragma unroll
              for (int k = 0; k < V; ++k) {
                const float d = as_stored<T>(v[k]) - K[k];
                s1[k] += d;
                s2[k] = fmaf(d, d, s2[k]);
              }
              Vec<T, V>::store(y + (row0 + r) * C + j * V, v);
            });
      }
    } else {  // (braced: see tests/test_constexpr_pragma.py)
      if (j < Cv)
        for (int r = r0 + rl; r < r1; r += U * L) {
          float v[U][V];
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (r + u * L < r1) src.load(ch, row0 + r + u * L, j, v[u]);
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (r + u * L < r1) {
#pragma unroll
              for (int k = 0; k < V; ++k) {
                const float d = as_stored<T>(v[u][k]) - K[k];
                s1[k] += d;
                s2[k] = fmaf(d, d, s2[k]);
              }
              Vec<T, V>::store(y + (row0 + r + u * L) * C + j * V, v[u]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) red[rl * w + cl * V + k] = make_float2(s1[k], s2[k]);
    __syncthreads();
    fold_rows(red, L, w);
    for (int e = t; e < w && j0 * V + e < C; e += nt)
      partial[((size_t)b * S + s) * C + j0 * V + e] = make_float4(red[e].x, red[e].y, ks[e], 0.f);
    __syncthreads();  // red and ks are reused
  }
  if (!last_block(tickets + 1 + b, S)) return;
  if (t == 0) tickets[1 + b] = 0;
  const float4* pb = partial + (size_t)b * S * C;
  auto rows = [&](int i) { return (double)(min(R, (i + 1) * rps) - i * rps); };
  double2* sb = sums + (size_t)b * C;
  // per channel: (sum of y, squared deviations within the splits)
  finish_columns(
      S, C, tmp,
      [&](int c, int i0, int i1) {
        double a = 0, m2 = 0;
        each_run<kRunLoads>(pb + (size_t)i0 * C + c, i1 - i0, (size_t)C, [&](int k, const float4& p) {
          const double n = rows(i0 + k);
          a += n * p.z + p.x, m2 += p.y - (double)p.x * p.x / n;
        });
        return make_double2(a, m2);
      },
      [&](int c, double2 v) { sb[c] = v; });
  const double N = (double)R * Cg;
  for (int g = t; g < G; g += nt) {
    double a = 0;
    for (int c = g * Cg; c < (g + 1) * Cg; ++c) a += sb[c].x;
    mean[b * G + g] = (float)(a / N);
  }
  __syncthreads();
  // per channel: its squared deviations about the group mean = within the splits + the splits'
  // spread about that mean (the group mean in double, recomputed: the float above is rounded)
  finish_columns(
      S, C, tmp,
      [&](int c, int i0, int i1) {
        const int g = c / Cg;
        double a = 0;
        for (int k = g * Cg; k < (g + 1) * Cg; ++k) a += sb[k].x;
        const double mg = a / N;
        double sp = 0;
        each_run<kRunLoads>(pb + (size_t)i0 * C + c, i1 - i0, (size_t)C, [&](int k, const float4& p) {
          const double n = rows(i0 + k), dm = p.z + (double)p.x / n - mg;
          sp += n * dm * dm;
        });
        return make_double2(sp, 0.0);
      },
      [&](int c, double2 v) { sb[c].y += v.x; });
  for (int g = t; g < G; g += nt) {
    double m2 = 0;
    for (int c = g * Cg; c < (g + 1) * Cg; ++c) m2 += sb[c].y;
    rstd[b * G + g] = (float)(1.0 / sqrt(fmax(m2 / N, 0.0) + 1e-5));  // GroupNorm's eps
  }
}

// Host side: one launch of stats_rows_kernel for y [B, H, W, C] with mean, rstd [B, G].
// stats_rows_fit: whether the shape fits ctx's scratch (tickets, partials, sums).
inline long long stats_rows_splits(const Tensor& y) {
  return (long long)(CudaCtx::kPartialFloats / 4) / ((long long)y.dim[0] * y.dim[3]);
}
inline bool stats_rows_fit(const Tensor& y, const Tensor& mean) {
  const long long B = y.dim[0], C = y.dim[3], G = mean.dim[1];
  return B >= 1 && B < 65536 && G >= 1 && C % G == 0 && (size_t)B + 1 <= CudaCtx::kTickets &&
         stats_rows_splits(y) >= 1 && (size_t)(B * C * 16) <= CudaCtx::kAuxFloats * 4;
}
template <class T, int V, class Src>
void stats_rows(CudaCtx& ctx, const Src& src, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int B = (int)y.dim[0], R = (int)(y.dim[1] * y.dim[2]), C = (int)y.dim[3];
  constexpr auto k = stats_rows_kernel<T, V, Src>;
  const size_t sm = ring_smem<src_ring<Src>::value, k>(1);
  const Plan p = plan(k, B, R, C, V, 2, stats_rows_splits(y), sm);
  k<<<p.grid(), p.nt, sm, ctx.stream>>>(
      src, dptr<T>(y), R, C, (int)mean.dim[1], p.Cl, p.L, p.rps, reinterpret_cast<float4*>(ctx.partial()),
      reinterpret_cast<double2*>(ctx.aux()), ctx.tickets, dptr<float>(mean), dptr<float>(rstd));
  KERNEL_CHECK();
}

}  // namespace rowblock
}  // namespace unet
