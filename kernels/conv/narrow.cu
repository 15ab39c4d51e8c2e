// Convolution variant "narrow": ConvFwd with at most 8 output channels — the UNet's last layer
// (C -> 3, or 6 with learned sigma) — as a direct convolution on CUDA cores. Further down:
// "narrow_tc", the same on tensor cores (bf16, tf32), "narrow_dgrad", that layer's data gradient
// (f32 FMAs, every precision), and "narrow_wgrad", the tf32 filter gradient of a conv with at
// most 3 input or output channels (the first and last layers).
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
// Measured and not kept (H100, seed64 batch 32, 2026-11-25, same runs): the first layer's forward
// (3 -> 64, where cuDNN pads the channels in two convertTensor launches before an sm80 kernel,
// ~35 us) as a direct kernel, a thread per pixel and 16-byte output vector, the 27 inputs from
// L1 and f32 weights in shared memory: tf32 step 12.483 -> 12.493 ms, bf16 7.653 -> 7.697 (its
// per-tap index arithmetic and bounds checks for 4-8 FMAs each); again as "narrow_dgrad"'s kernel
// (below; the forward is its computation with the filter flipped and transposed), 8 pixels a
// thread: tf32 12.403 -> 12.410, bf16 7.586 -> 7.582 (same run, 3 ABBA rounds), though cuDNN's
// three launches there take ~33 us on the forward's chain (2026-11-25).
#include <cuda_pipeline.h>

#include <algorithm>

#include "cuda_engine.cuh"
#include "mma_sync.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

constexpr int kP = 4;            // output pixels per lane group
constexpr int kMaxCo = 8;        // what the variant takes
constexpr int kNarrowThreads = 256;
constexpr size_t kMaxSmem = 160 * 1024;  // f32 weights [k*k][Co][Ci] must fit (Ci <= 740 at 3x3, Co 6)
// Within kMaxSmem and the device's opt-in limit (smaller GPUs take the other variants).
inline bool narrow_smem_fits(size_t bytes) { return bytes <= kMaxSmem && device_smem_fits(bytes); }

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
  static size_t smem_set = 0;
  allow_dynamic_smem(kern, smem, smem_set);  // what the launch needs (kMaxSmem can exceed a GPU's limit)
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
         (o.y.dtype == o.x.dtype || o.y.dtype == DType::F32) &&
         (!o.res.defined() || o.res.dtype == o.y.dtype) && o.y.dim[0] < 65536 &&
         narrow_smem_fits(smem_bytes(o));
}

// ---- variant "narrow_tc": the same layer on tensor cores (bf16 or tf32 input, 3x3, stride 1) ----
// Measured on the H100 (seed64 batch 32, 64 -> 3 at 64x64, bf16): "narrow" took 53 us, 8.5
// TFLOP/s of FMAs for 17 MB of input: its per-element conversions, index arithmetic and the
// nine-fold re-reads of each input vector cost more than the multiplies. Here a block of 16 warps
// takes 8 output rows x 64 columns: the 10 input rows they read (66 columns, zero padding
// included) go to shared memory (by chunks of 128 bytes a pixel: 64 bf16 or 32 f32 channels), and
// each warp runs the 3x3 taps as an implicit GEMM of 32 pixels (half a row) x 8 outputs (mma.sync
// m16n8k16 bf16 / m16n8k8 tf32, the weights zero-padded from Co to 8 columns, the pixels'
// fragments read with ldmatrix from rows 144 bytes apart: no bank conflicts). The chunk's weights
// are put in shared memory once a block, in each lane's B-fragment order (9 KB; one 8-byte load a
// lane per tap and k-step). f32 accumulation in a fixed order (deterministic), then the epilogue in
// f32 before the one rounding, as "narrow". tf32 rounds both operands to nearest, as cuDNN's tf32
// kernels do. By chunks a block needs 104 KB whatever Ci is (two blocks an SM).
// H200, sampling's forward at seed64 batch 64 (64 -> 3 at 64x64), same runs (2026-11-29): the
// kernel before, 4 warps of 2 rows x 32 pixels each building its own B fragments in registers
// (9 taps x 4 k-steps: loads, bounds tests and conversions a lane; ncu: instruction-bound at 13%
// of DRAM bandwidth), tf32 92.9 us and bf16 31.7; this one 51.9 and 27.3 (training's batch 32:
// bf16 19.3 -> 13.3). Measured and not kept (same runs): 8 rows with a warp a row (64 pixels)
// tf32 55.0 / bf16 26.9; 16 rows a warp a row (one 180 KB block an SM) 54.4 / 26.4; 4 rows of two
// warps 57.9 / 28.2; tf32's input rounded once as it is copied in (through registers instead of
// cp.async) rather than after each ldmatrix: 63.2 (8 rows) and 88.3 (4 rows) against 55.0 and 73.2.
// Earlier (H100, 2026-11-25): wmma (the weights' fragments from shared memory, 160-byte rows),
// two thirds of its time the fragment loads; persistent blocks with two stages (the next chunk's
// copies in flight during the MMAs): with 8 warps an SM the MMA chains' latency showed.
constexpr int kTcCols = 64, kTcRows = 8, kTcWarpsRow = 2;  // a warp: kTcCols / kTcWarpsRow pixels of a row
constexpr int kTcThreads = kTcRows * kTcWarpsRow * 32;
constexpr int kTcFrags = kTcCols / kTcWarpsRow / 16;  // a warp's 16-pixel fragments
constexpr int kTcInCols = kTcCols + 2, kTcInRows = kTcRows + 2;
constexpr int kTcChunkBytes = 128, kTcPixelBytes = kTcChunkBytes + 16;  // 16 more: ldmatrix rows in distinct banks
constexpr int kTcKSteps = kTcChunkBytes / 32;                           // MMA k-steps (32 bytes of channels) a chunk
constexpr int kTcBFrags = 9 * kTcKSteps * 32;  // a chunk's B fragments (uint2 a lane)
// The input rows and the chunk's B fragments; the output staging reuses the input rows' space.
constexpr size_t kTcSmem = (size_t)kTcInRows * kTcInCols * kTcPixelBytes + (size_t)kTcBFrags * sizeof(uint2);
static_assert((size_t)kTcRows * kTcCols * 8 * sizeof(float) <= (size_t)kTcInRows * kTcInCols * kTcPixelBytes);

// c += a b for 16 pixels x 8 outputs over one k-step (32 bytes of channels).
template <class T>
__device__ __forceinline__ void mma_step(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, float>)
    mma_tf32(c, a, b);
  else
    mma_bf16(c, a, b);
}
// The B fragment's two registers for output n, k-step ks of the chunk at c0: tf32 the values at k
// = t and t + 4, bf16 the pairs at 2t and 2t + 8 (k within the step; zero past Co or the chunk).
template <class T>
__device__ __forceinline__ uint2 b_frag(const T* __restrict__ w, int n, int Co, int tap, int Ci, int c0,
                                        int kc, int ks, int t) {
  if (n >= Co) return make_uint2(0u, 0u);
  const T* wr = w + ((size_t)n * 9 + tap) * Ci + c0;
  if constexpr (std::is_same_v<T, float>) {
    const int k = ks * 8 + t;
    return make_uint2(k < kc ? tf32_bits(wr[k]) : 0u, k + 4 < kc ? tf32_bits(wr[k + 4]) : 0u);
  } else {
    const int k = ks * 16 + 2 * t;
    return make_uint2(k < kc ? *reinterpret_cast<const uint32_t*>(wr + k) : 0u,
                      k + 8 < kc ? *reinterpret_cast<const uint32_t*>(wr + k + 8) : 0u);
  }
}

template <class T, class TY, int CO>
__global__ void __launch_bounds__(kTcThreads, 2)
    narrow_tc_kernel(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias,
                     const float* __restrict__ emb, const TY* __restrict__ res, TY* __restrict__ y, int H,
                     int W, int Ci, int Co_rt) {
  pdl_entry();
  constexpr int vec = 16 / (int)sizeof(T), chunk = kTcChunkBytes / (int)sizeof(T);
  const int Co = CO ? CO : Co_rt;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  unsigned char* sx = tc_smem;  // [kTcInRows][kTcInCols] pixels
  uint2* sb = reinterpret_cast<uint2*>(tc_smem + kTcInRows * kTcInCols * kTcPixelBytes);  // [tap][ks][lane]
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int wrow = warp / kTcWarpsRow, wcol = (warp % kTcWarpsRow) * (kTcCols / kTcWarpsRow);
  const int x0 = blockIdx.x * kTcCols, y0 = blockIdx.y * kTcRows, b = blockIdx.z;
  float acc[kTcFrags][4] = {};
  // ldmatrix: lane l gives the row of pixel (l % 8) + 8 ((l / 8) % 2) at k byte offset 16 (l / 16)
  const uint32_t a_lane = (uint32_t)__cvta_generic_to_shared(sx) +
                          (uint32_t)(((lane % 8) + 8 * ((lane / 8) % 2)) * kTcPixelBytes + 16 * (lane / 16));
  for (int c0 = 0; c0 < Ci; c0 += chunk) {
    const int kc = min(chunk, Ci - c0), cv = kc / vec;  // channels, 16-byte vectors per pixel
    __syncthreads();  // the previous chunk's fragment loads are done
    for (int i = t; i < kTcInRows * kTcInCols * cv; i += kTcThreads) {
      const int c = cv == kTcChunkBytes / 16 ? i % (kTcChunkBytes / 16) : i % cv;
      const int r = cv == kTcChunkBytes / 16 ? i / (kTcChunkBytes / 16) : i / cv;
      const int col = r % kTcInCols, row = r / kTcInCols;
      const int iy = y0 - 1 + row, ix = x0 - 1 + col;
      unsigned char* dst = sx + (size_t)r * kTcPixelBytes + c * 16;
      if (iy >= 0 && iy < H && ix >= 0 && ix < W)
        __pipeline_memcpy_async(dst, x + (((size_t)b * H + iy) * W + ix) * Ci + c0 + c * vec, 16);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    if (kc < chunk)  // a partial chunk: zeros past its channels (their weights are zero too, but
                     // the stale bits could be NaN)
      for (int i = t; i < kTcInRows * kTcInCols * (chunk / vec - cv); i += kTcThreads) {
        const int r = i / (chunk / vec - cv), c = cv + i % (chunk / vec - cv);
        *reinterpret_cast<uint4*>(sx + (size_t)r * kTcPixelBytes + c * 16) = make_uint4(0, 0, 0, 0);
      }
    // The chunk's weights (B: k x 8 outputs) in each lane's fragment order, while the copies fly.
    for (int i = t; i < kTcBFrags; i += kTcThreads) {
      const int l = i % 32, ks = (i / 32) % kTcKSteps, tap = i / (32 * kTcKSteps);
      sb[i] = b_frag(w, l / 4, Co, tap, Ci, c0, kc, ks, l % 4);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
#pragma unroll
    for (int tap = 0; tap < 9; ++tap) {
      const int ky = tap / 3, kx = tap % 3;
      const uint32_t arow = a_lane + (uint32_t)(((wrow + ky) * kTcInCols + wcol + kx) * kTcPixelBytes);
#pragma unroll
      for (int ks = 0; ks < kTcKSteps; ++ks) {
        const uint2 bq = sb[(tap * kTcKSteps + ks) * 32 + lane];
        const uint32_t bw[2] = {bq.x, bq.y};
#pragma unroll
        for (int f = 0; f < kTcFrags; ++f) {
          uint32_t a[4];
          ldsm_x4(arow + (uint32_t)(f * 16 * kTcPixelBytes + ks * 32), a);
          if constexpr (std::is_same_v<T, float>) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = tf32_bits(__uint_as_float(a[e]));
          }
          mma_step<T>(acc[f], a, bw);
        }
      }
    }
  }
  __syncthreads();  // every warp's fragment loads are done: the input rows' space takes the outputs
  // C fragment: pixel f * 16 + lane / 4 (+ 8), outputs 2 (lane % 4) and + 1
  float* o = reinterpret_cast<float*>(sx) + warp * (kTcCols / kTcWarpsRow) * 8;
#pragma unroll
  for (int f = 0; f < kTcFrags; ++f) {
    const int p = f * 16 + lane / 4, n = 2 * (lane % 4);
    *reinterpret_cast<float2*>(o + p * 8 + n) = make_float2(acc[f][0], acc[f][1]);
    *reinterpret_cast<float2*>(o + (p + 8) * 8 + n) = make_float2(acc[f][2], acc[f][3]);
  }
  __syncwarp();
  const int oy = y0 + wrow;
  if (oy >= H) return;
  for (int j = lane; j < kTcCols / kTcWarpsRow * Co; j += 32) {
    const int p = j / Co, c = j % Co, ox = x0 + wcol + p;
    if (ox >= W) continue;
    const size_t idx = (((size_t)b * H + oy) * W + ox) * Co + c;
    float v = o[p * 8 + c];
    if (bias) v += bias[c];
    if (emb) v += emb[(size_t)b * Co + c];
    if (res) v += ldf(res, idx);
    stf(y, idx, v);
  }
}

template <class T, class TY, int CO>
void launch_tc(const ConvFwd& o, CudaCtx& ctx) {
  auto kern = narrow_tc_kernel<T, TY, CO>;
  static const bool attr = (allow_dynamic_smem(kern, kTcSmem), true);  // once per instantiation
  (void)attr;
  const int B = (int)o.x.dim[0], H = (int)o.x.dim[1], W = (int)o.x.dim[2], Ci = (int)o.x.dim[3];
  const dim3 grid((W + kTcCols - 1) / kTcCols, (H + kTcRows - 1) / kTcRows, B);
  kern<<<grid, kTcThreads, kTcSmem, ctx.stream>>>(dptr<T>(o.x), dptr<T>(o.w), dptr<float>(o.bias),
                                                  dptr<float>(o.emb), dptr<TY>(o.res), dptr<TY>(o.y), H, W,
                                                  Ci, (int)o.y.dim[3]);
  KERNEL_CHECK();
}

template <class T, class TY>
void dispatch_tc(const ConvFwd& o, CudaCtx& ctx) {
  const int Co = (int)o.y.dim[3];
  if (Co == 3) return launch_tc<T, TY, 3>(o, ctx);
  if (Co == 6) return launch_tc<T, TY, 6>(o, ctx);
  launch_tc<T, TY, 0>(o, ctx);
}

void narrow_tc_fwd(const ConvFwd& o, CudaCtx& ctx) {
  if (o.x.dtype == DType::F32) return dispatch_tc<float, float>(o, ctx);
  if (o.y.dtype == DType::F32) return dispatch_tc<bf16, float>(o, ctx);
  dispatch_tc<bf16, bf16>(o, ctx);
}

// bf16, and f32 inputs in tf32 (fp32 must not use TF32: there "narrow"'s f32 FMAs); 3x3 stride 1,
// Ci a multiple of one MMA k-step (16 bf16, 8 tf32), 16-byte aligned input rows and weights.
bool narrow_tc_ok(const ConvFwd& o, const CudaCtx& c) {
  const int64_t Ci = o.x.dim[3];
  const bool tc = o.x.dtype == DType::BF16 ? Ci % 16 == 0 : c.prec == Precision::TF32 && Ci % 8 == 0;
  return narrow_ok(o, c) && tc && device_smem_fits(kTcSmem) && o.w.dim[1] == 3 && o.stride == 1 &&
         aligned16(o.x.data) && aligned16(o.w.data) && o.x.dim[1] == o.y.dim[1] && o.x.dim[2] == o.y.dim[2];
}

// ---- variant "narrow_dgrad": the data gradient of a conv with at most 8 output channels ----
// The last layer's (C -> 3 or 6, 3x3) dx [B, H, W, C] from dy [B, H, W, Co]: cuDNN padded dy's
// channels (nhwcAddPadding, 22 us at seed64's 64x64 batch 32) and ran an sm80 dgrad kernel (55
// us), the first kernels of the backward's serial chain, for 0.45 GFLOP and a 34 MB write. As
// "narrow"'s forward it is a direct convolution on f32 FMAs: a block takes 2 rows x 64 columns of
// one image, dy's 4 x 66 neighbourhood (zero padding included) and the whole filter as f32 in
// shared memory; a thread owns one 4-channel vector of dx for a run of 8 pixels of a row, so each
// (tap row, output channel) is 10 dy values (broadcast to the 16 threads of a run) and 3 weight
// vectors for 96 FMAs, and the 16 threads of a run store its pixels' channels as one contiguous
// span. Every output is one thread's sum in a fixed order (ky, co, kx): deterministic, and f32
// products in every precision (tf32 included: at least as accurate as cuDNN's tf32).
constexpr int kDgCols = 64, kDgRows = 2, kDgRun = 8;  // a run: 8 consecutive pixels of a row
constexpr int kDgThreads = 256, kDgLanes = kDgThreads / (kDgRows * kDgCols / kDgRun);  // 16 channel vectors
size_t dg_smem_bytes(int Cw, int Cn) {
  return (size_t)(9 * Cn * Cw + (kDgRows + 2) * (kDgCols + 2) * Cn) * sizeof(float);
}

// dx[b][y][x][ci] = sum over (ky, co, kx) of dy[b][y + 1 - ky][x + 1 - kx][co] w[co][ky][kx][ci].
// CN: dy's channels when fixed at compile time (3, 6), else 0 and Cn <= 8 at run time.
template <class T, int CN>
__global__ void __launch_bounds__(kDgThreads, 3)
    narrow_dgrad_kernel(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, int H, int W, int Cw,
                        int Cn_rt) {
  pdl_entry();
  constexpr int CM = CN ? CN : kMaxCo;
  const int Cn = CN ? CN : Cn_rt;
  extern __shared__ float4 dg_smem4[];
  float* wsm = reinterpret_cast<float*>(dg_smem4);  // [tap][Cn][Cw]
  float* sdy = wsm + 9 * Cn * Cw;                     // [kDgRows + 2][kDgCols + 2][Cn]
  const int x0 = blockIdx.x * kDgCols, y0 = blockIdx.y * kDgRows, b = blockIdx.z, t = threadIdx.x;
  for (int i = t; i < 9 * Cn * Cw; i += kDgThreads) {  // w is [Cn][3][3][Cw]
    const int ci = i % Cw, r = i / Cw, tap = r % 9, co = r / 9;
    wsm[(tap * Cn + co) * Cw + ci] = ldf(w, i);
  }
  for (int i = t; i < (kDgRows + 2) * (kDgCols + 2) * Cn; i += kDgThreads) {
    const int co = i % Cn, r = i / Cn, iy = y0 - 1 + r / (kDgCols + 2), ix = x0 - 1 + r % (kDgCols + 2);
    sdy[i] = iy >= 0 && iy < H && ix >= 0 && ix < W ? ldf(dy, (((size_t)b * H + iy) * W + ix) * Cn + co) : 0.f;
  }
  __syncthreads();
  const int lane = t % kDgLanes, run = t / kDgLanes;
  const int ry = run / (kDgCols / kDgRun), xl = run % (kDgCols / kDgRun) * kDgRun, y = y0 + ry;
  if (y >= H || x0 + xl >= W) return;  // (no barrier follows)
  for (int j = lane; j < Cw / 4; j += kDgLanes) {
    float acc[kDgRun][4];
#pragma unroll
    for (int p = 0; p < kDgRun; ++p) acc[p][0] = acc[p][1] = acc[p][2] = acc[p][3] = 0.f;
#pragma unroll 1  // (unrolled, the loads of all 9 (ky, co) were hoisted: 177 registers, one block an SM)
    for (int ky = 0; ky < 3; ++ky) {
      // dy row y + 1 - ky is tile row ry + 2 - ky; pixel x0 + xl + p at kx reads tile column xl + p + 2 - kx
      const float* drow = sdy + ((ry + 2 - ky) * (kDgCols + 2) + xl) * Cn;
#pragma unroll
      for (int co = 0; co < CM; ++co) {
        if (!CN && co >= Cn) break;
        float d[kDgRun + 2];
#pragma unroll
        for (int c = 0; c < kDgRun + 2; ++c) d[c] = drow[c * Cn + co];
#pragma unroll
        for (int kx = 0; kx < 3; ++kx) {
          const float4 wv = *reinterpret_cast<const float4*>(wsm + ((ky * 3 + kx) * Cn + co) * Cw + 4 * j);
#pragma unroll
          for (int p = 0; p < kDgRun; ++p) {
            const float v = d[p + 2 - kx];
            acc[p][0] = fmaf(v, wv.x, acc[p][0]);
            acc[p][1] = fmaf(v, wv.y, acc[p][1]);
            acc[p][2] = fmaf(v, wv.z, acc[p][2]);
            acc[p][3] = fmaf(v, wv.w, acc[p][3]);
          }
        }
      }
    }
#pragma unroll
    for (int p = 0; p < kDgRun; ++p)
      if (x0 + xl + p < W)  // (st4: 16-byte stores of f32, 8-byte of bf16)
        st4(dx + ((((size_t)b * H + y) * W + x0 + xl + p) * Cw + 4 * j), 0,
            make_float4(acc[p][0], acc[p][1], acc[p][2], acc[p][3]));
  }
}

template <class T, int CN>
void launch_dgrad(const ConvBwdData& o, CudaCtx& ctx) {
  auto kern = narrow_dgrad_kernel<T, CN>;
  const int B = (int)o.dx.dim[0], H = (int)o.dx.dim[1], W = (int)o.dx.dim[2], Cw = (int)o.dx.dim[3];
  const int Cn = (int)o.dy.dim[3];
  const size_t smem = dg_smem_bytes(Cw, Cn);
  static size_t smem_set = 0;
  allow_dynamic_smem(kern, smem, smem_set);  // what the launch needs (kMaxSmem can exceed a GPU's limit)
  const dim3 grid((W + kDgCols - 1) / kDgCols, (H + kDgRows - 1) / kDgRows, B);
  kern<<<grid, kDgThreads, smem, ctx.stream>>>(dptr<T>(o.dy), dptr<T>(o.w), dptr<T>(o.dx), H, W, Cw, Cn);
  KERNEL_CHECK();
}

template <class T>
void dispatch_dgrad(const ConvBwdData& o, CudaCtx& ctx) {
  const int Cn = (int)o.dy.dim[3];
  if (Cn == 3) return launch_dgrad<T, 3>(o, ctx);
  if (Cn == 6) return launch_dgrad<T, 6>(o, ctx);
  launch_dgrad<T, 0>(o, ctx);
}

void narrow_dgrad(const ConvBwdData& o, CudaCtx& ctx) {
  if (o.dx.dtype == DType::BF16) return dispatch_dgrad<bf16>(o, ctx);
  dispatch_dgrad<float>(o, ctx);
}

// 3x3 stride 1 with equal sizes, at most 8 output channels (dy's), dx's channels in 4-vectors with
// aligned stores (16 bytes f32, 8 bf16), and the f32 filter in shared memory.
bool narrow_dgrad_ok(const ConvBwdData& o, const CudaCtx&) {
  const int64_t Cn = o.dy.dim[3], Cw = o.dx.dim[3];
  return o.stride == 1 && o.w.dim[1] == 3 && o.w.dim[2] == 3 && Cn >= 1 && Cn <= kMaxCo && Cw % 4 == 0 &&
         o.dx.dim[1] == o.dy.dim[1] && o.dx.dim[2] == o.dy.dim[2] && o.dx.dim[0] < 65536 &&
         reinterpret_cast<uintptr_t>(o.dx.data) % (4 * dtype_size(o.dx.dtype)) == 0 &&
         narrow_smem_fits(dg_smem_bytes((int)Cw, (int)Cn));
}

// ---- variant "narrow_wgrad": the filter gradient of a conv with at most 3 input or output channels (tf32) ----
// The model's first layer (3 -> C, 3x3): cuDNN's deterministic tf32 engine took 79 us at seed64's
// 64x64 batch 32 for 0.45 GFLOP, at the very end of the step's backward. As a GEMM it is
// dW^T [Co x 27] = dy^T [Co x P] . X27 [P x 27], X27's row p the 3x3 neighbourhood of pixel p (9
// taps x Ci): a block of four warps takes tiles of 2 output rows x 64 columns, dy's rows (Co
// channels, 16-byte copies) and x's 4 x 66 neighbourhood (rounded to tf32) in shared memory, each
// warp its 16-channel tiles of Co x 32 columns (27 taps x channels, then a column of ones: the bias
// gradient) on mma.sync m16n8k8, accumulated over the block's tiles in registers; then the blocks'
// partials are added in a fixed order (double) by a second kernel. The block count depends on the
// shapes only, so the sums' order does too: deterministic. The last layer (C -> 3) is the same
// GEMM with the roles swapped: dW [C x 27] = X^T . DY27, dy's neighbourhood mirrored, and the bias
// gradient from dy's column sums, added by each block as it loads its pixels (per-block partials
// beside the GEMM's; a separate column-sum launch took 44 us of the side lane for 1.5 MB). H100, 3 -> 64 at 64x64 batch 32, same
// run: 25.4 + 14.8 us against cuDNN's ~150 us of kernels (its engine 40 us, then tensor conversion
// 59, channel padding 15, split-K reduction 9, our bias column sums 21.5); tf32 step 13.052 /
// 13.038 / 13.003 ms against 13.059 / 13.048 / 13.038 (and 12.937 / 12.938 / 12.938 against 12.977
// / 12.988 / 12.996 in an earlier run, with a slower sum). 64 -> 3 (same H100, same run): the
// backward's kernels 0.165 -> 0.070 ms (cuDNN's wgrad 113 us -> 31 + 7), tf32 step 12.982 /
// 12.997 / 13.002 -> 12.916 / 12.896 / 12.904 ms. Measured and not kept (same H100, 2026-11-25): the
// first layer's tf32 forward and the last layer's data gradient as one more GEMM of this shape,
// out [P x C] = N27 . W27 (the narrow side's neighbourhood from this kernel's tile, W27 in
// registers, mma.sync): the 3 -> 64 forward 21.0 us against cuDNN's 32, the 64 -> 3 backward 0.069
// ms either way, the tf32 step 12.883 / 12.909 / 12.915 ms against 12.875 / 12.879 / 12.875.
// (The last layer's with fewer blocks, to crowd the backward's first kernels less: 132 blocks tf32
// step 12.376 ms, 264 12.345, 528 12.346; H100, same run, 3 rounds, 2026-11-25.)
constexpr int kWgThreads = 128, kWgBlocks = 528;  // 4 a nominal 132-SM GPU's SM
constexpr int kWgCols = 64, kWgRows = 2, kWgPix = kWgCols * kWgRows;
constexpr int kWgN = 32;                                    // 27 taps x channels, the ones column at 27
__host__ __device__ inline int wg_stride(int Co) { return Co + 8; }  // dy rows 8 banks apart: conflict-free A loads
size_t wg_smem_bytes(int Co) { return (size_t)kWgPix * wg_stride(Co) * 4 + (size_t)(kWgRows + 2) * (kWgCols + 2) * 4 * 4; }

// wide [B, H, W, Cw] and narrow [B, H, W, Cn]: the first layer's dy and x; with flip, the last
// layer's x and dy, whose neighbourhood of a pixel is taken mirrored: dW[co][tap][ci] = sum_q
// x[q][ci] dy[q - off(tap)][co]. part [block][Cw][kWgN].
__global__ void __launch_bounds__(kWgThreads)
    narrow_wgrad_kernel(const float* __restrict__ wide, const float* __restrict__ narrow, float* __restrict__ part,
                        int B, int H, int W, int Cn, int Cw, bool flip, bool sum_db) {
  pdl_entry();
  extern __shared__ __align__(16) float wg_smem[];
  const int S = wg_stride(Cw);
  float* sw = wg_smem;                    // wide [kWgPix][S]
  float* sn = wg_smem + kWgPix * S;       // narrow [kWgRows + 2][kWgCols + 2][4]
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, q = lane % 4;
  const int MT = Cw / 16;                 // 16-channel tiles, warp w takes w, w + 4, ...
  const int tx = (W + kWgCols - 1) / kWgCols, ty = (H + kWgRows - 1) / kWgRows;
  const long long tiles = (long long)tx * ty * B;
  // This lane's B columns: n = nt * 8 + g, as an offset into sn's neighbourhood of a pixel, -1 for
  // zero, -2 for one.
  int boff[4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int n = nt * 8 + g;
    if (n < 9 * Cn) {
      const int tap = n / Cn, ci = n % Cn, ky = flip ? 2 - tap / 3 : tap / 3, kx = flip ? 2 - tap % 3 : tap % 3;
      boff[nt] = (ky * (kWgCols + 2) + kx) * 4 + ci;
    } else {
      boff[nt] = n == 27 && !flip ? -2 : -1;
    }
  }
  float acc[2][4][4] = {};  // [m-tile of this warp][n-tile][fragment] (Cw <= 128: 2 a warp)
  // flip with db: dy's column sums (the bias gradient) over the block's pixels, as loaded (before
  // the tf32 rounding); a thread's neighbourhood loads are always of channel t % 4.
  const bool colsum = flip && sum_db;
  float csum = 0.f;
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int x0 = (int)(tile % tx) * kWgCols, y0 = (int)(tile / tx % ty) * kWgRows, b = (int)(tile / tx / ty);
    __syncthreads();  // the previous tile's reads are done
    const int cv = Cw / 4;
    for (int i = t; i < kWgPix * cv; i += kWgThreads) {
      const int c = i % cv, p = i / cv, oy = y0 + p / kWgCols, ox = x0 + p % kWgCols;
      float* dst = sw + p * S + c * 4;
      if (oy < H && ox < W)
        __pipeline_memcpy_async(dst, wide + (((size_t)b * H + oy) * W + ox) * Cw + c * 4, 16);
      else
        *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int i = t; i < (kWgRows + 2) * (kWgCols + 2) * 4; i += kWgThreads) {
      const int ci = i % 4, r = i / 4, iy = y0 - 1 + r / (kWgCols + 2), ix = x0 - 1 + r % (kWgCols + 2);
      float v = 0.f;
      if (ci < Cn && iy >= 0 && iy < H && ix >= 0 && ix < W) v = narrow[(((size_t)b * H + iy) * W + ix) * Cn + ci];
      const int rr = r / (kWgCols + 2), cc = r % (kWgCols + 2);
      if (colsum && rr >= 1 && rr <= kWgRows && cc >= 1 && cc <= kWgCols) csum += v;  // the tile's own pixels
      sn[i] = __uint_as_float(tf32_bits(v));
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int k0 = 0; k0 < kWgPix; k0 += 8) {
      // B: k = pixel k0 + q (and + 4), n = this lane's columns
      uint32_t bf[4][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int p = k0 + q + 4 * h;
        const float* nb = sn + ((p / kWgCols) * (kWgCols + 2) + p % kWgCols) * 4;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          bf[nt][h] = boff[nt] >= 0 ? __float_as_uint(nb[boff[nt]]) : (boff[nt] == -2 ? __float_as_uint(1.f) : 0u);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int mt = warp + 4 * j;
        if (mt >= MT) break;
        // A: m = wide channel mt * 16 + g (+ 8), k = pixel k0 + q (+ 4)
        const float* a0 = sw + (k0 + q) * S + mt * 16 + g;
        const uint32_t a[4] = {tf32_bits(a0[0]), tf32_bits(a0[8]), tf32_bits(a0[4 * S]), tf32_bits(a0[4 * S + 8])};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_tf32(acc[j][nt], a, bf[nt]);
      }
    }
  }
  // C: m = wide channel g (+ 8), n = 2q (+ 1)
  float* pb = part + (size_t)blockIdx.x * Cw * kWgN;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int mt = warp + 4 * j;
    if (mt >= MT) break;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int m = mt * 16 + g, n = nt * 8 + 2 * q;
      pb[(size_t)m * kWgN + n] = acc[j][nt][0], pb[(size_t)m * kWgN + n + 1] = acc[j][nt][1];
      pb[(size_t)(m + 8) * kWgN + n] = acc[j][nt][2], pb[(size_t)(m + 8) * kWgN + n + 1] = acc[j][nt][3];
    }
  }
  if (colsum) {  // the block's column sums at row 0, columns 28 + channel (zeros from the MMAs there)
    __shared__ float red[kWgThreads / 32][4];
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) csum += __shfl_xor_sync(0xffffffffu, csum, off);
    if (lane < 4) red[warp][lane] = csum;
    __syncthreads();  // (also orders the fragment stores above before these)
    if (t < Cn) {
      float s = 0.f;
      for (int w = 0; w < kWgThreads / 32; ++w) s += red[w][t];
      pb[28 + t] = s;
    }
  }
}

// dw [Co][3][3][Ci] (= [Co][27 columns]; flip: [27 columns][Ci], transposed) and db [Co] (the ones
// column): the blocks' partials added in a fixed order: 16 runs of consecutive blocks in parallel
// (8 loads in flight each), then the runs in order (double). (One thread adding all 528 in turn
// took 46 us.)
constexpr int kWgRuns = 16, kWgSumCols = 16;
__global__ void __launch_bounds__(kWgRuns* kWgSumCols)
    narrow_wgrad_sum_kernel(const float* __restrict__ part, int blocks, int Cw, int Cn, bool flip,
                            float* __restrict__ dw, float* __restrict__ db) {
  pdl_entry();
  __shared__ double runs[kWgRuns][kWgSumCols];
  const int col = threadIdx.x % kWgSumCols, run = threadIdx.x / kWgSumCols;
  const int i = blockIdx.x * kWgSumCols + col;  // column of [Cw][kWgN]
  const int per = (blocks + kWgRuns - 1) / kWgRuns, k0 = run * per, k1 = min(blocks, k0 + per);
  double s = 0;
  if (i < Cw * kWgN) {
    const size_t stride = (size_t)Cw * kWgN;
    int k = k0;
    for (; k + 8 <= k1; k += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = part[(size_t)(k + u) * stride + i];
#pragma unroll
      for (int u = 0; u < 8; ++u) s += v[u];
    }
    for (; k < k1; ++k) s += part[(size_t)k * stride + i];
  }
  runs[run][col] = s;
  __syncthreads();
  if (run || i >= Cw * kWgN) return;
  double tot = 0;
  for (int r = 0; r < kWgRuns; ++r) tot += runs[r][col];
  const int m = i / kWgN, n = i % kWgN;
  if (n < 9 * Cn)  // m the wide side's channel, n = (tap, narrow channel); dw is [Co][3][3][Ci]
    dw[flip ? ((size_t)(n % Cn) * 9 + n / Cn) * Cw + m : (size_t)m * 9 * Cn + n] = (float)tot;
  else if (n == 27 && db && !flip)
    db[m] = (float)tot;
  else if (flip && db && m == 0 && n >= 28 && n < 28 + Cn)  // dy's column sums (narrow_wgrad_kernel)
    db[n - 28] = (float)tot;
}

int wg_blocks(const ConvBwdFilter& o) {
  const long long tiles = (long long)((o.dy.dim[2] + kWgCols - 1) / kWgCols) * ((o.dy.dim[1] + kWgRows - 1) / kWgRows) *
                          o.dy.dim[0];
  return (int)std::min<long long>(tiles, kWgBlocks);
}
// The last layer's case: at most 3 output channels (dy the narrow tensor).
bool wg_flip(const ConvBwdFilter& o) { return o.dy.dim[3] <= 3; }
size_t narrow_wgrad_ws(const ConvBwdFilter& o, const CudaCtx&) {
  return (size_t)wg_blocks(o) * (wg_flip(o) ? o.x.dim[3] : o.dy.dim[3]) * kWgN * 4;
}

void narrow_wgrad(const ConvBwdFilter& o, CudaCtx& ctx) {
  const int B = (int)o.x.dim[0], H = (int)o.x.dim[1], W = (int)o.x.dim[2];
  const bool flip = wg_flip(o);
  const Tensor& wide = flip ? o.x : o.dy;
  const Tensor& narrow = flip ? o.dy : o.x;
  const int Cw = (int)wide.dim[3], Cn = (int)narrow.dim[3];
  static const bool attr = (allow_dynamic_smem(narrow_wgrad_kernel, wg_smem_bytes(128)), true);
  (void)attr;
  const int blocks = wg_blocks(o);
  float* part = static_cast<float*>(ctx.ws);
  narrow_wgrad_kernel<<<blocks, kWgThreads, wg_smem_bytes(Cw), ctx.stream>>>(
      dptr<float>(wide), dptr<float>(narrow), part, B, H, W, Cn, Cw, flip, o.db.defined());
  KERNEL_CHECK();
  narrow_wgrad_sum_kernel<<<(Cw * kWgN + kWgSumCols - 1) / kWgSumCols, kWgRuns * kWgSumCols, 0, ctx.stream>>>(
      part, blocks, Cw, Cn, flip, dptr<float>(o.dw), dptr<float>(o.db));
  KERNEL_CHECK();
}

// tf32 (f32 tensors, not fp32: TF32 products), 3x3 stride 1 with equal sizes, one side at most 3
// channels and the other a multiple of 16 up to 128, no embedding gradient, the wide tensor
// 16-byte aligned.
bool narrow_wgrad_ok(const ConvBwdFilter& o, const CudaCtx& c) {
  const int64_t Ci = o.x.dim[3], Co = o.dy.dim[3];
  const int64_t Cn = Co <= 3 ? Co : Ci, Cw = Co <= 3 ? Ci : Co;
  return c.prec == Precision::TF32 && o.x.dtype == DType::F32 && o.dy.dtype == DType::F32 &&
         o.dw.dtype == DType::F32 && (!o.db.defined() || o.db.dtype == DType::F32) && !o.demb.defined() &&
         o.stride == 1 && o.dw.dim[1] == 3 && o.dw.dim[2] == 3 && Cn >= 1 && Cn <= 3 && Cw % 16 == 0 &&
         Cw >= 16 && Cw <= 128 && device_smem_fits(wg_smem_bytes(128)) && o.x.dim[1] == o.dy.dim[1] &&
         o.x.dim[2] == o.dy.dim[2] && aligned16((Co <= 3 ? o.x : o.dy).data);
}

}  // namespace

void register_conv_narrow(CudaOps& ops) {
  ops.variants<ConvFwd>().push_back(
      {"narrow_tc", no_norm<ConvFwd, stats_ok<ConvFwd, narrow_tc_ok>>, then_stats<ConvFwd, narrow_tc_fwd>, nullptr});
  ops.variants<ConvFwd>().push_back(
      {"narrow", no_norm<ConvFwd, stats_ok<ConvFwd, narrow_ok>>, then_stats<ConvFwd, narrow_fwd>, nullptr});
  ops.variants<ConvBwdData>().push_back({"narrow_dgrad", narrow_dgrad_ok, narrow_dgrad, nullptr});
  ops.variants<ConvBwdFilter>().push_back(
      {"narrow_wgrad", no_norm<ConvBwdFilter, narrow_wgrad_ok>, narrow_wgrad, narrow_wgrad_ws});
}

}  // namespace unet
