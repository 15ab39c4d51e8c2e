// Resample variant "cuda": nearest 2x upsampling and 2x2 average pooling, NHWC, forward and
// backward, f32 or bf16. One thread per output element (or per 4 channels when C % 4 == 0):
// reads and writes are contiguous along channels, so warp accesses are coalesced.
#include "cuda_engine.cuh"

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

#define DIMS(t) (int)t.dim[1], (int)t.dim[2], (int)t.dim[3]
template <template <class> class F>
void run(const Tensor& in, const Tensor& out, const Tensor& small, CudaCtx& ctx) {
  with_act(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(F<T>{dptr<T>(in), dptr<T>(out), DIMS(small)}, out.numel(),
               small.dim[3] % 4 == 0 && vec4_ok<T>(in.data) && vec4_ok<T>(out.data), ctx.stream);
  });
}
#undef DIMS

void up_fwd(const UpsampleFwd& o, CudaCtx& ctx) { run<Upsample>(o.x, o.y, o.x, ctx); }
void up_bwd(const UpsampleBwd& o, CudaCtx& ctx) { run<UpsampleBwdF>(o.dy, o.dx, o.dx, ctx); }
// Avgpool's functor takes the LARGE tensor's H, W.
void pool_fwd(const AvgPoolFwd& o, CudaCtx& ctx) { run<Avgpool>(o.x, o.y, o.x, ctx); }
void pool_bwd(const AvgPoolBwd& o, CudaCtx& ctx) { run<AvgpoolBwdF>(o.dy, o.dx, o.dx, ctx); }

}  // namespace

void register_resample_cuda(CudaOps& ops) {
  ops.variants<UpsampleFwd>().push_back({"cuda", nullptr, up_fwd, nullptr});
  ops.variants<UpsampleBwd>().push_back({"cuda", nullptr, up_bwd, nullptr});
  ops.variants<AvgPoolFwd>().push_back({"cuda", nullptr, pool_fwd, nullptr});
  ops.variants<AvgPoolBwd>().push_back({"cuda", nullptr, pool_bwd, nullptr});
}

}  // namespace unet
