// Convolution variant "mma": bf16 stride-1 3x3 and 1x1 forward convolutions as implicit GEMMs on
// the tensor cores (mma.sync m16n8k16, f32 accumulate), straight from NHWC. The first step of
// issue 10's own tensor-core convolution (the one that could apply GroupNorm + SiLU as it loads
// its input, which cuDNN cannot): the forward, with bias / embedding / residual in its epilogue.
//
//  * One GEMM tile per block: 128 output pixels x BN output channels (BN = 64: 4 warps, 128: 8),
//    64 x 32 per warp; K = (tap, input channel) in blocks of 32 channels of one tap (Ci % 32 == 0),
//    so a row of an A tile is 64 contiguous bytes of the row's shifted pixel, zero-filled by
//    cp.async outside the image.
//  * 4 shared-memory stages filled by cp.async (16 bytes a copy), rows of 16-byte chunks with the
//    chunk index XORed by the row, so that ldmatrix's 8 rows of one chunk hit 8 distinct bank
//    groups.
//  * The epilogue adds bias, embedding and residual to the f32 sums in that order (the other
//    variants' order) and stores bf16 pairs.
// Deterministic: every output's K sum is one thread's, in K order, whatever the GPU.
//
// Not chosen by default (registered last; --kernels conv_fwd=mma forces it): on the H100
// (2026-11-24, batch 32, CUDA events of graph replays) it is 1.5-3x slower than cuDNN's Hopper
// kernels, same runs (forward only): 64x64 64->64 58 us vs 34, 64x64 192->64 137 vs 85, 64x64
// 128->128 154 vs 71, 32x32 128->128 42 vs 22, 16x16 192->192 40 vs 20, 8x8 256->256 50 vs 11 (32
// blocks: no split K yet); the forward-only sampling pass of seed64 2.78 -> 4.50 ms with it.
// ncu at 64x64 64->64: the tensor pipe active 34% of cycles (cuDNN's wgmma kernel 40%, in 64% of
// the time), stalls mostly fixed-latency waits and ldmatrix->mma dependencies at 4 warps per
// scheduler. Measured and not kept (another run, where this kernel took 54 / 126 / 151 / 41 / 41
// / 50 us): K blocks of 64 channels (3 stages) 54 / 114 / 172 / 45 / 33 / 40 us; the next k16
// step's fragments loaded during this one's mma (190-226 registers, 2 blocks per SM) 61 us at
// 64x64 64->64; 256 x 64 tiles 62 us. What would close the
// gap is Hopper's own path (wgmma from shared-memory descriptors, TMA loads, warp-specialized
// producers), and split K for the 8x8 and 16x16 levels.
#include <cuda_bf16.h>

#include "cuda_engine.cuh"
#include "implicit_gemm.cuh"

namespace unet {

namespace {

using namespace igemm;

// Block tile: BM output pixels; K blocks of BK input channels of one tap; cp.async stages.
constexpr int BM = 128, BK = 32, STAGES = 4;

// Byte offset of 16-byte chunk c of row r in a [rows][BK] bf16 tile (64-byte rows), the chunk
// swizzled so that 8 consecutive rows' chunk c lie in 8 distinct 16-byte bank groups.
__device__ __forceinline__ uint32_t tile_off(int r, int c) { return (uint32_t)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4)); }

// y [M, N] = conv(x, w) (+ bias + emb + res): M = B*H*W output pixels, x [B, H, W, Ci], w [N, KS,
// KS, Ci], all bf16 but bias / emb (f32). Block tile BM x BN, warps of 64 x 32 (BM/64 x BN/32).
template <int BN, int KS>
__global__ void __launch_bounds__(BM * BN / 64, 512 / (BM * BN / 64))  // 16 warps per SM
    fwd_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y,
               const float* __restrict__ bias, const float* __restrict__ emb, const bf16* __restrict__ res, int B,
               int H, int W, int Ci, int N) {
  pdl_entry();
  constexpr int CH = BK / 8, NT = BM * BN / 64, LA = BM * CH / NT, LB = BN * CH / NT;
  constexpr int PAD = KS / 2, KK = BK / 16, WMS = BM / 64;
  constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
  extern __shared__ __align__(128) unsigned char smem[];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int wm = warp % WMS, wn = warp / WMS;  // warp tile: rows wm*64, columns wn*32
  const int HW = H * W, M = B * HW, Cb = Ci / BK, KB = KS * KS * Cb, K = KS * KS * Ci;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const uint32_t s0 = smem_u32(smem);

  // This thread's copies: A chunk (row, c) = t + l*NT, B chunk alike.
  const bf16* ap[LA];
  int ay[LA], ax[LA];
#pragma unroll
  for (int l = 0; l < LA; ++l) {
    const int q = t + l * NT, m = m0 + q / CH, mm = m < M ? m : 0, b = mm / HW, r = mm - b * HW;
    ay[l] = m < M ? r / W : -4 * H;  // past the last pixel: every tap out of the image
    ax[l] = r % W;
    ap[l] = x + (size_t)mm * Ci + (q % CH) * 8;
  }
  const bf16* bp[LB];
  bool bok[LB];
#pragma unroll
  for (int l = 0; l < LB; ++l) {
    const int q = t + l * NT, n = n0 + q / CH;
    bok[l] = n < N;
    bp[l] = w + (size_t)(bok[l] ? n : 0) * K + (q % CH) * 8;
  }
  auto load = [&](int kb, int st) {
    const int tap = kb / Cb, c0 = (kb - tap * Cb) * BK, dy = tap / KS - PAD, dx = tap % KS - PAD;
    const long off = (long)(dy * W + dx) * Ci + c0;
    const uint32_t sa = s0 + st * STAGE, sb = sa + A_BYTES;
#pragma unroll
    for (int l = 0; l < LA; ++l) {
      const int q = t + l * NT;
      const bool ok = (unsigned)(ay[l] + dy) < (unsigned)H && (unsigned)(ax[l] + dx) < (unsigned)W;
      cp16(sa + tile_off(q / CH, q % CH), ok ? ap[l] + off : x, ok);
    }
#pragma unroll
    for (int l = 0; l < LB; ++l) {
      const int q = t + l * NT;
      cp16(sb + tile_off(q / CH, q % CH), bp[l] + (size_t)kb * BK, bok[l]);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KB) load(s, s);
    cp_commit();
  }
  // ldmatrix lanes: A's 4 matrices are (rows +0/+8) x (k chunk +0/+1), B's (n +0/+8) x (k +0/+1).
  const int a_row = wm * 64 + (lane & 7) + ((lane >> 3) & 1) * 8, a_chunk = lane >> 4;
  const int b_row = wn * 32 + (lane & 7) + (lane >> 4) * 8, b_chunk = (lane >> 3) & 1;
  for (int kb = 0; kb < KB; ++kb) {
    cp_wait<STAGES - 2>();
    __syncthreads();  // stage kb is everyone's; stage kb-1 (refilled below) is read by no one
    if (kb + STAGES - 1 < KB) load(kb + STAGES - 1, (kb + STAGES - 1) % STAGES);
    cp_commit();
    const uint32_t sa = s0 + (kb % STAGES) * STAGE, sb = sa + A_BYTES;
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      uint32_t a[4][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) ldsm_x4(sa + tile_off(a_row + i * 16, kk * 2 + a_chunk), a[i]);
#pragma unroll
      for (int j = 0; j < 2; ++j) ldsm_x4(sb + tile_off(b_row + j * 16, kk * 2 + b_chunk), b[j]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t bj[2] = {b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]};
          mma_bf16(acc[i][j], a[i], bj);
        }
    }
  }
  cp_wait<0>();

  // Epilogue: thread holds rows g, g + 8 and columns 2 q, 2 q + 1 of each 16 x 8 tile.
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + wm * 64 + i * 16 + h * 8 + g;
      if (m >= M) continue;
      const size_t bi = (size_t)(m / HW);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n0 + wn * 32 + j * 8 + 2 * q;
        if (n >= N) continue;
        float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
        if (bias) v0 += bias[n], v1 += bias[n + 1];
        if (emb) v0 += emb[bi * N + n], v1 += emb[bi * N + n + 1];
        const size_t o = (size_t)m * N + n;
        if (res) {
          const float2 r = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(res + o));
          v0 += r.x, v1 += r.y;
        }
        *reinterpret_cast<__nv_bfloat162*>(y + o) = __floats2bfloat162_rn(v0, v1);
      }
    }
}

// Shared memory of a block with BN output channels: STAGES stages of bf16 A and B tiles.
constexpr size_t smem_bytes(int BN) { return (size_t)STAGES * (BM + BN) * BK * 2; }
// The block's output channels for Co (the launch's choice, which fwd_ok sizes).
inline bool wide_n(const Geo& g) { return g.Co > 64; }

bool fwd_ok(const ConvFwd& o, const CudaCtx& c) {
  if (c.prec != Precision::BF16 || o.stride != 1 || o.x.dtype != DType::BF16 || o.w.dtype != DType::BF16 ||
      o.y.dtype != DType::BF16 || (o.res.defined() && o.res.dtype != DType::BF16))
    return false;
  if (o.w.dim[1] != o.w.dim[2] || !same_size(o.x, o.y)) return false;
  const Geo g = fwd_geo(o);
  return device_smem_fits(smem_bytes(wide_n(g) ? 128 : 64)) && (g.KS == 1 || g.KS == 3) && g.Ci % BK == 0 &&
         g.Co % 8 == 0 && g.M() < (1LL << 31) && (long long)g.Co < 65535LL * 64 &&
         (!o.mean.defined() || groupnorm_stats_fit(o.y, o.mean));
}

template <int BN, int KS>
void launch(CudaCtx& ctx, const Geo& g, const ConvFwd& o) {
  constexpr int bytes = smem_bytes(BN);
  static const bool attr = (allow_dynamic_smem(fwd_kernel<BN, KS>, bytes), true);
  (void)attr;
  const dim3 grid((unsigned)((g.M() + BM - 1) / BM), (unsigned)((g.Co + BN - 1) / BN));
  fwd_kernel<BN, KS><<<grid, BM * BN / 64, bytes, ctx.stream>>>(
      dptr<bf16>(o.x), dptr<bf16>(o.w), dptr<bf16>(o.y), dptr<float>(o.bias), dptr<float>(o.emb), dptr<bf16>(o.res),
      g.B, g.H, g.W, g.Ci, g.Co);
  KERNEL_CHECK();
}

void conv_fwd(const ConvFwd& o, CudaCtx& ctx) {
  need_aligned("mma", {o.x.data, o.w.data, o.y.data, o.res.data});
  const Geo g = fwd_geo(o);
  if (g.KS == 3)
    wide_n(g) ? launch<128, 3>(ctx, g, o) : launch<64, 3>(ctx, g, o);
  else
    wide_n(g) ? launch<128, 1>(ctx, g, o) : launch<64, 1>(ctx, g, o);
  if (o.mean.defined()) groupnorm_stats(ctx, o.y, o.mean, o.rstd);
}

}  // namespace

// Registered last (after im2col, which takes every shape): chosen only when forced
// (--kernels conv_fwd=mma), until it is faster than cuDNN (see the top of this file).
void register_conv_mma(CudaOps& ops) { ops.variants<ConvFwd>().push_back({"mma", no_norm<ConvFwd, fwd_ok>, conv_fwd, nullptr}); }

}  // namespace unet
