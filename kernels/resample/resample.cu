// Resample variant "cuda": nearest 2x upsampling and 2x2 average pooling, NHWC, forward and
// backward, f32 or bf16. One thread per output element (or per 4 channels when C % 4 == 0):
// reads and writes are contiguous along channels, so warp accesses are coalesced.
#include "cuda_engine.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

// y [B,2H,2W,C], y[b,Y,X] = x[b,Y/2,X/2]
template <class T>
struct Upsample {
  const T* x;
  T* y;
  int H, W, C;
  __device__ size_t src(size_t i) const {
    const int c = (int)(i % C);
    size_t p = i / C;
    const int X = (int)(p % (2 * W));
    p /= 2 * W;
    const int Y = (int)(p % (2 * H));
    const size_t b = p / (2 * H);
    return ((b * H + Y / 2) * W + X / 2) * C + c;
  }
  __device__ void vec4(size_t j) const { st4(y, j, ld4(x, src(4 * j) / 4)); }
  __device__ void scalar(size_t i) const { y[i] = x[src(i)]; }
};

// dx [B,H,W,C] = sum of the 2x2 block of dy it was copied to, in order (0,0),(0,1),(1,0),(1,1).
template <class T>
struct UpsampleBwdF {
  const T* dy;
  T* dx;
  int H, W, C;
  __device__ size_t base(size_t i) const {  // dy offset of (2i, 2j)
    const int c = (int)(i % C);
    size_t p = i / C;
    const int j = (int)(p % W);
    p /= W;
    const int r = (int)(p % H);
    const size_t b = p / H;
    return ((b * 2 * H + 2 * r) * (2 * W) + 2 * j) * C + c;
  }
  __device__ void vec4(size_t j) const {
    const size_t o = base(4 * j), rs = (size_t)2 * W * C;
    const float4 a = ld4(dy, o / 4), b = ld4(dy, (o + C) / 4), c = ld4(dy, (o + rs) / 4),
                 d = ld4(dy, (o + rs + C) / 4);
    st4(dx, j,
        make_float4(a.x + b.x + c.x + d.x, a.y + b.y + c.y + d.y, a.z + b.z + c.z + d.z,
                    a.w + b.w + c.w + d.w));
  }
  __device__ void scalar(size_t i) const {
    const size_t o = base(i), rs = (size_t)2 * W * C;
    stf(dx, i, ldf(dy, o) + ldf(dy, o + C) + ldf(dy, o + rs) + ldf(dy, o + rs + C));
  }
};

// y [B,H/2,W/2,C] = mean of each 2x2 window.
template <class T>
struct Avgpool {
  const T* x;
  T* y;
  int H, W, C;
  __device__ size_t base(size_t i) const {  // x offset of (2i, 2j)
    const int Ho = H / 2, Wo = W / 2;
    const int c = (int)(i % C);
    size_t p = i / C;
    const int j = (int)(p % Wo);
    p /= Wo;
    const int r = (int)(p % Ho);
    const size_t b = p / Ho;
    return ((b * H + 2 * r) * W + 2 * j) * C + c;
  }
  __device__ void vec4(size_t j) const {
    const size_t o = base(4 * j), rs = (size_t)W * C;
    const float4 a = ld4(x, o / 4), b = ld4(x, (o + C) / 4), c = ld4(x, (o + rs) / 4),
                 d = ld4(x, (o + rs + C) / 4);
    st4(y, j,
        make_float4((a.x + b.x + c.x + d.x) * 0.25f, (a.y + b.y + c.y + d.y) * 0.25f,
                    (a.z + b.z + c.z + d.z) * 0.25f, (a.w + b.w + c.w + d.w) * 0.25f));
  }
  __device__ void scalar(size_t i) const {
    const size_t o = base(i), rs = (size_t)W * C;
    stf(y, i, (ldf(x, o) + ldf(x, o + C) + ldf(x, o + rs) + ldf(x, o + rs + C)) * 0.25f);
  }
};

template <class T>
struct AvgpoolBwdF {
  const T* dy;
  T* dx;
  int H, W, C;
  __device__ size_t src(size_t i) const {
    const int Ho = H / 2, Wo = W / 2;
    const int c = (int)(i % C);
    size_t p = i / C;
    const int x = (int)(p % W);
    p /= W;
    const int r = (int)(p % H);
    const size_t b = p / H;
    return ((b * Ho + r / 2) * Wo + x / 2) * C + c;
  }
  __device__ void vec4(size_t j) const {
    const float4 g = ld4(dy, src(4 * j) / 4);
    st4(dx, j, make_float4(g.x * 0.25f, g.y * 0.25f, g.z * 0.25f, g.w * 0.25f));
  }
  __device__ void scalar(size_t i) const { stf(dx, i, ldf(dy, src(i)) * 0.25f); }
};

// The 2x2 block kernel: one thread per 16-byte channel vector of the small tensor's pixel (b, y,
// x) and the 2x2 pixels (2y + i, 2x + j) of the large one, 32-bit index math (one division by the
// vector count and one by the width per thread, where the maps above divide in 64 bits per
// element). Same arithmetic, in the same order, as the maps. H100, imagenet256 batch 16 bf16:
// nearest upsampling as a map ran at ~1.7 TB/s.
enum class Block { kUp, kUpBwd, kPool, kPoolBwd };
template <class T, int V, Block K>
__global__ void __launch_bounds__(256)
    block2x2_kernel(const T* __restrict__ in, T* __restrict__ out, unsigned n, unsigned Cv, unsigned W, unsigned C) {
  pdl_entry();
  const unsigned v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= n) return;
  const unsigned p = v / Cv, cv = v - p * Cv, by = p / W, x = p - by * W;  // by = b * H + y
  const size_t sm = (size_t)p * C + (size_t)cv * V;
  const size_t lg = ((size_t)(2 * by) * (2 * W) + 2 * x) * C + (size_t)cv * V, rs = (size_t)2 * W * C;
  using Vt = rowblock::Vec<T, V>;
  float a[V];
  if constexpr (K == Block::kUp || K == Block::kPoolBwd) {  // small -> 2x2 large
    Vt::load(in + sm, a);
    if constexpr (K == Block::kPoolBwd) {
#pragma unroll
      for (int k = 0; k < V; ++k) a[k] *= 0.25f;
    }
    Vt::store(out + lg, a);
    Vt::store(out + lg + C, a);
    Vt::store(out + lg + rs, a);
    Vt::store(out + lg + rs + C, a);
  } else {  // 2x2 large -> small: (0,0) + (0,1) + (1,0) + (1,1), left to right
    float b[V], c[V], d[V];
    Vt::load(in + lg, a);
    Vt::load(in + lg + C, b);
    Vt::load(in + lg + rs, c);
    Vt::load(in + lg + rs + C, d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      a[k] = a[k] + b[k] + c[k] + d[k];
      if constexpr (K == Block::kPool) a[k] *= 0.25f;
    }
    Vt::store(out + sm, a);
  }
}

// small: the half-size tensor (B, H, W, C); large: (B, 2H, 2W, C) (the ops' checks).
template <template <class> class F, Block K>
void run(const Tensor& in, const Tensor& out, const Tensor& small, const Tensor& large, CudaCtx& ctx) {
  with_act(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = rowblock::kWide<T>;
    const long long C = small.dim[3], n = small.numel() / V;
    if (n < (1LL << 31) && rowblock::wide_ok<T>((int)C, {in.data, out.data})) {  // (wide_ok: C % V too)
      if (n == 0) return;
      block2x2_kernel<T, V, K><<<(unsigned)((n + 255) / 256), 256, 0, ctx.stream>>>(
          dptr<T>(in), dptr<T>(out), (unsigned)n, (unsigned)(C / V), (unsigned)small.dim[2], (unsigned)C);
      KERNEL_CHECK();
      return;
    }
    // channels not a multiple of V, unaligned views, 2^31 vectors or more: the maps; they take the small tensor's H, W (Avgpool's
    // and AvgpoolBwdF's the large one's)
    const Tensor& d = (K == Block::kPool || K == Block::kPoolBwd) ? large : small;
    launch_map(F<T>{dptr<T>(in), dptr<T>(out), (int)d.dim[1], (int)d.dim[2], (int)d.dim[3]}, out.numel(),
               d.dim[3] % 4 == 0 && vec4_ok<T>(in.data) && vec4_ok<T>(out.data), ctx.stream);
  });
}

void up_fwd(const UpsampleFwd& o, CudaCtx& ctx) { run<Upsample, Block::kUp>(o.x, o.y, o.x, o.y, ctx); }
void up_bwd(const UpsampleBwd& o, CudaCtx& ctx) { run<UpsampleBwdF, Block::kUpBwd>(o.dy, o.dx, o.dx, o.dy, ctx); }
void pool_fwd(const AvgPoolFwd& o, CudaCtx& ctx) { run<Avgpool, Block::kPool>(o.x, o.y, o.y, o.x, ctx); }
void pool_bwd(const AvgPoolBwd& o, CudaCtx& ctx) { run<AvgpoolBwdF, Block::kPoolBwd>(o.dy, o.dx, o.dy, o.dx, ctx); }

}  // namespace

void register_resample_cuda(CudaOps& ops) {
  ops.variants<UpsampleFwd>().push_back({"cuda", nullptr, up_fwd, nullptr});
  ops.variants<UpsampleBwd>().push_back({"cuda", nullptr, up_bwd, nullptr});
  ops.variants<AvgPoolFwd>().push_back({"cuda", nullptr, pool_fwd, nullptr});
  ops.variants<AvgPoolBwd>().push_back({"cuda", nullptr, pool_bwd, nullptr});
}

}  // namespace unet
