// Elementwise ops, broadcast adds, scale-shift, dropout, loss and the diffusion helpers.
// All memory-bound: one pass, 16-byte accesses whenever the pointers and shapes allow.
#include "cuda_backend.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

struct SiluFwd {
  const float* x;
  float* y;
  __device__ void vec4(size_t j) const {
    float4 v = ld4(x, j);
    st4(y, j, make_float4(siluf_(v.x), siluf_(v.y), siluf_(v.z), siluf_(v.w)));
  }
  __device__ void scalar(size_t i) const { y[i] = siluf_(x[i]); }
};

struct SiluBwd {
  const float* x;
  const float* dy;
  float* dx;
  __device__ void vec4(size_t j) const {
    float4 v = ld4(x, j), g = ld4(dy, j);
    st4(dx, j,
        make_float4(g.x * silu_gradf_(v.x), g.y * silu_gradf_(v.y), g.z * silu_gradf_(v.z),
                    g.w * silu_gradf_(v.w)));
  }
  __device__ void scalar(size_t i) const { dx[i] = dy[i] * silu_gradf_(x[i]); }
};

struct Add {
  const float* a;
  const float* b;
  float* y;
  __device__ void vec4(size_t j) const {
    float4 u = ld4(a, j), v = ld4(b, j);
    st4(y, j, make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w));
  }
  __device__ void scalar(size_t i) const { y[i] = a[i] + b[i]; }
};

struct Scale {
  float* x;
  float s;
  __device__ void vec4(size_t j) const {
    float4 u = ld4(x, j);
    st4(x, j, make_float4(u.x * s, u.y * s, u.z * s, u.w * s));
  }
  __device__ void scalar(size_t i) const { x[i] *= s; }
};

// h[b, hw, c] += e[b, c]; HWC = HW*C. vec4 needs C % 4 == 0 (a vector never straddles rows).
struct AddBcast {
  float* h;
  const float* e;
  size_t HWC;
  int C;
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float4 ev = *reinterpret_cast<const float4*>(e + (i / HWC) * C + (int)(i % C));
    float4 u = ld4(h, j);
    st4(h, j, make_float4(u.x + ev.x, u.y + ev.y, u.z + ev.z, u.w + ev.w));
  }
  __device__ void scalar(size_t i) const { h[i] += e[(i / HWC) * C + (int)(i % C)]; }
};

// y = x * (1 + scale[b, c]) + shift[b, c], ss [B, 2C] = (scale | shift).
struct ScaleShift {
  const float* x;
  const float* ss;
  float* y;
  size_t HWC;
  int C;
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float* s = ss + (i / HWC) * 2 * C + (int)(i % C);
    const float4 sc = *reinterpret_cast<const float4*>(s);
    const float4 sh = *reinterpret_cast<const float4*>(s + C);
    const float4 u = ld4(x, j);
    st4(y, j,
        make_float4(u.x * (1.f + sc.x) + sh.x, u.y * (1.f + sc.y) + sh.y, u.z * (1.f + sc.z) + sh.z,
                    u.w * (1.f + sc.w) + sh.w));
  }
  __device__ void scalar(size_t i) const {
    const float* s = ss + (i / HWC) * 2 * C + (int)(i % C);
    y[i] = x[i] * (1.f + s[0]) + s[C];
  }
};

struct ScaleShiftDx {
  const float* ss;
  const float* dy;
  float* dx;
  size_t HWC;
  int C;
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float4 sc = *reinterpret_cast<const float4*>(ss + (i / HWC) * 2 * C + (int)(i % C));
    const float4 g = ld4(dy, j);
    st4(dx, j, make_float4(g.x * (1.f + sc.x), g.y * (1.f + sc.y), g.z * (1.f + sc.z), g.w * (1.f + sc.w)));
  }
  __device__ void scalar(size_t i) const { dx[i] = dy[i] * (1.f + ss[(i / HWC) * 2 * C + (int)(i % C)]); }
};

// Column-sum functors: f(b, r, c) over [B, HW, C] rows.
struct DhRow {
  const float* dh;
  int HW, C;
  __device__ float2 operator()(int b, int r, int c) const {
    return make_float2(dh[((size_t)b * HW + r) * C + c], 0.f);
  }
};
struct WriteX {
  float* out;
  int C;
  __device__ void operator()(int b, int c, double x, double) const { out[(size_t)b * C + c] = (float)x; }
};
struct DyXRow {
  const float* x;
  const float* dy;
  int HW, C;
  __device__ float2 operator()(int b, int r, int c) const {
    const size_t i = ((size_t)b * HW + r) * C + c;
    const float g = dy[i];
    return make_float2(g * x[i], g);
  }
};
struct WriteDss {
  float* dss;
  int C;
  __device__ void operator()(int b, int c, double x, double y) const {
    dss[(size_t)b * 2 * C + c] = (float)x;
    dss[(size_t)b * 2 * C + C + c] = (float)y;
  }
};

// keep iff u >= p, kept values times s = 1/(1-p) (p >= 1: everything dropped).
struct Dropout {
  const float* x;
  float* y;
  float p, s;
  uint64_t seed;
  __device__ float one(size_t i, float v) const {
    return (p < 1.0f && dropout_uniform(seed, i) >= p) ? v * s : 0.f;
  }
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float4 u = ld4(x, j);
    st4(y, j, make_float4(one(i, u.x), one(i + 1, u.y), one(i + 2, u.z), one(i + 3, u.w)));
  }
  __device__ void scalar(size_t i) const { y[i] = one(i, x[i]); }
};

struct QSample {
  const float* x0;
  const float* noise;
  const float* sa;
  const float* s1;
  float* xt;
  size_t n_per;
  __device__ void vec4(size_t j) const {
    const size_t b = 4 * j / n_per;
    const float a = sa[b], c = s1[b];
    const float4 u = ld4(x0, j), e = ld4(noise, j);
    st4(xt, j, make_float4(a * u.x + c * e.x, a * u.y + c * e.y, a * u.z + c * e.z, a * u.w + c * e.w));
  }
  __device__ void scalar(size_t i) const {
    const size_t b = i / n_per;
    xt[i] = sa[b] * x0[i] + s1[b] * noise[i];
  }
};

// y = a*x + b*y + c*z; a null x or z counts as zero.
struct Axpbypcz {
  float a, b, c;
  const float* x;
  float* y;
  const float* z;
  __device__ float one(float xv, float yv, float zv) const {
    float s = b * yv;
    if (x) s = a * xv + s;
    if (z) s = s + c * zv;
    return s;
  }
  __device__ void vec4(size_t j) const {
    const float4 yv = ld4(y, j);
    const float4 xv = x ? ld4(x, j) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 zv = z ? ld4(z, j) : make_float4(0.f, 0.f, 0.f, 0.f);
    st4(y, j,
        make_float4(one(xv.x, yv.x, zv.x), one(xv.y, yv.y, zv.y), one(xv.z, yv.z, zv.z),
                    one(xv.w, yv.w, zv.w)));
  }
  __device__ void scalar(size_t i) const { y[i] = one(x ? x[i] : 0.f, y[i], z ? z[i] : 0.f); }
};

// Same NaN behaviour as std::min(std::max(v, lo), hi).
struct Clamp {
  float* x;
  float lo, hi;
  __device__ float one(float v) const {
    v = (v < lo) ? lo : v;
    return (hi < v) ? hi : v;
  }
  __device__ void vec4(size_t j) const {
    const float4 u = ld4(x, j);
    st4(x, j, make_float4(one(u.x), one(u.y), one(u.z), one(u.w)));
  }
  __device__ void scalar(size_t i) const { x[i] = one(x[i]); }
};

// Sum over items of (pred-target)^2 in double, writing dpred = k (pred - target) on the way.
// Items 0..n4-1 are float4 groups, the rest single trailing elements.
struct MseItem {
  const float* pred;
  const float* target;
  float* dpred;
  float k;
  size_t n4;
  __device__ double one(size_t i) const {
    const float p = pred[i], t = target[i];
    if (dpred) dpred[i] = k * (p - t);
    const double d = (double)p - (double)t;
    return d * d;
  }
  __device__ double operator()(size_t it) const {
    if (it >= n4) return one(4 * n4 + (it - n4));
    const float4 p = ld4(pred, it), t = ld4(target, it);
    if (dpred)
      st4(dpred, it, make_float4(k * (p.x - t.x), k * (p.y - t.y), k * (p.z - t.z), k * (p.w - t.w)));
    const double a = (double)p.x - t.x, b = (double)p.y - t.y, c = (double)p.z - t.z, d = (double)p.w - t.w;
    return a * a + b * b + c * c + d * d;
  }
};

struct MseGrad {  // dpred only (no loss requested)
  const float* pred;
  const float* target;
  float* dpred;
  float k;
  __device__ void vec4(size_t j) const {
    const float4 p = ld4(pred, j), t = ld4(target, j);
    st4(dpred, j, make_float4(k * (p.x - t.x), k * (p.y - t.y), k * (p.z - t.z), k * (p.w - t.w)));
  }
  __device__ void scalar(size_t i) const { dpred[i] = k * (pred[i] - target[i]); }
};

}  // namespace

void CudaBackend::silu_fwd(const float* x, float* y, size_t n) {
  launch_map(SiluFwd{x, y}, n, aligned16(x) && aligned16(y), stream_);
}

void CudaBackend::silu_bwd(const float* x, const float* dy, float* dx, size_t n) {
  launch_map(SiluBwd{x, dy, dx}, n, aligned16(x) && aligned16(dy) && aligned16(dx), stream_);
}

void CudaBackend::add(const float* a, const float* b, float* y, size_t n) {
  launch_map(Add{a, b, y}, n, aligned16(a) && aligned16(b) && aligned16(y), stream_);
}

void CudaBackend::scale(float* x, float s, size_t n) { launch_map(Scale{x, s}, n, aligned16(x), stream_); }

void CudaBackend::add_bcast_fwd(float* h, const float* e, int B, int HW, int C) {
  const size_t n = (size_t)B * HW * C;
  launch_map(AddBcast{h, e, (size_t)HW * C, C}, n, C % 4 == 0 && aligned16(h) && aligned16(e), stream_);
}

void CudaBackend::add_bcast_bwd(const float* dh, float* de, int B, int HW, int C) {
  colsum2(*this, DhRow{dh, HW, C}, WriteX{de, C}, B, HW, C);
}

void CudaBackend::scale_shift_fwd(const float* x, const float* ss, float* y, int B, int HW, int C) {
  const size_t n = (size_t)B * HW * C;
  launch_map(ScaleShift{x, ss, y, (size_t)HW * C, C}, n,
             C % 4 == 0 && aligned16(x) && aligned16(ss) && aligned16(y), stream_);
}

void CudaBackend::scale_shift_bwd(const float* x, const float* ss, const float* dy, float* dx, float* dss,
                                  int B, int HW, int C) {
  // dss first: dx may alias dy or x.
  if (dss) colsum2(*this, DyXRow{x, dy, HW, C}, WriteDss{dss, C}, B, HW, C);
  if (dx) {
    const size_t n = (size_t)B * HW * C;
    launch_map(ScaleShiftDx{ss, dy, dx, (size_t)HW * C, C}, n,
               C % 4 == 0 && aligned16(ss) && aligned16(dy) && aligned16(dx), stream_);
  }
}

void CudaBackend::dropout_fwd(const float* x, float* y, size_t n, float p, uint64_t seed) {
  const float s = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  launch_map(Dropout{x, y, p, s, seed}, n, aligned16(x) && aligned16(y), stream_);
}

void CudaBackend::dropout_bwd(const float* dy, float* dx, size_t n, float p, uint64_t seed) {
  dropout_fwd(dy, dx, n, p, seed);  // the same mask and scale
}

void CudaBackend::mse_fwd_bwd(const float* pred, const float* target, float* loss, float* dpred, size_t n) {
  if (!n) return;
  const float k = 2.0f / (float)n;
  const bool vec = aligned16(pred) && aligned16(target) && (!dpred || aligned16(dpred));
  if (loss) {
    const size_t n4 = vec ? n / 4 : 0;
    full_sum(*this, MseItem{pred, target, dpred, k, n4}, n4 + (n - 4 * n4), 1.0 / (double)n, loss);
  } else if (dpred) {
    launch_map(MseGrad{pred, target, dpred, k}, n, vec, stream_);
  }
}

void CudaBackend::q_sample(const float* x0, const float* noise, const float* sqrt_ab, const float* sqrt_1mab,
                           float* xt, int B, size_t n_per) {
  const size_t n = (size_t)B * n_per;
  launch_map(QSample{x0, noise, sqrt_ab, sqrt_1mab, xt, n_per}, n,
             n_per % 4 == 0 && aligned16(x0) && aligned16(noise) && aligned16(xt), stream_);
}

void CudaBackend::axpbypcz(float a, const float* x, float b, float* y, float c, const float* z, size_t n) {
  launch_map(Axpbypcz{a, b, c, x, y, z}, n, aligned16(y) && (!x || aligned16(x)) && (!z || aligned16(z)),
             stream_);
}

void CudaBackend::clamp(float* x, float lo, float hi, size_t n) {
  launch_map(Clamp{x, lo, hi}, n, aligned16(x), stream_);
}

}  // namespace unet
