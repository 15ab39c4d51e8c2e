// Convolution variants "wgmma" and "wgmma_tap": tf32 and bf16 stride-1 convolutions as implicit GEMMs
// on Hopper's warpgroup tensor-core instructions (wgmma), fed by the tensor memory accelerator (TMA),
// the path cuDNN's own sm90 kernels take. They can apply a GroupNorm + SiLU to the input tiles in
// shared memory (ConvFwd's / ConvBwdFilter's norm, tf32: the halo forward and the filter gradient),
// which cuDNN cannot; measured slower than the separate pass so far (UNET_FUSE_NORM, blocks.h).
// The 3x3 filter gradient ("wgmma" of ConvBwdFilter: filter_kernel in tf32, filter16_kernel in
// bf16, below) is the default on Hopper: tf32 step 14.28 -> 12.87 ms, bf16 7.92 -> 7.81 against
// cuDNN 9.19's (H100, same runs); so is "wgmma_t" (halo_t_kernel: tf32 forwards and data gradients
// at width 64 with at most 64 outputs, the output channels as the GEMM's M).
//
//  * A block computes 128 output pixels x BN output channels with 2 consumer warpgroups (64 pixel
//    rows each, m64nBNk8 tf32 / k16 bf16, f32 accumulators in registers) and 1 producer warp whose
//    first thread issues the TMA copies.
//  * K = (tap, input channel) in blocks of one 128-byte row of the swizzle that the copies write and
//    the wgmma descriptors read (32 channels of f32, 64 of bf16). The copy engine fills with zeros
//    whatever lies outside the image (the padding) or past the last channel.
//  * "wgmma" (halo_kernel; 3x3 at width 64): each K block of the input tile (2 image rows) is loaded
//    once with its halo and read at 9 shifted starts (below); "wgmma_tap" (fwd_kernel; 3x3 and 1x1
//    at any width whose rows or images tile 128 pixels): one copy per tap of the pixel box moved by
//    (ky - 1, kx - 1). The data gradient is "wgmma" on dy with the rotated filter.
//  * The filter's tiles are 2-D boxes of [Co, KS*KS*Ci]; shared-memory stages have a "full"
//    mbarrier (the copy's bytes arrived) and an "empty" one (both warpgroups' wgmma's that read it
//    finished).
//  * The epilogue stages the sums through shared memory and adds bias, embedding and residual in
//    that order (the other variants' order) in f32, in 16-byte vectors, rounding bf16 once.
// Deterministic: every output's K sum is one thread's, in K order, whatever the GPU. tf32 operands
// are rounded to nearest first (round_tf32), as cuDNN's tf32 kernels do.
//
// The "wgmma" / "wgmma_tap" forwards and data gradient only when forced (registered last; "wgmma_t"
// below is not, and with at most 64 outputs is faster than both): with tf32 rounded as
// cuDNN rounds, the width-64 forwards are at par with cuDNN 9.19 (H100, batch 32, one launch with
// the filter's rounding: 64 -> 64 0.058 vs
// 0.059 ms, 128 -> 64 0.095 vs 0.100, 192 -> 64 0.134 vs 0.144; tf32 step 14.28 / 14.30 / 14.26
// -> 14.33 / 14.31 / 14.29 ms with them, sampling's forward at batch 64 7.735 -> 7.713); bf16's
// are faster alone (0.032 vs 0.035 ms at 64 -> 64) but not in the model (sampling 4.499 -> 4.540);
// the data gradient is faster alone (64 -> 64 backward 0.186 -> 0.161 ms, before tf32 rounding) but
// two blocks per SM on every SM left the side lane's filter gradients no room beside it in the
// step; the per-tap kernel is at best at par (32x32) and slower at 16x16 and 8x8 (no split K).
// Built for sm_90a only (CMakeLists.txt: wgmma is arch-specific); the variants decline every op on
// other GPUs.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>

#include "cuda_engine.cuh"
#include "gn_coef.cuh"
#include "implicit_gemm.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

using namespace igemm;

constexpr int BM = 128, THREADS = 288;  // 2 consumer warpgroups, then 1 producer warp
// A K block is one 128-byte row of the swizzle: 32 channels of f32 (tf32), 64 of bf16; its 4
// wgmma k-steps (k8 tf32, k16 bf16) are 32 bytes each either way.
constexpr int ROW = 128;
template <class T>
constexpr int kBK = ROW / (int)sizeof(T);

__device__ __forceinline__ uint32_t saddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// TMA tile loads into shared memory, completing on mbarrier `bar`.
__device__ __forceinline__ void tma4(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                     int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma2(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
// Shared-memory matrix descriptor of a K-major tile of 128-byte rows with the 128-byte swizzle:
// 8-row groups 1024 bytes apart (the stride byte offset); the leading byte offset is unused then.
// sbo: the stride between groups of 8 rows (MN-major operands: between groups of 8 K rows); 1024,
// the swizzle's period, for rows packed one after the other.
__device__ __forceinline__ uint64_t sdesc(uint32_t addr, uint32_t sbo = 1024) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(sbo >> 4) << 32 | (uint64_t)1 << 62;
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// tf32: the tensor cores read an f32 operand's top 19 bits (truncation, which shrinks every product
// by 2^-11 on average per operand: a conv's outputs came out ~1e-3 small, relative error 7.7e-4
// against cuDNN's 2.9e-4); cuDNN and PyTorch round to nearest. The filter is rounded as it is copied
// into the workspace (round_kernel, flip_kernel<true>); the input tile in shared memory by the
// consumer warpgroup about to read it (cvt.rna), overlapped with its previous wgmma's: the halo
// kernel once per 32-channel block (its 3 padded rows; rounding rows the other warpgroup also
// rounds gives the same bits, so every read sees the rounded tile whichever writes last), the
// per-tap kernel per tap. Then the proxy fence (generic writes -> the wgmma's async-proxy reads)
// and the warpgroup's own named barrier (id 2 + g). (Rounding the filter's tiles there too, per
// tap, cost 0.053 -> 0.079 ms at 64 -> 64.)
template <class T>
__device__ __forceinline__ void round_tf32(uint32_t addr, int bytes, int t) {
  if constexpr (sizeof(T) == 4) {
    for (int i = t * 16; i < bytes; i += 128 * 16) {
      uint32_t v[4];
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                   : "r"(addr + i));
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = __float_as_uint(tf32_rna(__uint_as_float(v[e])));
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr + i), "r"(v[0]), "r"(v[1]), "r"(v[2]),
                   "r"(v[3])
                   : "memory");
    }
  }
}
template <class T>
__device__ __forceinline__ void rounded(int g) {
  if constexpr (sizeof(T) == 4) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + g) : "memory");
  }
}

// D[64 x N] += A[64 x k] B[N x k]^T (k = 8 tf32 / 16 bf16), operands from shared memory, f32 D in
// registers. Inline PTX takes no operand list of a length given by a template parameter, so the
// accumulators' operands (N / 2 of them, numbered from %0) are spelled by the macros below: WG_R<g>
// names operands 8 g .. 8 g + 7 in the instruction's text, WG_ACC<n>(d) binds d[0 .. n - 1]; the
// descriptors and the scale-d flag follow them.
#define WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define WG_R1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define WG_R2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define WG_R3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define WG_R4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define WG_R5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define WG_R6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define WG_R7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define WG_R8 "%64, %65, %66, %67, %68, %69, %70, %71"
#define WG_R9 "%72, %73, %74, %75, %76, %77, %78, %79"
#define WG_R10 "%80, %81, %82, %83, %84, %85, %86, %87"
#define WG_R11 "%88, %89, %90, %91, %92, %93, %94, %95"
#define WG_R12 "%96, %97, %98, %99, %100, %101, %102, %103"
#define WG_R13 "%104, %105, %106, %107, %108, %109, %110, %111"
#define WG_R14 "%112, %113, %114, %115, %116, %117, %118, %119"
#define WG_R15 "%120, %121, %122, %123, %124, %125, %126, %127"
#define WG_R32 WG_R0 ", " WG_R1 ", " WG_R2 ", " WG_R3
#define WG_R64 WG_R32 ", " WG_R4 ", " WG_R5 ", " WG_R6 ", " WG_R7
#define WG_R96 WG_R64 ", " WG_R8 ", " WG_R9 ", " WG_R10 ", " WG_R11
#define WG_R128 WG_R96 ", " WG_R12 ", " WG_R13 ", " WG_R14 ", " WG_R15
#define WG_ACC8(d, i)                                                                                 \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define WG_ACC32_AT(d, i) WG_ACC8(d, i), WG_ACC8(d, i + 8), WG_ACC8(d, i + 16), WG_ACC8(d, i + 24)
#define WG_ACC32(d) WG_ACC32_AT(d, 0)
#define WG_ACC64(d) WG_ACC32_AT(d, 0), WG_ACC32_AT(d, 32)
#define WG_ACC96(d) WG_ACC64(d), WG_ACC32_AT(d, 64)
#define WG_ACC128(d) WG_ACC96(d), WG_ACC32_AT(d, 96)
// One specialization: T, N, the instruction's shape and types, R = N / 2 accumulators, and the
// operand numbers of the A and B descriptors and of the scale-d flag (R, R + 1, R + 2); bf16 adds
// its two transpose flags (both K-major: 0).
#define WG_SS(T, N, SHAPE, R, NA, NB, NP, TAIL)                                                         \
  template <>                                                                                           \
  struct Wgmma<T, N> {                                                                                  \
    static __device__ __forceinline__ void mma(float (&d)[R], uint64_t a, uint64_t b, int acc = 1) {    \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #NP ", 0;\nwgmma.mma_async.sync.aligned." SHAPE \
                   " {" WG_R##R "}, %" #NA ", %" #NB ", p, 1, 1" TAIL ";\n}\n"                          \
                   : WG_ACC##R(d)                                                                       \
                   : "l"(a), "l"(b), "r"(acc));                                                         \
    }                                                                                                   \
  };
template <class T, int N>
struct Wgmma;
WG_SS(float, 64, "m64n64k8.f32.tf32.tf32", 32, 32, 33, 34, "")
WG_SS(float, 128, "m64n128k8.f32.tf32.tf32", 64, 64, 65, 66, "")
WG_SS(float, 192, "m64n192k8.f32.tf32.tf32", 96, 96, 97, 98, "")
WG_SS(float, 256, "m64n256k8.f32.tf32.tf32", 128, 128, 129, 130, "")
WG_SS(bf16, 64, "m64n64k16.f32.bf16.bf16", 32, 32, 33, 34, ", 0, 0")
WG_SS(bf16, 128, "m64n128k16.f32.bf16.bf16", 64, 64, 65, 66, ", 0, 0")
// wgmma_t's width: 2 padded image rows of 66 pixels, rounded up to 8
#define WG_R68 WG_R64 ", %64, %65, %66, %67"
#define WG_ACC68(d) WG_ACC64(d), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
WG_SS(float, 136, "m64n136k8.f32.tf32.tf32", 68, 68, 69, 70, "")

// D[64 x 64] += A[64 x 8] B[64 x 8]^T in tf32 with A from registers (a0..a3: rows l / 4 and
// l / 4 + 8 of the warp's 16, columns l % 4 and l % 4 + 4: the layout of mma.sync's m16n8k8) and B
// from shared memory: the filter gradient's operands, whose K (pixels) is not contiguous in NHWC.
__device__ __forceinline__ void wgmma_rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" WG_R32 "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : WG_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// A GroupNorm (+ scale-shift) (+ SiLU) of the input, applied to its tiles in shared memory
// (ConvFwd's / ConvBwdFilter's norm; tf32): its tensors, gamma null for none.
struct NormArgs {
  const float *gamma = nullptr, *beta = nullptr, *ss = nullptr, *mean = nullptr, *rstd = nullptr,
              *xbias = nullptr, *xemb = nullptr;
  int G = 1;
  bool silu = false;
};
// The forward kernels' scalar arguments.
struct Args {
  const float* bias;
  const float* emb;
  const void* res;  // T, as y
  void* y;
  int M, HW, W, N, Ci, Cb, KS, KB;  // Cb: K blocks per tap; KB = KS*KS*Cb
  int H;
  NormArgs nrm;
};

// The norm's coefficients (gn_coef.cuh, as the GroupNorm kernels compute them) of channels
// c0 .. c0 + n - 1 of sample b into tab: m[n], then a[n], then bb[n]; zeros past the last channel,
// so that the copy engine's zero channels stay zero. Threads t < n, one channel each.
__device__ __forceinline__ void norm_coefs(float* tab, int n, const NormArgs& q, int b, int c0, int C, int t) {
  if (t >= n) return;
  const int c = c0 + t;
  Coef k{0.f, 0.f, 0.f, 0.f};
  if (c < C) k = coef_of(q.gamma, q.beta, q.ss, q.mean, q.rstd, q.xbias, q.xemb, b, c, C, q.G);
  tab[t] = k.m, tab[n + t] = k.a, tab[2 * n + t] = k.bb;
}
// One 16-byte chunk (4 channels) of a tile in shared memory, in place: SiLU((v - m) a + bb) (the
// GroupNorm apply kernel's arithmetic, so the same bits as the pass it replaces), rounded to tf32
// as the convolution rounds its input.
__device__ __forceinline__ void norm_chunk(uint32_t ad, const float (&m)[4], const float (&a)[4],
                                           const float (&bb)[4], bool silu) {
  float v[4];
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(ad));
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float z = fmaf(v[e] - m[e], a[e], bb[e]);
    v[e] = tf32_rna(silu ? silu_fast(z) : z);
  }
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(ad), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
               : "memory");
}
// The norm applied in place to ROWS pixel rows of an input tile in shared memory: `atoms` atoms
// of 32 channels, astride bytes apart (multiples of 1024), each PW pixels a row, a pixel a
// 128-byte row of the swizzle; tile pixel (r, c) is image pixel (y0 - 1 + r, x0 - 1 + c), and
// those outside the image stay zero (the padding comes after the norm). tab: norm_coefs's, the
// tile's n channels. nt threads, this one t.
template <int PW, int ROWS>
__device__ __forceinline__ void norm_tile(uint32_t tile, int atoms, uint32_t astride, int y0, int x0, int H, int W,
                                          const float* tab, int n, bool silu, int t, int nt) {
  constexpr int PER_ATOM = ROWS * PW * 8;  // 16-byte chunks
  for (int i = t; i < atoms * PER_ATOM; i += nt) {
    const int at = i / PER_ATOM, p = (i - at * PER_ATOM) >> 3, ph = i & 7;
    const int r = p / PW, yy = y0 - 1 + r, xx = x0 - 1 + (p - r * PW);
    if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
    const int c = at * 32 + 4 * (ph ^ (p & 7));  // (the swizzle: chunk ^ row % 8)
    const float4 m = *reinterpret_cast<const float4*>(tab + c), a = *reinterpret_cast<const float4*>(tab + n + c),
                 bb = *reinterpret_cast<const float4*>(tab + 2 * n + c);
    const float mm[4] = {m.x, m.y, m.z, m.w}, aa[4] = {a.x, a.y, a.z, a.w}, b4[4] = {bb.x, bb.y, bb.z, bb.w};
    norm_chunk(tile + at * astride + p * ROW + ph * 16, mm, aa, b4, silu);
  }
}

// o (channels n .. n + 3 of an output pixel of image img) += bias + embedding + r (the residual's
// values, loaded ahead), each when given, in that order (the other variants' order).
__device__ __forceinline__ void add_epilogue(float4& o, const Args& a, size_t img, int n, const float4& r) {
  if (a.bias) {
    const float4 b = *reinterpret_cast<const float4*>(a.bias + n);
    o.x += b.x, o.y += b.y, o.z += b.z, o.w += b.w;
  }
  if (a.emb) {
    const float4 e = *reinterpret_cast<const float4*>(a.emb + img * a.N + n);
    o.x += e.x, o.y += e.y, o.z += e.z, o.w += e.w;
  }
  if (a.res) o.x += r.x, o.y += r.y, o.z += r.z, o.w += r.w;
}

// The epilogue of both kernels, once every consumer's wgmma's are done: the accumulators go to
// shared memory (the freed input stages, `stage`), then all 256 consumer threads add bias,
// embedding and residual and store, as 16-byte vectors along the rows (coalesced, 8 loads in
// flight per thread; straight from the fragments, each thread's loads of the residual waited
// for one another behind its stores). Thread (warp w, lane l) of warpgroup g holds rows
// 64 g + 16 w + l / 4 (+ 8) and columns 8 j + 2 (l % 4) (+ 1).
template <class T, int BN>
__device__ __forceinline__ void store_tile(const Args& a, const float (&d)[BN / 2], int m0, int n0, int g, int t,
                                           float* stage) {
  constexpr int LD = BN + 8;  // row pitch in floats: the fragment's 8 rows in 4 bank groups
  asm volatile("bar.sync 1, 256;\n" ::: "memory");  // both warpgroups' wgmma's have read the stages
  const int w = t >> 5, l = t & 31;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* row = stage + (g * 64 + w * 16 + h * 8 + (l >> 2)) * LD + 2 * (l & 3);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
      *reinterpret_cast<float2*>(row + 8 * j) = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
  }
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  constexpr int V = BN / 4, TOTAL = BM * V, PER = TOTAL / 256, U = PER < 8 ? PER : 8;
  static_assert(TOTAL % 256 == 0 && PER % U == 0, "whole vectors per thread");
  const T* res = static_cast<const T*>(a.res);
  T* y = static_cast<T*>(a.y);
  const int tid = g * 128 + t;
#pragma unroll 1
  for (int i0 = 0; i0 < PER; i0 += U) {
    float4 v[U], r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = tid + (i0 + u) * 256, rr = idx / V, c = (idx % V) * 4, m = m0 + rr, n = n0 + c;
      v[u] = *reinterpret_cast<const float4*>(stage + rr * LD + c);
      r[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (res && m < a.M && n < a.N) r[u] = ld4(res, ((size_t)m * a.N + n) / 4);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = tid + (i0 + u) * 256, rr = idx / V, c = (idx % V) * 4, m = m0 + rr, n = n0 + c;
      if (m >= a.M || n >= a.N) continue;
      float4 o = v[u];
      add_epilogue(o, a, (size_t)(m / a.HW), n, r[u]);
      st4(y, ((size_t)m * a.N + n) / 4, o);
    }
  }
}

// y [M, N] = conv(x, w) (+ bias + emb + res), x [B, H, W, Ci] and w [N, KS, KS, Ci] through their
// tensor maps. Block tile BM x BN; warpgroup 0 loads, warpgroups 1 and 2 multiply.
template <class T, int BN, int STAGES, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
    fwd_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, const Args a) {
  pdl_entry();  // (before any load; the barriers' set-up could go first, but it is short)
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)  // (the host pass parses it too)
  constexpr uint32_t A_BYTES = BM * ROW, B_BYTES = BN * ROW, STAGE = A_BYTES + B_BYTES;
  constexpr int BK = kBK<T>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (saddr(smem_raw) + 1023) & ~1023u;  // the 128-byte swizzle's 1024-byte period
  const uint32_t full = base + STAGES * STAGE, empty = full + 8 * STAGES;
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 2);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 2) {
    if (t == 0) {
      const int b0 = m0 / a.HW, r = m0 - b0 * a.HW, y0 = r / a.W, x0 = r - y0 * a.W, pad = a.KS / 2;
      for (int kb = 0, tap = 0, cb = 0; kb < a.KB; ++kb) {
        const int s = kb % STAGES;
        if (kb >= STAGES) mbar_wait(empty + 8 * s, ((kb / STAGES) - 1) & 1);
        const int ky = tap / a.KS, kx = tap - ky * a.KS;
        const uint32_t dst = base + s * STAGE;
        mbar_expect_tx(full + 8 * s, STAGE);
        tma4(dst, &xmap, full + 8 * s, cb * BK, x0 + kx - pad, y0 + ky - pad, b0);
        tma2(dst + A_BYTES, &wmap, full + 8 * s, tap * a.Ci + cb * BK, n0);
        if (++cb == a.Cb) cb = 0, ++tap;
      }
    }
    return;
  }
  const int g = wg;  // this warpgroup's 64 pixel rows
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
  for (int kb = 0; kb < a.KB; ++kb) {
    const int s = kb % STAGES;
    mbar_wait(full + 8 * s, (kb / STAGES) & 1);
    const uint32_t sa = base + s * STAGE + g * 64 * 128, sb = base + s * STAGE + A_BYTES;
    round_tf32<T>(sa, 64 * ROW, t);
    rounded<T>(g);
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) Wgmma<T, BN>::mma(d, sdesc(sa + 32 * k), sdesc(sb + 32 * k));
    wg_commit();
    wg_wait<1>();  // the previous block's wgmma's are done: its stage may be refilled
    if (kb > 0 && t == 0) mbar_arrive(empty + 8 * ((kb - 1) % STAGES));
  }
  wg_wait<0>();

  store_tile<T, BN>(a, d, m0, n0, g, t, reinterpret_cast<float*>(smem_raw + (base - saddr(smem_raw))));
#endif
}

// 3x3 at width 64 (tiles of 2 image rows): the input tile is loaded once per 32-channel block with
// its halo, 4 x 66 pixels (zeros outside the image, from the copy engine), and each tap's A
// operand is that tile read from another start row: a warpgroup's 64 pixels are one padded row,
// so the shifted window is again 64 rows 128 bytes apart (the 128-byte swizzle follows the
// address bits, so any 128-byte row start works with base offset 0). The input comes from shared
// memory once where per-tap loads read it 9 times; the filter's 9 tap tiles of the block stream
// through STAGES stages. Two slots for the input tile: the next block's loads while this one's
// taps run.
constexpr int HALO_THREADS = THREADS + 32;  // and the norm's warp
constexpr int TW = 64, TH = BM / TW, HALO_BYTES = (TW + 2) * (TH + 2) * ROW,
              HALO_SLOT = (HALO_BYTES + 1023) / 1024 * 1024;
template <class T, int BN, int STAGES, int MINB>
__global__ void __launch_bounds__(HALO_THREADS, MINB)
    halo_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, const Args a) {
  pdl_entry();  // (before any load; the barriers' set-up could go first, but it is short)
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)  // (the host pass parses it too)
  constexpr uint32_t B_BYTES = BN * ROW, slot = HALO_SLOT;
  constexpr int BK = kBK<T>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (saddr(smem_raw) + 1023) & ~1023u;
  const uint32_t bbase = base + 2 * slot;
  const uint32_t full = bbase + STAGES * B_BYTES, empty = full + 8 * STAGES, afull = empty + 8 * STAGES,
                 aempty = afull + 16, normed = aempty + 16;
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const bool nrm = sizeof(T) == 4 && a.nrm.gamma;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 2);
    for (int s = 0; s < 2; ++s)
      mbar_init(afull + 8 * s, 1), mbar_init(aempty + 8 * s, 2), mbar_init(normed + 8 * s, 32);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 2) {
    if (t == 0) {
      const int b0 = m0 / a.HW, r = m0 - b0 * a.HW, y0 = r / a.W, x0 = r - y0 * a.W;
      for (int cb = 0, kb = 0; cb < a.Cb; ++cb) {
        const int as = cb & 1;
        if (cb >= 2) mbar_wait(aempty + 8 * as, ((cb >> 1) - 1) & 1);
        mbar_expect_tx(afull + 8 * as, HALO_BYTES);
        tma4(base + as * slot, &xmap, afull + 8 * as, cb * BK, x0 - 1, y0 - 1, b0);
        for (int tap = 0; tap < 9; ++tap, ++kb) {
          const int s = kb % STAGES;
          if (kb >= STAGES) mbar_wait(empty + 8 * s, ((kb / STAGES) - 1) & 1);
          mbar_expect_tx(full + 8 * s, B_BYTES);
          tma2(bbase + s * B_BYTES, &wmap, full + 8 * s, tap * a.Ci + cb * BK, n0);
        }
      }
    } else if (t >= 32 && nrm) {
      // The norm's warp: each input tile as it arrives, in place (a lane keeps one 16-byte chunk
      // of channels, 4 pixels a step: the 8 lanes of a pixel hit 8 distinct bank groups), then
      // "normed" for the consumers. Beside their wgmma's on the other slot; few registers, where
      // the consumers' 64 accumulators leave no room for the pass (ptxas spilled and serialised
      // their wgmma's, C7515).
      const int l = t - 32, lc = l & 7;
      const int b0 = m0 / a.HW, y0 = (m0 - b0 * a.HW) / a.W;
      for (int cb = 0; cb < a.Cb; ++cb) {
        const int as = cb & 1;
        float mm[4], aa[4], bb[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = cb * BK + 4 * lc + e;
          Coef k{0.f, 0.f, 0.f, 0.f};  // (zeros past the last channel keep the copy's zeros)
          if (c < a.Ci) k = coef_of(a.nrm.gamma, a.nrm.beta, a.nrm.ss, a.nrm.mean, a.nrm.rstd, a.nrm.xbias,
                                    a.nrm.xemb, b0, c, a.Ci, a.nrm.G);
          mm[e] = k.m, aa[e] = k.a, bb[e] = k.bb;
        }
        mbar_wait(afull + 8 * as, (cb >> 1) & 1);
        const uint32_t ab = base + as * slot;
        for (int p = l >> 3; p < (TH + 2) * (TW + 2); p += 4) {
          const int r = p / (TW + 2), yy = y0 - 1 + r, xx = p - r * (TW + 2) - 1;
          if (yy < 0 || yy >= a.H || xx < 0 || xx >= a.W) continue;  // the padding stays zero
          norm_chunk(ab + p * ROW + ((lc ^ (p & 7)) << 4), mm, aa, bb, a.nrm.silu);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the wgmma's reads
        mbar_arrive(normed + 8 * as);
      }
    }
    return;
  }
  const int g = wg;
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
  for (int cb = 0, kb = 0; cb < a.Cb; ++cb) {
    const int as = cb & 1;
    mbar_wait((nrm ? normed : afull) + 8 * as, (cb >> 1) & 1);
    const uint32_t ab = base + as * slot;
    if (!nrm) {
      round_tf32<T>(ab + g * (TW + 2) * ROW, 3 * (TW + 2) * ROW, t);  // the 3 padded rows it reads
      rounded<T>(g);
    }
    for (int tap = 0; tap < 9; ++tap, ++kb) {
      const int s = kb % STAGES, ky = tap / 3, kx = tap - ky * 3;
      mbar_wait(full + 8 * s, (kb / STAGES) & 1);
      const uint32_t sa = ab + (uint32_t)(((g + ky) * (TW + 2) + kx) * 128), sb = bbase + s * B_BYTES;
      wg_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) Wgmma<T, BN>::mma(d, sdesc(sa + 32 * k), sdesc(sb + 32 * k));
      wg_commit();
      wg_wait<1>();
      if (t == 0) {
        if (kb > 0) mbar_arrive(empty + 8 * ((kb - 1) % STAGES));
        if (tap == 0 && cb > 0) mbar_arrive(aempty + 8 * ((cb - 1) & 1));
      }
    }
  }
  wg_wait<0>();
  store_tile<T, BN>(a, d, m0, n0, g, t, reinterpret_cast<float*>(smem_raw + (base - saddr(smem_raw))));
#endif
}

// The pixel tile as a box of the NHWC input: (bw, bh, bn) pixels x rows x images, 128 in all,
// covering 128 consecutive output pixels. False where the shape does not tile that way.
struct Box {
  int w = 0, h = 0, n = 0;
};
bool pixel_box(int H, int W, Box& b) {
  if (W >= BM) {
    if (W % BM) return false;
    b = {BM, 1, 1};
    return true;
  }
  if (BM % W) return false;
  const int rows = BM / W;
  if (H >= rows) {
    if (H % rows) return false;
    b = {W, rows, 1};
    return true;
  }
  if (rows % H) return false;
  b = {W, H, rows / H};
  return true;
}

bool sm90a_device() {
  static const bool yes = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;
  }();
  return yes;
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// The storage type of a precision: f32 (tf32 tensor cores) or bf16; fp32 has none here.
DType elt(Precision p) { return p == Precision::BF16 ? DType::BF16 : DType::F32; }
// What every path needs: tf32 or bf16 on an sm_90 GPU (the encoder from the driver), stride 1,
// channel rows of whole 16-byte units for the tensor maps and 4-channel output vectors.
bool common_ok(const CudaCtx& c, const Geo& g) {
  const int unit = c.prec == Precision::BF16 ? 8 : 4;
  return c.prec != Precision::FP32 && sm90a_device() && encoder() && g.Ci % unit == 0 && g.Co % 8 == 0 &&
         g.M() < (1LL << 31) && (long long)g.KS * g.KS * g.Ci < (1LL << 31);
}
// The halo kernel's shapes: 3x3 at width 64 with at most 128 output channels (two blocks per SM).
bool halo_ok(const CudaCtx& c, const Geo& g) {
  return common_ok(c, g) && g.KS == 3 && g.W == TW && g.H % TH == 0 && g.Co <= 128;
}
bool typed(DType t, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* x : ts)
    if (x->defined() && x->dtype != t) return false;
  return true;
}
bool fwd_shape_ok(const ConvFwd& o, const CudaCtx& c) {
  return o.stride == 1 && typed(elt(c.prec), {&o.x, &o.w, &o.y, &o.res}) && typed(DType::F32, {&o.bias, &o.emb}) &&
         o.w.dim[1] == o.w.dim[2] && same_size(o.x, o.y) &&
         (!o.mean.defined() || groupnorm_stats_fit(o.y, o.mean));
}
// (the norm of the input: tf32 only)
bool fwd_ok(const ConvFwd& o, const CudaCtx& c) {
  return fwd_shape_ok(o, c) && halo_ok(c, fwd_geo(o)) && (!o.norm.on() || c.prec == Precision::TF32);
}
bool tap_ok(const ConvFwd& o, const CudaCtx& c) {
  const Geo g = fwd_geo(o);
  Box b;
  return fwd_shape_ok(o, c) && common_ok(c, g) && (g.KS == 1 || g.KS == 3) && pixel_box(g.H, g.W, b);
}
// (data gradients, the forward of dy: tf32 only, as the rotated filter is written by an f32 kernel)
bool data_shape_ok(const ConvBwdData& o, const CudaCtx& c) {
  return c.prec == Precision::TF32 && o.stride == 1 && typed(DType::F32, {&o.dy, &o.w, &o.dx}) &&
         o.w.dim[1] == o.w.dim[2] && same_size(o.dy, o.dx);
}
bool data_ok(const ConvBwdData& o, const CudaCtx& c) {
  return data_shape_ok(o, c) && halo_ok(c, as_forward(data_geo(o)));
}

template <class T>
void encode(CUtensorMap* m, const void* p, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
            const cuuint32_t* box) {
  const cuuint32_t ones[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt = sizeof(T) == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encoder()(m, dt, rank, const_cast<void*>(p), dims, strides, box, ones,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw std::runtime_error("conv wgmma: cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
}
// x [B, H, W, Ci] as boxes of one K block's channels x bw x bh x bn; w [Co, K] as boxes of a K block
// x bn.
template <class T>
void encode_x(CUtensorMap* m, const void* x, const Geo& g, int bw, int bh, int bn) {
  const cuuint64_t e = sizeof(T), d[4] = {(cuuint64_t)g.Ci, (cuuint64_t)g.W, (cuuint64_t)g.H, (cuuint64_t)g.B};
  const cuuint64_t st[3] = {g.Ci * e, (cuuint64_t)g.W * g.Ci * e, (cuuint64_t)g.H * g.W * g.Ci * e};
  const cuuint32_t b[4] = {(cuuint32_t)kBK<T>, (cuuint32_t)bw, (cuuint32_t)bh, (cuuint32_t)bn};
  encode<T>(m, x, 4, d, st, b);
}
template <class T>
void encode_w(CUtensorMap* m, const void* w, const Geo& g, int bn) {
  const int K = g.KS * g.KS * g.Ci;
  const cuuint64_t d[2] = {(cuuint64_t)K, (cuuint64_t)g.Co}, st[1] = {(cuuint64_t)K * sizeof(T)};
  const cuuint32_t b[2] = {(cuuint32_t)kBK<T>, (cuuint32_t)bn};
  encode<T>(m, w, 2, d, st, b);
}

// The kernels' pointers and sizes; y = conv(x, w) (+ bias + emb + res); x, w, res, y of type T.
struct Io {
  const void *x, *w;
  const float *bias, *emb;
  const void* res;
  void* y;
  NormArgs nrm{};
};
NormArgs norm_args(const NormIn& n) {
  if (!n.on()) return {};
  return {dptr<float>(n.gamma), dptr<float>(n.beta), dptr<float>(n.ss),   dptr<float>(n.mean),
          dptr<float>(n.rstd),  dptr<float>(n.xbias), dptr<float>(n.xemb), (int)n.mean.dim[1], n.silu};
}
Io io_of(const ConvFwd& o, const void* w) {
  return {o.x.data, w, dptr<float>(o.bias), dptr<float>(o.emb), o.res.defined() ? o.res.data : nullptr,
          o.y.data, norm_args(o.norm)};
}
template <class T>
Args args(const Geo& g, const Io& io) {
  const int Cb = (g.Ci + kBK<T> - 1) / kBK<T>;
  return Args{io.bias, io.emb,        io.res, io.y, (int)g.M(), g.H * g.W, g.W, g.Co, g.Ci, Cb, g.KS,
              g.KS * g.KS * Cb, g.H, io.nrm};
}
// The filter rounded to tf32 into the workspace (tf32 forwards; see round_tf32).
__global__ void round_kernel(const float* __restrict__ w, float* __restrict__ o, int n4) {
  pdl_entry();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
    float4 v = reinterpret_cast<const float4*>(w)[i];
    v.x = tf32_rna(v.x), v.y = tf32_rna(v.y), v.z = tf32_rna(v.z), v.w = tf32_rna(v.w);
    reinterpret_cast<float4*>(o)[i] = v;
  }
}
size_t fwd_ws(const ConvFwd& o, const CudaCtx& c) {
  return c.prec == Precision::TF32 ? round256((size_t)o.w.numel() * 4) : 0;
}
// The filter the kernels read: tf32's rounded copy (in the workspace), bf16's own.
const void* filter(const ConvFwd& o, CudaCtx& ctx) {
  if (ctx.prec != Precision::TF32) return o.w.data;
  const int n4 = (int)(o.w.numel() / 4);
  float* out = static_cast<float*>(ctx.ws);
  round_kernel<<<std::min((n4 + 255) / 256, 1024), 256, 0, ctx.stream>>>(dptr<float>(o.w), out, n4);
  KERNEL_CHECK();
  return out;
}

template <class T, int BN, int STAGES, int MINB>
void launch_tap(CudaCtx& ctx, const Geo& g, const Io& io) {
  constexpr int bytes = STAGES * (BM + BN) * ROW + 1024 + 16 * STAGES;
  static const bool attr = (allow_dynamic_smem(fwd_kernel<T, BN, STAGES, MINB>, bytes), true);
  (void)attr;
  Box b;
  pixel_box(g.H, g.W, b);
  CUtensorMap xmap, wmap;
  encode_x<T>(&xmap, io.x, g, b.w, b.h, b.n);
  encode_w<T>(&wmap, io.w, g, BN);
  const dim3 grid((unsigned)((g.M() + BM - 1) / BM), (unsigned)((g.Co + BN - 1) / BN));
  fwd_kernel<T, BN, STAGES, MINB><<<grid, THREADS, bytes, ctx.stream>>>(xmap, wmap, args<T>(g, io));
  KERNEL_CHECK();
}

template <class T, int BN, int STAGES>
void launch_halo(CudaCtx& ctx, const Geo& g, const Io& io) {
  constexpr int bytes = 2 * HALO_SLOT + STAGES * BN * ROW + 1024 + 16 * STAGES + 48;
  static const bool attr = (allow_dynamic_smem(halo_kernel<T, BN, STAGES, 2>, bytes), true);
  (void)attr;
  CUtensorMap xmap, wmap;
  encode_x<T>(&xmap, io.x, g, TW + 2, TH + 2, 1);
  encode_w<T>(&wmap, io.w, g, BN);
  const dim3 grid((unsigned)((g.M() + BM - 1) / BM), (unsigned)((g.Co + BN - 1) / BN));
  halo_kernel<T, BN, STAGES, 2><<<grid, HALO_THREADS, bytes, ctx.stream>>>(xmap, wmap, args<T>(g, io));
  KERNEL_CHECK();
}
// Two blocks per SM: ~100 KB of shared memory each.
template <class T>
void run_halo(CudaCtx& ctx, const Geo& g, const Io& io) {
  g.Co <= 64 ? launch_halo<T, 64, 4>(ctx, g, io) : launch_halo<T, 128, 2>(ctx, g, io);
}

// ---- "wgmma_t" (tf32; the default on Hopper where it runs): the width-64 3x3 forward with the
// output channels (at most 64) as the GEMM's M and the pixels as its N. With 64 output channels
// the halo kernel's wgmma's are m64n64: each reads 4 KB of operands from shared memory per 32
// tensor-core cycles, all of the 128 bytes a cycle shared memory delivers (cuDNN's 64-channel
// tiles likewise: ~130-180 TFLOP/s at seed64's 64x64 level). Here A is the filter's tap tile
// (64 output x 32 input channels) and B the halo tile read from the tap's shifted start, N = 2
// padded image rows (132 pixels, 136 with the rounding up): ~95 bytes a cycle. The sums of the
// padding columns (and of the 4 extra pixels) are computed and dropped.
//  * A block: 4 output rows of one image, warpgroup g rows 2g and 2g + 1, every output channel;
//    its input tile per 32-channel K block is 6 x 66 pixels (zeros outside the image, from the
//    copy engine), in one slot (refilled once both warpgroups' wgmma's on it are done); the
//    filter's tap tiles stream through T_STAGES stages. ~100 KB of shared memory and 94 registers:
//    two blocks an SM, each one's loads, rounding and epilogue beside the other's wgmma's (at one
//    block an SM with two slots and 3 rows a warpgroup, m64n200: 0.057 ms at 64 -> 64, batch 32,
//    against 0.049 here and cuDNN's 0.052; H200).
//  * The last taps' windows run a few rows past the tile (into the filter's stages): only dropped
//    sums read them.
//  * Epilogue: the accumulators (channel x pixel) go transposed into the freed slot and stages
//    (pixel rows 68 floats apart: conflict-free both ways), then 16-byte stores along the NHWC
//    rows, bias, embedding and residual added in that order.
constexpr int T_ROWS = 2, T_RB = 2 * T_ROWS;          // output rows a warpgroup, a block
constexpr int T_N = (T_ROWS * (TW + 2) + 7) / 8 * 8;  // a warpgroup's pixels (wgmma's N)
constexpr int T_TILE = (T_RB + 2) * (TW + 2) * ROW;   // input tile bytes per K block
constexpr int T_SLOT = (T_TILE + 1023) / 1024 * 1024;
constexpr int T_STAGES = 6, T_BM = 64, T_LD = 68;  // filter stages; channels; staged row (floats)
constexpr int T_SMEM = T_SLOT + T_STAGES * T_BM * ROW + 1024 + 16 * T_STAGES + 32;
static_assert(2 * T_N * T_LD * 4 <= T_SLOT + T_STAGES * T_BM * ROW, "the staged sums fit");

__global__ void __launch_bounds__(THREADS, 2)
    halo_t_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
                  const Args a) {
  pdl_entry();
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)  // (the host pass parses it too)
  constexpr uint32_t A_BYTES = T_BM * ROW;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (saddr(smem_raw) + 1023) & ~1023u, wbase = base + T_SLOT;
  const uint32_t full = wbase + T_STAGES * A_BYTES, empty = full + 8 * T_STAGES, afull = empty + 8 * T_STAGES,
                 aempty = afull + 8;
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int rblocks = (a.H + T_RB - 1) / T_RB, b0 = blockIdx.x / rblocks, y0 = (blockIdx.x % rblocks) * T_RB;
  if (threadIdx.x == 0) {
    for (int s = 0; s < T_STAGES; ++s) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 2);
    mbar_init(afull, 1), mbar_init(aempty, 2);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 2) {
    if (t == 0) {
      for (int cb = 0, kb = 0; cb < a.Cb; ++cb) {
        if (cb > 0) mbar_wait(aempty, (cb - 1) & 1);
        mbar_expect_tx(afull, T_TILE);
        tma4(base, &xmap, afull, cb * kBK<float>, -1, y0 - 1, b0);
        for (int tap = 0; tap < 9; ++tap, ++kb) {
          const int s = kb % T_STAGES;
          if (kb >= T_STAGES) mbar_wait(empty + 8 * s, ((kb / T_STAGES) - 1) & 1);
          mbar_expect_tx(full + 8 * s, A_BYTES);
          tma2(wbase + s * A_BYTES, &wmap, full + 8 * s, tap * a.Ci + cb * kBK<float>, 0);
        }
      }
    }
    return;
  }
  const int g = wg;
  float d[T_N / 2];  // (no zeros written: the first wgmma does not add; zeroing them made ptxas
                     // serialise the wgmma's, C7515)
  for (int cb = 0, kb = 0; cb < a.Cb; ++cb) {
    mbar_wait(afull, cb & 1);
    // the tile's 6 halo rows rounded once, 3 by each warpgroup (not the 4 each reads: 8 row passes
    // a K block), then both wait for both: measured up to 0.03 ms a tf32 step on an H200
    round_tf32<float>(base + g * (T_RB + 2) / 2 * (TW + 2) * ROW, (T_RB + 2) / 2 * (TW + 2) * ROW, t);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    for (int tap = 0; tap < 9; ++tap, ++kb) {
      const int s = kb % T_STAGES, ky = tap / 3, kx = tap - ky * 3;
      mbar_wait(full + 8 * s, (kb / T_STAGES) & 1);
      const uint32_t sa = wbase + s * A_BYTES,
                     sb = base + (uint32_t)(((g * T_ROWS + ky) * (TW + 2) + kx) * ROW);
      wg_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k)
        Wgmma<float, T_N>::mma(d, sdesc(sa + 32 * k), sdesc(sb + 32 * k), kb + k > 0);
      wg_commit();
      wg_wait<1>();
      if (t == 0 && kb > 0) mbar_arrive(empty + 8 * ((kb - 1) % T_STAGES));
    }
    wg_wait<0>();  // the slot is refilled once this K block's wgmma's are done
    if (t == 0) mbar_arrive(aempty);
  }

  // Thread (warp w, lane l) holds channels 16 w + l / 4 (+ 8) of pixels 8 j + 2 (l % 4) (+ 1).
  float* stage = reinterpret_cast<float*>(smem_raw + (base - saddr(smem_raw))) + g * T_N * T_LD;
  asm volatile("bar.sync 1, 256;\n" ::: "memory");  // both warpgroups' wgmma's are done with the slot
  const int w = t >> 5, l = t & 31, c = 16 * w + (l >> 2);
#pragma unroll
  for (int j = 0; j < T_N / 8; ++j) {
    float* p = stage + (8 * j + 2 * (l & 3)) * T_LD + c;
    p[0] = d[4 * j], p[T_LD] = d[4 * j + 1], p[8] = d[4 * j + 2], p[T_LD + 8] = d[4 * j + 3];
  }
  asm volatile("bar.sync %0, 128;\n" ::"r"(2 + g) : "memory");
  const float* res = static_cast<const float*>(a.res);
  float* y = static_cast<float*>(a.y);
  constexpr int CV = T_BM / 4, PER = T_ROWS * TW * CV / 128, U = 8;  // float4s a thread
  static_assert(PER % U == 0, "whole rounds");
#pragma unroll 1
  for (int i0 = 0; i0 < PER; i0 += U) {
    float4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = t + (i0 + u) * 128, q = idx / CV, n = (idx % CV) * 4, yy = y0 + g * T_ROWS + q / TW;
      r[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (res && yy < a.H && n < a.N)
        r[u] = ld4(res, ((((size_t)b0 * a.H + yy) * TW + q % TW) * a.N + n) / 4);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = t + (i0 + u) * 128, q = idx / CV, n = (idx % CV) * 4, yy = y0 + g * T_ROWS + q / TW;
      if (yy >= a.H || n >= a.N) continue;
      float4 o = *reinterpret_cast<const float4*>(stage + ((q / TW) * (TW + 2) + q % TW) * T_LD + n);
      add_epilogue(o, a, (size_t)b0, n, r[u]);
      st4(y, ((((size_t)b0 * a.H + yy) * TW + q % TW) * a.N + n) / 4, o);
    }
  }
#endif
}

void launch_halo_t(CudaCtx& ctx, const Geo& g, const Io& io) {
  static const bool attr = (allow_dynamic_smem(halo_t_kernel, T_SMEM), true);
  (void)attr;
  CUtensorMap xmap, wmap;
  encode_x<float>(&xmap, io.x, g, TW + 2, T_RB + 2, 1);
  encode_w<float>(&wmap, io.w, g, T_BM);
  const dim3 grid((unsigned)(g.B * ((g.H + T_RB - 1) / T_RB)));
  halo_t_kernel<<<grid, THREADS, T_SMEM, ctx.stream>>>(xmap, wmap, args<float>(g, io));
  KERNEL_CHECK();
}
// tf32, 3x3 at width 64, at most 64 output channels (T_BM), any height. (bf16: slower than cuDNN
// in the model, sampling's forward at batch 64 3.81 -> 3.90 ms, so not offered.)
bool halo_t_ok(const CudaCtx& c, const Geo& g) {
  return c.prec == Precision::TF32 && common_ok(c, g) && g.KS == 3 && g.W == TW && g.Co <= T_BM;
}

// A forward through run(tag) with tag float (tf32) or bf16, then the norm's statistics if asked.
template <class Run>
void run_fwd(const ConvFwd& o, CudaCtx& ctx, const char* variant, Run run) {
  need_aligned(variant, {o.x.data, o.w.data, o.y.data, o.res.data, ctx.ws});
  const Io io = io_of(o, filter(o, ctx));
  if (ctx.prec == Precision::BF16)
    run(bf16{}, fwd_geo(o), io);
  else
    run(float{}, fwd_geo(o), io);
  if (o.mean.defined()) groupnorm_stats(ctx, o.y, o.mean, o.rstd);
}
void conv_fwd(const ConvFwd& o, CudaCtx& ctx) {
  run_fwd(o, ctx, "wgmma", [&](auto tag, const Geo& g, const Io& io) { run_halo<decltype(tag)>(ctx, g, io); });
}

void conv_fwd_t(const ConvFwd& o, CudaCtx& ctx) {
  run_fwd(o, ctx, "wgmma_t", [&](auto, const Geo& g, const Io& io) { launch_halo_t(ctx, g, io); });
}
bool fwd_t_ok(const ConvFwd& o, const CudaCtx& c) { return fwd_shape_ok(o, c) && halo_t_ok(c, fwd_geo(o)); }

// Per-tap loads: two blocks per SM up to 128 output channels, else one with the widest tile
// (tf32; bf16 has the 64- and 128-channel tiles only).
template <class T>
void run_tap(CudaCtx& ctx, const Geo& g, const Io& io) {
  if (g.Co <= 64) launch_tap<T, 64, 4, 2>(ctx, g, io);
  else if (g.Co <= 128 || sizeof(T) == 2) launch_tap<T, 128, 3, 2>(ctx, g, io);
  else if (g.Co <= 192) launch_tap<float, 192, 5, 1>(ctx, g, io);
  else launch_tap<float, 256, 4, 1>(ctx, g, io);
}
void conv_fwd_tap(const ConvFwd& o, CudaCtx& ctx) {
  run_fwd(o, ctx, "wgmma_tap", [&](auto tag, const Geo& g, const Io& io) { run_tap<decltype(tag)>(ctx, g, io); });
}

// dx = the forward of dy with the rotated filter (in the workspace), through launch(geo, io).
size_t data_ws(const ConvBwdData& o, const CudaCtx&) { return flip_bytes(data_geo(o)); }
template <class Launch>
void run_data(const ConvBwdData& o, CudaCtx& ctx, const char* variant, Launch launch) {
  need_aligned(variant, {o.dy.data, o.w.data, o.dx.data, ctx.ws});
  const Geo g = data_geo(o);
  float* wt = static_cast<float*>(ctx.ws);
  flip_filter<true>(ctx.stream, dptr<float>(o.w), wt, g);
  launch(as_forward(g), Io{o.dy.data, wt, nullptr, nullptr, nullptr, o.dx.data});
}
void conv_data(const ConvBwdData& o, CudaCtx& ctx) {
  run_data(o, ctx, "wgmma", [&](const Geo& g, const Io& io) { run_halo<float>(ctx, g, io); });
}
// The same through wgmma_t where dx has at most 64 channels.
bool data_t_ok(const ConvBwdData& o, const CudaCtx& c) {
  return data_shape_ok(o, c) && halo_t_ok(c, as_forward(data_geo(o)));
}
void conv_data_t(const ConvBwdData& o, CudaCtx& ctx) {
  run_data(o, ctx, "wgmma_t", [&](const Geo& g, const Io& io) { launch_halo_t(ctx, g, io); });
}

// ---- the filter gradient (tf32): dw[co][ky][kx][ci] = sum over pixels p of dy[p][co] x[p + tap][ci]
// K is the pixels, and NHWC keeps neither operand's K contiguous, which tf32 wgmma needs of a
// shared-memory operand. So the x side comes from registers (A: M = the block's 64 input channels
// of one tap; each thread loads its fragment from the swizzled NHWC tile at the tap's shifted
// pixel, any alignment) and dy is transposed in shared memory into K-major rows (B: N = 64 output
// channels), rounded to tf32 on the way, once per K block for all 9 taps.
//  * A block: 64 input x 64 output channels, all 9 taps, a range of K blocks of 64 pixels (64 / WB
//    image rows of WB pixels, WB = min(W, 64) a template parameter, so that every shared-memory
//    address is a register plus an immediate). Its input tile is the block's rows with a 1-pixel
//    halo all round (zeros outside the image, from the copy engine), so each K block's x and dy are
//    read once for the 9 taps. 3 warpgroups, one per filter row ky (3 accumulators of 64 x 64
//    each); no producer warp: thread 0 refills a stage once all have read it (one barrier per K
//    block), 3 stages ahead (2 at W = 64, beside the two transposed dy); the next block's dy is
//    transposed beside the last k-step's wgmma's.
//  * About 66 blocks in all (filter_splits: half an H100's SMs; the side lane's filter gradients
//    leave the other half to the main lane).
//  * Split K: each block's sums go to its own slice of the workspace and filter_finish_kernel
//    adds the slices in order (deterministic; the split count depends on the shape only).
//    Measured and not kept: the slices spread over 8 warps a column chunk (more loads in flight),
//    H100 tf32 step within noise (12.632 vs 12.639 ms, same run).
//  * The bias and embedding gradients (dy's column sums, over all pixels and per image): the
//    blocks of the first 64 input channels add the dy values their threads transpose (before the
//    rounding), per split and image, into FArgs::csum; filter_finish_kernel adds those in double,
//    beside its sums of the splits.
//  * K order within a k-step of 8 pixels: K position k holds pixel 2 (k % 4) + k / 4, so that a
//    warp's A loads (8 channels x 4 pixels 2 apart) fall in 32 distinct banks of the swizzled tile.
constexpr int FK = 64, FTHREADS = 384, DY_BYTES = FK * ROW;  // dy: 2 atoms of 32 channels
struct FArgs {
  float* out;           // [splits][Co][9][Ci]
  size_t split_stride;  // floats
  int Ci, H, W, KB, per;  // KB blocks in all, per block
  NormArgs nrm;         // the norm of x, applied by warpgroup 2 as each tile arrives
  // tf32: dy's column sums (the bias and embedding gradients) as the transposes read dy, by the
  // blocks of the first 64 input channels: partials [splits][imgs][FILTER_SLOTS][Co], null for
  // none. Co: dy's channels; imgs: images a split can touch.
  float* csum = nullptr;
  int Co = 0, imgs = 0;
};
// The column sums' partials: the transposing threads (t < 256) add their 4 output channels' values
// over the pixels of one image in a split, the 16 threads sharing them meet in FILTER_SLOTS
// partials (filter_kernel's flush_sums); split s and image b are at s imgs + b - first image of s.
constexpr int FILTER_SLOTS = 4;
__host__ __device__ __forceinline__ int filter_first_img(int split, int per, int per_img) {
  return split * per / per_img;
}
// WB pixels per tile row (FK / WB rows); an input tile's atom (32 channels of f32, 64 of bf16: a
// 128-byte row per pixel) of WB + 2 by FK / WB + 2 pixels takes xatom bytes, 1024-aligned for the
// swizzle.
template <int WB>
constexpr uint32_t xatom() {
  return (uint32_t)((WB + 2) * (FK / WB + 2) * ROW + 1023) / 1024 * 1024;
}
// K block kb's place: image b, its tile's first row y0 and column x0 (tiles of FK / WB rows of WB
// pixels, xtiles = W / WB of them a row, per_img = xtiles H / (FK / WB) an image).
struct KTile {
  int b, y0, x0;
};
template <int WB>
__device__ __forceinline__ KTile ktile(int kb, int xtiles, int per_img) {
  const int b = kb / per_img, r = kb - b * per_img;
  return {b, r / xtiles * (FK / WB), (r % xtiles) * WB};
}
// Stages of x and dy: 3 where they fit beside the two transposed dy (2 at W = 64).
template <int WB>
constexpr int fstages() {
  return WB == 64 ? 2 : 3;
}
// The filter gradient's epilogue (both kernels): the sums go out through shared memory (ep: the
// stages, free by now; 9 x 64 x 68 floats), [warpgroup][kx][co][ci] at a pitch of 68 floats (the
// fragment's stores in 32 banks), then as rows of 16-byte vectors per (co, tap): accumulator (row,
// col) = (input channel, output channel), rows 16 w + r8 (+ 8), columns 8 n + 2 j (+ 1) of thread
// (warpgroup ky, warp w, lane 4 r8 + j).
constexpr int EP = 68, EP_BYTES = 9 * 64 * EP * 4;
__device__ __forceinline__ float* ep_of(unsigned char* smem_raw, uint32_t base) {
  return reinterpret_cast<float*>(smem_raw + (base - saddr(smem_raw)));
}
__device__ __forceinline__ void filter_store(const float (&d)[3][32], float* ep, const FArgs& a, int split, int ci0,
                                             int co0, int t) {
  const int ky = t >> 7, w = (t >> 5) & 3, l = t & 31, r8 = l >> 2, j = l & 3;
#pragma unroll
  for (int kx = 0; kx < 3; ++kx) {
    float* e = ep + (ky * 3 + kx) * 64 * EP + 16 * w + r8;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int c = 8 * n + 2 * j;
      e[c * EP] = d[kx][4 * n];
      e[(c + 1) * EP] = d[kx][4 * n + 1];
      e[c * EP + 8] = d[kx][4 * n + 2];
      e[(c + 1) * EP + 8] = d[kx][4 * n + 3];
    }
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(FTHREADS) : "memory");  // (the 3 warpgroups; not filter16's producer)
  float* out = a.out + (size_t)split * a.split_stride + ci0;
  for (int v = t; v < 9 * 64 * 16; v += FTHREADS) {  // (tap, co, 4 channels)
    const int tap = v / (64 * 16), co = (v / 16) % 64, c4 = v % 16;
    const float4 x = *reinterpret_cast<const float4*>(ep + (tap * 64 + co) * EP + 4 * c4);
    *reinterpret_cast<float4*>(out + ((size_t)(co0 + co) * 9 + tap) * a.Ci + 4 * c4) = x;
  }
}
template <int WB>
__global__ void __launch_bounds__(FTHREADS, 1)
    filter_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap dymap, const FArgs a) {
  pdl_entry();
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (saddr(smem_raw) + 1023) & ~1023u;
  constexpr int R = FK / WB, PW = WB + 2;  // tile rows; the input tile's row pitch in pixels
  constexpr int FSTAGES = fstages<WB>();
  constexpr uint32_t xa = xatom<WB>(), stage = 2 * xa + 2 * DY_BYTES;
  const uint32_t dyt = base + FSTAGES * stage, full = dyt + 4 * DY_BYTES;  // the 2 transposed dy, barriers
  float* ntab = reinterpret_cast<float*>(smem_raw + (full + 64 - saddr(smem_raw)));  // the norm's, 3 x 64
  const int split = blockIdx.x, ci0 = blockIdx.y * 64, co0 = blockIdx.z * 64;
  const int kb0 = split * a.per, nkb = min(a.per, a.KB - kb0);
  const int xtiles = a.W / WB, per_img = (a.H / R) * xtiles;
  const int t = threadIdx.x;
  constexpr unsigned bytes = 2 * PW * (R + 2) * ROW + 2 * DY_BYTES;
  auto load = [&](int i) {  // K block kb0 + i into its stage (thread 0)
    const int s = i % FSTAGES;
    const KTile k = ktile<WB>(kb0 + i, xtiles, per_img);
    const uint32_t dst = base + s * stage;
    mbar_expect_tx(full + 8 * s, bytes);
    for (int c = 0; c < 2; ++c) {
      tma4(dst + c * xa, &xmap, full + 8 * s, ci0 + 32 * c, k.x0 - 1, k.y0 - 1, k.b);
      tma4(dst + 2 * xa + c * DY_BYTES, &dymap, full + 8 * s, co0 + 32 * c, k.x0, k.y0, k.b);
    }
  };
  if (t == 0) {
    for (int s = 0; s < FSTAGES; ++s) mbar_init(full + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int i = 0; i < FSTAGES && i < nkb; ++i) load(i);
  }
  __syncthreads();
  const int ky = t >> 7, w = (t >> 5) & 3, l = t & 31, r8 = l >> 2, j = l & 3;
  // This thread's A rows: channels 16 w + r8 (+ 8), in atom w / 2, swizzle chunks ch0 and ch0 + 2.
  // Its pixels at (k-step ks, hh, kx) sit at tile row T + C, T = ky PW + 2 j for the thread and C
  // a constant of the unrolled loops; the swizzle XORs the chunk with (T + C) % 8, so the 8 offsets
  // of each chunk are computed once: every load is then one register plus an immediate.
  const int ch0 = ((16 * (w & 1) + r8) >> 2), T = ky * PW + 2 * j;
  const uint32_t athread = (uint32_t)(w >> 1) * xa + ((r8 & 3) << 2) + T * ROW;  // from the stage's start
  // (ch1 = ch0 ^ 2, and nothing else sets address bits 4-6: the + 8 rows' address is the other's ^ 32)
  uint32_t sw[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) sw[m] = (uint32_t)((ch0 ^ ((T + m) & 7)) << 4);
  float d[3][32];
#pragma unroll
  for (int k = 0; k < 3; ++k)
#pragma unroll
    for (int i = 0; i < 32; ++i) d[k][i] = 0.f;
  // dy's column sums of image cimg so far (this thread's 4 output channels), flushed when the
  // image changes and at the end (by all 256 transposing threads at once): the 4 lanes of a warp
  // that share the channels (lanes 8 q + 2 ((c - q) & 3) + h, q < 4, for lane 2 c + h) are added
  // in q order into the q = 0 lane, which writes slot 2 (warp / 4) + h (FILTER_SLOTS a split and
  // image: warps w and w + 4 transpose the same channels).
  const bool sums = a.csum != nullptr && blockIdx.y == 0 && t < 256;
  float cs[4] = {0.f, 0.f, 0.f, 0.f};
  int cimg = -1;
  auto flush_sums = [&]() {
    if (cimg < 0) return;
    const int lane = t & 31, q = lane >> 3, li = lane & 7;
#pragma unroll
    for (int p = 1; p < 4; ++p) {
      const int src = 8 * p + 2 * (((li >> 1) - p) & 3) + (li & 1);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float o = __shfl_sync(0xffffffffu, cs[c], src);
        if (q == 0) cs[c] += o;
      }
    }
    if (q == 0) {
      const int w = t >> 5, cq = 2 * (li >> 1) + (w & 1) + 8 * ((w >> 1) & 1);
      const int s = cimg - filter_first_img(split, a.per, per_img) + split * a.imgs;
      *reinterpret_cast<float4*>(a.csum + ((size_t)s * FILTER_SLOTS + 2 * (w >> 2) + (li & 1)) * a.Co + co0 +
                                 4 * cq) = make_float4(cs[0], cs[1], cs[2], cs[3]);
    }
    cs[0] = cs[1] = cs[2] = cs[3] = 0.f;
  };
  // dy of K block i (its stage) -> dyt[i & 1] [64 co][64 K positions], rounded, as 4 x 4 blocks
  // (threads < 256): pixels 8 g + h + 2 e (e < 4) are K positions 8 g + 4 h + e. The blocks of each
  // 8 lanes (a phase of a 16-byte access) are chosen so that both their loads and their stores fall
  // in 8 distinct 16-byte bank groups: h = i % 2, g % 4 = i / 2 and co / 8 = 2 ((i / 2 + ua) % 4)
  // + ub (lane i of the phase; ua, ub, uc, ug: the phase's number).
  auto transpose = [&](int i) {
    const int s = i % FSTAGES;
    mbar_wait(full + 8 * s, (i / FSTAGES) & 1);
    const uint32_t dys = base + s * stage + 2 * xa, dt = dyt + (i & 1) * 2 * DY_BYTES;
    const int li = t & 7, u = t >> 3;
    const int h = li & 1, g = ((li >> 1) & 3) + 4 * ((u >> 4) & 1);
    const int cq = 2 * (((li >> 1) + u) & 3) + ((u >> 2) & 1) + 8 * ((u >> 3) & 1);
    const int co = 4 * cq, atom = co >> 5, chunk = (co & 31) >> 2;
    float v[4][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int px = 8 * g + h + 2 * e;
      const uint32_t ad = dys + atom * DY_BYTES + px * ROW + ((chunk ^ (px & 7)) << 4);
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(v[e][0]), "=f"(v[e][1]), "=f"(v[e][2]), "=f"(v[e][3])
                   : "r"(ad));
    }
    if (sums) {  // (before the rounding: the sums of dy as stored)
      const int b = ktile<WB>(kb0 + i, xtiles, per_img).b;
      if (b != cimg) {
        flush_sums();
        cimg = b;
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) cs[c] += (v[0][c] + v[1][c]) + (v[2][c] + v[3][c]);
    }
    const int kp = 8 * g + 4 * h, katom = kp >> 5, kchunk = (kp & 31) >> 2;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int row = co + c;
      const uint32_t ad = dt + katom * DY_BYTES + row * ROW + ((kchunk ^ (row & 7)) << 4);
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(ad), "f"(tf32_rna(v[0][c])),
                   "f"(tf32_rna(v[1][c])), "f"(tf32_rna(v[2][c])), "f"(tf32_rna(v[3][c]))
                   : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the wgmma's reads
  };
  // With a norm of x: warpgroup 2 applies it to block i's input tile in place (beside the others'
  // transposes; its coefficients anew where the block's image changes).
  int nimg = -1;
  auto normalize = [&](int i) {
    const int s = i % FSTAGES, u = t - 256;
    const KTile k = ktile<WB>(kb0 + i, xtiles, per_img);
    mbar_wait(full + 8 * s, (i / FSTAGES) & 1);
    if (k.b != nimg) {  // (every thread of the warpgroup sees the same b)
      norm_coefs(ntab, 64, a.nrm, k.b, ci0, a.Ci, u);
      asm volatile("bar.sync 1, 128;\n" ::: "memory");  // (id 1 again in filter_store, after the loop)
      nimg = k.b;
    }
    norm_tile<PW, R + 2>(base + s * stage, 2, xa, k.y0, k.x0, a.H, a.W, ntab, 64, a.nrm.silu, u, 128);
  };
  const bool nrm = a.nrm.gamma != nullptr;
  if (nkb > 0 && t < 256) transpose(0);
  if (nkb > 0 && t >= 256 && nrm) normalize(0);
  __syncthreads();
  for (int i = 0; i < nkb; ++i) {
    const int s = i % FSTAGES;
    const uint32_t xs = base + s * stage, dt = dyt + (i & 1) * 2 * DY_BYTES;
    // Warpgroup 2 did not wait for the stage in transpose(): the wait (for a phase complete by
    // now, so it returns at once) is what makes the copy engine's writes visible to its reads.
    if (t >= 256) mbar_wait(full + 8 * s, (i / FSTAGES) & 1);
    uint32_t xp[8];  // (32-bit shared addresses: half the registers of generic pointers)
#pragma unroll
    for (int m = 0; m < 8; ++m) xp[m] = xs + athread + sw[m];
    uint32_t av[2][3][4];  // A fragments of the even and odd k-steps
#pragma unroll
    for (int ks = 0; ks < FK / 8; ++ks) {
      uint32_t(&A)[3][4] = av[ks & 1];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {  // pixels 8 ks + 2 j (a0, a1) and + 1 (a2, a3)
#pragma unroll
        for (int kx = 0; kx < 3; ++kx) {
          const int C = (8 * ks / WB) * PW + (8 * ks) % WB + hh + kx;
          float lo, hi;
          const uint32_t ad = xp[C & 7] + C * ROW;
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(lo) : "r"(ad));
          asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(hi) : "r"(ad ^ 32));
          A[kx][2 * hh] = __float_as_uint(tf32_rna(lo));
          A[kx][2 * hh + 1] = __float_as_uint(tf32_rna(hi));
        }
      }
      wg_fence();
      const uint64_t bd = sdesc(dt + (ks >> 2) * DY_BYTES + 32 * (ks & 3));
#pragma unroll
      for (int kx = 0; kx < 3; ++kx) wgmma_rs64(d[kx], A[kx], bd);
      wg_commit();
      // The next block's dy beside the last wgmma's (into the other dyt, whose readers were drained
      // at the end of the previous block).
      if (ks == FK / 8 - 1 && i + 1 < nkb) {
        if (t < 256) transpose(i + 1);
        else if (nrm) normalize(i + 1);
      }
      wg_wait<1>();  // (ptxas keeps an in-flight wgmma's A registers from reuse until it is done)
    }
    // Drained per K block (wgmma's still reading registers across the loop's back edge made ptxas
    // serialize them all, C7515); then every warpgroup is done with the stage and this dyt, and the
    // next dyt is complete.
    wg_wait<0>();
    __syncthreads();
    if (t == 0 && i + FSTAGES < nkb) load(i + FSTAGES);
  }
  if (sums) flush_sums();
  filter_store(d, ep_of(smem_raw, base), a, split, ci0, co0, t);
#endif
}
// ---- the bf16 filter gradient: filter_kernel's blocks, K blocks and splits, but both operands
// straight from the NHWC tiles in shared memory: 16-bit wgmma reads an operand MN-major (its M or
// N contiguous, K the rows), and an NHWC pixel is a 128-byte row of 64 channels, so x's tile is A
// (M = 64 input channels, K = pixels) and dy's is B (N = 64 output channels) as the copy engine
// wrote them, no transposes and no registers; a tap is the A tile read from a shifted start row
// (any 128-byte row: the swizzle follows the address bits, as in halo_kernel). A k-step is 16
// pixels of one image row (at width 8 of two: the second group of 8 K rows one padded row on, its
// descriptor's group stride). 3 warpgroups (one per filter row) and a producer warp that refills a
// stage once all three have read it ("empty"), 4 stages ahead; each warpgroup keeps one K block's
// wgmma's in flight while it issues the next. H100, seed64 bf16 step
// against cuDNN's filter gradients (same run): 7.81 / 7.81 / 7.83 vs 7.92 / 7.93 / 7.91 ms (with a
// drain and a block barrier per K block instead of the producer warp: at par, 7.87 / 7.92); 66
// blocks as in tf32 (132: 8.03, 100: 7.95, 44: 7.94). Width 8 too (the 8x8 level): 7.81 / 7.81 /
// 7.81 vs 7.85 / 7.85 / 7.84 without it, 7.90 / 7.90 / 7.91 with cuDNN's (same run). Not kept: as
// many stages as the epilogue's room holds (6 at widths 16 and 32, 7 at 8): 7.92 / 7.92 / 7.93 vs
// 7.90 / 7.89 / 7.90 ms (same run, a slower H100).
constexpr int F16_STAGES = 4, F16_THREADS = FTHREADS + 32;
template <int WB>
constexpr int filter16_smem() {
  constexpr int stages = F16_STAGES * (int)(xatom<WB>() + FK * ROW);
  return (stages > EP_BYTES ? stages : EP_BYTES) + 16 * F16_STAGES + 1024;
}
// D[64 ci x 64 co] += A B^T, k16, both MN-major bf16 in shared memory.
__device__ __forceinline__ void wgmma_mn64(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_R32 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : WG_ACC32(d)
      : "l"(a), "l"(b), "r"(1));
}
template <int WB>
__global__ void __launch_bounds__(F16_THREADS, 1)
    filter16_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap dymap,
                    const FArgs a) {
  pdl_entry();
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (saddr(smem_raw) + 1023) & ~1023u;
  constexpr int R = FK / WB, PW = WB + 2;
  constexpr uint32_t xa = xatom<WB>(), stage = xa + FK * ROW;
  constexpr int SB = F16_STAGES * (int)stage;
  const uint32_t full = base + (SB > EP_BYTES ? SB : EP_BYTES), empty = full + 8 * F16_STAGES;
  const int split = blockIdx.x, ci0 = blockIdx.y * 64, co0 = blockIdx.z * 64;
  const int kb0 = split * a.per, nkb = min(a.per, a.KB - kb0);
  const int t = threadIdx.x, ky = t >> 7;
  if (t == 0) {
    for (int s = 0; s < F16_STAGES; ++s) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 3);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (t >= FTHREADS) {  // the producer warp (its first thread)
    if (t == FTHREADS) {
      const int xtiles = a.W / WB, per_img = (a.H / R) * xtiles;
      for (int i = 0; i < nkb; ++i) {
        const int s = i % F16_STAGES;
        const KTile k = ktile<WB>(kb0 + i, xtiles, per_img);
        const uint32_t dst = base + s * stage;
        if (i >= F16_STAGES) mbar_wait(empty + 8 * s, ((i / F16_STAGES) - 1) & 1);
        mbar_expect_tx(full + 8 * s, PW * (R + 2) * ROW + FK * ROW);
        tma4(dst, &xmap, full + 8 * s, ci0, k.x0 - 1, k.y0 - 1, k.b);
        tma4(dst + xa, &dymap, full + 8 * s, co0, k.x0, k.y0, k.b);
      }
    }
    return;
  }
  float d[3][32];
#pragma unroll
  for (int k = 0; k < 3; ++k)
#pragma unroll
    for (int i = 0; i < 32; ++i) d[k][i] = 0.f;
  for (int i = 0; i < nkb; ++i) {
    const int s = i % F16_STAGES;
    mbar_wait(full + 8 * s, (i / F16_STAGES) & 1);
    const uint32_t xs = base + s * stage, dys = xs + xa;
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < FK / 16; ++ks) {  // 16 pixels of image row 16 ks / WB from column 16 ks % WB
      // (at width 8, image rows 2 ks and 2 ks + 1: the second group of 8 K rows one padded row on)
      const int row = (WB == 8 ? 2 * ks + ky : 16 * ks / WB + ky) * PW + (WB == 8 ? 0 : (16 * ks) % WB);
      const uint64_t bd = sdesc(dys + 16 * ks * ROW);
#pragma unroll
      for (int kx = 0; kx < 3; ++kx) wgmma_mn64(d[kx], sdesc(xs + (row + kx) * ROW, WB == 8 ? PW * ROW : 1024), bd);
    }
    wg_commit();
    wg_wait<1>();  // the previous block's are done: its stage may be refilled
    if (i > 0 && (t & 127) == 0) mbar_arrive(empty + 8 * ((i - 1) % F16_STAGES));
  }
  wg_wait<0>();
  asm volatile("bar.sync 1, %0;\n" ::"n"(FTHREADS) : "memory");  // (all wgmma's done with the stages)
  filter_store(d, ep_of(smem_raw, base), a, split, ci0, co0, t);
#endif
}
// A K block's tile: wb = min(W, 64) pixels (8, 16, 32 or 64) x 64 / wb rows; 0 where the shape
// does not tile that way.
int filter_wb(const Geo& g) {
  const int wb = std::min(g.W, FK);
  return (wb == 8 || wb == 16 || wb == 32 || wb == 64) && g.W % wb == 0 && g.H % (FK / wb) == 0 ? wb : 0;
}
template <int WB>
constexpr int filter_smem() {
  return fstages<WB>() * (2 * (int)xatom<WB>() + 2 * DY_BYTES + 8) + 4 * DY_BYTES + 1024 + 64 + 3 * 64 * 4;
}
// Splits: about 66 blocks, half an H100's SMs, whatever the GPU (so the sums' order, and bits,
// depend on the shape alone). The filter gradients run on the side lane beside the main lane's
// kernels, which the other half keeps free; fewer splits also mean fewer partial sums to add.
// Measured (tf32 step, H100, same run): 264 / 200 / 132 / 100 / 80 / 66 / 52 / 44 / 33 blocks:
// 14.00 / 13.67 / 13.29 / 13.02 / 12.93 / 12.87 / 13.18 / 13.76 / 14.70 ms.
int filter_splits(const Geo& g, int& per) {
  const int KB = (int)(g.M() / FK), blocks = (g.Ci / 64) * (g.Co / 64);
  const int want = std::max(1, std::min(KB, (66 + blocks / 2) / blocks));
  per = (KB + want - 1) / want;
  return (KB + per - 1) / per;
}
// tf32 (filter_kernel, the norm of x too) and bf16 (filter16_kernel, no norm).
bool filter_ok(const ConvBwdFilter& o, const CudaCtx& c) {
  const bool bf = c.prec == Precision::BF16;
  if (!((c.prec == Precision::TF32 || bf) && o.stride == 1 && o.dw.defined() &&
        typed(elt(c.prec), {&o.x, &o.dy}) && o.dw.dtype == DType::F32 && o.dw.dim[1] == 3 && o.dw.dim[2] == 3 &&
        same_size(o.x, o.dy) && !(bf && o.norm.on())))
    return false;
  if ((o.db.defined() || o.demb.defined()) && !rowblock::column_sums_fit(o.dy)) return false;
  const Geo g = filter_geo(o);
  const int wb = filter_wb(g);
  return common_ok(c, g) && g.Ci % 64 == 0 && g.Co % 64 == 0 && wb > 0;
}
template <int WB>
void launch_filter(CudaCtx& ctx, dim3 grid, const CUtensorMap& xmap, const CUtensorMap& dymap, const FArgs& fa) {
  if (ctx.prec == Precision::BF16) {
    static const bool attr16 = (allow_dynamic_smem(filter16_kernel<WB>, filter16_smem<WB>()), true);
    (void)attr16;
    filter16_kernel<WB><<<grid, F16_THREADS, filter16_smem<WB>(), ctx.stream>>>(xmap, dymap, fa);
    return;
  }
  static const bool attr = (allow_dynamic_smem(filter_kernel<WB>, filter_smem<WB>()), true);
  (void)attr;
  filter_kernel<WB><<<grid, FTHREADS, filter_smem<WB>(), ctx.stream>>>(xmap, dymap, fa);
}
// After filter_kernel, one launch: blocks [0, nsplit) add the S splits' slices of dw (sum_splits'
// loop and order), the next (Co + 31) / 32 blocks dy's column sums from FArgs::csum when given:
// per_sample [B, Co] and total [Co], each optional, in double in a fixed order (a block: 32
// channels x 8 image rows). One launch rather than two on the side lane's chain.
__global__ void __launch_bounds__(256)
    filter_finish_kernel(const float* __restrict__ part, int S, size_t n4, float* __restrict__ dw, int nsplit,
                         const float* __restrict__ csum, int B, int Co, int per, int per_img, int imgs,
                         float* __restrict__ per_sample, float* __restrict__ total) {
  pdl_entry();
  if ((int)blockIdx.x < nsplit) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n4; j += (size_t)nsplit * blockDim.x) {
      reinterpret_cast<float4*>(dw)[j] = sum_slices(part, S, n4, j);
    }
    return;
  }
  __shared__ double red[8][32];
  const int tx = threadIdx.x & 31, r = threadIdx.x >> 5, co = (blockIdx.x - nsplit) * 32 + tx;
  double tot = 0.0;
  if (co < Co)
    for (int b = r; b < B; b += 8) {
      const int s0 = b * per_img / per, s1 = min(S - 1, ((b + 1) * per_img - 1) / per);
      double v = 0.0;
      for (int s = s0; s <= s1; ++s) {
        const float* q = csum + (size_t)(s * imgs + b - filter_first_img(s, per, per_img)) * FILTER_SLOTS * Co + co;
        float f[FILTER_SLOTS];
#pragma unroll
        for (int k = 0; k < FILTER_SLOTS; ++k) f[k] = q[(size_t)k * Co];
#pragma unroll
        for (int k = 0; k < FILTER_SLOTS; ++k) v += f[k];
      }
      if (per_sample) per_sample[(size_t)b * Co + co] = (float)v;
      tot += v;
    }
  red[r][tx] = tot;
  __syncthreads();
  if (r != 0 || co >= Co || !total) return;
  for (int k = 1; k < 8; ++k) tot += red[k][tx];
  total[co] = (float)tot;
}
// tf32 gives the bias and embedding gradients from its transposes (filter_kernel's csum) instead
// of a column-sum pass over dy (rowblock::column_sums; bf16's kernel transposes nothing). H100,
// seed64 tf32 step, same run, the orders alternated: 12.590 ms (mean of 6) against 12.647 with the
// pass, each of the 6 pairs lower.
bool fused_sums(const ConvBwdFilter& o, const CudaCtx& c) {
  return c.prec == Precision::TF32 && (o.db.defined() || o.demb.defined());
}
// K blocks an image holds.
int filter_per_img(const Geo& g) { return (int)((long long)g.H * g.W / FK); }
// Images a split's K blocks can touch (the column sums' slots per split).
int filter_imgs(const Geo& g, int per) {
  return std::min(g.B, (per - 1) / filter_per_img(g) + 2);
}
size_t split_bytes(const ConvBwdFilter& o, int splits) {
  return splits > 1 ? round256((size_t)splits * o.dw.numel() * 4) : 0;
}
size_t filter_ws(const ConvBwdFilter& o, const CudaCtx& c) {
  int per = 0;
  const Geo g = filter_geo(o);
  const int splits = filter_splits(g, per);
  const size_t sums =
      fused_sums(o, c) ? round256((size_t)splits * filter_imgs(g, per) * FILTER_SLOTS * g.Co * 4) : 0;
  return split_bytes(o, splits) + sums;
}
void conv_filter(const ConvBwdFilter& o, CudaCtx& ctx) {
  need_aligned("wgmma", {o.x.data, o.dy.data, o.dw.data, ctx.ws});
  const bool sums = fused_sums(o, ctx);
  if (!sums) rowblock::column_sums(ctx, o.dy, o.demb, o.db);
  const Geo g = filter_geo(o);
  int per = 0;
  const int splits = filter_splits(g, per), wb = filter_wb(g);
  float* csum = sums ? reinterpret_cast<float*>(static_cast<char*>(ctx.ws) + split_bytes(o, splits)) : nullptr;
  const int imgs = filter_imgs(g, per);
  CUtensorMap xmap, dymap;
  const Geo gy{g.B, g.H, g.W, g.Co, g.Co, 3};
  if (ctx.prec == Precision::BF16) {  // (one 64-channel box: a 128-byte pixel row)
    encode_x<bf16>(&xmap, o.x.data, g, wb + 2, FK / wb + 2, 1);
    encode_x<bf16>(&dymap, o.dy.data, gy, wb, FK / wb, 1);
  } else {
    encode_x<float>(&xmap, o.x.data, g, wb + 2, FK / wb + 2, 1);
    encode_x<float>(&dymap, o.dy.data, gy, wb, FK / wb, 1);
  }
  const size_t n = (size_t)o.dw.numel();  // (slices n floats apart, as sum_splits reads them)
  const FArgs fa{splits > 1 ? static_cast<float*>(ctx.ws) : dptr<float>(o.dw),
                 n,
                 g.Ci,
                 g.H,
                 g.W,
                 (int)(g.M() / FK),
                 per,
                 norm_args(o.norm),
                 csum,
                 g.Co,
                 imgs};
  const dim3 grid(splits, g.Ci / 64, g.Co / 64);
  switch (wb) {
    case 64: launch_filter<64>(ctx, grid, xmap, dymap, fa); break;
    case 32: launch_filter<32>(ctx, grid, xmap, dymap, fa); break;
    case 16: launch_filter<16>(ctx, grid, xmap, dymap, fa); break;
    default: launch_filter<8>(ctx, grid, xmap, dymap, fa);
  }
  KERNEL_CHECK();
  const int nsplit = splits > 1 ? (int)grid_for(n / 4) : 0, ncsum = sums ? (g.Co + 31) / 32 : 0;
  if (nsplit + ncsum == 0) return;
  filter_finish_kernel<<<nsplit + ncsum, 256, 0, ctx.stream>>>(
      static_cast<const float*>(ctx.ws), splits, n / 4, dptr<float>(o.dw), nsplit, csum, g.B, g.Co, per,
      filter_per_img(g), imgs, dptr<float>(o.demb), dptr<float>(o.db));
  KERNEL_CHECK();
}

}  // namespace

// Last in the tables: only when forced (--kernels conv_fwd=wgmma, conv_fwd=wgmma_tap,
// conv_bwd_data=wgmma), as none of these beats cuDNN in the step yet (the top of this file).
void register_conv_wgmma(CudaOps& ops) {
  ops.variants<ConvFwd>().push_back({"wgmma", fwd_ok, conv_fwd, fwd_ws});
  ops.variants<ConvFwd>().push_back({"wgmma_tap", no_norm<ConvFwd, tap_ok>, conv_fwd_tap, fwd_ws});
  ops.variants<ConvBwdData>().push_back({"wgmma", data_ok, conv_data, data_ws});
}

// Ahead of cuDNN: the tf32 and bf16 filter gradients (the tops of filter_kernel and filter16_kernel),
// and wgmma_t's tf32 forwards and data gradients (above halo_t_kernel).
void register_conv_wgmma_first(CudaOps& ops) {
  ops.variants<ConvBwdFilter>().push_back({"wgmma", filter_ok, conv_filter, filter_ws});
  ops.variants<ConvFwd>().push_back({"wgmma_t", no_norm<ConvFwd, fwd_t_ok>, conv_fwd_t, fwd_ws});
  ops.variants<ConvBwdData>().push_back({"wgmma_t", data_t_ok, conv_data_t, data_ws});
}

}  // namespace unet
