// Convolution variant "pointwise" of ConvBwdFilter: the tf32 filter gradient of a 1x1 stride-1
// convolution (the ResBlocks' skip connections, attention's qkv and proj_out), and its bias
// gradient, on mma.sync. dW [Co, Ci] = dy^T x: a GEMM whose K is the pixels, which NHWC stores with
// the channels contiguous, so neither operand is K-major: Hopper's tf32 wgmma cannot read them from
// shared memory, and cuDNN (through cuBLAS) ran these on sm80 kernels with split-K reduce launches
// (~1.2 ms of kernels a seed64 tf32 step, ~1 TB/s at the 64x64 level), then a column-sum pass for
// the bias. Here the fragments are loaded from shared memory one f32 at a time, which any layout
// allows.
//
//  * A block: 64 output x 64 input channels, 8 warps of 32 x 32 (2 m16 x 4 n8 MMA tiles, m16n8k8),
//    warps 4-7 on the second half of each K block (their sums added to the first four's at the
//    end: twice the warps for one tile's traffic), over a range of pixels (split K), in K blocks of
//    64 pixels: dy's and x's 64 x 64 tiles through 3 cp.async stages (16 bytes a copy, zeros past
//    the last pixel), rows padded to 72 floats so that a fragment's 32 loads (rows t and t + 4,
//    columns g: 72 t + g) hit 32 distinct banks. Operands rounded to tf32 to nearest as they are
//    loaded (as cuDNN's tf32 kernels round).
//  * Blocks: the tiles fastest (the blocks reading one pixel range run together and share it in L2),
//    about kBlocks in all (a count from the shape alone: the sums' order, and so their bits, are the
//    same on every GPU); each split's sums go to its own slice of the workspace.
//  * The bias gradient (dy's column sums): the blocks of the first 64 input channels add the dy tile
//    they stage, 4 partials a split; one launch after (pw_finish_kernel) adds the slices of dW in
//    split order and the partials in double, in a fixed order. Deterministic.
// H100, seed64 tf32 step (CUDA events of graph replays, same runs, orders alternated, means of 4-6):
// 12.503 against 12.538 ms with cuDNN's; another machine 12.558 against 12.599 (the forms measured
// beside it, within noise of each other: K blocks of 32 pixels in 4 stages at 132 or 264 blocks,
// 12.569; 64 pixels at 264 blocks, 12.579; 4 warps a block without the K halves, 12.50 vs 12.46 at
// 264). Alone (unet profile --layer conv1x1, batch 32) it is not at memory speed: 64x64 192 -> 64
// 64 us (+ 6 us finish; 134 MB), 16x16 192 -> 576 46 us, 8x8 256 -> 768 21 us; Nsight Compute in
// the step: 2 warps a scheduler, 0.43 issued a cycle, memory and SM both ~23% busy (latency: each
// k-step's loads, conversions and MMAs in a chain). Fewer blocks: 66 (the first form) 12.93 vs 12.46 ms.
// The k-step loop has a constant trip count (its bounds were the warp's K half, and nvcc unrolled
// it only in part: 24 MMA instructions in the kernel's PTX, 32 now), so the next k-step's fragment
// loads are issued beside this one's MMAs: H200, seed64 tf32 step 11.274 / 11.286 ->
// 11.192 / 11.184 ms (same run, alternated), this kernel's sum 1.27 -> 1.14 ms a step; the same
// sums in the same order (30 training steps bitwise the same).
#include "cuda_engine.cuh"
#include "implicit_gemm.cuh"

namespace unet {

namespace {

using namespace igemm;

constexpr int PT = 64, PK = 64, PSTAGES = 3, PTHREADS = 256, PITCH = PT + 8;  // floats
constexpr int PSLOTS = PTHREADS / 64;  // column-sum partials a split
constexpr int TILE_FLOATS = PK * PITCH, PW_SMEM = PSTAGES * 2 * TILE_FLOATS * 4;

struct PwArgs {
  const float *x, *dy;
  float* out;           // [splits][Co][Ci] (dW itself for one split)
  size_t split_stride;  // floats
  float* csum;          // [splits][2][Co] or null
  long long P;          // pixels
  int Ci, Co, KB, per;  // K blocks in all, per split
};

__global__ void __launch_bounds__(PTHREADS) pw_wgrad_kernel(const PwArgs a) {
  pdl_entry();
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int tiles_ci = a.Ci / PT;
  const int ci0 = (blockIdx.x % tiles_ci) * PT, co0 = (blockIdx.x / tiles_ci) * PT, split = blockIdx.y;
  const int kb0 = split * a.per, nkb = min(a.per, a.KB - kb0);
  const int t = threadIdx.x, w = t >> 5, l = t & 31, g = l >> 2, q = l & 3, kg = w >> 2;
  // stage s: dy tile at smem + 2 s TILE_FLOATS, x tile after it
  auto load = [&](int i) {
    const long long p0 = (long long)(kb0 + i) * PK;
    float* st = smem + (i % PSTAGES) * 2 * TILE_FLOATS;
#pragma unroll
    for (int r = 0; r < PK * PT / 4 / PTHREADS; ++r) {
      const int c = t + PTHREADS * r, row = c >> 4, c4 = (c & 15) * 4;
      const long long p = p0 + row;
      const bool ok = p < a.P;
      const long long pc = ok ? p : 0;
      cp16(smem_u32(st + row * PITCH + c4), a.dy + pc * a.Co + co0 + c4, ok);
      cp16(smem_u32(st + TILE_FLOATS + row * PITCH + c4), a.x + pc * a.Ci + ci0 + c4, ok);
    }
  };
  for (int i = 0; i < PSTAGES - 1; ++i) {
    if (i < nkb) load(i);
    cp_commit();
  }
  float acc[2][4][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[m][n][k] = 0.f;
  const bool sums = a.csum != nullptr && ci0 == 0;
  float cs = 0.f;  // column t % 64 of dy over rows 8 (t / 64) .. + 7 of each tile
  const int wm = (w & 1) * 32, wn = ((w >> 1) & 1) * 32;
  for (int i = 0; i < nkb; ++i) {
    cp_wait<PSTAGES - 2>();
    __syncthreads();  // stage i landed for all; stage i - 1's readers are done
    if (i + PSTAGES - 1 < nkb) load(i + PSTAGES - 1);
    cp_commit();
    const float* dys = smem + (i % PSTAGES) * 2 * TILE_FLOATS;
    const float* xs = dys + TILE_FLOATS;
    if (sums) {
      const float* c = dys + (t >> 6) * (PK / PSLOTS) * PITCH + (t & 63);
#pragma unroll
      for (int r = 0; r < PK / PSLOTS; ++r) cs += c[r * PITCH];
    }
#pragma unroll
    for (int j = 0; j < PK / 16; ++j) {  // (warps 4-7 the K block's second half)
      const int kk = kg * PK / 16 + j;     // (a constant trip count: fully unrolled)
      const float* d0 = dys + (8 * kk + q) * PITCH + wm + g;
      const float* x0 = xs + (8 * kk + q) * PITCH + wn + g;
      uint32_t af[2][4], bf[4][2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {  // A[co][pixel]: rows g, g + 8; columns q, q + 4
        af[m][0] = tf32_bits(d0[16 * m]);
        af[m][1] = tf32_bits(d0[16 * m + 8]);
        af[m][2] = tf32_bits(d0[4 * PITCH + 16 * m]);
        af[m][3] = tf32_bits(d0[4 * PITCH + 16 * m + 8]);
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {  // B[pixel][ci]: rows q, q + 4; column g
        bf[n][0] = tf32_bits(x0[8 * n]);
        bf[n][1] = tf32_bits(x0[4 * PITCH + 8 * n]);
      }
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n) mma_tf32(acc[m][n], af[m], bf[n]);
    }
  }
  cp_wait<0>();
  if (sums) a.csum[((size_t)split * PSLOTS + (t >> 6)) * a.Co + co0 + (t & 63)] = cs;
  // The second K group's sums join the first's through shared memory (the stages, free now), in
  // that order; the first group's warps store.
  __syncthreads();
  float* red = smem + (w & 3) * 32 * 32 + l;
  if (kg == 1) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int k = 0; k < 4; ++k) red[((m * 4 + n) * 4 + k) * 32] = acc[m][n][k];
  }
  __syncthreads();
  if (kg == 1) return;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[m][n][k] += red[((m * 4 + n) * 4 + k) * 32];
  float* out = a.out + (size_t)split * a.split_stride;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int co = co0 + wm + 16 * m + g, ci = ci0 + wn + 8 * n + 2 * q;
      *reinterpret_cast<float2*>(out + (size_t)co * a.Ci + ci) = make_float2(acc[m][n][0], acc[m][n][1]);
      *reinterpret_cast<float2*>(out + (size_t)(co + 8) * a.Ci + ci) = make_float2(acc[m][n][2], acc[m][n][3]);
    }
}

// After pw_wgrad_kernel, one launch: blocks [0, nsplit) add the S slices of dW in order (sum_splits'
// loop), the next ones dy's column sums: total[co] = the 2 S partials, in double, in order.
__global__ void __launch_bounds__(256)
    pw_finish_kernel(const float* __restrict__ part, int S, size_t n4, float* __restrict__ dw, int nsplit,
                     const float* __restrict__ csum, int Co, float* __restrict__ total) {
  pdl_entry();
  if ((int)blockIdx.x < nsplit) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n4; j += (size_t)nsplit * blockDim.x) {
      reinterpret_cast<float4*>(dw)[j] = sum_slices(part, S, n4, j);
    }
    return;
  }
  const int co = (blockIdx.x - nsplit) * blockDim.x + threadIdx.x;
  if (co >= Co) return;
  double v = 0.0;
  const int n = PSLOTS * S;
  int s = 0;
  for (; s + 8 <= n; s += 8) {  // (8 loads in flight, added in order)
    float f[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) f[u] = csum[(size_t)(s + u) * Co + co];
#pragma unroll
    for (int u = 0; u < 8; ++u) v += f[u];
  }
  for (; s < n; ++s) v += csum[(size_t)s * Co + co];
  total[co] = (float)v;
}

// The split K of an op: about kBlocks blocks, at least 4 K blocks a split; the workspace holds the
// splits' slices of dW (with more than one) and then the column-sum partials (with a bias
// gradient). 200 rather than one wave (132 on an H100 or H200, one block an SM): the kernel runs on
// the side lane beside the main lane's, and smaller splits finish in the gaps they leave. H200,
// seed64 tf32 step, two runs on two machines (CUDA events): 132 -> 200 blocks 11.213 / 11.212 ->
// 11.173 / 11.158 ms and 11.362 / 11.375 / 11.372 -> 11.319 / 11.313 / 11.309 (160: 11.288 / 11.318
// / 11.306; 232: 11.35; 264: 11.205 / 11.188; 100: 11.280 / 11.276); this kernel 1.06 -> 0.96 ms a
// step, pw_finish_kernel (more slices to add) 0.20 -> 0.30.
constexpr int kBlocks = 200;
struct PwPlan {
  int KB, per, splits;
  size_t slices, bytes;  // the slices' bytes; the workspace's
};
PwPlan pw_plan(const ConvBwdFilter& o) {
  const Geo g = filter_geo(o);
  PwPlan p;
  p.KB = (int)((g.M() + PK - 1) / PK);
  const int tiles = (g.Ci / PT) * (g.Co / PT);
  const int want = std::max(1, std::min((p.KB + 3) / 4, (kBlocks + tiles / 2) / tiles));
  p.per = (p.KB + want - 1) / want;
  p.splits = (p.KB + p.per - 1) / p.per;
  p.slices = p.splits > 1 ? round256((size_t)p.splits * o.dw.numel() * 4) : 0;
  p.bytes = p.slices + (o.db.defined() ? round256((size_t)p.splits * PSLOTS * g.Co * 4) : 0);
  return p;
}

bool pw_ok(const ConvBwdFilter& o, const CudaCtx& c) {
  if (!(c.prec == Precision::TF32 && o.stride == 1 && o.dw.defined() && o.x.dtype == DType::F32 &&
        o.dy.dtype == DType::F32 && o.dw.dtype == DType::F32 && o.dw.dim[1] == 1 && o.dw.dim[2] == 1 &&
        !o.demb.defined() && (!o.db.defined() || o.db.dtype == DType::F32) && same_size(o.x, o.dy)))
    return false;
  const Geo g = filter_geo(o);
  return device_smem_fits(PW_SMEM) && g.Ci % PT == 0 && g.Co % PT == 0 &&
         (long long)(g.Ci / PT) * (g.Co / PT) <= 65535 && g.M() < (1LL << 40) && aligned16(o.x.data) &&
         aligned16(o.dy.data) && aligned16(o.dw.data);
}
size_t pw_ws(const ConvBwdFilter& o, const CudaCtx&) { return pw_plan(o).bytes; }
void pw_wgrad(const ConvBwdFilter& o, CudaCtx& ctx) {
  need_aligned("pointwise", {o.x.data, o.dy.data, o.dw.data, ctx.ws});
  const Geo g = filter_geo(o);
  const PwPlan p = pw_plan(o);
  const int splits = p.splits;
  const size_t n = (size_t)o.dw.numel();
  float* csum = o.db.defined() ? reinterpret_cast<float*>(static_cast<char*>(ctx.ws) + p.slices) : nullptr;
  const PwArgs pa{dptr<float>(o.x), dptr<float>(o.dy), splits > 1 ? static_cast<float*>(ctx.ws) : dptr<float>(o.dw),
                  n, csum, g.M(), g.Ci, g.Co, p.KB, p.per};
  const dim3 grid((g.Ci / PT) * (g.Co / PT), splits);
  static const bool attr = (allow_dynamic_smem(pw_wgrad_kernel, PW_SMEM), true);
  (void)attr;
  pw_wgrad_kernel<<<grid, PTHREADS, PW_SMEM, ctx.stream>>>(pa);
  KERNEL_CHECK();
  const int nsplit = splits > 1 ? (int)grid_for(n / 4) : 0, ncsum = csum ? (g.Co + 255) / 256 : 0;
  if (nsplit + ncsum == 0) return;
  pw_finish_kernel<<<nsplit + ncsum, 256, 0, ctx.stream>>>(static_cast<const float*>(ctx.ws), splits, n / 4,
                                                           dptr<float>(o.dw), nsplit, csum, g.Co, dptr<float>(o.db));
  KERNEL_CHECK();
}

}  // namespace

// Ahead of cuDNN (family.cu): tf32 1x1 filter gradients.
void register_conv_pointwise(CudaOps& ops) {
  ops.variants<ConvBwdFilter>().push_back({"pointwise", no_norm<ConvBwdFilter, pw_ok>, pw_wgrad, pw_ws});
}

}  // namespace unet
