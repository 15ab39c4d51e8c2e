// Nearest 2x upsampling, 2x2 average pooling and channel concat, NHWC, forward and backward.
// One thread per output element (or per 4 channels when C % 4 == 0): reads and writes are
// contiguous along channels, so every warp access is coalesced. Pure data movement.
#include "cuda_backend.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

// y [B,2H,2W,C], y[b,Y,X] = x[b,Y/2,X/2]
struct Upsample {
  const float* x;
  float* y;
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
  __device__ void vec4(size_t j) const { st4(y, j, *reinterpret_cast<const float4*>(x + src(4 * j))); }
  __device__ void scalar(size_t i) const { y[i] = x[src(i)]; }
};

// dx [B,H,W,C] = sum of the 2x2 block of dy it was copied to, in order (0,0),(0,1),(1,0),(1,1).
struct UpsampleBwd {
  const float* dy;
  float* dx;
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
    const float4 a = *reinterpret_cast<const float4*>(dy + o);
    const float4 b = *reinterpret_cast<const float4*>(dy + o + C);
    const float4 c = *reinterpret_cast<const float4*>(dy + o + rs);
    const float4 d = *reinterpret_cast<const float4*>(dy + o + rs + C);
    st4(dx, j,
        make_float4(a.x + b.x + c.x + d.x, a.y + b.y + c.y + d.y, a.z + b.z + c.z + d.z,
                    a.w + b.w + c.w + d.w));
  }
  __device__ void scalar(size_t i) const {
    const size_t o = base(i), rs = (size_t)2 * W * C;
    dx[i] = dy[o] + dy[o + C] + dy[o + rs] + dy[o + rs + C];
  }
};

// y [B,H/2,W/2,C] = mean of each 2x2 window (odd trailing row/column dropped).
struct Avgpool {
  const float* x;
  float* y;
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
    const float4 a = *reinterpret_cast<const float4*>(x + o);
    const float4 b = *reinterpret_cast<const float4*>(x + o + C);
    const float4 c = *reinterpret_cast<const float4*>(x + o + rs);
    const float4 d = *reinterpret_cast<const float4*>(x + o + rs + C);
    st4(y, j,
        make_float4((a.x + b.x + c.x + d.x) * 0.25f, (a.y + b.y + c.y + d.y) * 0.25f,
                    (a.z + b.z + c.z + d.z) * 0.25f, (a.w + b.w + c.w + d.w) * 0.25f));
  }
  __device__ void scalar(size_t i) const {
    const size_t o = base(i), rs = (size_t)W * C;
    y[i] = (x[o] + x[o + C] + x[o + rs] + x[o + rs + C]) * 0.25f;
  }
};

struct AvgpoolBwd {
  const float* dy;
  float* dx;
  int H, W, C;
  // dy offset for dx element i, or -1 when it lies in a dropped odd row/column.
  __device__ long long src(size_t i) const {
    const int Ho = H / 2, Wo = W / 2;
    const int c = (int)(i % C);
    size_t p = i / C;
    const int x = (int)(p % W);
    p /= W;
    const int r = (int)(p % H);
    const size_t b = p / H;
    if (r / 2 >= Ho || x / 2 >= Wo) return -1;
    return (long long)(((b * Ho + r / 2) * Wo + x / 2) * C + c);
  }
  __device__ void vec4(size_t j) const {
    const long long s = src(4 * j);
    if (s < 0) {
      st4(dx, j, make_float4(0.f, 0.f, 0.f, 0.f));
      return;
    }
    const float4 g = *reinterpret_cast<const float4*>(dy + s);
    st4(dx, j, make_float4(g.x * 0.25f, g.y * 0.25f, g.z * 0.25f, g.w * 0.25f));
  }
  __device__ void scalar(size_t i) const {
    const long long s = src(i);
    dx[i] = s < 0 ? 0.f : dy[s] * 0.25f;
  }
};

// y [R, Ca+Cb] = a [R, Ca] ++ b [R, Cb]; vec4 needs Ca % 4 == 0 and Cb % 4 == 0.
struct Concat {
  const float* a;
  const float* b;
  float* y;
  int Ca, Cb;
  __device__ const float* src(size_t i) const {
    const int C = Ca + Cb;
    const size_t r = i / C;
    const int c = (int)(i % C);
    return c < Ca ? a + r * Ca + c : b + r * Cb + (c - Ca);
  }
  __device__ void vec4(size_t j) const { st4(y, j, *reinterpret_cast<const float4*>(src(4 * j))); }
  __device__ void scalar(size_t i) const { y[i] = *src(i); }
};

struct ConcatBwd {
  const float* dy;
  float* da;
  float* db;
  int Ca, Cb;
  __device__ float* dst(size_t i) const {  // nullptr when that gradient is not wanted
    const int C = Ca + Cb;
    const size_t r = i / C;
    const int c = (int)(i % C);
    if (c < Ca) return da ? da + r * Ca + c : nullptr;
    return db ? db + r * Cb + (c - Ca) : nullptr;
  }
  __device__ void vec4(size_t j) const {
    if (float* d = dst(4 * j)) *reinterpret_cast<float4*>(d) = ld4(dy, j);
  }
  __device__ void scalar(size_t i) const {
    if (float* d = dst(i)) *d = dy[i];
  }
};

}  // namespace

void CudaBackend::upsample2x_fwd(const float* x, float* y, int B, int H, int W, int C) {
  const size_t n = (size_t)B * 4 * H * W * C;
  launch_map(Upsample{x, y, H, W, C}, n, C % 4 == 0 && aligned16(x) && aligned16(y), stream_);
}

void CudaBackend::upsample2x_bwd(const float* dy, float* dx, int B, int H, int W, int C) {
  const size_t n = (size_t)B * H * W * C;
  launch_map(UpsampleBwd{dy, dx, H, W, C}, n, C % 4 == 0 && aligned16(dy) && aligned16(dx), stream_);
}

void CudaBackend::avgpool2x2_fwd(const float* x, float* y, int B, int H, int W, int C) {
  const size_t n = (size_t)B * (H / 2) * (W / 2) * C;
  launch_map(Avgpool{x, y, H, W, C}, n, C % 4 == 0 && aligned16(x) && aligned16(y), stream_);
}

void CudaBackend::avgpool2x2_bwd(const float* dy, float* dx, int B, int H, int W, int C) {
  const size_t n = (size_t)B * H * W * C;
  launch_map(AvgpoolBwd{dy, dx, H, W, C}, n, C % 4 == 0 && aligned16(dy) && aligned16(dx), stream_);
}

void CudaBackend::concat_fwd(const float* a, const float* b, float* y, int B, int HW, int Ca, int Cb) {
  const size_t n = (size_t)B * HW * (Ca + Cb);
  launch_map(Concat{a, b, y, Ca, Cb}, n,
             Ca % 4 == 0 && Cb % 4 == 0 && aligned16(a) && aligned16(b) && aligned16(y), stream_);
}

void CudaBackend::concat_bwd(const float* dy, float* da, float* db, int B, int HW, int Ca, int Cb) {
  if (!da && !db) return;
  const size_t n = (size_t)B * HW * (Ca + Cb);
  launch_map(ConcatBwd{dy, da, db, Ca, Cb}, n,
             Ca % 4 == 0 && Cb % 4 == 0 && aligned16(dy) && (!da || aligned16(da)) && (!db || aligned16(db)),
             stream_);
}

}  // namespace unet
