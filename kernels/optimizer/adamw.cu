// Optimizer over the flat parameter arena: gradient norm (deterministic), clip scale, fused
// AdamW (one pass over p, g, m, v; the clip scale is read on the device, so no host sync), EMA.
#include "cuda_backend.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

struct SquareItem {  // items < n4: float4 groups; then single trailing elements
  const float* x;
  size_t n4;
  __device__ double operator()(size_t it) const {
    if (it >= n4) {
      const double v = x[4 * n4 + (it - n4)];
      return v * v;
    }
    const float4 u = ld4(x, it);
    return (double)u.x * u.x + (double)u.y * u.y + (double)u.z * u.z + (double)u.w * u.w;
  }
};

__global__ void clip_scale_kernel(const float* sumsq, float clip, float* norm, float* grad_scale) {
  const float nrm = sqrtf(sumsq[0]);
  if (norm) *norm = nrm;
  *grad_scale = clip > 0.f ? fminf(1.f, clip / (nrm + 1e-6f)) : 1.f;
}

// PyTorch AdamW (single-tensor path), g scaled by *grad_scale:
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr/bc1) m / (sqrt(v)/sqrt(bc2) + eps),  bc = 1 - beta^t.
struct AdamW {
  float* p;
  const float* g;
  float* m;
  float* v;
  const float* grad_scale;
  float beta1, beta2, eps, decay, step, sbc2;
  const float* hyper;  // when set: {decay, step, sbc2} read on the device (CUDA-graph replay)
  __device__ void one(float& pi, float gi, float& mi, float& vi, float gs) const {
    const float decay = hyper ? hyper[0] : this->decay, step = hyper ? hyper[1] : this->step,
                sbc2 = hyper ? hyper[2] : this->sbc2;
    gi *= gs;
    mi = beta1 * mi + (1.f - beta1) * gi;
    vi = beta2 * vi + (1.f - beta2) * gi * gi;
    pi = pi * decay - step * mi / (sqrtf(vi) / sbc2 + eps);
  }
  __device__ void vec4(size_t j) const {
    const float gs = grad_scale ? *grad_scale : 1.f;
    float4 pp = ld4(p, j), gg = ld4(g, j), mm = ld4(m, j), vv = ld4(v, j);
    one(pp.x, gg.x, mm.x, vv.x, gs);
    one(pp.y, gg.y, mm.y, vv.y, gs);
    one(pp.z, gg.z, mm.z, vv.z, gs);
    one(pp.w, gg.w, mm.w, vv.w, gs);
    st4(p, j, pp);
    st4(m, j, mm);
    st4(v, j, vv);
  }
  __device__ void scalar(size_t i) const {
    const float gs = grad_scale ? *grad_scale : 1.f;
    float pi = p[i], mi = m[i], vi = v[i];
    one(pi, g[i], mi, vi, gs);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
};

struct Ema {
  float* e;
  const float* p;
  float rate, r1;
  __device__ void vec4(size_t j) const {
    const float4 a = ld4(e, j), b = ld4(p, j);
    st4(e, j,
        make_float4(rate * a.x + r1 * b.x, rate * a.y + r1 * b.y, rate * a.z + r1 * b.z,
                    rate * a.w + r1 * b.w));
  }
  __device__ void scalar(size_t i) const { e[i] = rate * e[i] + r1 * p[i]; }
};

}  // namespace

void CudaBackend::sum_squares(const float* x, float* out, size_t n) {
  const size_t n4 = aligned16(x) ? n / 4 : 0;
  full_sum(*this, SquareItem{x, n4}, n4 + (n - 4 * n4), 1.0, out);
}

void CudaBackend::clip_scale(const float* sumsq, float clip, float* norm, float* grad_scale) {
  clip_scale_kernel<<<1, 1, 0, stream_>>>(sumsq, clip, norm, grad_scale);
  KERNEL_CHECK();
}

void CudaBackend::adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                        float beta2, float eps, float wd, float bc1, float bc2, const float* grad_scale) {
  AdamW f{p, g, m, v, grad_scale, beta1, beta2, eps, 1.f - lr * wd, lr / bc1, sqrtf(bc2), nullptr};
  launch_map(f, n, aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v), stream_);
}

void CudaBackend::adamw_dev(float* p, const float* g, float* m, float* v, size_t n, const float* hyper,
                            float beta1, float beta2, float eps, const float* grad_scale) {
  AdamW f{p, g, m, v, grad_scale, beta1, beta2, eps, 0.f, 0.f, 0.f, hyper};
  launch_map(f, n, aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v), stream_);
}

void CudaBackend::ema(float* e, const float* p, float rate, size_t n) {
  launch_map(Ema{e, p, rate, 1.f - rate}, n, aligned16(e) && aligned16(p), stream_);
}

}  // namespace unet
