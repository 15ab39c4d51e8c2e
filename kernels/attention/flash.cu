// Attention variant "flash": FlashAttention-2 (Dao, 2023) on mma.sync tensor-core tiles. The
// [T, T] scores never leave the chip:
//  * forward: one block per (b, head, 64 or 128 query rows). Each warp keeps 16 query rows of Q as
//    mma fragments in registers; K and V stream through shared memory in blocks of keys (cp.async,
//    double-buffered); S = Q K^T, an online softmax (running max and sum per row) and O += P V stay
//    in registers. Writes out and lse (the natural log-sum-exp of the scaled logits).
//  * backward: blocks that each own what they write —
//    one per key block computes dK, dV over all query blocks, one per query block computes dQ over
//    all key blocks, both kinds in one launch (flash_bwd_kernel; as two kernels one after the other
//    the seed64 tf32 step took 12.69-12.70 ms against 12.65, bf16 7.79-7.81 against 7.78, H100,
//    same runs) — so no block accumulates into another's output: no atomics, bitwise
//    reproducible. Both recompute P = exp(S - lse) and dP = dO V^T (seven GEMM-shaped products per
//    tile pair instead of FA2's five with atomic dQ). Each block computes D = rowsum(dO * O) of
//    the query rows it reads as their tiles land (dsum_rows; it was a kernel of its own). No
//    workspace.
// Arithmetic: bf16 tensors use m16n8k16 bf16 mma with f32 accumulation (P and dS rounded to bf16
// for their product, as FA2 does); f32 tensors use m16n8k8 tf32 mma — in tf32 mode on operands
// rounded once to tf32 (in shared memory, as each tile lands), in fp32 mode as 3xTF32
// (a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi with a = a_hi + a_lo), which keeps fp32's accuracy.
// The softmax runs in base 2 (exp2 of logits pre-multiplied by log2 e / sqrt(d)).
// Shapes: head width 32, 64 or 128 (fp32 mode's backward: 32, 64), any T (partial blocks masked);
// the rest runs "cublas". Speed and accuracy: README (Speed), tests/test_attention.cpp.
//
// Fragment layouts (PTX ISA, mma.m16n8k8 / m16n8k16; g = lane / 4, t = lane % 4): an f32
// accumulator tile of 16 x 8 holds (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) in c0..c3. For
// tf32 the k index of a step is permuted so that every operand read is a pair of adjacent
// elements: hardware k = t stands for column 2t and k = t + 4 for column 2t + 1, in A and in B
// alike (a sum over k does not care about its order). With that, an S accumulator tile is
// directly the A fragment of P V (a0..a3 = c0, c2, c1, c3), and for bf16 two adjacent tiles are
// (packed pairs), so P never goes through shared memory.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cuda_engine.cuh"
#include "mma_sync.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// ---- PTX wrappers --------------------------------------------------------------------------

// 16 bytes global -> shared, asynchronously; src_bytes = 0 writes zeros (rows past T).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lower k) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- warp-level tiles: one policy per storage type / mode ------------------------------------
// Shared-memory tiles are row-major with a padded leading dimension LD (elements). Operands:
//  load_a      A (16 rows x KS) of X[row][k]                 (Q, K, V, dO as the left factor)
//  load_b_nk2  B (KS x 16: two n-tiles of 8) of X[n][k]       (K or Q as the right factor of X Y^T)
//  load_b_kn2  B (KS x 16) of X[k][n]                         (V, dO, Q, K as the right factor of P Y)
//  a_from_acc  A (16 x KS) from accumulator tiles             (P or dS, columns kk*KS ..)
// Paddings avoid bank conflicts: bf16 rows of 2 (D + 8) bytes put ldmatrix's 8 row addresses in
// distinct 16-byte bank groups; f32 rows of D + 8 floats spread the paired (8-byte) reads of
// lanes (g, t) over all banks; D + 4 does the same for the column reads of load_b_kn2 (used where
// a tile is read only that way; elsewhere they see a 2-way conflict).

template <class T, bool kSplit>
struct Tile;

// f32 storage, tf32 mma (kSplit: 3xTF32 on raw f32 operands).
template <bool kSplit_>
struct Tile<float, kSplit_> {
  static constexpr int KS = 8, kPad = 8, kPadKN = 4;
  static constexpr bool kSplit = kSplit_;
  static constexpr bool kRoundTiles = !kSplit;  // tf32: tiles rounded once in shared memory
  __device__ static uint32_t op(float x) { return kSplit ? __float_as_uint(x) : tf32_bits(x); }

  __device__ static void load_a(uint32_t (&a)[4], const float* X, int ld, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const float2 u = *reinterpret_cast<const float2*>(X + g * ld + 2 * t);
    const float2 v = *reinterpret_cast<const float2*>(X + (g + 8) * ld + 2 * t);
    a[0] = __float_as_uint(u.x), a[1] = __float_as_uint(v.x), a[2] = __float_as_uint(u.y),
    a[3] = __float_as_uint(v.y);
  }
  // A from global memory rows r0 (row g) and r1 (row g + 8); nullptr = a row past T (zeros).
  __device__ static void load_a_gmem(uint32_t (&a)[4], const float* r0, const float* r1, int k0, int lane) {
    const int t = lane & 3;
    const float2 u = r0 ? *reinterpret_cast<const float2*>(r0 + k0 + 2 * t) : make_float2(0.f, 0.f);
    const float2 v = r1 ? *reinterpret_cast<const float2*>(r1 + k0 + 2 * t) : make_float2(0.f, 0.f);
    a[0] = op(u.x), a[1] = op(v.x), a[2] = op(u.y), a[3] = op(v.y);
  }
  __device__ static void load_b_nk2(uint32_t (&b)[2][2], const float* X, int ld, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const float2 u = *reinterpret_cast<const float2*>(X + g * ld + 2 * t);
    const float2 v = *reinterpret_cast<const float2*>(X + (g + 8) * ld + 2 * t);
    b[0][0] = __float_as_uint(u.x), b[0][1] = __float_as_uint(u.y);
    b[1][0] = __float_as_uint(v.x), b[1][1] = __float_as_uint(v.y);
  }
  __device__ static void load_b_kn2(uint32_t (&b)[2][2], const float* X, int ld, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const float* p = X + 2 * t * ld + g;
    b[0][0] = __float_as_uint(p[0]), b[0][1] = __float_as_uint(p[ld]);
    b[1][0] = __float_as_uint(p[8]), b[1][1] = __float_as_uint(p[ld + 8]);
  }
  template <int N>
  __device__ static void a_from_acc(uint32_t (&a)[4], const float (&c)[N][4], int kk) {
    a[0] = op(c[kk][0]), a[1] = op(c[kk][2]), a[2] = op(c[kk][1]), a[3] = op(c[kk][3]);
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    if constexpr (!kSplit) {
      mma_tf32(c, a, b);
    } else {
      uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float x = __uint_as_float(a[i]);
        ah[i] = tf32_bits(x), al[i] = tf32_bits(x - __uint_as_float(ah[i]));
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float x = __uint_as_float(b[i]);
        bh[i] = tf32_bits(x), bl[i] = tf32_bits(x - __uint_as_float(bh[i]));
      }
      // Into a fresh accumulator, small terms first, then one IEEE add per element: the tensor
      // cores' accumulation truncates, and chained along a whole key loop (T / 8 steps) that cost
      // ~T/16 ulp (8e-6 relative at T = 1024, measured); per step it is a rounding of 8 products.
      float t[4] = {0.f, 0.f, 0.f, 0.f};
      mma_tf32(t, al, bh);
      mma_tf32(t, ah, bl);
      mma_tf32(t, ah, bh);
      c[0] += t[0], c[1] += t[1], c[2] += t[2], c[3] += t[3];
    }
  }
};

// bf16 storage, bf16 mma; shared-memory operands through ldmatrix.
template <>
struct Tile<bf16, false> {
  static constexpr int KS = 16, kPad = 8, kPadKN = 8;
  static constexpr bool kRoundTiles = false;

  __device__ static void load_a(uint32_t (&a)[4], const bf16* X, int ld, int lane) {
    ldsm_x4(smem_u32(X + (lane & 15) * ld + (lane >> 4) * 8), a);
  }
  __device__ static void load_a_gmem(uint32_t (&a)[4], const bf16* r0, const bf16* r1, int k0, int lane) {
    const int t = lane & 3;
    auto at = [](const bf16* r, int k) { return r ? *reinterpret_cast<const uint32_t*>(r + k) : 0u; };
    a[0] = at(r0, k0 + 2 * t), a[1] = at(r1, k0 + 2 * t), a[2] = at(r0, k0 + 2 * t + 8),
    a[3] = at(r1, k0 + 2 * t + 8);
  }
  __device__ static void load_b_nk2(uint32_t (&b)[2][2], const bf16* X, int ld, int lane) {
    uint32_t r[4];
    ldsm_x4(smem_u32(X + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8), r);
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
  }
  __device__ static void load_b_kn2(uint32_t (&b)[2][2], const bf16* X, int ld, int lane) {
    uint32_t r[4];
    ldsm_x4_t(smem_u32(X + (lane & 15) * ld + (lane >> 4) * 8), r);
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
  }
  template <int N>
  __device__ static void a_from_acc(uint32_t (&a)[4], const float (&c)[N][4], int kk) {
    a[0] = pack_bf16(c[2 * kk][0], c[2 * kk][1]), a[1] = pack_bf16(c[2 * kk][2], c[2 * kk][3]);
    a[2] = pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]),
    a[3] = pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_bf16(c, a, b);
  }
};

// ---- tiles global -> shared ------------------------------------------------------------------

// Rows [r0, r0 + ROWS) of a [*, D] slice (row stride ld elements) into dst[ROWS][LD]; rows at or
// past rmax are zero-filled. Each thread copies 16-byte chunks c = tid, tid + NT, ...
template <int ROWS, int D, int LD, int NT, class T>
__device__ __forceinline__ void cp_tile(T* dst, const T* src, size_t ld, int r0, int rmax, int tid) {
  constexpr int E = 16 / sizeof(T), CPR = D / E;
  static_assert(ROWS * CPR % NT == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < ROWS * CPR / NT; ++i) {
    const int c = tid + i * NT, r = c / CPR, k = (c % CPR) * E;
    const bool ok = r0 + r < rmax;
    cp_async16(dst + r * LD + k, src + (ok ? (size_t)(r0 + r) * ld + k : 0), ok ? 16 : 0);
  }
}
// tf32 mode: rounds the chunks this thread copied (after its cp.async group completed).
template <int ROWS, int D, int LD, int NT, class T>
__device__ __forceinline__ void round_tile(T* dst, int tid) {
  if constexpr (sizeof(T) == 4) {
    constexpr int CPR = D / 4;
#pragma unroll
    for (int i = 0; i < ROWS * CPR / NT; ++i) {
      const int c = tid + i * NT;
      float4* p = reinterpret_cast<float4*>(dst + (c / CPR) * LD + (c % CPR) * 4);
      float4 v = *p;
      v.x = __uint_as_float(tf32_bits(v.x)), v.y = __uint_as_float(tf32_bits(v.y));
      v.z = __uint_as_float(tf32_bits(v.z)), v.w = __uint_as_float(tf32_bits(v.w));
      *p = v;
    }
  }
}

__device__ __forceinline__ void st2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void st2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// acc (16 x 8 ND) += A Y: A from accumulator tiles a (16 x 8 NK: P or dS), Y [8 NK][LD] in shared
// memory; the MT form below with one tile.
template <class M, int LD, int MT, int NK, int ND, class T>
__device__ __forceinline__ void add_product(float (&acc)[MT][ND][4], const float (&a)[MT][NK][4], const T* Y,
                                            int lane);
template <class M, int LD, int NK, int ND, class T>
__device__ __forceinline__ void add_product(float (&acc)[ND][4], const float (&a)[NK][4], const T* Y,
                                            int lane) {
  add_product<M, LD>(reinterpret_cast<float(&)[1][ND][4]>(acc), reinterpret_cast<const float(&)[1][NK][4]>(a),
                     Y, lane);
}

// acc[m] += A[m] Y for the warp's MT row tiles m, each fragment of Y loaded once for all of them.
template <class M, int LD, int MT, int NK, int ND, class T>
__device__ __forceinline__ void add_product(float (&acc)[MT][ND][4], const float (&a)[MT][NK][4], const T* Y,
                                            int lane) {
#pragma unroll
  for (int kk = 0; kk < NK * 8 / M::KS; ++kk) {
    uint32_t pa[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) M::a_from_acc(pa[m], a[m], kk);
#pragma unroll
    for (int n = 0; n < ND; n += 2) {
      uint32_t bb[2][2];
      M::load_b_kn2(bb, Y + kk * M::KS * LD + n * 8, LD, lane);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        M::mma(acc[m][n], pa[m], bb[0]);
        M::mma(acc[m][n + 1], pa[m], bb[1]);
      }
    }
  }
}

// One step of a loop over tiles i = 0 .. n-1 whose tile 0 is already in flight. Two stages: issue
// tile i + 1 into the other stage, wait for tile i. One stage (where two would not leave room for
// two blocks per SM): issue tile i (i > 0; the loop's closing barrier freed the stage), wait for it.
template <int S, class F>
__device__ __forceinline__ int pipe_step(int i, int n, F&& load) {
  if constexpr (S == 2) {
    if (i + 1 < n) {
      load(i + 1, (i + 1) & 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    return i & 1;
  } else {
    if (i > 0) load(i, 0);
    cp_wait<0>();
    return 0;
  }
}

// Dsum = rowsum(dO * O) over a head's D channels, for the rows of a tile whose dO this thread
// copies with cp_tile<ROWS, D, LD, NT> (the same chunk mapping): once the tile landed, the
// thread's O chunks come from global memory, its dO chunks from shared memory (before round_tile
// rounds them), and the CPR consecutive lanes of a row add up their partial dot products. It was
// a kernel of its own before the backward (11 launches, 77 us of a seed64 tf32 step on the main
// lane; H200, same runs, three rounds, CUDA events: bf16 step 6.927 / 6.931 / 6.922 -> 6.883 /
// 6.906 / 6.898 ms, tf32 10.900 / 10.888 / 10.904 -> 10.917 / 10.898 / 10.904: the backward kernel
// takes ~0.06 ms longer, about what the separate kernel took). Measured and not kept: O's loads
// issued before the tile's wait (registers held across it: tf32 step 10.960 / 10.956), O copied
// into shared memory beside dO (tf32 10.903 / 10.907 / 10.899, bf16 6.903 / 6.910 / 6.905).
template <int ROWS, int D, int LD, int NT, class T>
__device__ __forceinline__ void dsum_rows(float* dst, const T* sdO, const T* out, size_t ld, int r0, int rmax,
                                          int tid) {
  constexpr int E = 16 / sizeof(T), CPR = D / E;
  static_assert(32 % CPR == 0 && NT % CPR == 0, "a row's chunks in consecutive lanes of one warp");
#pragma unroll
  for (int i = 0; i < ROWS * CPR / NT; ++i) {
    const int c = tid + i * NT, r = c / CPR, k = (c % CPR) * E;
    float o[E], d[E], v = 0.f;
    rowblock::Vec<T, E>::load(sdO + r * LD + k, d);
    if (r0 + r < rmax) {  // (rows past T: Dsum 0)
      rowblock::Vec<T, E>::load(out + (size_t)(r0 + r) * ld + k, o);
#pragma unroll
      for (int e = 0; e < E; ++e) v += o[e] * d[e];
    }
#pragma unroll
    for (int s = CPR / 2; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
    if (c % CPR == 0) dst[r] = v;
  }
}

struct Heads {
  int q, k, v;  // channel offsets of head h's q, k, v inside a qkv row of 3C
};
__device__ __forceinline__ Heads heads_at(int h, int C, int D, bool legacy) {
  if (legacy) return {3 * h * D, 3 * h * D + D, 3 * h * D + 2 * D};
  return {h * D, C + h * D, 2 * C + h * D};
}

constexpr int kWarps = 4, kThr = kWarps * 32, kRowsPerBlock = kWarps * 16;
// Resident blocks an SM that the kernels' registers must allow (__launch_bounds__; 0: no bound).
// Head width 32 (seed64's) in tf32 and bf16: 4, at most 128 registers a thread. Unbounded, ptxas
// took 131 (tf32 forward), 158 / 162 (backward, tf32 / bf16): 3 blocks an SM, where 4 fit in
// shared memory; bounded, no spills but the tf32 backward's 96 bytes. H200, seed64, same run, CUDA
// events of graph replays (2026-11-28): the flash kernels' sums 9% lower in sampling's forward
// (0.283 -> 0.259 ms at batch 64) and the bf16 backward; sampling's forward 6.493 / 6.487 ->
// 6.463 / 6.462 ms, bf16 step 7.081 / 7.066 -> 7.044 / 7.043, tf32 step 11.206 / 11.193 -> 11.187 /
// 11.190. Wider heads would spill (tf32 forward at 64: 108 bytes, backward 876), and fp32's 3xTF32
// more.
template <int D, bool kSplit>
constexpr int kMinBlocks = D == 32 && !kSplit ? 4 : 0;
// MT: the forward's row tiles of 16 a warp (Kernels::kMT). At 2 each shared-memory fragment of K
// and V feeds two mma's, halving the shared-memory reads per product; 3 blocks an SM (ptxas: 162
// registers, no spills).
template <int D, bool kSplit, int MT>
constexpr int kMinBlocksMT = MT == 1              ? kMinBlocks<D, kSplit>
                             : D == 32 && !kSplit ? 3
                                                  : 0;

// ---- forward ---------------------------------------------------------------------------------
// grid (ceil(T / (64 MT)), B * heads); 4 warps x MT x 16 query rows (Kernels::kMT).
// sl2 = log2(e) / sqrt(D).
template <class T, int D, bool kSplit, int BC, int MT = 1>
__global__ void __launch_bounds__(kThr, kMinBlocksMT<D, kSplit, MT>)
    flash_fwd_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse, int T_, int C,
                     int heads, bool legacy, float sl2) {
  pdl_entry();
  constexpr int kRows = kRowsPerBlock * MT;
  using M = Tile<T, kSplit>;
  constexpr int KS = M::KS, LDK = D + M::kPad, LDV = D + M::kPadKN;
  extern __shared__ float4 smem_f4[];
  T* sK = reinterpret_cast<T*>(smem_f4);  // [2][BC][LDK]
  T* sV = sK + 2 * BC * LDK;              // [2][BC][LDV]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const size_t ld = 3 * (size_t)C;
  const Heads off = heads_at(h, C, D, legacy);
  const T* base = qkv + (size_t)b * T_ * ld;
  const int rw = blockIdx.x * kRows + warp * 16 * MT;  // this warp's first query row

  auto load_kv = [&](int j, int st) {
    cp_tile<BC, D, LDK, kThr>(sK + st * BC * LDK, base + off.k, ld, j * BC, T_, tid);
    cp_tile<BC, D, LDV, kThr>(sV + st * BC * LDV, base + off.v, ld, j * BC, T_, tid);
    cp_commit();
  };
  load_kv(0, 0);  // in flight while Q is read

  uint32_t qa[MT][D / KS][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const int r = rw + 16 * m + g;
    const T* r0 = r < T_ ? base + (size_t)r * ld + off.q : nullptr;
    const T* r1 = r + 8 < T_ ? base + (size_t)(r + 8) * ld + off.q : nullptr;
#pragma unroll
    for (int ks = 0; ks < D / KS; ++ks) M::load_a_gmem(qa[m][ks], r0, r1, ks * KS, lane);
  }

  float o[MT][D / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.f;
  float mrow[MT][2], lrow[MT][2];  // rows g, g + 8 of each tile (lrow: lane partial sums)
#pragma unroll
  for (int m = 0; m < MT; ++m) mrow[m][0] = mrow[m][1] = -INFINITY, lrow[m][0] = lrow[m][1] = 0.f;

  const int nkb = (T_ + BC - 1) / BC;
  for (int j = 0; j < nkb; ++j) {
    const int st = pipe_step<2>(j, nkb, load_kv);
    if (M::kRoundTiles) {
      round_tile<BC, D, LDK, kThr>(sK + st * BC * LDK, tid);
      round_tile<BC, D, LDV, kThr>(sV + st * BC * LDV, tid);
    }
    __syncthreads();
    const T* K = sK + st * BC * LDK;
    const T* V = sV + st * BC * LDV;

    float s[MT][BC / 8][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / KS; ++ks)
#pragma unroll
      for (int n = 0; n < BC / 8; n += 2) {
        uint32_t bb[2][2];
        M::load_b_nk2(bb, K + n * 8 * LDK + ks * KS, LDK, lane);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          M::mma(s[m][n], qa[m][ks], bb[0]);
          M::mma(s[m][n + 1], qa[m][ks], bb[1]);
        }
      }

    // Online softmax. This lane holds columns n*8 + 2*t4 + e of rows g (r = 0) and g + 8 (r = 1)
    // of each tile; the four lanes of a quad hold a whole row.
    const int kvalid = T_ - j * BC;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = mrow[m][r];
#pragma unroll
        for (int n = 0; n < BC / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = n * 8 + 2 * t4 + e < kvalid ? s[m][n][2 * r + e] * sl2 : -INFINITY;
            s[m][n][2 * r + e] = x;
            mx = fmaxf(mx, x);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float alpha = exp2f(mrow[m][r] - mx);  // 0 on the first block (mrow = -inf; mx is finite)
        mrow[m][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < BC / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = exp2f(s[m][n][2 * r + e] - mx);
            s[m][n][2 * r + e] = p;
            sum += p;
          }
        lrow[m][r] = lrow[m][r] * alpha + sum;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) o[m][n][2 * r] *= alpha, o[m][n][2 * r + 1] *= alpha;
      }

    add_product<M, LDV>(o, s, V, lane);  // O += P V
    __syncthreads();                     // the stage is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = lrow[m][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = rw + 16 * m + g + 8 * r;
      if (row >= T_) continue;
      const float inv = 1.f / l;
      T* po = out + ((size_t)b * T_ + row) * C + h * D + 2 * t4;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) st2(po + n * 8, o[m][n][2 * r] * inv, o[m][n][2 * r + 1] * inv);
      if (t4 == 0) lse[(size_t)bh * T_ + row] = (mrow[m][r] + log2f(l)) * kLn2;
    }
}

// ---- backward --------------------------------------------------------------------------------

// dK, dV of 64 keys (4 warps x 16) over every query block of BR rows. The warp's S^T (keys x
// queries) = K_w Q^T, P^T = exp2(S^T sl2 - lse2[query]), dP^T = V_w dO^T, dV += P^T dO,
// dS^T = P^T (dP^T - Dsum[query]), dK += dS^T Q (scaled by 1/sqrt(D) at the end).
template <class T, int D, bool kSplit, int BR, int S>
__device__ __forceinline__ void bwd_dkdv(const T* __restrict__ qkv, const T* __restrict__ dout,
                                         const float* __restrict__ lse, const T* __restrict__ out,
                                         T* __restrict__ dqkv, int T_, int C, int heads, bool legacy,
                                         float sl2, float scale) {
  using M = Tile<T, kSplit>;
  constexpr int KS = M::KS, BK = kRowsPerBlock, LD = D + M::kPad;
  extern __shared__ float4 smem_f4[];
  T* sK = reinterpret_cast<T*>(smem_f4);                   // [BK][LD]
  T* sV = sK + BK * LD;                                    // [BK][LD]
  T* sQ = sV + BK * LD;                                    // [S][BR][LD]
  T* sO = sQ + S * BR * LD;                                // [S][BR][LD] (dO)
  float* sL = reinterpret_cast<float*>(sO + S * BR * LD);  // [S][BR] lse * log2(e)
  float* sD = sL + S * BR;                                 // [S][BR] Dsum
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const size_t ld = 3 * (size_t)C;
  const Heads off = heads_at(h, C, D, legacy);
  const T* base = qkv + (size_t)b * T_ * ld;
  const T* dbase = dout + (size_t)b * T_ * C + h * D;
  const T* obase = out + (size_t)b * T_ * C + h * D;
  const float* lrow = lse + (size_t)bh * T_;
  const int k0 = blockIdx.x * BK;

  auto load_q = [&](int i, int st) {
    cp_tile<BR, D, LD, kThr>(sQ + st * BR * LD, base + off.q, ld, i * BR, T_, tid);
    cp_tile<BR, D, LD, kThr>(sO + st * BR * LD, dbase, C, i * BR, T_, tid);
    for (int r = tid; r < BR; r += kThr) {
      const int q = i * BR + r;
      // queries past T: lse = +inf makes their P exactly 0 (and their Dsum is 0)
      sL[st * BR + r] = q < T_ ? lrow[q] * kLog2e : INFINITY;
    }
    cp_commit();
  };
  cp_tile<BK, D, LD, kThr>(sK, base + off.k, ld, k0, T_, tid);
  cp_tile<BK, D, LD, kThr>(sV, base + off.v, ld, k0, T_, tid);
  load_q(0, 0);  // one group with K and V

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[n][i] = dv[n][i] = 0.f;
  const int kvalid = T_ - (k0 + warp * 16);  // this warp's rows g (+8) exist iff g (+8) < kvalid
  const T* Kw = sK + warp * 16 * LD;
  const T* Vw = sV + warp * 16 * LD;

  const int nqb = (T_ + BR - 1) / BR;
  for (int i = 0; i < nqb; ++i) {
    const int st = pipe_step<S>(i, nqb, load_q);
    dsum_rows<BR, D, LD, kThr>(sD + st * BR, sO + st * BR * LD, obase, C, i * BR, T_, tid);
    if (M::kRoundTiles) {
      if (i == 0) {
        round_tile<BK, D, LD, kThr>(sK, tid);
        round_tile<BK, D, LD, kThr>(sV, tid);
      }
      round_tile<BR, D, LD, kThr>(sQ + st * BR * LD, tid);
      round_tile<BR, D, LD, kThr>(sO + st * BR * LD, tid);
    }
    __syncthreads();
    const T* Q = sQ + st * BR * LD;
    const T* dO = sO + st * BR * LD;
    const float* L = sL + st * BR;
    const float* Dq = sD + st * BR;

    float s[BR / 8][4], dp[BR / 8][4];
#pragma unroll
    for (int n = 0; n < BR / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / KS; ++ks) {
      uint32_t ka[4], va[4];
      M::load_a(ka, Kw + ks * KS, LD, lane);
      M::load_a(va, Vw + ks * KS, LD, lane);
#pragma unroll
      for (int n = 0; n < BR / 8; n += 2) {
        uint32_t bq[2][2], bo[2][2];
        M::load_b_nk2(bq, Q + n * 8 * LD + ks * KS, LD, lane);
        M::load_b_nk2(bo, dO + n * 8 * LD + ks * KS, LD, lane);
        M::mma(s[n], ka, bq[0]);
        M::mma(s[n + 1], ka, bq[1]);
        M::mma(dp[n], va, bo[0]);
        M::mma(dp[n + 1], va, bo[1]);
      }
    }
    // P^T (keys past T: 0, so nothing of theirs is ever non-finite), then dS^T in dp
#pragma unroll
    for (int n = 0; n < BR / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + 2 * t4 + (e & 1), row = g + 8 * (e >> 1);
        const float p = row < kvalid ? exp2f(s[n][e] * sl2 - L[col]) : 0.f;
        s[n][e] = p;
        dp[n][e] = p * (dp[n][e] - Dq[col]);
      }
    add_product<M, LD>(dv, s, dO, lane);  // dV += P^T dO
    add_product<M, LD>(dk, dp, Q, lane);  // dK += dS^T Q
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (g + 8 * r >= kvalid) continue;
    T* row = dqkv + ((size_t)b * T_ + k0 + warp * 16 + g + 8 * r) * ld + 2 * t4;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      st2(row + off.k + n * 8, dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale);
      st2(row + off.v + n * 8, dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
}

// dQ of 64 query rows (4 warps x 16) over every key block of BC keys: S = Q_w K^T,
// P = exp2(S sl2 - lse2), dP = dO_w V^T, dS = P (dP - Dsum), dQ += dS K (scaled at the end).
template <class T, int D, bool kSplit, int BC, int S>
__device__ __forceinline__ void bwd_dq(const T* __restrict__ qkv, const T* __restrict__ dout,
                                       const float* __restrict__ lse, const T* __restrict__ out,
                                       T* __restrict__ dqkv, int T_, int C, int heads, bool legacy, float sl2,
                                       float scale) {
  using M = Tile<T, kSplit>;
  constexpr int KS = M::KS, BQ = kRowsPerBlock, LD = D + M::kPad;
  extern __shared__ float4 smem_f4[];
  T* sQ = reinterpret_cast<T*>(smem_f4);  // [BQ][LD]
  T* sO = sQ + BQ * LD;                   // [BQ][LD] (dO)
  T* sK = sO + BQ * LD;                   // [S][BC][LD]
  T* sV = sK + S * BC * LD;               // [S][BC][LD]
  float* sDq = reinterpret_cast<float*>(sV + S * BC * LD);  // [BQ] Dsum
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const size_t ld = 3 * (size_t)C;
  const Heads off = heads_at(h, C, D, legacy);
  const T* base = qkv + (size_t)b * T_ * ld;
  const int q0 = blockIdx.x * BQ, rw = q0 + warp * 16;

  auto load_kv = [&](int j, int st) {
    cp_tile<BC, D, LD, kThr>(sK + st * BC * LD, base + off.k, ld, j * BC, T_, tid);
    cp_tile<BC, D, LD, kThr>(sV + st * BC * LD, base + off.v, ld, j * BC, T_, tid);
    cp_commit();
  };
  cp_tile<BQ, D, LD, kThr>(sQ, base + off.q, ld, q0, T_, tid);
  cp_tile<BQ, D, LD, kThr>(sO, dout + (size_t)b * T_ * C + h * D, C, q0, T_, tid);
  load_kv(0, 0);  // one group with Q and dO

  // rows past T: lse2 = 0 and Dsum = 0 keep their (discarded) values finite
  float l2[2], dq_[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = rw + g + 8 * r;
    l2[r] = row < T_ ? lse[(size_t)bh * T_ + row] * kLog2e : 0.f;
  }
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  const T* Qw = sQ + warp * 16 * LD;
  const T* Ow = sO + warp * 16 * LD;

  const int nkb = (T_ + BC - 1) / BC;
  for (int j = 0; j < nkb; ++j) {
    const int st = pipe_step<S>(j, nkb, load_kv);
    if (j == 0)  // (read after the barrier below)
      dsum_rows<BQ, D, LD, kThr>(sDq, sO, out + (size_t)b * T_ * C + h * D, C, q0, T_, tid);
    if (M::kRoundTiles) {
      if (j == 0) {
        round_tile<BQ, D, LD, kThr>(sQ, tid);
        round_tile<BQ, D, LD, kThr>(sO, tid);
      }
      round_tile<BC, D, LD, kThr>(sK + st * BC * LD, tid);
      round_tile<BC, D, LD, kThr>(sV + st * BC * LD, tid);
    }
    __syncthreads();
    const T* K = sK + st * BC * LD;
    const T* V = sV + st * BC * LD;
    if (j == 0) dq_[0] = sDq[warp * 16 + g], dq_[1] = sDq[warp * 16 + g + 8];

    float s[BC / 8][4], dp[BC / 8][4];
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / KS; ++ks) {
      uint32_t qa[4], oa[4];
      M::load_a(qa, Qw + ks * KS, LD, lane);
      M::load_a(oa, Ow + ks * KS, LD, lane);
#pragma unroll
      for (int n = 0; n < BC / 8; n += 2) {
        uint32_t bk[2][2], bv[2][2];
        M::load_b_nk2(bk, K + n * 8 * LD + ks * KS, LD, lane);
        M::load_b_nk2(bv, V + n * 8 * LD + ks * KS, LD, lane);
        M::mma(s[n], qa, bk[0]);
        M::mma(s[n + 1], qa, bk[1]);
        M::mma(dp[n], oa, bv[0]);
        M::mma(dp[n + 1], oa, bv[1]);
      }
    }
    const int kvalid = T_ - j * BC;
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const float p = n * 8 + 2 * t4 + (e & 1) < kvalid ? exp2f(s[n][e] * sl2 - l2[r]) : 0.f;
        dp[n][e] = p * (dp[n][e] - dq_[r]);
      }
    add_product<M, LD>(dq, dp, K, lane);  // dQ += dS K
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = rw + g + 8 * r;
    if (row >= T_) continue;
    T* p = dqkv + ((size_t)b * T_ + row) * ld + off.q + 2 * t4;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) st2(p + n * 8, dq[n][2 * r] * scale, dq[n][2 * r + 1] * scale);
  }
}

// ---- host side -------------------------------------------------------------------------------

// Key block of the forward and dQ kernels, query block of the dK/dV kernel: 64, or 32 where the
// accumulators of 64 would not fit registers (D = 128: f32 everywhere, bf16 in dK/dV; the forward
// at MT = 2).
template <class T, int D, int MT = 1>
constexpr int kBlockN = (D == 128 && sizeof(T) == 4) || MT == 2 ? 32 : 64;
template <class T, int D>
constexpr int kBlockDkdv = D == 128 ? 32 : 64;
// Pipeline stages of the backward kernels' streamed tiles: 2 for bf16; 1 for f32, whose tiles are
// twice the bytes: one stage leaves shared memory for 3 blocks per SM at D = 64 (2 with two
// stages) and 2 at D = 128 (1). Measured on the H100, tf32 backward at T = 1024 (B 8, C 512):
// D = 64 0.62 ms with one stage vs 0.71 with two, D = 128 0.69 vs 1.03; seed64's d = 32 shapes equal.
template <class T, int D>
constexpr int kStagesBwd = sizeof(T) == 4 ? 1 : 2;

template <class T, int D, bool kSplit, int MT = 1>
constexpr size_t fwd_smem() {
  using M = Tile<T, kSplit>;
  return (size_t)2 * kBlockN<T, D, MT> * (2 * D + M::kPad + M::kPadKN) * sizeof(T);
}
template <class T, int D, bool kSplit, int S>
constexpr size_t dkdv_smem() {
  constexpr int LD = D + Tile<T, kSplit>::kPad, BR = kBlockDkdv<T, D>;
  return ((size_t)2 * kRowsPerBlock * LD + (size_t)2 * S * BR * LD) * sizeof(T) +
         (size_t)2 * S * BR * sizeof(float);
}
template <class T, int D, bool kSplit, int S>
constexpr size_t dq_smem() {
  constexpr int LD = D + Tile<T, kSplit>::kPad, BC = kBlockN<T, D>;
  return ((size_t)2 * kRowsPerBlock * LD + (size_t)2 * S * BC * LD) * sizeof(T) +
         kRowsPerBlock * sizeof(float);
}

struct Geo {
  int B, T, C, heads, d;
  bool bf;
};
Geo geo(const Tensor& qkv, const Tensor& out, const Tensor& lse) {
  Geo g;
  g.B = (int)qkv.dim[0], g.T = (int)(qkv.dim[1] * qkv.dim[2]), g.C = (int)out.dim[3],
  g.heads = (int)lse.dim[1];
  g.d = g.C / g.heads;
  g.bf = qkv.dtype == DType::BF16;
  return g;
}

// The backward's dK/dV blocks (blockIdx.z 0) and dQ blocks (1) as one launch: at seed64's 16x16
// and 8x8 levels each pass alone left the GPU partly idle and the two waited on each other.
template <class T, int D, bool kSplit, int BR, int BC, int S>
__global__ void __launch_bounds__(kThr, kMinBlocks<D, kSplit>)
    flash_bwd_kernel(const T* __restrict__ qkv, const T* __restrict__ dout, const float* __restrict__ lse,
                     const T* __restrict__ out, T* __restrict__ dqkv, int T_, int C, int heads, bool legacy,
                     float sl2, float scale) {
  pdl_entry();
  if (blockIdx.z == 0)
    bwd_dkdv<T, D, kSplit, BR, S>(qkv, dout, lse, out, dqkv, T_, C, heads, legacy, sl2, scale);
  else
    bwd_dq<T, D, kSplit, BC, S>(qkv, dout, lse, out, dqkv, T_, C, heads, legacy, sl2, scale);
}

template <class T, int D, bool kSplit>
struct Kernels {
  static constexpr int BN = kBlockN<T, D>, S = kStagesBwd<T, D>;
  // fp32 mode (3xTF32, register-starved) at D = 128 runs its backward slower than "cublas"
  // (measured 2.02 ms vs 1.63 at T = 1024, B 8, C 512): left to it.
  static constexpr bool kBwd = !(kSplit && D == 128);
  // The forward's row tiles of 16 a warp (4 warps a block) where T fills a block (T >= 128): 2 in
  // tf32 at head width 32, where the kernel reads its K and V fragments from shared memory twice
  // as often as it issues mma's with one tile; 1 elsewhere. Before it, 8 warps of one tile (each
  // block rounds every K and V tile it loads, and 8 warps shared that: 43.4 -> 39.9 us against 4
  // warps, H200, the 16x16 level at batch 64). H200, seed64's 16x16 attention (C 192, 6 heads),
  // one launch, same run: batch 32 21.1 -> 19.4 us, batch 64 39.9 -> 36.7; sampling's forward
  // (tf32, batch 64, CUDA events of graph replays, two rounds) 6.232 / 6.229 -> 6.213 / 6.212 ms;
  // the tf32 step unchanged (10.959 / 10.959 -> 10.968 / 10.973). The backward with 2 tiles a warp
  // (query / key blocks of 32 to fit registers) measured no faster (70.1 vs 70.4 us at batch 32,
  // 133.0 vs 137.3 at 64; with two pipeline stages 69.3 / 134.4), so it keeps one.
  static constexpr int kMT = D == 32 && !kSplit && sizeof(T) == 4 ? 2 : 1;
  // Once per device (at plan time, before any graph capture; again harmlessly at the first launch).
  static void prepare() {
    static bool done[64] = {};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 64 && done[dev]) return;
    allow_dynamic_smem(flash_fwd_kernel<T, D, kSplit, BN>, fwd_smem<T, D, kSplit>());
    if constexpr (kMT != 1)
      allow_dynamic_smem(flash_fwd_kernel<T, D, kSplit, kBlockN<T, D, kMT>, kMT>,
                         fwd_smem<T, D, kSplit, kMT>());
    if constexpr (kBwd) {
      constexpr int BR = kBlockDkdv<T, D>;
      allow_dynamic_smem(flash_bwd_kernel<T, D, kSplit, BR, BN, S>, bwd_smem());
    }
    if (dev < 64) done[dev] = true;
  }
  static constexpr size_t bwd_smem() {
    return std::max(dkdv_smem<T, D, kSplit, S>(), dq_smem<T, D, kSplit, S>());
  }
  static bool fits(bool bwd) {
    if (bwd && !kBwd) return false;
    const size_t m = bwd ? bwd_smem() : std::max(fwd_smem<T, D, kSplit>(), fwd_smem<T, D, kSplit, kMT>());
    return device_smem_fits(m);
  }
  static void fwd(const AttentionFwd& o, CudaCtx& ctx, const Geo& g) {
    prepare();
    auto go = [&](auto mt) {
      constexpr int MT = decltype(mt)::value, rows = kWarps * 16 * MT;
      const dim3 grid((g.T + rows - 1) / rows, g.B * g.heads);
      flash_fwd_kernel<T, D, kSplit, kBlockN<T, D, MT>, MT>
          <<<grid, kThr, fwd_smem<T, D, kSplit, MT>(), ctx.stream>>>(
              dptr<T>(o.qkv), dptr<T>(o.out), dptr<float>(o.lse), g.T, g.C, g.heads, o.legacy,
              (float)(kLog2e / std::sqrt((double)D)));
    };
    if (kMT != 1 && g.T >= kWarps * 16 * kMT)
      go(std::integral_constant<int, kMT>{});
    else
      go(std::integral_constant<int, 1>{});
    KERNEL_CHECK();
  }
  static void bwd(const AttentionBwd& o, CudaCtx& ctx, const Geo& g) {
    if constexpr (!kBwd) {
      throw std::logic_error("attention flash: no backward for this head width in fp32");
    } else {
      constexpr int BR = kBlockDkdv<T, D>;
      prepare();
      const float sl2 = (float)(kLog2e / std::sqrt((double)D)), scale = (float)(1.0 / std::sqrt((double)D));
      const dim3 grid((g.T + kRowsPerBlock - 1) / kRowsPerBlock, g.B * g.heads, 2);
      flash_bwd_kernel<T, D, kSplit, BR, BN, S><<<grid, kThr, bwd_smem(), ctx.stream>>>(
          dptr<T>(o.qkv), dptr<T>(o.dout), dptr<float>(o.lse), dptr<T>(o.out), dptr<T>(o.dqkv), g.T, g.C,
          g.heads, o.legacy, sl2, scale);
      KERNEL_CHECK();
    }
  }
};

// Calls f(Kernels<T, D, split>{}) for the op's storage type, head width and precision.
template <class F>
bool dispatch(const Geo& g, Precision prec, F&& f) {
  auto by_d = [&](auto tag, auto split) {
    using T = decltype(tag);
    constexpr bool S = decltype(split)::value;
    switch (g.d) {
      case 32:
        f(Kernels<T, 32, S>{});
        return true;
      case 64:
        f(Kernels<T, 64, S>{});
        return true;
      case 128:
        f(Kernels<T, 128, S>{});
        return true;
      default:
        return false;
    }
  };
  if (g.bf) return by_d(bf16{}, std::false_type{});
  if (prec == Precision::FP32) return by_d(float{}, std::true_type{});
  return by_d(float{}, std::false_type{});
}

bool supported(const Geo& g, const CudaCtx& ctx, bool bwd, std::initializer_list<const void*> ptrs) {
  if (g.heads < 1 || g.C % g.heads || g.T < 1 || g.B < 1) return false;
  if ((size_t)g.B * g.heads > 65535) return false;  // grid.y
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;  // 16-byte tile copies
  bool fits = false;
  if (!dispatch(g, ctx.prec, [&](auto k) { fits = decltype(k)::fits(bwd); })) return false;
  return fits;
}

bool fwd_ok(const AttentionFwd& o, const CudaCtx& ctx) {
  return supported(geo(o.qkv, o.out, o.lse), ctx, false, {o.qkv.data, o.out.data});
}
bool bwd_ok(const AttentionBwd& o, const CudaCtx& ctx) {
  return supported(geo(o.qkv, o.out, o.lse), ctx, true, {o.qkv.data, o.out.data, o.dout.data, o.dqkv.data});
}

void run_fwd(const AttentionFwd& o, CudaCtx& ctx) {
  const Geo g = geo(o.qkv, o.out, o.lse);
  dispatch(g, ctx.prec, [&](auto k) { decltype(k)::fwd(o, ctx, g); });
}
void run_bwd(const AttentionBwd& o, CudaCtx& ctx) {
  const Geo g = geo(o.qkv, o.out, o.lse);
  dispatch(g, ctx.prec, [&](auto k) { decltype(k)::bwd(o, ctx, g); });
}

// No workspace (the backward's blocks compute the Dsum of their query rows themselves). Asked at
// plan time, so the shared-memory opt-in happens before any graph capture.
size_t fwd_ws(const AttentionFwd& o, const CudaCtx& ctx) {
  dispatch(geo(o.qkv, o.out, o.lse), ctx.prec, [&](auto k) { decltype(k)::prepare(); });
  return 0;
}
size_t bwd_ws(const AttentionBwd& o, const CudaCtx& ctx) {
  const Geo g = geo(o.qkv, o.out, o.lse);
  dispatch(g, ctx.prec, [&](auto k) { decltype(k)::prepare(); });
  return 0;
}

}  // namespace

void register_attention_flash(CudaOps& ops) {
  ops.variants<AttentionFwd>().push_back({"flash", fwd_ok, run_fwd, fwd_ws});
  ops.variants<AttentionBwd>().push_back({"flash", bwd_ok, run_bwd, bwd_ws});
}

}  // namespace unet
