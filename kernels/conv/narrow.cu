// Convolution variant "narrow": ConvFwd with at most 8 output channels — the UNet's last layer
// (C -> 3, or 6 with learned sigma) — as a direct convolution on CUDA cores.
//
// Why: such a layer is a GEMM with N = 3..8, which tensor-core engines run at a few TFLOP/s, and
// cuDNN has no engine at all for bf16 inputs with an f32 output (the model's output is f32), so
// the layer fell to im2col + cuBLAS: 1.7 ms of imagenet64's 43 ms sampling forward (H100, bf16,
// batch 64) for 6 GFLOP and 100 MB of input. Here the input is read once from memory (its k*k
// taps from L1/L2), the weights sit in shared memory as f32, and the work is FMAs.
//
//  * A group of G lanes (the largest power of two dividing Ci/V, at most 32) computes kP
//    consecutive output pixels: each lane takes channel vectors cv = lane, lane + G, ... (V
//    channels: 8 for bf16, 4 for f32, 1 when Ci or the alignment does not allow vectors), all
//    taps, all Co outputs, reading its weights as float4s from planes laid out so that a warp's
//    reads hit distinct banks; then the group's partial sums are added with xor shuffles (fixed
//    order: deterministic) and its lanes write the kP*Co contiguous outputs.
//  * Epilogue in f32 before the one rounding: y = conv + bias[c] + emb[b, c] + res.
//  * f32 accumulation everywhere (no tensor cores): at least as accurate as every precision asks.
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>

#include "cuda_engine.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

constexpr int kP = 4;            // output pixels per lane group
constexpr int kMaxCo = 8;        // what the variant takes
constexpr int kNarrowThreads = 256;
constexpr size_t kMaxSmem = 160 * 1024;  // f32 weights [k*k][Co][Ci] must fit (Ci <= 740 at 3x3, Co 6)

// Weights of one (tap, output channel) as f32 planes that lane cv reads as float4s without bank
// conflicts: for V = 8 two planes (channels 0-3 and 4-7 of every chunk), for V = 4 one, each Cv
// float4s long; V = 1 keeps the plain [Ci] row. wsm = [tap][Co][NP][Cv][4].
template <int V>
__device__ __forceinline__ size_t wsm_index(int tap, int c, int ci, int Co, int Ci) {
  if (V == 1) return ((size_t)tap * Co + c) * Ci + ci;
  constexpr int NP = V / 4;
  const int Cv = Ci / V, cv = ci / V, v = ci % V;
  return ((((size_t)tap * Co + c) * NP + v / 4) * Cv + cv) * 4 + v % 4;
}

// CO: the output channels when fixed at compile time (3, 6), else 0 and Co <= 8 at run time.
template <class T, class TY, int V, int CO>
__global__ void __launch_bounds__(kNarrowThreads)
    narrow_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias,
                      const float* __restrict__ emb, const TY* __restrict__ res, TY* __restrict__ y, int B, int H,
                      int W, int Ci, int Ho, int Wo, int Co_rt, int k, int s, int G) {
  pdl_entry();
  constexpr int CM = CO ? CO : kMaxCo;
  const int Co = CO ? CO : Co_rt;
  extern __shared__ float4 wsm4[];
  float* wsm = reinterpret_cast<float*>(wsm4);
  const int KK = k * k, pad = k / 2;
  for (int i = threadIdx.x; i < KK * Co * Ci; i += blockDim.x) {  // w is [Co][k][k][Ci]
    const int ci = i % Ci, r = i / Ci, tap = r % KK, co = r / KK;
    wsm[wsm_index<V>(tap, co, ci, Co, Ci)] = ldf(w, i);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, gl = lane & (G - 1);
  const int per_block = blockDim.x / G;
  const long long gid = (long long)blockIdx.x * per_block + threadIdx.x / G;
  const long long warp_first = (long long)blockIdx.x * per_block + (threadIdx.x & ~31) / G;
  const long long ngroups = (long long)gridDim.x * per_block;
  const long long M = (long long)B * Ho * Wo;
  const int Cv = Ci / V;
  // Rounds over pixel blocks; the loop condition is the warp's first group's, so every lane of a
  // warp runs the same iterations (the shuffles need the whole warp).
  for (long long round = 0; (round * ngroups + warp_first) * kP < M; ++round) {
    const long long m0 = (round * ngroups + gid) * kP;
    int pb[kP], py[kP], px[kP];
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      const long long m = m0 + p;
      pb[p] = -1, py[p] = 0, px[p] = 0;
      if (m < M) {
        px[p] = (int)(m % Wo);
        const long long t = m / Wo;
        py[p] = (int)(t % Ho), pb[p] = (int)(t / Ho);
      }
    }
    float acc[kP][CM];
#pragma unroll
    for (int p = 0; p < kP; ++p)
#pragma unroll
      for (int c = 0; c < CM; ++c) acc[p][c] = 0.f;
    for (int tap = 0; tap < KK; ++tap) {
      const int ky = tap / k, kx = tap % k;
      for (int cv = gl; cv < Cv; cv += G) {
        float xv[kP][V];
#pragma unroll
        for (int p = 0; p < kP; ++p) {
          const int iy = py[p] * s - pad + ky, ix = px[p] * s - pad + kx;
          if (pb[p] >= 0 && iy >= 0 && iy < H && ix >= 0 && ix < W) {
            rowblock::Vec<T, V>::load(x + (((size_t)pb[p] * H + iy) * W + ix) * Ci + (size_t)cv * V, xv[p]);
          } else {
#pragma unroll
            for (int v = 0; v < V; ++v) xv[p][v] = 0.f;
          }
        }
#pragma unroll
        for (int c = 0; c < CM; ++c) {
          if (!CO && c >= Co) break;
          float wv[V];
          if (V == 1) {
            wv[0] = wsm[wsm_index<V>(tap, c, cv, Co, Ci)];
          } else {
#pragma unroll
            for (int h = 0; h < V / 4; ++h) {
              const float4 q = wsm4[((size_t)(tap * Co + c) * (V / 4) + h) * Cv + cv];
              wv[4 * h] = q.x, wv[4 * h + 1] = q.y, wv[4 * h + 2] = q.z, wv[4 * h + 3] = q.w;
            }
          }
#pragma unroll
          for (int p = 0; p < kP; ++p)
#pragma unroll
            for (int v = 0; v < V; ++v) acc[p][c] = fmaf(xv[p][v], wv[v], acc[p][c]);
        }
      }
    }
    if (G > 1)
#pragma unroll
      for (int p = 0; p < kP; ++p)
#pragma unroll
        for (int c = 0; c < CM; ++c)
          for (int off = G / 2; off > 0; off >>= 1) acc[p][c] += __shfl_xor_sync(0xffffffffu, acc[p][c], off);
    // The kP pixels' outputs are contiguous: y[m0 * Co + j], j = p * Co + c; lane gl writes j = gl mod G.
#pragma unroll
    for (int p = 0; p < kP; ++p)
#pragma unroll
      for (int c = 0; c < CM; ++c) {
        if (c >= Co || pb[p] < 0 || (p * Co + c) % G != gl) continue;
        const size_t o = (size_t)(m0 + p) * Co + c;
        float v = acc[p][c];
        if (bias) v += bias[c];
        if (emb) v += emb[(size_t)pb[p] * Co + c];
        if (res) v += ldf(res, o);
        stf(y, o, v);
      }
  }
}

// Lanes per group: the largest power of two dividing the chunk count (at most 32), so every lane
// of a group takes the same number of chunks (192 bf16 channels: 24 chunks, groups of 8 lanes).
int group_lanes(int Cv) { return std::min(32, Cv & -Cv); }

size_t smem_bytes(const ConvFwd& o) {
  return (size_t)o.w.dim[0] * o.w.dim[1] * o.w.dim[2] * o.w.dim[3] * sizeof(float);
}

template <class T, class TY, int V, int CO>
void launch(const ConvFwd& o, CudaCtx& ctx) {
  auto kern = narrow_fwd_kernel<T, TY, V, CO>;
  const size_t smem = smem_bytes(o);
  static size_t smem_set = 48 * 1024;  // per instantiation: the default opt-in limit
  if (smem > smem_set) {
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxSmem));
    smem_set = kMaxSmem;
  }
  const int B = (int)o.x.dim[0], H = (int)o.x.dim[1], W = (int)o.x.dim[2], Ci = (int)o.x.dim[3];
  const int Ho = (int)o.y.dim[1], Wo = (int)o.y.dim[2], Co = (int)o.y.dim[3], k = (int)o.w.dim[1];
  const int G = group_lanes(std::max(1, Ci / V));
  const long long groups = ((long long)B * Ho * Wo + kP - 1) / kP;
  const int per_block = kNarrowThreads / G;
  // Enough blocks to fill the GPU (the weight fill is per block, so not many more).
  int dev = 0, sms = 132, per_sm = 1;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kNarrowThreads, smem);
  const long long want = (groups + per_block - 1) / per_block;
  const int blocks = (int)std::max(1LL, std::min(want, (long long)sms * std::max(1, per_sm)));
  kern<<<blocks, kNarrowThreads, smem, ctx.stream>>>(dptr<T>(o.x), dptr<T>(o.w), dptr<float>(o.bias),
                                                     dptr<float>(o.emb), dptr<TY>(o.res), dptr<TY>(o.y), B, H,
                                                     W, Ci, Ho, Wo, Co, k, o.stride, G);
  KERNEL_CHECK();
}

template <class T, class TY>
void dispatch_vec(const ConvFwd& o, CudaCtx& ctx) {
  constexpr int VV = sizeof(T) == 2 ? 8 : 4;
  const int Ci = (int)o.x.dim[3], Co = (int)o.y.dim[3];
  if (Ci % VV == 0 && aligned16(o.x.data)) {
    if (Co == 3) return launch<T, TY, VV, 3>(o, ctx);
    if (Co == 6) return launch<T, TY, VV, 6>(o, ctx);
    return launch<T, TY, VV, 0>(o, ctx);
  }
  launch<T, TY, 1, 0>(o, ctx);  // odd channel counts (tests, small models)
}

void narrow_fwd(const ConvFwd& o, CudaCtx& ctx) {
  if (o.x.dtype == DType::BF16) {
    if (o.y.dtype == DType::F32) return dispatch_vec<bf16, float>(o, ctx);
    return dispatch_vec<bf16, bf16>(o, ctx);
  }
  dispatch_vec<float, float>(o, ctx);
}

bool narrow_ok(const ConvFwd& o, const CudaCtx&) {
  const int64_t Co = o.y.dim[3], k = o.w.dim[1];
  return Co >= 1 && Co <= kMaxCo && k % 2 == 1 && o.w.dim[2] == k && o.w.dtype == o.x.dtype &&
         (o.y.dtype == o.x.dtype || o.y.dtype == DType::F32) && (!o.res.defined() || o.res.dtype == o.y.dtype) &&
         o.y.dim[0] < 65536 && smem_bytes(o) <= kMaxSmem;
}

// ---- variant "narrow_tc": the same layer on tensor cores (bf16 input, 3x3, stride 1) ----
// Measured on the H100 (seed64 batch 32, 64 -> 3 at 64x64, bf16): "narrow" took 53 us, 8.5
// TFLOP/s of FMAs for 17 MB of input: its per-element conversions, index arithmetic and the
// nine-fold re-reads of each input vector cost more than the multiplies. Here a block of four
// warps takes 2 output rows x 64 columns: the 4 input rows they read (66 columns, zero padding
// included) and the weights go to shared memory (by chunks of channels, below), and each warp runs the 3x3
// taps as an implicit GEMM on bf16 tensor cores (wmma m32n8k16: 32 pixels x 8 outputs, the
// weights zero-padded from Co to 8 columns), f32 accumulation in a fixed order (deterministic),
// then the epilogue in f32 before the one rounding, as "narrow".
//
// The channels go through shared memory in chunks of 64 (input and weights of one chunk, then its
// MMAs, then the next), so a block needs 56 KB whatever Ci is: with every channel at once,
// imagenet256's 256-channel output layer took 184 KB per block (one block per SM, 2.0 ms of its
// 77 ms forward).
constexpr int kTcCols = 64, kTcRows = 2, kTcWarps = 4;
constexpr int kTcInCols = kTcCols + 2, kTcInRows = kTcRows + 2;
constexpr int kTcChunk = 64;

// Input pixels in shared memory are kTcChunk + 16 channels apart: 32-byte aligned rows for the
// fragment loads, and consecutive pixels 8 banks apart (at a stride that is a multiple of 128
// bytes, the rows of a fragment all hit the same banks).
constexpr int kTcStride = kTcChunk + 16;
size_t tc_smem_bytes() {
  return (size_t)kTcInRows * kTcInCols * kTcStride * 2 + (size_t)9 * kTcChunk * 8 * 2 + (size_t)kTcWarps * 32 * 8 * 4;
}

template <class TY, int CO>
__global__ void __launch_bounds__(kTcWarps * 32)
    narrow_tc_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ bias,
                     const float* __restrict__ emb, const TY* __restrict__ res, TY* __restrict__ y, int H, int W,
                     int Ci, int Co_rt) {
  pdl_entry();
  using namespace nvcuda;
  const int Co = CO ? CO : Co_rt;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  constexpr int ps = kTcStride;
  bf16* sx = reinterpret_cast<bf16*>(tc_smem);                        // [kTcInRows][kTcInCols][ps]
  bf16* sw = sx + (size_t)kTcInRows * kTcInCols * ps;                 // [9 * kc][8]
  float* so = reinterpret_cast<float*>(sw + (size_t)9 * kTcChunk * 8);  // [warp][32][8]
  const int t = threadIdx.x, nt = blockDim.x;
  const int x0 = blockIdx.x * kTcCols, y0 = blockIdx.y * kTcRows, b = blockIdx.z;
  const int warp = t / 32, wr = warp / 2, wc = (warp % 2) * 32;
  wmma::fragment<wmma::accumulator, 32, 8, 16, float> acc;
  wmma::fill_fragment(acc, 0.f);
  wmma::fragment<wmma::matrix_a, 32, 8, 16, bf16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 32, 8, 16, bf16, wmma::row_major> fb;
  // B's columns n >= Co stay zero through every chunk (the chunks write columns n < Co only)
  uint4* sw4 = reinterpret_cast<uint4*>(sw);
  for (int i = t; i < 9 * kTcChunk; i += nt) sw4[i] = make_uint4(0, 0, 0, 0);
  for (int c0 = 0; c0 < Ci; c0 += kTcChunk) {
    const int kc = min(kTcChunk, Ci - c0), cv = kc / 8;  // channels, 16-byte vectors per pixel
    __syncthreads();  // the zeros above, or the previous chunk's fragment loads, are done
    for (int i = t; i < kTcInRows * kTcInCols * cv; i += nt) {
      const int c = i % cv, r = i / cv, col = r % kTcInCols, row = r / kTcInCols;
      const int iy = y0 - 1 + row, ix = x0 - 1 + col;
      bf16* dst = sx + (size_t)r * ps + c * 8;
      if (iy >= 0 && iy < H && ix >= 0 && ix < W)
        __pipeline_memcpy_async(dst, x + (((size_t)b * H + iy) * W + ix) * Ci + c0 + c * 8, 16);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    // B[tap * kc + ci][n] = w[n][tap][c0 + ci] (w is [Co][3][3][Ci]): w read as 16-byte vectors (a
    // few independent loads per thread; element loads, each waited for before the next, made this
    // fill the kernel's longest phase) scattered into the columns
    for (int i = t; i < Co * 9 * cv; i += nt) {
      const int n = i / (9 * cv), rem = i - n * 9 * cv, tap = rem / cv, v = rem - tap * cv;
      const uint4 q = *reinterpret_cast<const uint4*>(w + ((size_t)n * 9 + tap) * Ci + c0 + v * 8);
      const bf16* e = reinterpret_cast<const bf16*>(&q);
      const int kk0 = tap * kc + v * 8;
#pragma unroll
      for (int j = 0; j < 8; ++j) sw[(kk0 + j) * 8 + n] = e[j];
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int tap = 0; tap < 9; ++tap) {
      const int ky = tap / 3, kx = tap % 3;
      const bf16* arow = sx + ((size_t)(wr + ky) * kTcInCols + wc + kx) * ps;
      const bf16* brow = sw + (size_t)tap * kc * 8;
      for (int k0 = 0; k0 < kc; k0 += 16) {
        wmma::load_matrix_sync(fa, arow + k0, ps);
        wmma::load_matrix_sync(fb, brow + (size_t)k0 * 8, 8);
        wmma::mma_sync(acc, fa, fb, acc);
      }
    }
  }
  float* o = so + warp * 32 * 8;
  wmma::store_matrix_sync(o, acc, 8, wmma::mem_row_major);
  __syncwarp();
  const int oy = y0 + wr, lane = t % 32;
  if (oy >= H) return;
  for (int j = lane; j < 32 * Co; j += 32) {
    const int p = j / Co, c = j % Co, ox = x0 + wc + p;
    if (ox >= W) continue;
    const size_t idx = (((size_t)b * H + oy) * W + ox) * Co + c;
    float v = o[p * 8 + c];
    if (bias) v += bias[c];
    if (emb) v += emb[(size_t)b * Co + c];
    if (res) v += ldf(res, idx);
    stf(y, idx, v);
  }
}

template <class TY, int CO>
void launch_tc(const ConvFwd& o, CudaCtx& ctx) {
  auto kern = narrow_tc_kernel<TY, CO>;
  const int B = (int)o.x.dim[0], H = (int)o.x.dim[1], W = (int)o.x.dim[2], Ci = (int)o.x.dim[3];
  const size_t smem = tc_smem_bytes();
  static bool smem_set = false;  // per instantiation
  if (!smem_set) {
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    smem_set = true;
  }
  const dim3 grid((W + kTcCols - 1) / kTcCols, (H + kTcRows - 1) / kTcRows, B);
  kern<<<grid, kTcWarps * 32, smem, ctx.stream>>>(dptr<bf16>(o.x), dptr<bf16>(o.w), dptr<float>(o.bias),
                                                  dptr<float>(o.emb), dptr<TY>(o.res), dptr<TY>(o.y), H, W, Ci,
                                                  (int)o.y.dim[3]);
  KERNEL_CHECK();
}

template <class TY>
void dispatch_tc(const ConvFwd& o, CudaCtx& ctx) {
  const int Co = (int)o.y.dim[3];
  if (Co == 3) return launch_tc<TY, 3>(o, ctx);
  if (Co == 6) return launch_tc<TY, 6>(o, ctx);
  launch_tc<TY, 0>(o, ctx);
}

void narrow_tc_fwd(const ConvFwd& o, CudaCtx& ctx) {
  if (o.y.dtype == DType::F32) return dispatch_tc<float>(o, ctx);
  dispatch_tc<bf16>(o, ctx);
}

// bf16 only (f32 inputs stay on "narrow"'s f32 FMAs: fp32 must not use TF32, and tf32 gains
// little on a layer this small); 3x3 stride 1, Ci a multiple of 16, 16-byte aligned input rows.
bool narrow_tc_ok(const ConvFwd& o, const CudaCtx& c) {
  const int64_t Ci = o.x.dim[3];
  return narrow_ok(o, c) && o.x.dtype == DType::BF16 && o.w.dim[1] == 3 && o.stride == 1 && Ci % 16 == 0 &&
         aligned16(o.x.data) && aligned16(o.w.data) && o.x.dim[1] == o.y.dim[1] &&
         o.x.dim[2] == o.y.dim[2];
}

}  // namespace

void register_conv_narrow(CudaOps& ops) {
  ops.variants<ConvFwd>().push_back(
      {"narrow_tc", no_norm<ConvFwd, stats_ok<ConvFwd, narrow_tc_ok>>, then_stats<ConvFwd, narrow_tc_fwd>, nullptr});
  ops.variants<ConvFwd>().push_back(
      {"narrow", no_norm<ConvFwd, stats_ok<ConvFwd, narrow_ok>>, then_stats<ConvFwd, narrow_fwd>, nullptr});
}

}  // namespace unet
