// GroupNorm variant "threepass": NHWC [B, HW, C], G groups of Cg = C/G consecutive channels,
// eps 1e-5, optional scale-shift (ss [B, 2C]) and SiLU after the affine; f32 or bf16 storage,
// f32 statistics.
//
// Forward, three kernels:
//  1. per-(b, c) sums of the SHIFTED values x - K[b,g] and their squares (K = the group's first
//     element), by the deterministic column reduction (coalesced: a warp reads 32 channels);
//  2. per (b, g): add the group's channel sums in channel order (double), mean = K + S1/n,
//     var = S2/n - (S1/n)^2 — the shifted-data algorithm, which avoids the catastrophic
//     cancellation of the plain E[x^2] - E[x]^2 when |mean| >> std;
//  3. y = SiLU((xhat gamma + beta)(1 + scale) + shift), elementwise with vector accesses.
// Backward: one column reduction gives S1 = sum dz*xhat and S0 = sum dz per (b, c), where
// dz = dy SiLU'(z) (z recomputed from the saved statistics). Everything else follows from them:
// with f = 1 + scale, dn = f dz, so sum dn*xhat = f S1 and sum dn = f S0; dscale = gamma S1 +
// beta S0, dshift = S0; then the usual per-(b, g) coefficients and dx elementwise.
#include "cuda_engine.cuh"
#include "rowblock.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

constexpr double kEps = 1e-5;

template <class T>
struct ShiftedSums {
  const T* x;
  int HW, C, Cg;
  __device__ float2 operator()(int b, int r, int c) const {
    const T* xb = x + (size_t)b * HW * C;
    const float K = ldf(xb, (size_t)(c / Cg) * Cg);  // first element of the group (pixel 0)
    const float v = ldf(xb, (size_t)r * C + c) - K;
    return make_float2(v, v * v);
  }
};

struct StoreBC {  // per-(b, c) totals into aux [B*C] as double2
  double2* out;
  int C;
  __device__ void operator()(int b, int c, double x, double y) const {
    out[(size_t)b * C + c] = make_double2(x, y);
  }
};

template <class T>
__global__ void gn_stats_kernel(const double2* sums, const T* x, float* mean, float* rstd, int B, int HW,
                                int C, int G) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * G) return;
  const int b = i / G, g = i % G, Cg = C / G;
  double s1 = 0, s2 = 0;
  for (int c = g * Cg; c < (g + 1) * Cg; ++c) {
    s1 += sums[(size_t)b * C + c].x;
    s2 += sums[(size_t)b * C + c].y;
  }
  const double n = (double)HW * Cg;
  const double m1 = s1 / n;
  const double var = fmax(s2 / n - m1 * m1, 0.0);
  mean[i] = (float)(ldf(x, (size_t)b * HW * C + (size_t)g * Cg) + m1);
  rstd[i] = (float)(1.0 / sqrt(var + kEps));
}

// The forward value z (before SiLU) at element i.
struct GnParams {
  const float* gamma;
  const float* beta;
  const float* ss;  // nullable
  const float* mean;
  const float* rstd;
  size_t HWC;
  int C, G, Cg;
  bool silu;
  // xhat and z for element value v at flat index i
  __device__ float2 xz(size_t i, float v) const {
    const int c = (int)(i % C);
    const size_t b = i / HWC, bg = b * G + c / Cg;
    const float xh = (v - mean[bg]) * rstd[bg];
    float z = xh * gamma[c] + beta[c];
    if (ss) z = z * (1.f + ss[b * 2 * C + c]) + ss[b * 2 * C + C + c];
    return make_float2(xh, z);
  }
};

template <class TX, class TY>
struct GnApply {
  const TX* x;
  TY* y;
  GnParams p;
  __device__ float one(size_t i, float v) const {
    const float z = p.xz(i, v).y;
    return p.silu ? siluf_(z) : z;
  }
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float4 u = ld4(x, j);
    st4(y, j, make_float4(one(i, u.x), one(i + 1, u.y), one(i + 2, u.z), one(i + 3, u.w)));
  }
  __device__ void scalar(size_t i) const { stf(y, i, one(i, ldf(x, i))); }
};

// dz and xhat at element i.
template <class TX, class TD>
struct GnGrad {
  const TX* x;
  const TD* dy;
  GnParams p;
  __device__ float2 at(size_t i) const {
    const float2 v = p.xz(i, ldf(x, i));
    float dz = ldf(dy, i);
    if (p.silu) dz *= silu_gradf_(v.y);
    return make_float2(dz, v.x);
  }
};

template <class TX, class TD>
struct GradSums {  // (dz*xhat, dz) per (b, c)
  GnGrad<TX, TD> g;
  int HW, C;
  __device__ float2 operator()(int b, int r, int c) const {
    const float2 v = g.at(((size_t)b * HW + r) * C + c);
    return make_float2(v.x * v.y, v.x);
  }
};

// coef[b*G+g] = (mean_g(dn*gamma), mean_g(dn*gamma*xhat)); dss per (b, c); dgamma/dbeta summed
// over b in order.
__global__ void gn_bwd_coef_kernel(const double2* sums, const float* gamma, const float* beta,
                                   const float* ss, float2* coef, float* dgamma, float* dbeta, float* dss,
                                   int B, int HW, int C, int G) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int Cg = C / G;
  auto f = [&](int b, int c) { return ss ? 1.0 + (double)ss[(size_t)b * 2 * C + c] : 1.0; };
  if (i < B * G) {
    const int b = i / G, g = i % G;
    double a = 0, bb = 0;
    for (int c = g * Cg; c < (g + 1) * Cg; ++c) {
      const double2 s = sums[(size_t)b * C + c];  // (dz*xhat, dz)
      const double k = f(b, c) * gamma[c];
      a += k * s.y;
      bb += k * s.x;
    }
    const double n = (double)HW * Cg;
    coef[i] = make_float2((float)(a / n), (float)(bb / n));
  }
  if (i < C) {
    double sg = 0, sb = 0;
    for (int b = 0; b < B; ++b) {
      const double2 s = sums[(size_t)b * C + i];
      const double k = f(b, i);
      sg += k * s.x;
      sb += k * s.y;
    }
    if (dgamma) dgamma[i] = (float)sg;
    if (dbeta) dbeta[i] = (float)sb;
  }
  if (dss && i < B * C) {
    const int b = i / C, c = i % C;
    const double2 s = sums[i];
    dss[(size_t)b * 2 * C + c] = (float)(gamma[c] * s.x + beta[c] * s.y);
    dss[(size_t)b * 2 * C + C + c] = (float)s.y;
  }
}

template <class TX, class TD>
struct GnDx {
  GnGrad<TX, TD> g;
  const float2* coef;
  TD* dx;
  const TD* add;
  __device__ float one(size_t i) const {
    const GnParams& p = g.p;
    const int c = (int)(i % p.C);
    const size_t b = i / p.HWC, bg = b * p.G + c / p.Cg;
    const float2 v = g.at(i);
    const float2 k = coef[bg];
    const float f = p.ss ? 1.f + p.ss[b * 2 * p.C + c] : 1.f;
    const float d = p.rstd[bg] * (v.x * f * p.gamma[c] - k.x - v.y * k.y);
    return add ? d + ldf(add, i) : d;
  }
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    st4(dx, j, make_float4(one(i), one(i + 1), one(i + 2), one(i + 3)));
  }
  __device__ void scalar(size_t i) const { stf(dx, i, one(i)); }
};

void check_scratch(int B, int C, int G) {
  // aux holds B*C double2 (per-(b, c) sums) then B*G float2 (coefficients).
  if ((size_t)B * C * 4 + (size_t)B * G * 2 > CudaCtx::kAuxFloats)
    throw std::runtime_error("groupnorm: B*C too large for the reduction scratch");
}

GnParams params(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& ss,
                const Tensor& mean, const Tensor& rstd, bool silu) {
  const int C = (int)x.dim[3], G = (int)mean.dim[1];
  return GnParams{dptr<float>(gamma),
                  dptr<float>(beta),
                  dptr<float>(ss),
                  dptr<float>(mean),
                  dptr<float>(rstd),
                  (size_t)x.dim[1] * x.dim[2] * C,
                  C,
                  G,
                  C / G,
                  silu};
}

void gn_fwd(const GroupNormFwd& o, CudaCtx& ctx) {
  const int B = (int)o.x.dim[0], HW = (int)(o.x.dim[1] * o.x.dim[2]), C = (int)o.x.dim[3],
            G = (int)o.mean.dim[1];
  check_scratch(B, C, G);
  const GnParams p = params(o.x, o.gamma, o.beta, o.ss, o.mean, o.rstd, o.silu);
  double2* sums = reinterpret_cast<double2*>(ctx.aux());
  with_act(o.x.dtype, [&](auto tx) {
    using TX = decltype(tx);
    const TX* x = dptr<TX>(o.x);
    colsum2(ctx, ShiftedSums<TX>{x, HW, C, C / G}, StoreBC{sums, C}, B, HW, C);
    gn_stats_kernel<TX><<<(B * G + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
        sums, x, dptr<float>(o.mean), dptr<float>(o.rstd), B, HW, C, G);
    KERNEL_CHECK();
    with_act(o.y.dtype, [&](auto ty) {
      using TY = decltype(ty);
      launch_map(GnApply<TX, TY>{x, dptr<TY>(o.y), p}, o.x.numel(), vec4_ok<TX>(x) && vec4_ok<TY>(o.y.data),
                 ctx.stream);
    });
  });
}

void gn_bwd(const GroupNormBwd& o, CudaCtx& ctx) {
  const int B = (int)o.x.dim[0], HW = (int)(o.x.dim[1] * o.x.dim[2]), C = (int)o.x.dim[3],
            G = (int)o.mean.dim[1];
  check_scratch(B, C, G);
  const GnParams p = params(o.x, o.gamma, o.beta, o.ss, o.mean, o.rstd, o.silu);
  double2* sums = reinterpret_cast<double2*>(ctx.aux());
  float2* coef = reinterpret_cast<float2*>(ctx.aux() + (size_t)B * C * 4);
  with_act(o.x.dtype, [&](auto tx) {
    using TX = decltype(tx);
    with_act(o.dy.dtype, [&](auto td) {
      using TD = decltype(td);
      const GnGrad<TX, TD> gg{dptr<TX>(o.x), dptr<TD>(o.dy), p};
      colsum2(ctx, GradSums<TX, TD>{gg, HW, C}, StoreBC{sums, C}, B, HW, C);
      const int nt = std::max({B * G, C, o.dss.defined() ? B * C : 0});
      gn_bwd_coef_kernel<<<(nt + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
          sums, p.gamma, p.beta, p.ss, coef, dptr<float>(o.dgamma), dptr<float>(o.dbeta), dptr<float>(o.dss),
          B, HW, C, G);
      KERNEL_CHECK();
      if (o.dx.defined())
        launch_map(GnDx<TX, TD>{gg, coef, dptr<TD>(o.dx), dptr<TD>(o.add)}, o.x.numel(),
                   vec4_ok<TX>(o.x.data) && vec4_ok<TD>(o.dy.data) && vec4_ok<TD>(o.dx.data) &&
                       vec4_ok<TD>(o.add.data),
                   ctx.stream);
    });
  });
  rowblock::gn_bwd_column_sums(ctx, o);
}

// The dx kernel writes dx as dy's dtype.
bool bwd_ok(const GroupNormBwd& o, const CudaCtx&) {
  return (!o.dx.defined() || o.dx.dtype == o.dy.dtype) && (!o.add.defined() || o.add.dtype == o.dy.dtype) &&
         rowblock::gn_bwd_column_sums_fit(o) && !gn_has_offset(o) && !o.dx2.defined() &&
         !o.add2.defined();
}
// The input offset (gn_has_offset) is read by "smem" and "fused" only, the statistics alone (no y)
// computed by "fused" only.
bool fwd_ok(const GroupNormFwd& o, const CudaCtx&) {
  return !gn_has_offset(o) && o.y.defined() && !o.x2.defined();
}

}  // namespace

void register_groupnorm_threepass(CudaOps& ops) {
  ops.variants<GroupNormFwd>().push_back({"threepass", fwd_ok, gn_fwd, nullptr});
  ops.variants<GroupNormBwd>().push_back({"threepass", bwd_ok, gn_bwd, nullptr});
}

}  // namespace unet
