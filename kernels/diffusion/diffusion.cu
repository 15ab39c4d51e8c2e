// Diffusion variant "cuda": q_sample, the samplers' elementwise arithmetic (f32) and their noise.
#include "cuda_engine.cuh"
#include "rng.h"

namespace unet {

namespace {

struct QSampleF {
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

// y = a*x + b*y + c*z; an absent x or z counts as zero (same order as the reference).
struct AxpbypczF {
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
struct ClampF {
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

struct LearnedRangeF {
  const float* v;
  const float* z;
  float* y;
  float min_log, max_log;
  __device__ float one(float vv, float zz) const {
    const float frac = (vv + 1.0f) / 2.0f;
    const float log_var = frac * max_log + (1.0f - frac) * min_log;
    return expf(0.5f * log_var) * zz;
  }
  __device__ void vec4(size_t j) const {
    const float4 a = ld4(v, j), b = ld4(z, j);
    st4(y, j, make_float4(one(a.x, b.x), one(a.y, b.y), one(a.z, b.z), one(a.w, b.w)));
  }
  __device__ void scalar(size_t i) const { y[i] = one(v[i], z[i]); }
};

// Normal draws index0 + 4j .. 4j + 3 for an even index0: the two Box-Muller pairs of hashes
// index0/2 + 2j and + 2j + 1, each hash computed once as normal_fill() does (NormalFill's vectorised
// path and SampleStep's).
__device__ inline float4 normal4(uint64_t key, Stream s, uint64_t index0, size_t j) {
  double a0, a1, b0, b1;
  const uint64_t p = (index0 >> 1) + 2 * j;
  box_muller_pair(rng_bits(key, s, p), &a0, &a1);
  box_muller_pair(rng_bits(key, s, p + 1), &b0, &b1);
  return make_float4((float)a0, (float)a1, (float)b0, (float)b1);
}

// z[i] = normal(seed, s, index0 + i); vec4 when index0 is even.
struct NormalF {
  float* z;
  uint64_t seed, index0;
  Stream s;
  __device__ void vec4(size_t j) const { st4(z, j, normal4(seed, s, index0, j)); }
  __device__ void scalar(size_t i) const { z[i] = normal(seed, s, index0 + i); }
};

// SampleStep: each element as the op sequence it replaces computes it (AxpbypczF's, ClampF's and
// LearnedRangeF's expressions, NormalF's draws), the step's numbers read from coef on the device.
struct SampleStepF {
  float* x;
  const float* eps;
  const float* v;
  float* x0;
  float* z;
  const float* coef;
  Stream s;
  bool xstart, clip;
  // element i with its normal draw zz
  __device__ void one(size_t i, float zz) const {
    const float* c = coef;
    const float xv = x[i];
    float a = eps[i];
    if (!xstart) {  // AxpbypczF{x = eps, y = x0 = x}: b*y, then a*x + that
      const float bx = c[0] * xv;
      a = c[1] * a + bx;
    }
    if (clip) a = ClampF{nullptr, -1.0f, 1.0f}.one(a);
    x0[i] = a;
    if (v) zz = LearnedRangeF{nullptr, nullptr, nullptr, c[5], c[6]}.one(v[i], zz);
    z[i] = zz;
    float r = c[3] * xv;
    r = c[2] * a + r;
    if (c[4] != 0.0f) r = r + c[4] * zz;
    x[i] = r;
  }
  __device__ void vec4(size_t j) const {
    const uint64_t key = sample_step_u64(coef, 7), index0 = sample_step_u64(coef, 9);
    float zz[4];
    if (index0 % 2 == 0) {  // NormalF's pairs
      const float4 q = normal4(key, s, index0, j);
      zz[0] = q.x, zz[1] = q.y, zz[2] = q.z, zz[3] = q.w;
    } else {
      for (int e = 0; e < 4; ++e) zz[e] = normal(key, s, index0 + 4 * j + e);
    }
    for (int e = 0; e < 4; ++e) one(4 * j + e, zz[e]);
  }
  __device__ void scalar(size_t i) const {
    one(i, normal(sample_step_u64(coef, 7), s, sample_step_u64(coef, 9) + i));
  }
};

void qsample(const QSample& o, CudaCtx& ctx) {
  const size_t n = o.x0.numel(), n_per = o.x0.per_sample();
  const int B = (int)o.x0.dim[0];
  launch_map(QSampleF{dptr<float>(o.x0), dptr<float>(o.noise), dptr<float>(o.coef), dptr<float>(o.coef) + B,
                      dptr<float>(o.xt), n_per},
             n, n_per % 4 == 0 && aligned16(o.x0.data) && aligned16(o.noise.data) && aligned16(o.xt.data),
             ctx.stream);
}
void axpby(const Axpbypcz& o, CudaCtx& ctx) {
  const float *x = dptr<float>(o.x), *z = dptr<float>(o.z);
  launch_map(AxpbypczF{o.a, o.b, o.c, x, dptr<float>(o.y), z}, o.y.numel(),
             aligned16(o.y.data) && (!x || aligned16(x)) && (!z || aligned16(z)), ctx.stream);
}
void clamp(const Clamp& o, CudaCtx& ctx) {
  launch_map(ClampF{dptr<float>(o.x), o.lo, o.hi}, o.x.numel(), aligned16(o.x.data), ctx.stream);
}
void lrn(const LearnedRangeNoise& o, CudaCtx& ctx) {
  launch_map(LearnedRangeF{dptr<float>(o.v), dptr<float>(o.z), dptr<float>(o.y), o.min_log, o.max_log},
             o.y.numel(), aligned16(o.v.data) && aligned16(o.z.data) && aligned16(o.y.data), ctx.stream);
}

void normal_noise(const NormalFill& o, CudaCtx& ctx) {
  launch_map(NormalF{dptr<float>(o.z), o.seed, o.index0, (Stream)o.stream}, o.z.numel(),
             aligned16(o.z.data) && o.index0 % 2 == 0, ctx.stream);
}

void sample_step(const SampleStep& o, CudaCtx& ctx) {
  launch_map(SampleStepF{dptr<float>(o.x), dptr<float>(o.eps), dptr<float>(o.v), dptr<float>(o.x0),
                         dptr<float>(o.z), dptr<float>(o.coef), (Stream)o.stream, o.xstart, o.clip},
             o.x.numel(), true, ctx.stream);
}

}  // namespace

void register_diffusion_cuda(CudaOps& ops) {
  ops.variants<QSample>().push_back({"cuda", nullptr, qsample, nullptr});
  ops.variants<Axpbypcz>().push_back({"cuda", nullptr, axpby, nullptr});
  ops.variants<Clamp>().push_back({"cuda", nullptr, clamp, nullptr});
  ops.variants<LearnedRangeNoise>().push_back({"cuda", nullptr, lrn, nullptr});
  ops.variants<NormalFill>().push_back({"cuda", nullptr, normal_noise, nullptr});
  ops.variants<SampleStep>().push_back({"cuda", nullptr, sample_step, nullptr});
}

}  // namespace unet
