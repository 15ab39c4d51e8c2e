// GroupNorm over NHWC [B, HW, C], G groups of Cg = C/G consecutive channels, eps 1e-5, optional
// fused SiLU after the affine.
//
// Forward, three kernels:
//  1. per-(b, c) sums of the SHIFTED values x - K[b,g] and their squares (K = the group's first
//     element), by the deterministic column reduction (coalesced: a warp reads 32 channels);
//  2. per (b, g): add the group's channel sums in channel order (double), mean = K + S1/n,
//     var = S2/n - (S1/n)^2 — the shifted-data algorithm, which avoids the catastrophic
//     cancellation of the plain E[x^2] - E[x]^2 when |mean| >> std;
//  3. the normalisation, elementwise with 16-byte accesses.
// Backward, likewise: per-(b, c) sums of dz and dz*xhat (dz = dy, times SiLU'(z) when fused, with z
// recomputed from the saved mean/rstd), then per-(b, g) coefficients and dgamma/dbeta (summed
// over b in order), then dx elementwise. Two reads of x and dy, one write of dx.
#include "cuda_backend.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

constexpr double kEps = 1e-5;

struct ShiftedSums {
  const float* x;
  int HW, C, Cg;
  __device__ float2 operator()(int b, int r, int c) const {
    const float* xb = x + (size_t)b * HW * C;
    const float K = xb[(c / Cg) * Cg];  // first element of the group (pixel 0)
    const float v = xb[(size_t)r * C + c] - K;
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

__global__ void gn_stats_kernel(const double2* sums, const float* x, float* mean, float* rstd, int B, int HW,
                                int C, int G) {
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
  mean[i] = (float)(x[(size_t)b * HW * C + (size_t)g * Cg] + m1);
  rstd[i] = (float)(1.0 / sqrt(var + kEps));
}

struct GnApply {
  const float* x;
  const float* gamma;
  const float* beta;
  const float* mean;
  const float* rstd;
  float* y;
  size_t HWC;
  int C, G, Cg;
  bool silu;
  __device__ float one(size_t i, float v) const {
    const int c = (int)(i % C);
    const size_t bg = (i / HWC) * G + c / Cg;
    float z = (v - mean[bg]) * rstd[bg] * gamma[c] + beta[c];
    return silu ? siluf_(z) : z;
  }
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float4 u = ld4(x, j);
    st4(y, j, make_float4(one(i, u.x), one(i + 1, u.y), one(i + 2, u.z), one(i + 3, u.w)));
  }
  __device__ void scalar(size_t i) const { y[i] = one(i, x[i]); }
};

// dz and xhat at element i of channel c in group bg.
struct GnGrad {
  const float* x;
  const float* dy;
  const float* gamma;
  const float* beta;
  const float* mean;
  const float* rstd;
  bool silu;
  __device__ float2 at(size_t i, int c, size_t bg) const {
    const float xh = (x[i] - mean[bg]) * rstd[bg];
    float dz = dy[i];
    if (silu) dz *= silu_gradf_(xh * gamma[c] + beta[c]);
    return make_float2(dz, xh);
  }
};

struct GradSums {  // (dz*xhat, dz) per (b, c)
  GnGrad g;
  int HW, C, G, Cg;
  __device__ float2 operator()(int b, int r, int c) const {
    const float2 v = g.at(((size_t)b * HW + r) * C + c, c, (size_t)b * G + c / Cg);
    return make_float2(v.x * v.y, v.x);
  }
};

// coef[b*G+g] = (mean_g(dz*gamma), mean_g(dz*gamma*xhat)); dgamma/dbeta summed over b in order.
__global__ void gn_bwd_coef_kernel(const double2* sums, const float* gamma, float2* coef, float* dgamma,
                                   float* dbeta, int B, int HW, int C, int G) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int Cg = C / G;
  if (i < B * G) {
    const int b = i / G, g = i % G;
    double a = 0, bb = 0;
    for (int c = g * Cg; c < (g + 1) * Cg; ++c) {
      const double2 s = sums[(size_t)b * C + c];  // (dz*xhat, dz)
      a += gamma[c] * s.y;
      bb += gamma[c] * s.x;
    }
    const double n = (double)HW * Cg;
    coef[i] = make_float2((float)(a / n), (float)(bb / n));
  }
  if (i < C) {
    double sg = 0, sb = 0;
    for (int b = 0; b < B; ++b) {
      sg += sums[(size_t)b * C + i].x;
      sb += sums[(size_t)b * C + i].y;
    }
    if (dgamma) dgamma[i] = (float)sg;
    if (dbeta) dbeta[i] = (float)sb;
  }
}

struct GnDx {
  GnGrad g;
  const float2* coef;
  float* dx;
  size_t HWC;
  int C, G, Cg;
  __device__ float one(size_t i) const {
    const int c = (int)(i % C);
    const size_t bg = (i / HWC) * G + c / Cg;
    const float2 v = g.at(i, c, bg);
    const float2 k = coef[bg];
    return g.rstd[bg] * (v.x * g.gamma[c] - k.x - v.y * k.y);
  }
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    st4(dx, j, make_float4(one(i), one(i + 1), one(i + 2), one(i + 3)));
  }
  __device__ void scalar(size_t i) const { dx[i] = one(i); }
};

void check_gn(const CudaBackend& be, int B, int C, int G) {
  if (G <= 0 || C % G != 0) throw std::invalid_argument("groupnorm: C must be a multiple of G");
  // aux holds B*C double2 (per-(b, c) sums) then B*G float2 (coefficients).
  if ((size_t)B * C * 4 + (size_t)B * G * 2 > CudaBackend::kAuxFloats)
    throw std::runtime_error("groupnorm: B*C too large for the reduction scratch");
  (void)be;
}

}  // namespace

void CudaBackend::groupnorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                float* rstd, int B, int HW, int C, int G, bool silu) {
  check_gn(*this, B, C, G);
  if (B <= 0 || C <= 0) return;
  const int Cg = C / G;
  double2* sums = reinterpret_cast<double2*>(aux());
  colsum2(*this, ShiftedSums{x, HW, C, Cg}, StoreBC{sums, C}, B, HW, C);
  gn_stats_kernel<<<(B * G + kThreads - 1) / kThreads, kThreads, 0, stream_>>>(sums, x, mean, rstd, B, HW, C,
                                                                               G);
  KERNEL_CHECK();
  const size_t n = (size_t)B * HW * C;
  launch_map(GnApply{x, gamma, beta, mean, rstd, y, (size_t)HW * C, C, G, Cg, silu}, n,
             aligned16(x) && aligned16(y), stream_);
}

void CudaBackend::groupnorm_bwd(const float* x, const float* gamma, const float* beta, const float* mean,
                                const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta,
                                int B, int HW, int C, int G, bool silu) {
  check_gn(*this, B, C, G);
  if (B <= 0 || C <= 0) return;
  const int Cg = C / G;
  double2* sums = reinterpret_cast<double2*>(aux());
  float2* coef = reinterpret_cast<float2*>(aux() + (size_t)B * C * 4);
  const GnGrad gg{x, dy, gamma, beta, mean, rstd, silu};
  colsum2(*this, GradSums{gg, HW, C, G, Cg}, StoreBC{sums, C}, B, HW, C);
  const int nt = std::max(B * G, C);
  gn_bwd_coef_kernel<<<(nt + kThreads - 1) / kThreads, kThreads, 0, stream_>>>(sums, gamma, coef, dgamma,
                                                                               dbeta, B, HW, C, G);
  KERNEL_CHECK();
  if (dx) {
    const size_t n = (size_t)B * HW * C;
    launch_map(GnDx{gg, coef, dx, (size_t)HW * C, C, G, Cg}, n,
               aligned16(x) && aligned16(dy) && aligned16(dx), stream_);
  }
}

}  // namespace unet
