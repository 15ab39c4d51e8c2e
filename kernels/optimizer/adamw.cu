// Optimizer variant "cuda" over the flat parameter arena: gradient norm (deterministic), clip
// scale, the AdamW schedule (one thread, the same arithmetic as the CPU: lib/ops/optimizer.h),
// fused AdamW (one pass over p, g, m, v; scalars read on the device, so no host sync and a graph
// replays it), EMA.
#include "adamw_schedule.h"
#include "cuda_engine.cuh"
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

__global__ void clip_scale_kernel(const float* sumsq, int k, float clip, float* norm, float* grad_scale) {
  pdl_entry();
  double s = 0;  // (lib/ops/optimizer.h's order)
  for (int i = 0; i < k; ++i) s += (double)sumsq[i];
  const float nrm = sqrtf((float)s);
  if (norm) *norm = nrm;
  *grad_scale = clip > 0.f ? fminf(1.f, clip / (nrm + 1e-6f)) : 1.f;
}

__global__ void schedule_kernel(int32_t* step, float* hyper, double lr, double wd, double b1, double b2,
                                long long warmup, long long anneal) {
  pdl_entry();
  const int32_t t = ++*step;
  ref::adamw_hyper(t, lr, wd, b1, b2, warmup, anneal, hyper);
}

// PyTorch AdamW (single-tensor path), g scaled by *grad_scale:
//   p *= hyper[0];  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= hyper[1] m / (sqrt(v)/hyper[2] + eps).
// ema = rate ema + (1 - rate) p: one product, then one fused multiply-add.
__device__ __forceinline__ float ema_one(float e, float p, float rate, float r1) {
  return __fmaf_rn(rate, e, __fmul_rn(r1, p));
}

struct AdamWF {
  float* p;
  const float* g;
  float* m;
  float* v;
  const float* grad_scale;
  const float* hyper;
  float beta1, beta2, eps;
  float* e;  // the EMA, updated from the new p in the same pass (optional)
  float rate, r1;
  bf16* s;  // the bf16 copy of the new p (optional; Cast's rounding)
  __device__ void one(float& pi, float gi, float& mi, float& vi, float gs) const {
    gi *= gs;
    mi = beta1 * mi + (1.f - beta1) * gi;
    vi = beta2 * vi + (1.f - beta2) * gi * gi;
    pi = pi * hyper[0] - hyper[1] * mi / (sqrtf(vi) / hyper[2] + eps);
  }
  // Each returns its g's sum of squares (for AdamW's gsq; map_kernel drops it).
  __device__ double vec4(size_t j) const {
    const float gs = grad_scale ? *grad_scale : 1.f;
    float4 pp = ld4(p, j), gg = ld4(g, j), mm = ld4(m, j), vv = ld4(v, j);
    const double sq = (double)gg.x * gg.x + (double)gg.y * gg.y + (double)gg.z * gg.z + (double)gg.w * gg.w;
    // the EMA's load with the others (after the stores below it was a second round trip: the
    // compiler cannot move a load across stores that may alias it)
    const float4 a = e ? ld4(e, j) : float4{};
    one(pp.x, gg.x, mm.x, vv.x, gs);
    one(pp.y, gg.y, mm.y, vv.y, gs);
    one(pp.z, gg.z, mm.z, vv.z, gs);
    one(pp.w, gg.w, mm.w, vv.w, gs);
    st4(p, j, pp);
    st4(m, j, mm);
    st4(v, j, vv);
    if (s) st4(s, j, pp);
    if (e) {
      st4(e, j,
          make_float4(ema_one(a.x, pp.x, rate, r1), ema_one(a.y, pp.y, rate, r1), ema_one(a.z, pp.z, rate, r1),
                      ema_one(a.w, pp.w, rate, r1)));
    }
    return sq;
  }
  __device__ double scalar(size_t i) const {
    const float gs = grad_scale ? *grad_scale : 1.f;
    float pi = p[i], mi = m[i], vi = v[i];
    const float gi = g[i];
    one(pi, gi, mi, vi, gs);
    if (e) e[i] = ema_one(e[i], pi, rate, r1);
    if (s) stf(s, i, pi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    return (double)gi * gi;
  }
};

// AdamW with gsq: map_kernel's loops, each thread also adding its elements' g^2 in double, the
// block's sums added in sum_partial_kernel's fixed tree into partial[block]; sum_final_kernel
// then adds those in order. The optimizer's early updates take the gradient norm so, from the
// gradients each range's update reads anyway (a separate pass per range on the optimizer's stream
// cost the H100 seed64 tf32 step ~0.1 ms; one pass over all 88 MB at the step's end, 45 us).
__global__ void adamw_sq_kernel(AdamWF f, size_t n4, size_t n, double* partial) {
  pdl_entry();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  double acc = 0;
  for (size_t j = tid; j < n4; j += stride) acc += f.vec4(j);
  for (size_t i = 4 * n4 + tid; i < n; i += stride) acc += f.scalar(i);
  block_sum_to(acc, partial);
}

void sumsq(const SumSquares& o, CudaCtx& ctx) {
  const size_t n = o.x.numel();
  const size_t n4 = aligned16(o.x.data) ? n / 4 : 0;
  full_sum(ctx, SquareItem{dptr<float>(o.x), n4}, n4 + (n - 4 * n4), 1.0, dptr<float>(o.out));
}
void clip(const ClipScale& o, CudaCtx& ctx) {
  clip_scale_kernel<<<1, 1, 0, ctx.stream>>>(dptr<float>(o.sumsq), (int)o.sumsq.numel(), o.clip,
                                             dptr<float>(o.norm), dptr<float>(o.scale));
  KERNEL_CHECK();
}
void schedule(const AdamWSchedule& o, CudaCtx& ctx) {
  schedule_kernel<<<1, 1, 0, ctx.stream>>>(dptr<int32_t>(o.step), dptr<float>(o.hyper), o.lr, o.weight_decay,
                                           o.beta1, o.beta2, (long long)o.warmup, (long long)o.anneal);
  KERNEL_CHECK();
}
void adamw(const AdamW& o, CudaCtx& ctx) {
  const AdamWF f{dptr<float>(o.p),
                 dptr<float>(o.g),
                 dptr<float>(o.m),
                 dptr<float>(o.v),
                 dptr<float>(o.scale),
                 dptr<float>(o.hyper),
                 o.beta1,
                 o.beta2,
                 o.eps,
                 dptr<float>(o.ema),
                 o.ema_rate,
                 1.f - o.ema_rate,
                 dptr<bf16>(o.shadow)};
  const size_t n = o.p.numel();
  const bool vec = aligned16(f.p) && aligned16(f.g) && aligned16(f.m) && aligned16(f.v) &&
                   (!f.e || aligned16(f.e)) && (!f.s || vec4_ok<bf16>(f.s));
  if (!o.gsq.defined()) return launch_map(f, n, vec, ctx.stream);
  const size_t n4 = vec ? n / 4 : 0, items = std::max(n4, n - 4 * n4);
  const unsigned nb = grid_for(items);  // (at most kGridCap partials: within the optimizer stream's scratch)
  double* partial = reinterpret_cast<double*>(ctx.partial());
  adamw_sq_kernel<<<nb, kThreads, 0, ctx.stream>>>(f, n4, n, partial);
  KERNEL_CHECK();
  sum_final_kernel<0><<<1, kThreads, 0, ctx.stream>>>(partial, (int)nb, 1.0, dptr<float>(o.gsq));
  KERNEL_CHECK();
}

}  // namespace

void register_optimizer_cuda(CudaOps& ops) {
  ops.variants<SumSquares>().push_back({"cuda", nullptr, sumsq, nullptr});
  ops.variants<ClipScale>().push_back({"cuda", nullptr, clip, nullptr});
  ops.variants<AdamWSchedule>().push_back({"cuda", nullptr, schedule, nullptr});
  ops.variants<AdamW>().push_back({"cuda", nullptr, adamw, nullptr});
}

}  // namespace unet
