// Convolution variant "simt": fp32 mode's (no tensor cores) stride-1 3x3 and 1x1 convolutions as
// implicit GEMMs on f32 FMAs — forward, data gradient and filter gradient — without a patch
// matrix.
//
// Why: in fp32 cuDNN 9 has only NCHW FMA engines for most of seed64's shapes, so each conv ran a
// transpose to NCHW and back around kernels at 15-35 TFLOP/s; on the H100 (2026-11-24, seed64
// batch 32) the fp32 step spent ~80 of its 92 ms of kernels in convolutions (wgrad 28 ms at ~17
// TFLOP/s, dgrad 23, fprop 14, layout transposes 7), against a 67 TFLOP/s FMA peak.
//
//  * One GEMM tile per block: BM x BN outputs, 8 x 8 per thread (the thread's rows at ty*4 + {0..3}
//    and BM/2 + ty*4 + {0..3}, columns alike, so its shared-memory reads are float4s that a warp
//    reads as broadcasts or consecutive words), K in blocks of 8 staged in two shared buffers:
//    the next block's global loads (float4, zero outside the image) are in flight while the
//    current block's 512 FMAs per thread run.
//  * Forward (conv form): rows are output pixels m = (b, y, x), columns output channels, K = (tap,
//    input channel); a K block is 8 channels of one tap, so the A tile is 8 consecutive channels
//    of each row's shifted pixel (Ci % 8 == 0). bias, embedding and residual are added in the
//    epilogue in f32, in the order of the other variants' epilogues.
//  * Data gradient: the forward form on dy with the filter rotated by 180 degrees and its
//    channel axes swapped (written to the workspace first: 9 Ci Co floats).
//  * Filter gradient: rows are output channels, columns (tap, input channel), K the B*H*W pixels,
//    split into S ranges (partials in the workspace, then added in range order) so that a
//    layer's few tiles fill the GPU.
//  * Small forwards split K as well when the tiles are fewer than two per SM.
// Deterministic: no atomics, fixed tiles and splits chosen from the shapes alone (not the GPU).
#include <cuda_pipeline.h>

#include <algorithm>

#include "cuda_engine.cuh"
#include "implicit_gemm.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

using namespace igemm;

constexpr int BK = 8;

__device__ __forceinline__ float4 zero4() { return make_float4(0.f, 0.f, 0.f, 0.f); }

// The 8 x 8 outer-product steps of one shared K block: acc[i][j] += A[k][row i] B[k][col j].
template <int BM, int BN>
__device__ __forceinline__ void mma_block(const float (*As)[BM + 4], const float (*Bs)[BN + 4], int ty, int tx,
                                          float (&acc)[8][8]) {
#pragma unroll
  for (int k = 0; k < BK; ++k) {
    const float4 a0 = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
    const float4 a1 = *reinterpret_cast<const float4*>(&As[k][BM / 2 + ty * 4]);
    const float4 b0 = *reinterpret_cast<const float4*>(&Bs[k][tx * 4]);
    const float4 b1 = *reinterpret_cast<const float4*>(&Bs[k][BN / 2 + tx * 4]);
    const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}
__device__ __forceinline__ void zero(float (&acc)[8][8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
}
__device__ __forceinline__ int row_of(int ty, int i, int half) { return (i < 4 ? 0 : half) + ty * 4 + (i & 3); }
// f(row, col, v) for the thread's 8 x 8 outputs as 16 float4s of 4 columns (rows < rows, cols <
// cols: the matrix's; cols % 4 == 0, so a float4 is all in or all out).
template <int BM, int BN, class F>
__device__ __forceinline__ void each_out(const float (&acc)[8][8], int ty, int tx, int r0, int c0, int rows, int cols,
                                         F&& f) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r0 + row_of(ty, i, BM / 2);
    if (r >= rows) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = c0 + h * (BN / 2) + tx * 4;
      if (c < cols) f(r, c, make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]));
    }
  }
}
// y [M, N] (+ bias + emb + res) or, split, part[z][M][N] = the K range's sums. M = B*H*W output
// pixels, x [B, H, W, Ci], w [N, KS, KS, Ci]; K blocks [z kbs, (z + 1) kbs).
template <int BM, int BN, int KS>
__global__ void __launch_bounds__(BM * BN / 64, 128 * 128 / (BM * BN) * 2)
    fwd_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
               const float* __restrict__ bias, const float* __restrict__ emb, const float* __restrict__ res, int B,
               int H, int W, int Ci, int N, int kbs, float* __restrict__ part) {
  pdl_entry();
  constexpr int T = BM * BN / 64, LA = 2 * BM / T, LB = 2 * BN / T, PAD = KS / 2;
  __shared__ __align__(16) float As[2][BK][BM + 4];
  __shared__ __align__(16) float Bs[2][BK][BN + 4];
  const int t = threadIdx.x, HW = H * W, M = B * HW;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int Cb = Ci / BK, KB = KS * KS * Cb, K = KS * KS * Ci;
  const int kb0 = blockIdx.z * kbs, kb1 = min(KB, kb0 + kbs);
  // A row l: its pixel's (y, x) (y = -H past the last row: every tap reads zeros) and address
  const float* ap[LA];
  int ay[LA], ax[LA];
#pragma unroll
  for (int l = 0; l < LA; ++l) {
    const int m = m0 + ((t + l * T) >> 1), mm = m < M ? m : 0, b = mm / HW, r = mm - b * HW;
    ay[l] = m < M ? r / W : -2 * H, ax[l] = r % W;
    ap[l] = x + (size_t)mm * Ci + ((t + l * T) & 1) * 4;
  }
  const float* bp[LB];
  bool bok[LB];
#pragma unroll
  for (int l = 0; l < LB; ++l) {
    const int q = t + l * T, n = n0 + (q >> 1);
    bok[l] = n < N;
    bp[l] = w + (size_t)(bok[l] ? n : 0) * K + (q & 1) * 4;
  }
  float4 ra[LA], rb[LB];
  auto load = [&](int kb) {
    const int tap = kb / Cb, c0 = (kb - tap * Cb) * BK, dy = tap / KS - PAD, dx = tap % KS - PAD;
    const int off = (dy * W + dx) * Ci + c0;
#pragma unroll
    for (int l = 0; l < LA; ++l) {
      const bool ok = (unsigned)(ay[l] + dy) < (unsigned)H && (unsigned)(ax[l] + dx) < (unsigned)W;
      ra[l] = ok ? ldg4(ap[l] + off) : zero4();
    }
#pragma unroll
    for (int l = 0; l < LB; ++l) rb[l] = bok[l] ? ldg4(bp[l] + kb * BK) : zero4();
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int l = 0; l < LA; ++l) {
      const int q = t + l * T, row = q >> 1, k4 = (q & 1) * 4;
      As[buf][k4][row] = ra[l].x, As[buf][k4 + 1][row] = ra[l].y;
      As[buf][k4 + 2][row] = ra[l].z, As[buf][k4 + 3][row] = ra[l].w;
    }
#pragma unroll
    for (int l = 0; l < LB; ++l) {
      const int q = t + l * T, row = q >> 1, k4 = (q & 1) * 4;
      Bs[buf][k4][row] = rb[l].x, Bs[buf][k4 + 1][row] = rb[l].y;
      Bs[buf][k4 + 2][row] = rb[l].z, Bs[buf][k4 + 3][row] = rb[l].w;
    }
  };
  float acc[8][8];
  zero(acc);
  const int tx = t % (BN / 8), ty = t / (BN / 8);
  if (kb0 < kb1) {
    load(kb0);
    store(0);
  }
  __syncthreads();
  for (int kb = kb0; kb < kb1; ++kb) {
    const int buf = (kb - kb0) & 1;
    if (kb + 1 < kb1) load(kb + 1);
    mma_block<BM, BN>(As[buf], Bs[buf], ty, tx, acc);
    if (kb + 1 < kb1) store(buf ^ 1);
    __syncthreads();
  }
  float* out = part ? part + (size_t)blockIdx.z * M * N : y;
  each_out<BM, BN>(acc, ty, tx, m0, n0, M, N, [&](int m, int n, float4 v) {
    const size_t o = (size_t)m * N + n;
    if (!part) add_terms(v, bias, emb, res, n, (size_t)(m / HW), N, o);
    *reinterpret_cast<float4*>(out + o) = v;
  });
}

// dW [Co, KS*KS*Ci] (or part[z][Co][KS*KS*Ci]) = dy^T patches(x) over the pixel range
// [z mbs, (z + 1) mbs) * 8: rows are output channels, columns (tap, input channel). Both tiles
// are rows of 8 pixels as stored (channels contiguous), so they go to shared memory untransposed
// by cp.async, kStages K blocks in flight (its operands stream from L2, no reuse in L1); with no
// staging registers the 64-wide tiles stopped spilling (H100, 64x64 64->64 batch 32: 621 -> 545
// us per launch; 128x128 tiles the same).
constexpr int kStages = 3;
template <int BM, int BN, int KS>
__global__ void __launch_bounds__(BM * BN / 64, 128 * 128 / (BM * BN) * 2)
    wgrad_kernel(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ out, int B, int H,
                 int W, int Ci, int Co, int mbs) {
  pdl_entry();
  constexpr int T = BM * BN / 64, LA = 2 * BM / T, LB = 2 * BN / T, PAD = KS / 2;
  __shared__ __align__(16) float As[kStages][BK][BM + 4];
  __shared__ __align__(16) float Bs[kStages][BK][BN + 4];
  const int t = threadIdx.x, HW = H * W, M = B * HW, NN = KS * KS * Ci;
  const int c0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int MB = (M + BK - 1) / BK, mb0 = blockIdx.z * mbs, mb1 = min(MB, mb0 + mbs);
  // A (dy): pixel ak of the block, channels ac .. +4; B (x): pixel bk, columns bn .. +4 = tap
  // (bdy, bdx), channels bci .. +4, the pixel tracked as (b, y, x) and advanced 8 per block.
  int ak[LA], ac[LA], bk[LB], bn[LB], bdy[LB], bdx[LB], bci[LB], bb[LB], by[LB], bx[LB];
#pragma unroll
  for (int l = 0; l < LA; ++l) {
    const int q = t + l * T;
    ak[l] = q / (BM / 4), ac[l] = (q % (BM / 4)) * 4;
  }
#pragma unroll
  for (int l = 0; l < LB; ++l) {
    const int q = t + l * T;
    bk[l] = q / (BN / 4), bn[l] = (q % (BN / 4)) * 4;
    const int nn = n0 + bn[l] < NN ? n0 + bn[l] : 0, tap = nn / Ci;
    bci[l] = nn - tap * Ci, bdy[l] = tap / KS - PAD, bdx[l] = tap % KS - PAD;
    const int m = mb0 * BK + bk[l], b = m / HW, r = m - b * HW;
    bb[l] = b, by[l] = r / W, bx[l] = r % W;
  }
  // Issues K block mb into stage st (blocks in order: the B pixels advance); zeros outside.
  auto issue = [&](int mb, int st) {
#pragma unroll
    for (int l = 0; l < LA; ++l) {
      const int m = mb * BK + ak[l];
      const bool ok = m < M && c0 + ac[l] < Co;
      __pipeline_memcpy_async(&As[st][ak[l]][ac[l]], ok ? dy + (size_t)m * Co + c0 + ac[l] : dy, 16, ok ? 0 : 16);
    }
#pragma unroll
    for (int l = 0; l < LB; ++l) {
      const int iy = by[l] + bdy[l], ix = bx[l] + bdx[l];
      const bool ok = bb[l] < B && n0 + bn[l] < NN && (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
      __pipeline_memcpy_async(&Bs[st][bk[l]][bn[l]], ok ? x + (((size_t)bb[l] * H + iy) * W + ix) * Ci + bci[l] : x,
                              16, ok ? 0 : 16);
      bx[l] += BK;
      while (bx[l] >= W) bx[l] -= W, ++by[l];
      while (by[l] >= H) by[l] -= H, ++bb[l];
    }
  };
  float acc[8][8];
  zero(acc);
  const int tx = t % (BN / 8), ty = t / (BN / 8);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (mb0 + st < mb1) issue(mb0 + st, st);
    __pipeline_commit();
  }
  for (int mb = mb0; mb < mb1; ++mb) {
    __pipeline_wait_prior(kStages - 2);  // block mb has landed (this thread's copies)
    __syncthreads();                     // everyone's, and everyone is done with block mb - 1
    const int nxt = mb + kStages - 1;
    if (nxt < mb1) issue(nxt, (nxt - mb0) % kStages);
    __pipeline_commit();
    const int st = (mb - mb0) % kStages;
    mma_block<BM, BN>(As[st], Bs[st], ty, tx, acc);
  }
  float* o = out + (size_t)blockIdx.z * Co * NN;
  each_out<BM, BN>(acc, ty, tx, c0, n0, Co, NN,
                   [&](int c, int n, float4 v) { *reinterpret_cast<float4*>(o + (size_t)c * NN + n) = v; });
}

// ---- tiles and splits, from the shapes alone ----
// A block of BM x BN / 64 threads holds 128 registers per thread, so an SM keeps 16 warps of any
// tile: 2 blocks of 128x128, 4 of 128x64 or 64x128, 8 of 64x64. The choice minimises a time
// model: whole waves of resident blocks (a 1.09-wave launch takes two waves' time: the first
// rule, "the largest tile with a wave of blocks", ran wgrad at 20 TFLOP/s), each block's FMAs at
// ~45 TFLOP/s over the GPU (smaller tiles a little slower: more loads per FMA), and for a split
// K its partial sums written and read again at ~2.5 TB/s plus a launch.
constexpr int kSMs = 132;  // fixed (not the GPU's): the summation order must not depend on the GPU
struct Cfg {
  int bm = 128, bn = 128, S = 1;
};
Cfg choose(long long rows, long long cols, long long kblocks) {
  static const int opts[4][2] = {{128, 128}, {128, 64}, {64, 128}, {64, 64}};
  Cfg best;
  double best_t = 1e30;
  for (const auto& o : opts) {
    const long long n = ((rows + o[0] - 1) / o[0]) * ((cols + o[1] - 1) / o[1]);
    const long long slots = (long long)kSMs * 16 / (o[0] * o[1] / 64 / 32);
    const double pref = o[0] * o[1] == 128 * 128 ? 1.0 : o[0] * o[1] == 128 * 64 ? 0.95 : 0.88;
    const double block_rate = 45e12 * pref / slots;  // FLOP/s of one resident block
    const long long smax = std::max<long long>(1, std::min<long long>(kblocks / 16, 64));
    for (long long S = 1; S <= smax; ++S) {
      const long long waves = (n * S + slots - 1) / slots;
      double t = waves * (2.0 * o[0] * o[1] * ((kblocks + S - 1) / S) * BK) / block_rate;
      if (S > 1) t += S * (double)rows * cols * 8 / 2.5e12 + 3e-6;
      if (t < best_t * (1 - 1e-6)) best_t = t, best = Cfg{o[0], o[1], (int)S};
    }
  }
  return best;
}

bool geo_ok(const Geo& g) {
  return (g.KS == 1 || g.KS == 3) && g.Ci % 8 == 0 && g.Co % 4 == 0 && g.Ci > 0 && g.Co > 0 &&
         g.M() * std::max(g.Ci, g.Co) * g.KS * g.KS < (1LL << 31);
}
bool mode_ok(const CudaCtx& c) { return c.prec == Precision::FP32; }

Cfg fwd_cfg(const Geo& g) { return choose(g.M(), g.Co, (long long)g.KS * g.KS * g.Ci / BK); }
Cfg wgrad_cfg(const Geo& g) { return choose(g.Co, (long long)g.KS * g.KS * g.Ci, (g.M() + BK - 1) / BK); }

template <class F>
void with_tile(const Cfg& c, F&& f) {
  if (c.bm == 128 && c.bn == 128) f(std::integral_constant<int, 128>{}, std::integral_constant<int, 128>{});
  else if (c.bm == 128) f(std::integral_constant<int, 128>{}, std::integral_constant<int, 64>{});
  else if (c.bn == 128) f(std::integral_constant<int, 64>{}, std::integral_constant<int, 128>{});
  else f(std::integral_constant<int, 64>{}, std::integral_constant<int, 64>{});
}
template <class F>
void with_ks(int ks, F&& f) {
  if (ks == 3) f(std::integral_constant<int, 3>{});
  else f(std::integral_constant<int, 1>{});
}

// y = conv(x, w) + bias + emb + res, x [B, H, W, Ci], w [Co, KS, KS, Ci]; part: the workspace
// for a split K (fwd_part_bytes).
void run_fwd(CudaCtx& ctx, const Geo& g, const float* x, const float* w, float* y, const float* bias,
             const float* emb, const float* res, float* part) {
  const Cfg c = fwd_cfg(g);
  const int KB = g.KS * g.KS * g.Ci / BK, kbs = (KB + c.S - 1) / c.S;
  with_ks(g.KS, [&](auto ks) {
    constexpr int KS = decltype(ks)::value;
    with_tile(c, [&](auto bm, auto bn) {
      constexpr int BM = decltype(bm)::value, BN = decltype(bn)::value;
      const dim3 grid((unsigned)((g.M() + BM - 1) / BM), (unsigned)((g.Co + BN - 1) / BN), (unsigned)c.S);
      fwd_kernel<BM, BN, KS><<<grid, BM * BN / 64, 0, ctx.stream>>>(x, w, y, bias, emb, res, g.B, g.H, g.W, g.Ci,
                                                                   g.Co, kbs, c.S > 1 ? part : nullptr);
      KERNEL_CHECK();
    });
  });
  if (c.S == 1) return;
  const size_t n4 = (size_t)g.M() * g.Co / 4;
  splitsum_kernel<true><<<grid_for(n4), kThreads, 0, ctx.stream>>>(part, c.S, n4, y, bias, emb, res, g.Co, g.H * g.W);
  KERNEL_CHECK();
}
size_t fwd_part_bytes(const Geo& g) {
  const Cfg c = fwd_cfg(g);
  return c.S > 1 ? round256((size_t)c.S * g.M() * g.Co * 4) : 0;
}

bool fwd_ok(const ConvFwd& o, const CudaCtx& c) {
  return mode_ok(c) && o.stride == 1 && o.x.dtype == DType::F32 && o.y.dtype == DType::F32 && same_size(o.x, o.y) &&
         o.w.dim[1] == o.w.dim[2] && geo_ok(fwd_geo(o)) && (!o.mean.defined() || groupnorm_stats_fit(o.y, o.mean));
}
bool data_ok(const ConvBwdData& o, const CudaCtx& c) {
  const Geo g = data_geo(o);
  return mode_ok(c) && o.stride == 1 && o.dy.dtype == DType::F32 && same_size(o.dx, o.dy) &&
         o.w.dim[1] == o.w.dim[2] && geo_ok(g) && geo_ok(as_forward(g));
}
bool filter_ok(const ConvBwdFilter& o, const CudaCtx& c) {
  return mode_ok(c) && o.dw.defined() && o.stride == 1 && o.x.dtype == DType::F32 && same_size(o.x, o.dy) &&
         o.dw.dim[1] == o.dw.dim[2] && geo_ok(filter_geo(o)) &&
         (!(o.db.defined() || o.demb.defined()) || rowblock::column_sums_fit(o.dy));
}

size_t fwd_ws(const ConvFwd& o, const CudaCtx&) { return fwd_part_bytes(fwd_geo(o)); }
// The data gradient's workspace: the rotated filter (flip_kernel), then the split partials.
size_t data_ws(const ConvBwdData& o, const CudaCtx&) {
  const Geo g = data_geo(o);
  return flip_bytes(g) + fwd_part_bytes(as_forward(g));
}
size_t filter_ws(const ConvBwdFilter& o, const CudaCtx&) {
  const Geo g = filter_geo(o);
  const Cfg c = wgrad_cfg(g);
  return c.S > 1 ? round256((size_t)c.S * g.Co * g.KS * g.KS * g.Ci * 4) : 0;
}

void conv_fwd(const ConvFwd& o, CudaCtx& ctx) {
  need_aligned("simt", {o.x.data, o.w.data, o.y.data, o.bias.data, o.emb.data, o.res.data, ctx.ws});
  run_fwd(ctx, fwd_geo(o), dptr<float>(o.x), dptr<float>(o.w), dptr<float>(o.y), dptr<float>(o.bias),
          dptr<float>(o.emb), dptr<float>(o.res), static_cast<float*>(ctx.ws));
  if (o.mean.defined()) groupnorm_stats(ctx, o.y, o.mean, o.rstd);
}

void conv_data(const ConvBwdData& o, CudaCtx& ctx) {
  need_aligned("simt", {o.dy.data, o.w.data, o.dx.data, ctx.ws});
  const Geo g = data_geo(o);
  float* wt = static_cast<float*>(ctx.ws);
  flip_filter(ctx.stream, dptr<float>(o.w), wt, g);
  float* part = reinterpret_cast<float*>(static_cast<char*>(ctx.ws) + flip_bytes(g));
  run_fwd(ctx, as_forward(g), dptr<float>(o.dy), wt, dptr<float>(o.dx), nullptr, nullptr, nullptr, part);
}

void conv_filter(const ConvBwdFilter& o, CudaCtx& ctx) {
  need_aligned("simt", {o.x.data, o.dy.data, o.dw.data, ctx.ws});
  rowblock::column_sums(ctx, o.dy, o.demb, o.db);
  const Geo g = filter_geo(o);
  const Cfg c = wgrad_cfg(g);
  const long long NN = (long long)g.KS * g.KS * g.Ci, MB = (g.M() + BK - 1) / BK;
  const int mbs = (int)((MB + c.S - 1) / c.S);
  float* out = c.S > 1 ? static_cast<float*>(ctx.ws) : dptr<float>(o.dw);
  with_ks(g.KS, [&](auto ks) {
    constexpr int KS = decltype(ks)::value;
    with_tile(c, [&](auto bm, auto bn) {
      constexpr int BM = decltype(bm)::value, BN = decltype(bn)::value;
      const dim3 grid((unsigned)((g.Co + BM - 1) / BM), (unsigned)((NN + BN - 1) / BN), (unsigned)c.S);
      wgrad_kernel<BM, BN, KS><<<grid, BM * BN / 64, 0, ctx.stream>>>(dptr<float>(o.x), dptr<float>(o.dy), out,
                                                                     g.B, g.H, g.W, g.Ci, g.Co, mbs);
      KERNEL_CHECK();
    });
  });
  if (c.S > 1) sum_splits(ctx.stream, out, c.S, (size_t)g.Co * NN, dptr<float>(o.dw));
}

}  // namespace

void register_conv_simt(CudaOps& ops) {
  ops.variants<ConvFwd>().push_back({"simt", no_norm<ConvFwd, fwd_ok>, conv_fwd, fwd_ws});
  ops.variants<ConvBwdData>().push_back({"simt", data_ok, conv_data, data_ws});
  ops.variants<ConvBwdFilter>().push_back({"simt", no_norm<ConvBwdFilter, filter_ok>, conv_filter, filter_ws});
}

}  // namespace unet
