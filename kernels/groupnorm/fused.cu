// GroupNorm variant "fused": the statistics of "vec" (per-channel sums of x - K, K the group's
// first element, added in double where partial sums meet), in fewer and leaner launches. On the
// H100 (seed64, batch 32, bf16) "vec"'s element kernels ran at a third of memory speed, bound by
// per-element coefficient loads and 64-bit index arithmetic, and its small kernels between the
// passes (split sums, statistics, coefficients) cost as much as a pass. Here (rowblock.cuh):
//  * a thread owns one 16-byte channel vector of one sample for a run of rows, so its
//    coefficients are computed once into registers from mean/rstd/gamma/beta/ss, and the row
//    loop is loads, FMAs (and SiLU), stores;
//  * the last block of each sample to finish its partial sums completes that sample's reduction
//    (statistics, or the backward's group coefficients and dss), and with dgamma/dbeta the last
//    of those adds them over the batch:
//      forward   sums + statistics | apply          2 launches ("vec": 4)
//      apply     apply                              1 launch   ("vec": 2)
//      backward  sums + coefficients | dx           2 launches ("vec": 5)
//  * the normalisation is computed as (x - mean) * coefficient, not x * a + (beta - mean a), so a
//    large common offset does not cancel in f32;
//  * apply (and bf16's dx) stream the rows through shared memory (rowblock::Ring, kRingApply
//    below) and walk them backwards; the sums passes keep theirs in registers.
// Deterministic: every partial has a fixed slot and is added in a fixed order; the tickets only
// decide which block adds. Split counts are sized to one wave of resident blocks (rowblock::plan),
// so the order depends on the shapes and the build, not on the GPU it runs on.
// Measured 2026-11-23 (H100, seed64, batch 32, kernel sums of the step): GroupNorm 4.45 -> 3.12 ms
// in bf16, 4.37 -> 3.83 ms in tf32; with "smem" (below) for bf16's small maps, 2.97 ms.
// Variant "smem" (further down) takes the small maps where a group chunk fits in shared memory.
#include <cuda_pipeline.h>

#include <algorithm>

#include "cuda_engine.cuh"
#include "gn_coef.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

using namespace rowblock;

constexpr double kEps = 1e-5;

// Rows in flight per thread, loaded packed (Vec::ld) before any arithmetic and unpacked one row
// at a time (unpacking them all up front took the registers that more rows need). Measured on
// the H100 (same runs): with 4 rows and everything unpacked first, apply ran at ~2.1 TB/s at
// imagenet256's 256x256x512 batch 16 (1.01 ms per launch); 12 rows of bf16 at 2 blocks per SM
// (128 registers, no spills; 16 spill), 0.77 ms; 8 of f32 at 3 blocks (16 cost the seed64 tf32
// step 0.05 ms). The statistics at 8 rows: 0.45 -> 0.36 ms. The two-input backward kernels keep 2
// rows of x and dy (4 measured the same). imagenet256's forward 73.7 -> 70.8 ms, the seed64 bf16
// step 9.05-9.09 -> 8.86 ms, tf32 unchanged.
template <int V>
constexpr int kUA = V >= 8 ? 12 : 8;
constexpr int kUS = 8, kU2 = 2;
// Resident blocks per SM of apply, bwd_sums and dx: 3 for f32's 4-channel vectors (the backward
// kernels at 3: H100 tf32 step 15.26/15.29 -> 15.22/15.20 ms), 2 for bf16's 8-channel ones (at 3
// they spill: 9.07 -> 9.52 ms).
template <int V>
constexpr int kBlocks = V >= 8 ? 2 : 3;
// Rows streamed through shared memory (rowblock::Ring) instead of registers, D slots a thread:
// more bytes in flight than registers hold (Nsight Compute, H200, sampling at batch 64: apply at
// 64x64 moved 64-65% of DRAM peak, bwd_sums 53-67%, dx 60-80%). apply (16 slots of f32, 8 of bf16)
// and dx walk their rows backwards, so their first rows are the last the pass before them read
// (dx kernel sum 1.33 -> 1.30 ms a tf32 step, apply 0.954 -> 0.941 ms a sampling forward). H200,
// same runs, CUDA events, old / new binary: apply with 16 / 8 slots: sampling's forward at batch
// 64 tf32 6.163 / 6.167 -> 6.113 / 6.110 ms, bf16 3.896 / 3.897 -> 3.866 / 3.859, tf32 step
// unchanged; bf16's dx with 4 slots: bf16 step 6.963 / 6.952 -> 6.907 / 6.911. All of it against
// the binary before: tf32 step 10.901 / 10.885 -> 10.893 / 10.887, bf16 6.982 / 7.012 -> 6.934 /
// 6.906, sampling tf32 6.158 / 6.160 -> 6.105 / 6.106, bf16 3.906 / 3.904 -> 3.873 / 3.861.
// Measured and not kept: the statistics (fwd_sums 0.45 -> 0.51-0.53 ms of a sampling forward at
// 8-32 slots), bwd_sums (tf32 1.31 -> 1.51 ms a step at 8) and f32's dx (1.33 -> 1.39 / 1.45 ms
// at 4 / 8 slots; tf32 step +0.06 / +0.09 ms): the sums passes read what the kernel before them
// just wrote, much of it from L2.
template <int V>
constexpr int kRingApply = V == 4   ? 16
                           : V == 8 ? 8
                                    : 0;
template <int V>
constexpr int kRingDx = V == 8 ? 4 : 0;
// The backward sums of f32's 4-channel vectors split for half a wave of resident blocks: in the
// training step they run beside the side lane's filter gradients, which hold half the SMs, so half
// a wave starts at once and fewer partials meet. H200, same run, tf32 step (4 alternated rounds):
// 10.860 / 10.808 / 10.846 / 10.849 -> 10.785 / 10.820 / 10.804 / 10.822 ms; bf16 (8-channel
// vectors) took 6.844 / 6.853 -> 6.871 / 6.881 with it, so keeps the whole wave (also 2x and 4x
// the wave measured for both backward passes: tf32 +0.06 .. +0.30 ms).
template <int V>
constexpr int kSumsWaveDiv = V == 4 ? 2 : 1;
// f32: the element kernels load their first rows before their per-channel coefficients (or the
// statistics' shifts), so that the two round trips overlap. H100, same run: tf32 step 14.922 /
// 14.882 / 14.903 -> 14.851 / 14.871 / 14.875 ms; for bf16 it cost 8.370 / 8.376 / 8.375 -> 8.383 /
// 8.390 / 8.387, so bf16 loads them in the loop (another H100, f32 only: tf32 14.926 / 14.900 /
// 14.910 -> 14.870 / 14.867 / 14.832, bf16 8.530 / 8.513 / 8.524 -> 8.528 / 8.520 / 8.516).
template <class T>
constexpr bool kPrologue = std::is_same_v<T, float>;

// A thread's walk over its rows rf, rf + KU L, ... below r1 (backwards with rev) with KU rows a
// step in registers: load(r) fills them (issued a step ahead for f32: kPrologue), pre() runs once
// the first loads are in flight, body(r) uses them.
template <class T, int KU, class Load, class Pre, class Body>
__device__ __forceinline__ void walk_registers(int rf, int r1, int L, bool rev, Load load, Pre pre,
                                               Body body) {
  const Walk wk = walk(rf, r1, KU * L, rev);
  if (kPrologue<T>) load(wk.first);
  pre();
  for (int i = 0, r = wk.first; i < wk.n; ++i, r += wk.step) {
    if (!kPrologue<T> || i) load(r);
    body(r);
  }
}

// f(raw, r) for the thread's rows r of column col (rows of C), walking rf, rf + L, ... below r1
// (backwards with rev): with D > 0 through a Ring of D slots in shared memory (dynamic, `ring`),
// else KU rows at a time in registers (KU rows in order per step). pre() runs once the first
// loads are in flight.
template <class T, int V, int KU, int D, class Pre, class F>
__device__ __forceinline__ void for_rows(const T* col, int C, int rf, int r1, int L, bool rev, void* ring,
                                         Pre pre, F f) {
  using Raw = typename Vec<T, V>::Raw;
  if constexpr (D > 0) {
    const T* const src[1] = {col};
    ring_rows<T, V, D, 1>(src, 0, C, rf, r1, L, rev, ring, pre,
                          [&](const Raw(&raw)[1], int r) { f(raw[0], r); });
  } else {
    Raw raw[KU];
    const auto load = [&](int r) {
#pragma unroll
      for (int u = 0; u < KU; ++u)
        if (r + u * L < r1) raw[u] = Vec<T, V>::ld(col + (size_t)(r + u * L) * C);
    };
    walk_registers<T, KU>(rf, r1, L, rev, load, pre, [&](int r) {
#pragma unroll
      for (int u = 0; u < KU; ++u)
        if (r + u * L < r1) f(raw[u], r + u * L);
    });
  }
}

// Sample b of an NHWC input given as one tensor [B, R, C] (P2 false: x2 and C1 unused) or as two
// channel parts (P2), x [B, R, C1] then x2 [B, R, C - C1] (a skip concatenation read where its
// parts lie; C1 a multiple of the vector width): channel c's column, its row pitch, its value in
// row 0. The one-part kernels are instances of their own: with the parts' branches in them,
// sampling's forward at batch 64 (tf32, H200, same run) took 6.10 -> 6.19 ms.
template <class T, bool P2>
struct Parts {
  const T *a, *b;
  int C1, C2;
  __device__ Parts(const T* x, const T* x2, int C1_, int C, int R, int s)
      : a(x + (size_t)s * R * (P2 ? C1_ : C)),
        b(P2 ? x2 + (size_t)s * R * (C - C1_) : nullptr),
        C1(P2 ? C1_ : C),
        C2(C - C1) {}
  __device__ const T* col(int c) const {
    if constexpr (P2) return c < C1 ? a + c : b + (c - C1);
    return a + c;
  }
  __device__ int pitch(int c) const {
    if constexpr (P2) return c < C1 ? C1 : C2;
    return C1;
  }
  __device__ float at0(int c) const {
    if constexpr (P2) return c < C1 ? ldf(a, (size_t)c) : ldf(b, (size_t)(c - C1));
    return ldf(a, (size_t)c);
  }
};

// Forward sums of (x - K, (x - K)^2) per (b, split, c); the last block of sample b writes its
// mean and rstd. x in one or two parts (Parts).
template <class T, int V, bool P2>
__global__ void __launch_bounds__(kThreads, 2)
    fwd_sums_kernel(const T* __restrict__ x, const T* __restrict__ x2, int C1,
                    const float* __restrict__ xbias, const float* __restrict__ xemb, int R, int C, int G,
                    int Cl, int L, int rps, float2* partial, double2* sums, unsigned* tickets,
                    float* __restrict__ mean, float* __restrict__ rstd) {
  pdl_entry();
  __shared__ float2 red[kThreads * V];
  __shared__ double2 tmp[kThreads];
  const int t = threadIdx.x, cl = t % Cl, rl = t / Cl, nt = blockDim.x;
  const int s = blockIdx.x, b = blockIdx.y, S = gridDim.x, Cv = C / V, Cg = C / G, w = Cl * V;
  const int r0 = s * rps, r1 = min(R, r0 + rps);
  const Parts<T, P2> xb(x, x2, C1, C, R, b);
  for (int j0 = 0; j0 < Cv; j0 += Cl) {  // trip count uniform over the block (it syncs inside)
    const int j = j0 + cl;
    float s1[V], s2[V];
#pragma unroll
    for (int k = 0; k < V; ++k) s1[k] = 0.f, s2[k] = 0.f;
    if (j < Cv) {
      float K[V];
      for_rows<T, V, kUS, 0>(
          xb.col(j * V), xb.pitch(j * V), r0 + rl, r1, L, false, nullptr,
          [&] {
#pragma unroll
            for (int k = 0; k < V; ++k) {  // the group's first value as read, minus this channel's offset
              const int c = j * V + k, c0 = c / Cg * Cg;
              K[k] = xb.at0(c0) + xoff(xbias, xemb, b, c0, C) - xoff(xbias, xemb, b, c, C);
            }
          },
          [&](const typename Vec<T, V>::Raw& raw, int) {
            float v[V];
            Vec<T, V>::unpack(raw, v);
#pragma unroll
            for (int k = 0; k < V; ++k) {
              const float d = v[k] - K[k];
              s1[k] += d;
              s2[k] = fmaf(d, d, s2[k]);
            }
          });
    }
#pragma unroll
    for (int k = 0; k < V; ++k) red[rl * w + cl * V + k] = make_float2(s1[k], s2[k]);
    __syncthreads();
    fold_rows(red, L, w);
    for (int e = t; e < w && j0 * V + e < C; e += nt) partial[((size_t)b * S + s) * C + j0 * V + e] = red[e];
    __syncthreads();  // red is reused
  }
  if (!last_block(tickets + 1 + b, S)) return;
  finish_sample(partial, b, S, C, sums, tmp);
  const double n = (double)R * Cg;
  for (int g = t; g < G; g += nt) {
    double a = 0, q = 0;
    for (int c = g * Cg; c < (g + 1) * Cg; ++c) a += sums[(size_t)b * C + c].x, q += sums[(size_t)b * C + c].y;
    const double m1 = a / n, var = fmax(q / n - m1 * m1, 0.0);
    mean[b * G + g] = (float)(xb.at0(g * Cg) + xoff(xbias, xemb, b, g * Cg, C) + m1);
    rstd[b * G + g] = (float)(1.0 / sqrt(var + kEps));
  }
  if (t == 0) tickets[1 + b] = 0;
}

// y = act((x - m) a + bb) from saved statistics; x in one or two parts (Parts), and with two,
// xcat (when given) = their concatenation [B, R, C], written as read.
template <class T, int V, bool P2>
__global__ void __launch_bounds__(kThreads, kBlocks<V>)
    apply_kernel(const T* __restrict__ x, const T* __restrict__ x2, int C1, T* __restrict__ xcat,
                 T* __restrict__ y, const float* __restrict__ gamma, const float* __restrict__ beta,
                 const float* __restrict__ ss, const float* __restrict__ mean, const float* __restrict__ rstd,
                 const float* __restrict__ xbias, const float* __restrict__ xemb, int R, int C, int G, int Cl,
                 int L, int rps, bool silu) {
  pdl_entry();
  extern __shared__ uint4 ring[];
  const int t = threadIdx.x, cl = t % Cl, rl = t / Cl;
  const int s = blockIdx.x, b = blockIdx.y, Cv = C / V;
  const int r1 = min(R, s * rps + rps);
  const size_t base = (size_t)b * R * C;
  const Parts<T, P2> xb(x, x2, C1, C, R, b);
  for (int j = cl; j < Cv; j += Cl) {
    float m[V], a[V], bb[V];
    for_rows<T, V, kUA<V>, kRingApply<V>>(
        xb.col(j * V), xb.pitch(j * V), s * rps + rl, r1, L, true, ring,
        [&] {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const Coef q = coef_of(gamma, beta, ss, mean, rstd, xbias, xemb, b, j * V + k, C, G);
            m[k] = q.m, a[k] = q.a, bb[k] = q.bb;
          }
        },
        [&](const typename Vec<T, V>::Raw& raw, int r) {
          float v[V];
          Vec<T, V>::unpack(raw, v);
          if constexpr (P2)
            if (xcat) Vec<T, V>::store(xcat + base + (size_t)r * C + j * V, v);  // (exact: T's values)
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float z = fmaf(v[k] - m[k], a[k], bb[k]);
            v[k] = silu ? silu_fast(z) : z;
          }
          Vec<T, V>::store(y + base + (size_t)r * C + j * V, v);
        });
  }
}

// The backward kernels' row loads, packed: rows r, r + L, ... (kU2 of them, those below r1) of x
// and dy, and of add when given (ar then too), at channel vector j; base: the sample's first row.
template <class T, int V>
__device__ __forceinline__ void load_rows(typename Vec<T, V>::Raw (&xr)[kU2], typename Vec<T, V>::Raw (&gr)[kU2],
                                          typename Vec<T, V>::Raw* ar, const T* __restrict__ x,
                                          const T* __restrict__ dy, const T* __restrict__ add, size_t base, int r,
                                          int r1, int L, int C, int j) {
#pragma unroll
  for (int u = 0; u < kU2; ++u)
    if (r + u * L < r1) {
      const size_t o = base + (size_t)(r + u * L) * C + j * V;
      xr[u] = Vec<T, V>::ld(x + o);
      gr[u] = Vec<T, V>::ld(dy + o);
      if (add) ar[u] = Vec<T, V>::ld(add + o);
    }
}

// dgamma, dbeta over the batch from the per-(b, c) sums (dz xhat, dz), each scaled by the
// sample's (1 + scale) with ss: one block, every thread of it.
__device__ __forceinline__ void param_grads(const double2* sums, const float* ss, int B, int C, double2* tmp,
                                            float* dgamma, float* dbeta) {
  auto run = [&](int c, int i0, int i1) {
    if (!ss) return sum_run(sums + (size_t)i0 * C + c, i1 - i0, (size_t)C);
    double sg = 0, sb = 0;
    for (int bi = i0; bi < i1; ++bi) {
      const double2 q = __ldcg(sums + (size_t)bi * C + c);
      const double k = 1.0 + (double)ss[(size_t)bi * 2 * C + c];
      sg += k * q.x, sb += k * q.y;
    }
    return make_double2(sg, sb);
  };
  finish_columns(B, C, tmp, run, [&](int c, double2 v) {
    if (dgamma) dgamma[c] = (float)v.x;
    if (dbeta) dbeta[c] = (float)v.y;
  });
}

// Backward sums of (dz xhat, dz) per (b, split, c), dz = dy SiLU'(z) (or dy). The last block of
// sample b: per-(b, c) totals (sums), dss, and the group coefficients coef[b, g] =
// (mean_g(f gamma dz), mean_g(f gamma dz xhat)); the last of those: dgamma, dbeta over the batch
// (when given: with a dx pass after it, that pass's extra block adds them instead, off the chain
// of finishing blocks between the two launches).
template <class T, int V>
__global__ void __launch_bounds__(kThreads, kBlocks<V>)
    bwd_sums_kernel(const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ gamma,
                    const float* __restrict__ beta, const float* __restrict__ ss, const float* __restrict__ mean,
                    const float* __restrict__ rstd, const float* __restrict__ xbias, const float* __restrict__ xemb,
                    int R, int C, int G, int Cl, int L, int rps, bool silu, float2* partial, double2* sums,
                    float2* coef, unsigned* tickets, float* dgamma,
                    float* dbeta, float* dss) {
  pdl_entry();
  __shared__ float2 red[kThreads * V];
  __shared__ double2 tmp[kThreads];
  const int t = threadIdx.x, cl = t % Cl, rl = t / Cl, nt = blockDim.x;
  const int s = blockIdx.x, b = blockIdx.y, S = gridDim.x, B = gridDim.y, Cv = C / V, Cg = C / G, w = Cl * V;
  const int r0 = s * rps, r1 = min(R, r0 + rps);
  const size_t base = (size_t)b * R * C;
  for (int j0 = 0; j0 < Cv; j0 += Cl) {
    const int j = j0 + cl;
    float p1[V], p0[V];
#pragma unroll
    for (int k = 0; k < V; ++k) p1[k] = 0.f, p0[k] = 0.f;
    if (j < Cv) {
      typename Vec<T, V>::Raw xr[kU2], gr[kU2];
      const auto load = [&](int r) { load_rows<T, V>(xr, gr, nullptr, x, dy, nullptr, base, r, r1, L, C, j); };
      const int rf = r0 + rl;
      if (kPrologue<T>) load(rf);
      float m[V], rs[V], a[V], bb[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const Coef q = coef_of(gamma, beta, ss, mean, rstd, xbias, xemb, b, j * V + k, C, G);
        m[k] = q.m, rs[k] = q.r, a[k] = q.a, bb[k] = q.bb;
      }
      for (int r = rf; r < r1; r += kU2 * L) {
        if (!kPrologue<T> || r != rf) load(r);
#pragma unroll
        for (int u = 0; u < kU2; ++u)
          if (r + u * L < r1) {
            float xv[V], gv[V];
            Vec<T, V>::unpack(xr[u], xv);
            Vec<T, V>::unpack(gr[u], gv);
#pragma unroll
            for (int k = 0; k < V; ++k) {
              const float d = xv[k] - m[k];
              float dz = gv[k];
              if (silu) dz *= silu_grad_fast(fmaf(d, a[k], bb[k]));
              p1[k] = fmaf(dz, d * rs[k], p1[k]);
              p0[k] += dz;
            }
          }
      }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) red[rl * w + cl * V + k] = make_float2(p1[k], p0[k]);
    __syncthreads();
    fold_rows(red, L, w);
    for (int e = t; e < w && j0 * V + e < C; e += nt) partial[((size_t)b * S + s) * C + j0 * V + e] = red[e];
    __syncthreads();
  }
  if (!last_block(tickets + 1 + b, S)) return;
  if (t == 0) tickets[1 + b] = 0;
  finish_sample(partial, b, S, C, sums, tmp);
  auto f = [&](int bi, int c) { return ss ? 1.0 + (double)ss[(size_t)bi * 2 * C + c] : 1.0; };
  if (dss)
    for (int c = t; c < C; c += nt) {
      const double2 q = sums[(size_t)b * C + c];
      dss[(size_t)b * 2 * C + c] = (float)(gamma[c] * q.x + beta[c] * q.y);
      dss[(size_t)b * 2 * C + C + c] = (float)q.y;
    }
  const double n = (double)R * Cg;
  for (int g = t; g < G; g += nt) {
    double kx = 0, ky = 0;
    for (int c = g * Cg; c < (g + 1) * Cg; ++c) {
      const double2 q = sums[(size_t)b * C + c];
      const double wgt = f(b, c) * gamma[c];
      kx += wgt * q.y, ky += wgt * q.x;
    }
    coef[b * G + g] = make_float2((float)(kx / n), (float)(ky / n));
  }
  if (!dgamma && !dbeta) return;
  if (!last_block(tickets, B)) return;
  param_grads(sums, ss, B, C, tmp, dgamma, dbeta);
  if (t == 0) tickets[0] = 0;
}

// Where channel c (the first of a vector) of row r of sample b goes: dx [B, R, C], or with dx2
// (the split) dx [B, R, C1] for c < C1, dx2 [B, R, C - C1] for the rest.
template <class T>
__device__ __forceinline__ T* dx_at(T* dx, T* dx2, int C1, int C, int R, int b, int r, int c) {
  if (!dx2) return dx + ((size_t)b * R + r) * C + c;
  if (c < C1) return dx + ((size_t)b * R + r) * C1 + c;
  return dx2 + ((size_t)b * R + r) * (C - C1) + (c - C1);
}

// dx = rstd (f gamma dz - kx - xhat ky) = dz a + (x - m) (-rstd^2 ky) - rstd kx (+ add).
// SUMS: also the column sums of dx as stored and of add (GroupNormBwd's dx_sums, dx_total,
// add_total), as colsum_kernel's: per-(b, split, c) partials, the last block of a sample adds
// them, the last sample's adds over the batch. The bias and embedding gradients of the convs on
// either side of the norm so come out of this pass instead of one more read of each tensor.
// With dgamma / dbeta the grid has one more row of blocks (blockIdx.y == B): its first block adds
// them over the batch from bwd_sums's per-(b, c) sums (bsums), beside the dx blocks, instead of a
// second finishing block after bwd_sums's per-sample ones, which the dx launch waited for (H100,
// seed64 batch 32, same run: bf16 step 8.583 / 8.584 / 8.572 -> 8.490 / 8.497 / 8.507 ms, tf32
// 14.976 / 14.971 / 14.978 -> 14.968 / 14.988 / 14.986).
template <class T, int V, bool SUMS>
__global__ void __launch_bounds__(kThreads, kBlocks<V>)
    dx_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, T* __restrict__ dx2, int C1,
              const T* __restrict__ add, const T* __restrict__ add2,
              const float* __restrict__ gamma,
              const float* __restrict__ beta, const float* __restrict__ ss, const float* __restrict__ mean,
              const float* __restrict__ rstd, const float* __restrict__ xbias, const float* __restrict__ xemb,
              const float2* __restrict__ coef, int R, int C, int G, int Cl, int L,
              int rps, bool silu, float2* partial, double2* sums, unsigned* tickets, float* dx_sums,
              float* dx_total, float* add_total, int B, const double2* __restrict__ bsums, float* dgamma,
              float* dbeta) {
  pdl_entry();
  extern __shared__ uint4 ring[];
  const int t = threadIdx.x, cl = t % Cl, rl = t / Cl;
  const int s = blockIdx.x, b = blockIdx.y, Cv = C / V, Cg = C / G;
  if (b == B) {  // the parameter-gradient row
    __shared__ double2 ptmp[kThreads];
    if (s == 0) param_grads(bsums, ss, B, C, ptmp, dgamma, dbeta);
    return;
  }
  const int r1 = min(R, s * rps + rps);
  const size_t base = (size_t)b * R * C;
  for (int j0 = 0; j0 < Cv; j0 += Cl) {  // trip count uniform over the block (SUMS syncs inside)
    const int j = j0 + cl;
    float sx[V], sa[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sx[k] = 0.f, sa[k] = 0.f;
    if (j < Cv) {
      float m[V], a[V], bb[V], bq[V], cq[V];
      const auto coefs = [&] {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const int c = j * V + k;
          const Coef q = coef_of(gamma, beta, ss, mean, rstd, xbias, xemb, b, c, C, G);
          const float2 kk = coef[b * G + c / Cg];
          m[k] = q.m, a[k] = q.a, bb[k] = q.bb;
          bq[k] = -q.r * q.r * kk.y;
          cq[k] = -q.r * kk.x;
        }
      };
      using Raw = typename Vec<T, V>::Raw;
      const auto body = [&](const Raw& xraw, const Raw& graw, const Raw& araw, int r) {
        float xv[V], gv[V];
        Vec<T, V>::unpack(xraw, xv);
        Vec<T, V>::unpack(graw, gv);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float d = xv[k] - m[k];
          float dz = gv[k];
          if (silu) dz *= silu_grad_fast(fmaf(d, a[k], bb[k]));
          gv[k] = fmaf(dz, a[k], fmaf(d, bq[k], cq[k]));
        }
        if (add) {
          Vec<T, V>::unpack(araw, xv);
#pragma unroll
          for (int k = 0; k < V; ++k) {
            gv[k] += xv[k];
            if (SUMS) sa[k] += xv[k];
          }
        }
        if (add2) {  // (rare: loaded here, not with the rows, to keep the registers)
          Vec<T, V>::load(add2 + base + (size_t)r * C + j * V, xv);
#pragma unroll
          for (int k = 0; k < V; ++k) gv[k] += xv[k];
        }
        Vec<T, V>::store(dx_at(dx, dx2, C1, C, R, b, r, j * V), gv);
        if (SUMS)
#pragma unroll
          for (int k = 0; k < V; ++k) sx[k] += as_stored<T>(gv[k]);
      };
      if constexpr (kRingDx < V >> 0) {
        const T* const src[3] = {x, dy, add};
        ring_rows<T, V, kRingDx<V>, 3>(
            src, base + j * V, C, s * rps + rl, r1, L, true, ring, coefs,
            [&](const Raw(&raw)[3], int r) { body(raw[0], raw[1], raw[2], r); }, add ? 3 : 2);
      } else {
        // add's rows are loaded with x's and dy's (after the arithmetic they were a second round
        // trip per iteration: H100 bf16 step 8.721 / 8.726 -> 8.669 / 8.661 ms, tf32 14.996 / 15.046 ->
        // 15.040 / 15.022, same run)
        Raw xr[kU2], gr[kU2], ar[kU2];
        const auto load = [&](int r) { load_rows<T, V>(xr, gr, ar, x, dy, add, base, r, r1, L, C, j); };
        walk_registers<T, kU2>(s * rps + rl, r1, L, true, load, coefs, [&](int r) {
#pragma unroll
          for (int u = 0; u < kU2; ++u)
            if (r + u * L < r1) body(xr[u], gr[u], ar[u], r + u * L);
        });
      }
    }
    if constexpr (SUMS) {
      __shared__ float2 red[kThreads * V];
      const int w = Cl * V;
#pragma unroll
      for (int k = 0; k < V; ++k) red[rl * w + cl * V + k] = make_float2(sx[k], sa[k]);
      __syncthreads();
      fold_rows(red, L, w);
      for (int e = t; e < w && j0 * V + e < C; e += blockDim.x)
        partial[((size_t)b * gridDim.x + s) * C + j0 * V + e] = red[e];
      __syncthreads();
    }
  }
  if constexpr (SUMS) {
    __shared__ double2 tmp[kThreads];
    const int S = gridDim.x, nt = blockDim.x;
    if (!last_block(tickets + 1 + b, S)) return;
    if (t == 0) tickets[1 + b] = 0;
    finish_sample(partial, b, S, C, sums, tmp);
    if (dx_sums)
      for (int c = t; c < C; c += nt) dx_sums[(size_t)b * C + c] = (float)sums[(size_t)b * C + c].x;
    if ((!dx_total && !add_total) || !last_block(tickets, B)) return;
    finish_columns(
        B, C, tmp, [&](int c, int i0, int i1) { return sum_run(sums + (size_t)i0 * C + c, i1 - i0, (size_t)C); },
        [&](int c, double2 v) {
          if (dx_total) dx_total[c] = (float)v.x;
          if (add_total) add_total[c] = (float)v.y;
        });
    if (t == 0) tickets[0] = 0;
  }
}

// ---- host side ----
// dx's channels (all of x's without dx2).
int split_at(const GroupNormBwd& o) { return o.dx2.defined() ? (int)o.dx.dim[3] : (int)o.x.dim[3]; }
// The 16-byte path's condition for a backward's tensors (and its split).
template <class T>
bool bwd_wide(const GroupNormBwd& o) {
  return wide_ok<T>((int)o.x.dim[3], {o.x.data, o.dy.data, o.dx.data, o.dx2.data, o.add.data, o.add2.data}) &&
         split_at(o) % kWide<T> == 0;
}

struct Dims {
  int B, R, C, G;
};
Dims dims(const Tensor& x, const Tensor& mean) {
  return {(int)x.dim[0], (int)(x.dim[1] * x.dim[2]), (int)x.dim[3], (int)mean.dim[1]};
}

// Scratch: partials [B, S, C] float2 in ctx.partial(); in ctx.aux() per-(b, c) double2 sums, then
// coef [B, G] float2, then the dx pass's per-(b, c) double2 sums (bwd_sums's are read by the dx
// pass's parameter-gradient block while its sample blocks write theirs). ("smem"'s backward: its
// sums, then its column sums' col, in the same 2 B C double2.)
long long max_splits(const Dims& d) { return (long long)(CudaCtx::kPartialFloats / 2) / ((long long)d.B * d.C); }
bool fits(const Dims& d) {
  // (B + 1 grid rows with the dx pass's parameter-gradient row, at most 65535)
  return d.B >= 1 && d.B < 65535 && (size_t)d.B + 1 <= CudaCtx::kTickets && max_splits(d) >= 1 &&
         (size_t)d.B * d.C * 32 + (size_t)d.B * d.G * 8 <= CudaCtx::kAuxFloats * 4;
}
double2* sums_of(CudaCtx& ctx) { return reinterpret_cast<double2*>(ctx.aux()); }
float2* coef_buf(CudaCtx& ctx, const Dims& d) {
  return reinterpret_cast<float2*>(reinterpret_cast<char*>(ctx.aux()) + (size_t)d.B * d.C * 16);
}
double2* dx_sums_of(CudaCtx& ctx, const Dims& d) {
  return reinterpret_cast<double2*>(reinterpret_cast<char*>(coef_buf(ctx, d)) + (size_t)d.B * d.G * 8);
}

// f(std::true_type{}) if `on`, else f(std::false_type{}): a kernel instance per value of a flag.
template <class F>
void with_flag(bool on, F&& f) {
  if (on)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// x2, C1, xcat: the input's second part, the first part's channels, the concatenation written
// (apply_kernel; none: x is the whole input).
template <class T, int V>
void apply(CudaCtx& ctx, const Dims& d, const T* x, T* y, const GroupNormApply& o, const T* x2 = nullptr,
           int C1 = 0, T* xcat = nullptr) {
  const auto launch = [&](auto p2) {
    constexpr auto k = apply_kernel<T, V, decltype(p2)::value>;
    const size_t sm = ring_smem<kRingApply<V>, k>(1);
    const Plan p = plan(k, d.B, d.R, d.C, V, kUA<V>, 1 << 20, sm);
    k<<<p.grid(), p.nt, sm, ctx.stream>>>(x, x2, C1, xcat, y, dptr<float>(o.gamma), dptr<float>(o.beta),
                                          dptr<float>(o.ss), dptr<float>(o.mean), dptr<float>(o.rstd),
                                          dptr<float>(o.xbias), dptr<float>(o.xemb), d.R, d.C, d.G, p.Cl, p.L,
                                          p.rps, o.silu);
    KERNEL_CHECK();
  };
  with_flag(x2 != nullptr, launch);
}

template <class T, int V>
void stats(CudaCtx& ctx, const Dims& d, const T* x, const Tensor& mean, const Tensor& rstd,
           const float* xbias = nullptr, const float* xemb = nullptr, const T* x2 = nullptr, int C1 = 0) {
  const auto launch = [&](auto p2) {
    constexpr auto k = fwd_sums_kernel<T, V, decltype(p2)::value>;
    const Plan p = plan(k, d.B, d.R, d.C, V, kUS, max_splits(d));
    k<<<p.grid(), p.nt, 0, ctx.stream>>>(x, x2, C1, xbias, xemb, d.R, d.C, d.G, p.Cl, p.L, p.rps,
                                         reinterpret_cast<float2*>(ctx.partial()), sums_of(ctx), ctx.tickets,
                                         dptr<float>(mean), dptr<float>(rstd));
    KERNEL_CHECK();
  };
  with_flag(x2 != nullptr, launch);
}

// With x2: the input in two parts (Parts), and xcat written by the apply pass.
void gn_fwd(const GroupNormFwd& o, CudaCtx& ctx) {
  const Dims d = dims(o.whole(), o.mean);
  const int C1 = (int)o.x.dim[3];
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *x = dptr<T>(o.x), *x2 = dptr<T>(o.x2);
    const bool wide = wide_ok<T>(d.C, {o.x.data, o.y.data, o.x2.data, o.xcat.data}) && C1 % kWide<T> == 0;
    with_width<T>(wide, [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      stats<T, V>(ctx, d, x, o.mean, o.rstd, dptr<float>(o.xbias), dptr<float>(o.xemb), x2, C1);
      if (!o.y.defined()) return;  // (the statistics of a norm that a conv applies)
      apply<T, V>(ctx, d, x, dptr<T>(o.y),
                  GroupNormApply{o.x, o.gamma, o.beta, o.ss, o.mean, o.rstd, o.y, o.silu, o.xbias, o.xemb},
                  x2, C1, dptr<T>(o.xcat));
    });
  });
}

void gn_apply(const GroupNormApply& o, CudaCtx& ctx) {
  const Dims d = dims(o.x, o.mean);
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    with_width<T>(wide_ok<T>(d.C, {o.x.data, o.y.data}), [&](auto vtag) {
      apply<T, decltype(vtag)::value>(ctx, d, dptr<T>(o.x), dptr<T>(o.y), o);
    });
  });
}

void gn_bwd(const GroupNormBwd& o, CudaCtx& ctx) {
  const Dims d = dims(o.x, o.mean);
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *x = dptr<T>(o.x), *dy = dptr<T>(o.dy);
    const int C1 = split_at(o);
    with_width<T>(bwd_wide<T>(o), [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      const Plan p = plan(bwd_sums_kernel<T, V>, d.B, d.R, d.C, V, kU2, max_splits(d), 0, kSumsWaveDiv<V>);
      const float *gamma = dptr<float>(o.gamma), *beta = dptr<float>(o.beta), *ss = dptr<float>(o.ss),
                  *mean = dptr<float>(o.mean), *rstd = dptr<float>(o.rstd), *xbias = dptr<float>(o.xbias),
                  *xemb = dptr<float>(o.xemb);
      float2* coef = coef_buf(ctx, d);
      // dgamma / dbeta: added by the dx pass's extra block when there is a dx pass
      const bool later = o.dx.defined();
      float *dgamma = dptr<float>(o.dgamma), *dbeta = dptr<float>(o.dbeta);
      bwd_sums_kernel<T, V><<<p.grid(), p.nt, 0, ctx.stream>>>(
          x, dy, gamma, beta, ss, mean, rstd, xbias, xemb, d.R, d.C, d.G, p.Cl, p.L, p.rps, o.silu,
          reinterpret_cast<float2*>(ctx.partial()), sums_of(ctx), coef, ctx.tickets, later ? nullptr : dgamma,
          later ? nullptr : dbeta, dptr<float>(o.dss));
      KERNEL_CHECK();
      if (!later) return;
      const auto dx_pass = [&](auto sums_tag) {
        constexpr bool SUMS = decltype(sums_tag)::value;
        constexpr auto k = dx_kernel<T, V, SUMS>;
        const size_t sm = ring_smem<kRingDx<V>, k>(o.add.defined() ? 3 : 2);
        // with SUMS the dx kernel's partials reuse bwd_sums's room (those were consumed)
        const Plan q = plan(k, d.B, d.R, d.C, V, kU2, SUMS ? max_splits(d) : 1 << 20, sm);
        dim3 grid = q.grid();
        if (dgamma || dbeta) grid.y += 1;
        k<<<grid, q.nt, sm, ctx.stream>>>(
            x, dy, dptr<T>(o.dx), dptr<T>(o.dx2), C1, dptr<T>(o.add), dptr<T>(o.add2), gamma, beta, ss, mean,
            rstd, xbias, xemb, coef, d.R, d.C, d.G, q.Cl, q.L, q.rps, o.silu,
            reinterpret_cast<float2*>(ctx.partial()), dx_sums_of(ctx, d), ctx.tickets, dptr<float>(o.dx_sums),
            dptr<float>(o.dx_total), dptr<float>(o.add_total), d.B, sums_of(ctx), dgamma, dbeta);
        KERNEL_CHECK();
      };
      with_flag(o.dx_sums.defined() || o.dx_total.defined() || o.add_total.defined(), dx_pass);
    });
  });
}

// The kernels with rings within the device's shared-memory opt-in limit (f32 apply's ring is 64
// KB; bf16 dx's 48 KB beside 20 KB of static reduction room).
bool rings_fit() {
  static const size_t most =
      std::max({kernel_smem(apply_kernel<float, 4, true>, Ring<kRingApply<4>>::bytes(kThreads, 1)),
                kernel_smem(apply_kernel<bf16, 8, true>, Ring<kRingApply<8>>::bytes(kThreads, 1)),
                kernel_smem(dx_kernel<bf16, 8, true>, Ring<kRingDx<8>>::bytes(kThreads, 3)),
                kernel_smem(dx_kernel<bf16, 8, false>, Ring<kRingDx<8>>::bytes(kThreads, 3))});
  return device_smem_fits(most);
}
bool fwd_ok(const GroupNormFwd& o, const CudaCtx&) {
  return (!o.y.defined() || (o.y.dtype == o.x.dtype && rings_fit())) &&
         (!o.xcat.defined() || o.y.defined()) && fits(dims(o.whole(), o.mean));
}
bool apply_ok(const GroupNormApply& o, const CudaCtx&) {
  return o.y.dtype == o.x.dtype && dims(o.x, o.mean).B < 65536 && rings_fit();
}
bool bwd_ok(const GroupNormBwd& o, const CudaCtx&) {
  return rings_fit() && o.dy.dtype == o.x.dtype && (!o.dx.defined() || o.dx.dtype == o.x.dtype) &&
         (!o.dx2.defined() || o.dx2.dtype == o.x.dtype) && (!o.add2.defined() || o.add2.dtype == o.x.dtype) &&
         (!o.add.defined() || o.add.dtype == o.x.dtype) && fits(dims(o.x, o.mean));
}


// ---- variant "smem": small maps, one block per (sample, chunk of whole groups) ----
// Measured with "fused" on the H100 (seed64, bf16): a forward at 8x8 or 16x16 costs ~10 us
// whatever its size, the latency chain of its cross-block reduction (partials, ticket, finishing
// block) and a second launch. Here a block takes sample b, channels [c0, c0 + Cb) (Cb = C / k,
// k dividing G, so whole groups) and every row, into shared memory (at most 48 KB), and the
// statistics become block-local:
//   forward   one launch: load, two passes over shared memory (mean, then squared deviations:
//             exact, no shift needed), apply, store;
//   backward  one launch: load x and dy, per-channel sums, group coefficients, dss, dx; the last
//             block (ticket) adds dgamma/dbeta over the batch.
// Row chunks of at least 32 bytes keep the loads sector-efficient. Every sum has a fixed order.
// Measured and not kept (H100, seed64 batch 32, same runs, 2026-11-25): the maps too large for a
// block split over a thread-block cluster (K = 2..8 blocks holding R / K rows each, the channel
// sums meeting in distributed shared memory), so x and dy are read once: with 32-byte row chunks
// and 48 KB slices, tf32 step 12.97 / 13.02 -> 13.74 / 13.73 ms, bf16 7.87 / 7.88 -> 8.42 / 8.42; with
// 64- to 256-byte chunks and 96 KB slices, 64x64 maps only: tf32 13.36 / 13.38, bf16 8.90 / 8.91
// (sampling's forward at batch 64: tf32 7.81 -> 7.79, bf16 4.57 -> 5.76). The phases of a block
// (load, sums, cluster barriers, apply) do not overlap, where "fused"'s passes stream. Again
// without shared-memory slices (2026-11-25): the forward in one launch, a sample's <= 8 blocks a
// cluster streaming their rows as fwd_sums_kernel, the statistics met in distributed shared
// memory, then apply_kernel's loop over the rows each block had just read (from L2): tf32 step
// +0.03-0.05 ms, bf16 7.64 -> 7.71, sampling's forward at batch 64 tf32 7.58 -> 7.68 (same runs).

constexpr size_t kSmemBytes = 48 << 10;  // the default dynamic shared memory limit
__host__ __device__ inline size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Shared memory: ninputs slices [R][Cb] of T, then per channel float4 cf (m, a, bb, r), float2 cq
// (dx coefficients; the forward keeps the group mean in .x), double2 csum, then double2 part
// [max(nt, Cb)], double2 gst [gb].
struct SmemLayout {
  size_t slice, cf, cq, csum, part, gst, bytes;
};
__host__ __device__ inline SmemLayout smem_layout(int R, int Cb, int gb, int nt, int ninputs, int es) {
  SmemLayout l;
  l.slice = (size_t)R * Cb * es;
  size_t o = ninputs * ((l.slice + 15) / 16 * 16);
  l.cf = o, o += (size_t)Cb * 16;
  l.cq = o, o += ((size_t)Cb * 8 + 15) / 16 * 16;
  l.csum = o, o += (size_t)Cb * 16;
  l.part = o, o += (size_t)(nt > Cb ? nt : Cb) * 16;
  l.gst = o, o += (size_t)gb * 16;
  l.bytes = o;
  return l;
}

// Per-channel sums over the R rows of the block's slice: f(r, cl) -> float2, f32 within a lane
// (lanes = threads per channel, rows strided by the lane count), lanes added in order in double.
template <class F>
__device__ __forceinline__ void channel_sums(int R, int Cb, double2* part, double2* out, F f) {
  const int t = threadIdx.x, nt = blockDim.x;
  const int tpc = Cb >= nt ? 1 : nt / Cb;
  for (int c0 = 0; c0 < Cb; c0 += nt) {  // Cb > nt: rounds of one lane per channel
    const int cl = tpc == 1 ? c0 + t : t % Cb, l = tpc == 1 ? 0 : t / Cb;
    if (cl < Cb && l < tpc) {
      float ax = 0.f, ay = 0.f;
      for (int r = l; r < R; r += tpc) {
        const float2 v = f(r, cl);
        ax += v.x, ay += v.y;
      }
      part[l * Cb + cl] = make_double2(ax, ay);
    }
  }
  __syncthreads();
  for (int cl = t; cl < Cb; cl += nt) {
    double2 a = part[cl];
    for (int l = 1; l < tpc; ++l) a.x += part[l * Cb + cl].x, a.y += part[l * Cb + cl].y;
    out[cl] = a;
  }
  __syncthreads();
}

// Starts copying the [R][Cb] slice at channel c0 of sample b (rows of C) into shared memory, V at
// a time: 16-byte asynchronous copies (cp.async), all in flight at once (measured: copies through
// registers, one round trip per vector, made the load the block's longest phase); slices_ready()
// waits for this thread's, and a __syncthreads() after it for everyone's.
template <class T, int V>
__device__ __forceinline__ void load_slice(const T* __restrict__ g, T* s, int b, int R, int C, int c0, int Cb) {
  const int t = threadIdx.x, nt = blockDim.x, Cbv = Cb / V;
  const int Cl = Cbv < nt ? Cbv : nt, L = nt / Cl;
  const T* gb = g + (size_t)b * R * C + c0;
  if (t < Cl * L)
    for (int j = t % Cl; j < Cbv; j += Cl)
      for (int r = t / Cl; r < R; r += L) {
        if constexpr (V == 1)
          s[r * Cb + j] = gb[(size_t)r * C + j];
        else
          __pipeline_memcpy_async(s + r * Cb + j * V, gb + (size_t)r * C + j * V, 16);
      }
}
__device__ __forceinline__ void slices_ready() {
  __pipeline_commit();
  __pipeline_wait_prior(0);
}

// f(r, j) for every V-vector (row r, vector j) of the slice, each once.
template <class T, int V, class F>
__device__ __forceinline__ void each_vector(int R, int Cb, F f) {
  const int t = threadIdx.x, nt = blockDim.x, Cbv = Cb / V;
  const int Cl = Cbv < nt ? Cbv : nt, L = nt / Cl;
  if (t < Cl * L)
    for (int j = t % Cl; j < Cbv; j += Cl)
      for (int r = t / Cl; r < R; r += L) f(r, j);
}

template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    smem_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ gamma,
                    const float* __restrict__ beta, const float* __restrict__ ss, float* __restrict__ mean,
                    float* __restrict__ rstd, const float* __restrict__ xbias, const float* __restrict__ xemb, int R,
                    int C, int G, int Cb, bool silu) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem[];
  const int t = threadIdx.x, nt = blockDim.x, b = blockIdx.y, c0 = blockIdx.x * Cb;
  const int Cg = C / G, gb = Cb / Cg, g0 = c0 / Cg;
  const SmemLayout lay = smem_layout(R, Cb, gb, nt, 1, (int)sizeof(T));
  T* sx = reinterpret_cast<T*>(smem);
  float4* cf = reinterpret_cast<float4*>(smem + lay.cf);
  double2* csum = reinterpret_cast<double2*>(smem + lay.csum);
  double2* part = reinterpret_cast<double2*>(smem + lay.part);
  double2* gst = reinterpret_cast<double2*>(smem + lay.gst);  // (mean, rstd) per group
  float2* cm = reinterpret_cast<float2*>(smem + lay.cq);       // the channel's group mean (.x)
  load_slice<T, V>(x, sx, b, R, C, c0, Cb);
  slices_ready();
  __syncthreads();
  const double n = (double)R * Cg;
  channel_sums(R, Cb, part, csum, [&](int r, int cl) { return make_float2(ldf(sx, (size_t)r * Cb + cl), 0.f); });
  for (int q = t; q < gb; q += nt) {  // the offset adds R * offset to each channel's sum
    double s = 0;
    for (int cl = q * Cg; cl < (q + 1) * Cg; ++cl) s += csum[cl].x + (double)R * xoff(xbias, xemb, b, c0 + cl, C);
    gst[q].x = s / n;
  }
  __syncthreads();
  for (int cl = t; cl < Cb; cl += nt) cm[cl].x = (float)(gst[cl / Cg].x - (double)xoff(xbias, xemb, b, c0 + cl, C));
  __syncthreads();
  channel_sums(R, Cb, part, csum, [&](int r, int cl) {
    const float d = ldf(sx, (size_t)r * Cb + cl) - cm[cl].x;
    return make_float2(d * d, 0.f);
  });
  for (int q = t; q < gb; q += nt) {
    double s = 0;
    for (int cl = q * Cg; cl < (q + 1) * Cg; ++cl) s += csum[cl].x;
    const float m = (float)gst[q].x, r = (float)(1.0 / sqrt(s / n + kEps));
    mean[b * G + g0 + q] = m, rstd[b * G + g0 + q] = r;
    gst[q].y = r;
  }
  __syncthreads();
  for (int cl = t; cl < Cb; cl += nt) {
    const double2 q = gst[cl / Cg];
    const Coef k = coef_from((float)q.x, (float)q.y, gamma, beta, ss, b, c0 + cl, C, xoff(xbias, xemb, b, c0 + cl, C));
    cf[cl] = make_float4(k.m, k.a, k.bb, k.r);
  }
  __syncthreads();
  T* yb = y + (size_t)b * R * C + c0;
  each_vector<T, V>(R, Cb, [&](int r, int j) {
    float v[V];
    Vec<T, V>::load(sx + r * Cb + j * V, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float4 q = cf[j * V + k];
      const float z = fmaf(v[k] - q.x, q.y, q.z);
      v[k] = silu ? silu_fast(z) : z;
    }
    Vec<T, V>::store(yb + (size_t)r * C + j * V, v);
  });
}

template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    smem_bwd_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, T* __restrict__ dx2, int C1,
                    const T* __restrict__ add, const T* __restrict__ add2,
                    const float* __restrict__ gamma, const float* __restrict__ beta, const float* __restrict__ ss,
                    const float* __restrict__ mean, const float* __restrict__ rstd, const float* __restrict__ xbias,
                    const float* __restrict__ xemb, int R, int C, int G, int Cb, bool silu, double2* sums, unsigned* tickets, float* dgamma, float* dbeta, float* dss,
                    double2* col, float* dx_sums, float* dx_total, float* add_total) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem[];
  const int t = threadIdx.x, nt = blockDim.x, b = blockIdx.y, B = gridDim.y, c0 = blockIdx.x * Cb;
  const int Cg = C / G, gb = Cb / Cg;
  const SmemLayout lay = smem_layout(R, Cb, gb, nt, 2, (int)sizeof(T));
  T* sx = reinterpret_cast<T*>(smem);
  T* sg = reinterpret_cast<T*>(smem + align16(lay.slice));
  float4* cf = reinterpret_cast<float4*>(smem + lay.cf);
  float2* cq = reinterpret_cast<float2*>(smem + lay.cq);
  double2* csum = reinterpret_cast<double2*>(smem + lay.csum);
  double2* part = reinterpret_cast<double2*>(smem + lay.part);
  load_slice<T, V>(x, sx, b, R, C, c0, Cb);
  load_slice<T, V>(dy, sg, b, R, C, c0, Cb);
  for (int cl = t; cl < Cb; cl += nt) {  // while the copies fly
    const Coef k = coef_of(gamma, beta, ss, mean, rstd, xbias, xemb, b, c0 + cl, C, G);
    cf[cl] = make_float4(k.m, k.a, k.bb, k.r);
  }
  slices_ready();
  __syncthreads();
  // (dz xhat, dz) per channel
  channel_sums(R, Cb, part, csum, [&](int r, int cl) {
    const float4 k = cf[cl];
    const float d = ldf(sx, (size_t)r * Cb + cl) - k.x;
    float dz = ldf(sg, (size_t)r * Cb + cl);
    if (silu) dz *= silu_grad_fast(fmaf(d, k.y, k.z));
    return make_float2(dz * (d * k.w), dz);
  });
  auto f = [&](int bi, int c) { return ss ? 1.0 + (double)ss[(size_t)bi * 2 * C + c] : 1.0; };
  for (int cl = t; cl < Cb; cl += nt) {
    const int c = c0 + cl;
    const double2 q = csum[cl];
    sums[(size_t)b * C + c] = q;
    if (dss) {
      dss[(size_t)b * 2 * C + c] = (float)(gamma[c] * q.x + beta[c] * q.y);
      dss[(size_t)b * 2 * C + C + c] = (float)q.y;
    }
  }
  const double n = (double)R * Cg;
  for (int cl = t; cl < Cb; cl += nt) {  // the group's coefficients, per channel
    const int q0 = cl / Cg * Cg;
    double kx = 0, ky = 0;
    for (int k = q0; k < q0 + Cg; ++k) {
      const double w = f(b, c0 + k) * gamma[c0 + k];
      kx += w * csum[k].y, ky += w * csum[k].x;
    }
    const float r = cf[cl].w, fkx = (float)(kx / n), fky = (float)(ky / n);
    cq[cl] = make_float2(-r * r * fky, -r * fkx);
  }
  __syncthreads();
  if (dx) {
    each_vector<T, V>(R, Cb, [&](int r, int j) {
      float xv[V], gv[V];
      Vec<T, V>::load(sx + r * Cb + j * V, xv);
      Vec<T, V>::load(sg + r * Cb + j * V, gv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float4 q = cf[j * V + k];
        const float2 e = cq[j * V + k];
        const float d = xv[k] - q.x;
        float dz = gv[k];
        if (silu) dz *= silu_grad_fast(fmaf(d, q.y, q.z));
        gv[k] = fmaf(dz, q.y, fmaf(d, e.x, e.y));
      }
      if (add) {
        Vec<T, V>::load(add + (size_t)b * R * C + c0 + (size_t)r * C + j * V, xv);
#pragma unroll
        for (int k = 0; k < V; ++k) gv[k] += xv[k];
      }
      if (add2) {
        Vec<T, V>::load(add2 + (size_t)b * R * C + c0 + (size_t)r * C + j * V, xv);
#pragma unroll
        for (int k = 0; k < V; ++k) gv[k] += xv[k];
      }
      Vec<T, V>::store(dx_at(dx, dx2, C1, C, R, b, r, c0 + j * V), gv);
      Vec<T, V>::store(sg + r * Cb + j * V, gv);  // dx as stored, for its column sums
    });
  }
  const bool totals = dx_total || add_total;
  if (dx && (dx_sums || totals)) {  // per-channel sums of dx (in sg now) and of add, block-local
    __syncthreads();
    const T* ab = add ? add + (size_t)b * R * C + c0 : nullptr;
    channel_sums(R, Cb, part, csum, [&](int r, int cl) {
      return make_float2(ldf(sg, (size_t)r * Cb + cl), ab ? ldf(ab, (size_t)r * C + cl) : 0.f);
    });
    for (int cl = t; cl < Cb; cl += nt) {
      const int c = c0 + cl;
      if (dx_sums) dx_sums[(size_t)b * C + c] = (float)csum[cl].x;
      col[(size_t)b * C + c] = csum[cl];
    }
  }
  if (!dgamma && !dbeta && !totals) return;
  if (!last_block(tickets, gridDim.x * gridDim.y)) return;
  if (totals)
    finish_columns(
        B, C, part, [&](int c, int i0, int i1) { return sum_run(col + (size_t)i0 * C + c, i1 - i0, (size_t)C); },
        [&](int c, double2 v) {
          if (dx_total) dx_total[c] = (float)v.x;
          if (add_total) add_total[c] = (float)v.y;
        });
  if (dgamma || dbeta) param_grads(sums, ss, B, C, part, dgamma, dbeta);
  if (t == 0) tickets[0] = 0;
}

// The chunking: the most chunks (blocks) whose rows are still >= 32 bytes, if the slices fit; with
// 16-byte-aligned pointers, the most whose chunk width is a multiple of the 16-byte vector, or none
// ("fused" then takes the shape). Measured on the H100 (seed64, bf16, batch 32): the concatenated
// widths 320 and 448 (groups of 10 and 14 channels) took 16 and 32 chunks of 20 and 14 channels
// one channel at a time, 204 us of kernels in 7 launches (32x32x320 forward 56.9 us); this way
// the step went 8.950 / 8.958 / 8.949 -> 8.925 / 8.923 / 8.926 ms (same run, 2026-11-24).
struct SmemPlan {
  int k = 0, Cb = 0, V = 1;
  size_t bytes = 0;
};
template <class T>
SmemPlan smem_plan(const Dims& d, int ninputs, bool wide_ptrs) {
  if (d.B < 1 || d.B >= 65536 || d.G < 1 || d.C % d.G) return {};
  const int Cg = d.C / d.G;
  for (int k = d.G; k >= 1; --k) {
    if (d.G % k) continue;
    const int Cb = d.C / k;
    if (k > 1 && Cb * (int)sizeof(T) < 32) continue;
    SmemPlan p;
    p.k = k, p.Cb = Cb;
    p.bytes = smem_layout(d.R, Cb, Cb / Cg, kThreads, ninputs, (int)sizeof(T)).bytes;
    if (p.bytes > kSmemBytes) return {};  // fewer chunks only grow the slices
    if (wide_ptrs && Cb % kWide<T>) continue;
    p.V = wide_ptrs ? kWide<T> : 1;
    return p;
  }
  return {};
}

bool smem_fits(const Dims& d, DType t, int ninputs, bool wide_ptrs) {
  const bool bf = t == DType::BF16;
  return (bf ? smem_plan<bf16>(d, ninputs, wide_ptrs) : smem_plan<float>(d, ninputs, wide_ptrs)).k > 0;
}
// The 16-byte path's condition for the op's tensors, as the launch decides it.
bool smem_wide(DType t, int C, std::initializer_list<const void*> ptrs) {
  return t == DType::BF16 ? wide_ok<bf16>(C, ptrs) : wide_ok<float>(C, ptrs);
}

void smem_fwd(const GroupNormFwd& o, CudaCtx& ctx) {
  const Dims d = dims(o.x, o.mean);
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    SmemPlan sp = smem_plan<T>(d, 1, wide_ok<T>(d.C, {o.x.data, o.y.data}));
    if (!sp.k) sp = smem_plan<T>(d, 1, false);  // chosen for another op of this shape (the choice is per shape)
    with_width<T>(sp.V != 1, [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      smem_fwd_kernel<T, V><<<dim3(sp.k, d.B), kThreads, sp.bytes, ctx.stream>>>(
          dptr<T>(o.x), dptr<T>(o.y), dptr<float>(o.gamma), dptr<float>(o.beta), dptr<float>(o.ss),
          dptr<float>(o.mean), dptr<float>(o.rstd), dptr<float>(o.xbias), dptr<float>(o.xemb), d.R, d.C, d.G, sp.Cb,
          o.silu);
      KERNEL_CHECK();
    });
  });
}

void smem_bwd(const GroupNormBwd& o, CudaCtx& ctx) {
  const Dims d = dims(o.x, o.mean);
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int C1 = split_at(o);
    SmemPlan sp = smem_plan<T>(d, 2, bwd_wide<T>(o));
    if (!sp.k) sp = smem_plan<T>(d, 2, false);
    with_width<T>(sp.V != 1, [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      smem_bwd_kernel<T, V><<<dim3(sp.k, d.B), kThreads, sp.bytes, ctx.stream>>>(
          dptr<T>(o.x), dptr<T>(o.dy), dptr<T>(o.dx), dptr<T>(o.dx2), C1, dptr<T>(o.add), dptr<T>(o.add2),
          dptr<float>(o.gamma),
          dptr<float>(o.beta),
          dptr<float>(o.ss), dptr<float>(o.mean), dptr<float>(o.rstd), dptr<float>(o.xbias), dptr<float>(o.xemb), d.R,
          d.C, d.G, sp.Cb, o.silu, sums_of(ctx),
          ctx.tickets, dptr<float>(o.dgamma), dptr<float>(o.dbeta), dptr<float>(o.dss),
          sums_of(ctx) + (size_t)d.B * d.C, dptr<float>(o.dx_sums), dptr<float>(o.dx_total),
          dptr<float>(o.add_total));
      KERNEL_CHECK();
    });
  });
}

// bf16 only: with f32 activations a slice holds half as many channels per row, and on the H100 the
// tf32 step measured 22.10 ms with "smem" against 21.98 ms with "fused" alone (bf16: 13.92 against
// 14.09, 2026-11-23); again with the column sums in both: 17.44-17.49 ms against 17.34 (17.41 with
// "smem" for the backward only); again at 12.84 ms (2026-11-25, same runs): 12.94 / 12.95 with
// "smem" for the f32 forwards, 12.91 / 12.93 for the backwards, 13.00 / 13.03 for both (sampling's
// forward 7.70 -> 8.00 ms): a block's serial row loops over a slice of 48 KB of f32 take longer
// than the two-launch passes. The f32 kernels pass the op tests (each time, without this
// restriction).
bool smem_fwd_ok(const GroupNormFwd& o, const CudaCtx&) {
  const Dims d = dims(o.x, o.mean);
  return o.x.dtype == DType::BF16 && o.y.defined() && o.y.dtype == o.x.dtype && !o.x2.defined() &&
         smem_fits(d, o.x.dtype, 1, smem_wide(o.x.dtype, d.C, {o.x.data, o.y.data}));
}
bool smem_bwd_ok(const GroupNormBwd& o, const CudaCtx&) {
  const Dims d = dims(o.x, o.mean);
  return o.x.dtype == DType::BF16 && o.dy.dtype == o.x.dtype && (!o.dx.defined() || o.dx.dtype == o.x.dtype) &&
         (!o.dx2.defined() || o.dx2.dtype == o.x.dtype) && (!o.add2.defined() || o.add2.dtype == o.x.dtype) &&
         (!o.add.defined() || o.add.dtype == o.x.dtype) && fits(d) &&  // (fits: sums, then col)
         smem_fits(d, o.x.dtype, 2, bwd_wide<bf16>(o));
}

}  // namespace

bool groupnorm_stats_fit(const Tensor& x, const Tensor& mean) { return fits(dims(x, mean)); }
void groupnorm_stats(CudaCtx& ctx, const Tensor& x, const Tensor& mean, const Tensor& rstd) {
  const Dims d = dims(x, mean);
  with_act(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    with_width<T>(wide_ok<T>(d.C, {x.data}), [&](auto vtag) {
      stats<T, decltype(vtag)::value>(ctx, d, dptr<T>(x), mean, rstd);
    });
  });
}

// "smem" first (the small maps it fits), then "fused" (any size); GroupNormApply is one pass either
// way, so "smem" runs "fused"'s there (every variant name covers every op of the family).
void register_groupnorm_fused(CudaOps& ops) {
  ops.variants<GroupNormFwd>().push_back({"smem", smem_fwd_ok, smem_fwd, nullptr});
  ops.variants<GroupNormApply>().push_back({"smem", apply_ok, gn_apply, nullptr});
  ops.variants<GroupNormBwd>().push_back({"smem", smem_bwd_ok, smem_bwd, nullptr});
  ops.variants<GroupNormFwd>().push_back({"fused", fwd_ok, gn_fwd, nullptr});
  ops.variants<GroupNormApply>().push_back({"fused", apply_ok, gn_apply, nullptr});
  ops.variants<GroupNormBwd>().push_back({"fused", bwd_ok, gn_bwd, nullptr});
}

}  // namespace unet
