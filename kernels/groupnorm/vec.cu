// GroupNorm variant "vec": the same algorithm as "threepass" (shifted-data statistics from a
// deterministic column reduction), restructured so the passes over the activation do almost no
// arithmetic beyond the memory traffic:
//  * per-(b, c) coefficients are computed once by small kernels over B*C threads:
//      forward  z = x a + bb        with a = rstd gamma (1 + scale), bb = (beta - mean rstd gamma)
//                                    (1 + scale) + shift
//      backward dx = dz A + x Bx + Cc  (A = rstd gamma f, Bx = -rstd^2 k_y, Cc = rstd (rstd k_y mean - k_x))
//    so the element kernels do one or two fused multiply-adds (and SiLU) per element, no divisions;
//  * element kernels move 16 bytes per thread (8 bf16 or 4 f32 channels) along the channel axis;
//  * the reductions read two channels per lane and keep their coefficients in registers;
//  * GroupNormApply (the backward pass's recompute) reuses the saved statistics: one pass.
// Statistics and coefficients are f32/double; storage f32 or bf16. Deterministic: fixed-order sums.
#include "cuda_engine.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

constexpr double kEps = 1e-5;
constexpr int kRows = 8;  // row lanes of the reduction blocks (32 x kRows threads)

// ---- pair loads/stores: 2 channels ----
__device__ __forceinline__ float2 ld2(const float* p, size_t i) {
  return *reinterpret_cast<const float2*>(p + i);
}
__device__ __forceinline__ float2 ld2(const bf16* p, size_t i) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p + i));
}

// Per-(b, c) partial sums over rows [s*rps, (s+1)*rps): stats (x - K, (x - K)^2) with K the
// group's first element, two channels per lane; partial [B, S, C] float2.
template <class T>
__global__ void stats_partial_kernel(const T* __restrict__ x, int R, int C, int Cg, int rps,
                                     float2* partial) {
  pdl_entry();
  __shared__ float4 sm[kRows][32];
  const int lane = threadIdx.x, ty = threadIdx.y;
  const int c = (blockIdx.x * 32 + lane) * 2, s = blockIdx.y, b = blockIdx.z, S = gridDim.y;
  const int r0 = s * rps, r1 = min(R, r0 + rps);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c < C) {
    const T* xb = x + (size_t)b * R * C;
    const float K0 = ldf(xb, (size_t)(c / Cg) * Cg), K1 = ldf(xb, (size_t)((c + 1) / Cg) * Cg);
    for (int r = r0 + ty; r < r1; r += kRows) {
      const float2 v = ld2(xb, (size_t)r * C + c);
      const float a = v.x - K0, d = v.y - K1;
      acc.x += a, acc.y += a * a, acc.z += d, acc.w += d * d;
    }
  }
  sm[ty][lane] = acc;
  __syncthreads();
  if (ty == 0 && c < C) {
    float4 t = sm[0][lane];
    for (int i = 1; i < kRows; ++i)
      t.x += sm[i][lane].x, t.y += sm[i][lane].y, t.z += sm[i][lane].z, t.w += sm[i][lane].w;
    float2* p = partial + ((size_t)b * S + s) * C + c;
    p[0] = make_float2(t.x, t.y);
    p[1] = make_float2(t.z, t.w);
  }
}

// Backward sums per (b, c): (dz xhat, dz), dz = dy SiLU'(z) (or dy), z = x a + bb, xhat = (x - mean) rstd.
template <class T>
__global__ void grad_partial_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                    const float2* __restrict__ zc, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, int R, int C, int G, int Cg, bool silu,
                                    int rps, float2* partial) {
  pdl_entry();
  __shared__ float4 sm[kRows][32];
  const int lane = threadIdx.x, ty = threadIdx.y;
  const int c = (blockIdx.x * 32 + lane) * 2, s = blockIdx.y, b = blockIdx.z, S = gridDim.y;
  const int r0 = s * rps, r1 = min(R, r0 + rps);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c < C) {
    const size_t o = (size_t)b * R * C;
    const float2 z0 = zc[(size_t)b * C + c], z1 = zc[(size_t)b * C + c + 1];
    const int g0 = b * G + c / Cg, g1 = b * G + (c + 1) / Cg;
    const float m0 = mean[g0], s0 = rstd[g0], m1 = mean[g1], s1 = rstd[g1];
    for (int r = r0 + ty; r < r1; r += kRows) {
      const size_t i = o + (size_t)r * C + c;
      const float2 xv = ld2(x, i), gv = ld2(dy, i);
      float d0 = gv.x, d1 = gv.y;
      if (silu) {
        d0 *= silu_gradf_(fmaf(xv.x, z0.x, z0.y));
        d1 *= silu_gradf_(fmaf(xv.y, z1.x, z1.y));
      }
      acc.x += d0 * ((xv.x - m0) * s0), acc.y += d0, acc.z += d1 * ((xv.y - m1) * s1), acc.w += d1;
    }
  }
  sm[ty][lane] = acc;
  __syncthreads();
  if (ty == 0 && c < C) {
    float4 t = sm[0][lane];
    for (int i = 1; i < kRows; ++i)
      t.x += sm[i][lane].x, t.y += sm[i][lane].y, t.z += sm[i][lane].z, t.w += sm[i][lane].w;
    float2* p = partial + ((size_t)b * S + s) * C + c;
    p[0] = make_float2(t.x, t.y);
    p[1] = make_float2(t.z, t.w);
  }
}

// Split sums in split order (double) -> sums[b, c].
__global__ void splits_kernel(const float2* partial, int B, int S, int C, double2* sums) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * C) return;
  const int b = i / C, c = i % C;
  double x = 0, y = 0;
  for (int s = 0; s < S; ++s) {
    const float2 v = partial[((size_t)b * S + s) * C + c];
    x += v.x, y += v.y;
  }
  sums[i] = make_double2(x, y);
}

// Forward coefficients of channel c from its group's statistics (and the scale-shift).
__device__ __forceinline__ float2 fwd_coef(float m, float r, float gamma, float beta, const float* ss, int b,
                                           int c, int C) {
  float a = r * gamma, bb = beta - m * a;
  if (ss) {
    const float f = 1.f + ss[(size_t)b * 2 * C + c];
    a *= f;
    bb = bb * f + ss[(size_t)b * 2 * C + C + c];
  }
  return make_float2(a, bb);
}

// Statistics per (b, g) (written by the group's first channel) and forward coefficients per (b, c).
template <class T>
__global__ void stats_kernel(const double2* sums, const T* x, const float* gamma, const float* beta,
                             const float* ss, float* mean, float* rstd, float2* zc, int B, int R, int C,
                             int G) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * C) return;
  const int b = i / C, c = i % C, Cg = C / G, g = c / Cg;
  double s1 = 0, s2 = 0;
  for (int k = g * Cg; k < (g + 1) * Cg; ++k)
    s1 += sums[(size_t)b * C + k].x, s2 += sums[(size_t)b * C + k].y;
  const double n = (double)R * Cg;
  const double m1 = s1 / n, var = fmax(s2 / n - m1 * m1, 0.0);
  const float m = (float)(ldf(x, (size_t)b * R * C + (size_t)g * Cg) + m1),
              r = (float)(1.0 / sqrt(var + kEps));
  if (c % Cg == 0) mean[b * G + g] = m, rstd[b * G + g] = r;
  zc[i] = fwd_coef(m, r, gamma[c], beta[c], ss, b, c, C);
}

// Forward coefficients from saved statistics.
__global__ void coef_kernel(const float* gamma, const float* beta, const float* ss, const float* mean,
                            const float* rstd, float2* zc, int B, int C, int G) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * C) return;
  const int b = i / C, c = i % C, bg = b * G + c / (C / G);
  zc[i] = fwd_coef(mean[bg], rstd[bg], gamma[c], beta[c], ss, b, c, C);
}

// Backward coefficients per (b, c), dss per (b, c), and dgamma/dbeta per c (summed over b in order).
__global__ void bwd_coef_kernel(const double2* sums, const float* gamma, const float* beta, const float* ss,
                                const float* mean, const float* rstd, float4* dc, float* dgamma, float* dbeta,
                                float* dss, int B, int R, int C, int G) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int Cg = C / G;
  auto f = [&](int b, int c) { return ss ? 1.0 + (double)ss[(size_t)b * 2 * C + c] : 1.0; };
  if (i < B * C) {
    const int b = i / C, c = i % C, g = c / Cg, bg = b * G + g;
    double kx = 0, ky = 0;  // group sums of gamma f (dz) and gamma f (dz xhat)
    for (int k = g * Cg; k < (g + 1) * Cg; ++k) {
      const double2 s = sums[(size_t)b * C + k];  // (dz xhat, dz)
      const double w = f(b, k) * gamma[k];
      kx += w * s.y;
      ky += w * s.x;
    }
    const double n = (double)R * Cg;
    kx /= n, ky /= n;
    const double r = rstd[bg], m = mean[bg];
    dc[i] = make_float4((float)(r * gamma[c] * f(b, c)), (float)(-r * r * ky), (float)(r * (r * ky * m - kx)),
                        0.f);
    if (dss) {
      const double2 s = sums[i];
      dss[(size_t)b * 2 * C + c] = (float)(gamma[c] * s.x + beta[c] * s.y);
      dss[(size_t)b * 2 * C + C + c] = (float)s.y;
    }
  }
  if (i < C) {
    double sg = 0, sb = 0;
    for (int b = 0; b < B; ++b) {
      const double2 s = sums[(size_t)b * C + i];
      const double k = f(b, i);
      sg += k * s.x, sb += k * s.y;
    }
    if (dgamma) dgamma[i] = (float)sg;
    if (dbeta) dbeta[i] = (float)sb;
  }
}

// ---- element kernels: N channels per thread (16 bytes when the pointers and C allow) ----
template <class T, int N>
struct Vec {
  static constexpr int n = 1;
  __device__ static void load(const T* p, float* v) { v[0] = ldf(p, 0); }
  __device__ static void store(T* p, const float* v) { stf(p, 0, v[0]); }
};
template <>
struct Vec<float, 4> {
  static constexpr int n = 4;
  __device__ static void load(const float* p, float* v) {
    const float4 u = *reinterpret_cast<const float4*>(p);
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
  }
  __device__ static void store(float* p, const float* v) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
};
template <>
struct Vec<bf16, 8> {
  static constexpr int n = 8;
  __device__ static void load(const bf16* p, float* v) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
      v[2 * k] = f.x, v[2 * k + 1] = f.y;
    }
  }
  __device__ static void store(bf16* p, const float* v) {
    uint32_t w[4];
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      w[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};
template <class T>
constexpr int kWide = sizeof(T) == 2 ? 8 : 4;

// y = act(x a + bb); items = rows x C/V vectors.
template <class T, int N>
__global__ void apply_kernel(const T* __restrict__ x, T* __restrict__ y, const float2* __restrict__ zc,
                             size_t rows, int R, int C, bool silu) {
  pdl_entry();
  constexpr int V = Vec<T, N>::n;
  const int Cv = C / V;
  const size_t n = rows * Cv;
  for (size_t it = blockIdx.x * (size_t)blockDim.x + threadIdx.x; it < n;
       it += (size_t)gridDim.x * blockDim.x) {
    const size_t row = it / Cv;
    const int c = (int)(it - row * Cv) * V;
    const size_t b = row / R;
    float v[V];
    Vec<T, N>::load(x + row * C + c, v);
    const float2* z = zc + b * C + c;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float2 q = z[k];
      const float t = fmaf(v[k], q.x, q.y);
      v[k] = silu ? siluf_(t) : t;
    }
    Vec<T, N>::store(y + row * C + c, v);
  }
}

// dx = dz A + x Bx + Cc with dz = dy SiLU'(x a + bb) (or dy).
template <class T, int N>
__global__ void dx_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                          const T* __restrict__ add, const float2* __restrict__ zc, const float4* __restrict__ dc,
                          size_t rows, int R, int C, bool silu) {
  pdl_entry();
  constexpr int V = Vec<T, N>::n;
  const int Cv = C / V;
  const size_t n = rows * Cv;
  for (size_t it = blockIdx.x * (size_t)blockDim.x + threadIdx.x; it < n;
       it += (size_t)gridDim.x * blockDim.x) {
    const size_t row = it / Cv;
    const int c = (int)(it - row * Cv) * V;
    const size_t b = row / R;
    float xv[V], gv[V];
    Vec<T, N>::load(x + row * C + c, xv);
    Vec<T, N>::load(dy + row * C + c, gv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float dz = gv[k];
      if (silu) {
        const float2 q = zc[b * C + c + k];
        dz *= silu_gradf_(fmaf(xv[k], q.x, q.y));
      }
      const float4 d = dc[b * C + c + k];
      gv[k] = fmaf(dz, d.x, fmaf(xv[k], d.y, d.z));
    }
    if (add) {
      Vec<T, N>::load(add + row * C + c, xv);
#pragma unroll
      for (int k = 0; k < V; ++k) gv[k] += xv[k];
    }
    Vec<T, N>::store(dx + row * C + c, gv);
  }
}

// ---- scratch layout in ctx.aux(): sums double2 [B*C] | zc float2 [B*C] | dc float4 [B*C] ----
struct Scratch {
  double2* sums;
  float2* zc;
  float4* dc;
};
Scratch scratch(CudaCtx& ctx, int B, int C) {
  const size_t n = (size_t)B * C;
  char* p = reinterpret_cast<char*>(ctx.aux());
  return {reinterpret_cast<double2*>(p), reinterpret_cast<float2*>(p + n * 16),
          reinterpret_cast<float4*>(p + n * 24)};
}
size_t scratch_bytes(int B, int C) { return (size_t)B * C * 40; }

int splits(int R) { return std::max(1, std::min(256, (R + 127) / 128)); }

template <class T>
void reduce_stats(CudaCtx& ctx, const T* x, int B, int R, int C, int G, double2* sums) {
  const int S0 = splits(R), rps = (R + S0 - 1) / S0, S = (R + rps - 1) / rps;
  if ((size_t)B * S * C * 2 > CudaCtx::kPartialFloats)
    throw std::runtime_error("groupnorm: reduction too wide");
  float2* partial = reinterpret_cast<float2*>(ctx.partial());
  dim3 grid((C / 2 + 31) / 32, S, B), block(32, kRows);
  stats_partial_kernel<T><<<grid, block, 0, ctx.stream>>>(x, R, C, C / G, rps, partial);
  KERNEL_CHECK();
  splits_kernel<<<(B * C + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(partial, B, S, C, sums);
  KERNEL_CHECK();
}

unsigned blocks_for(size_t n) { return grid_for(n); }

// 16-byte vectors when C and both pointers allow, else one element per thread.
bool wide_ok(int C, int V, std::initializer_list<const void*> ptrs) {
  if (C % V) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

template <class T>
void apply(CudaCtx& ctx, const T* x, T* y, const float2* zc, int B, int R, int C, bool silu) {
  const size_t rows = (size_t)B * R;
  if (wide_ok(C, kWide<T>, {x, y}))
    apply_kernel<T, kWide<T>>
        <<<blocks_for(rows * (C / kWide<T>)), kThreads, 0, ctx.stream>>>(x, y, zc, rows, R, C, silu);
  else
    apply_kernel<T, 1><<<blocks_for(rows * C), kThreads, 0, ctx.stream>>>(x, y, zc, rows, R, C, silu);
  KERNEL_CHECK();
}

struct Dims {
  int B, R, C, G;
};
Dims dims(const Tensor& x, const Tensor& mean) {
  return {(int)x.dim[0], (int)(x.dim[1] * x.dim[2]), (int)x.dim[3], (int)mean.dim[1]};
}

void gn_fwd(const GroupNormFwd& o, CudaCtx& ctx) {
  const Dims d = dims(o.x, o.mean);
  const Scratch s = scratch(ctx, d.B, d.C);
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = dptr<T>(o.x);
    reduce_stats(ctx, x, d.B, d.R, d.C, d.G, s.sums);
    stats_kernel<T><<<(d.B * d.C + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
        s.sums, x, dptr<float>(o.gamma), dptr<float>(o.beta), dptr<float>(o.ss), dptr<float>(o.mean),
        dptr<float>(o.rstd), s.zc, d.B, d.R, d.C, d.G);
    KERNEL_CHECK();
    apply(ctx, x, dptr<T>(o.y), s.zc, d.B, d.R, d.C, o.silu);
  });
}

void gn_apply(const GroupNormApply& o, CudaCtx& ctx) {
  const Dims d = dims(o.x, o.mean);
  const Scratch s = scratch(ctx, d.B, d.C);
  coef_kernel<<<(d.B * d.C + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
      dptr<float>(o.gamma), dptr<float>(o.beta), dptr<float>(o.ss), dptr<float>(o.mean), dptr<float>(o.rstd),
      s.zc, d.B, d.C, d.G);
  KERNEL_CHECK();
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    apply(ctx, dptr<T>(o.x), dptr<T>(o.y), s.zc, d.B, d.R, d.C, o.silu);
  });
}

void gn_bwd(const GroupNormBwd& o, CudaCtx& ctx) {
  const Dims d = dims(o.x, o.mean);
  const Scratch s = scratch(ctx, d.B, d.C);
  const int n = d.B * d.C;
  coef_kernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
      dptr<float>(o.gamma), dptr<float>(o.beta), dptr<float>(o.ss), dptr<float>(o.mean), dptr<float>(o.rstd),
      s.zc, d.B, d.C, d.G);
  KERNEL_CHECK();
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *x = dptr<T>(o.x), *dy = dptr<T>(o.dy);
    const int S0 = splits(d.R), rps = (d.R + S0 - 1) / S0, S = (d.R + rps - 1) / rps;
    if ((size_t)d.B * S * d.C * 2 > CudaCtx::kPartialFloats)
      throw std::runtime_error("groupnorm: reduction too wide");
    float2* partial = reinterpret_cast<float2*>(ctx.partial());
    dim3 grid((d.C / 2 + 31) / 32, S, d.B), block(32, kRows);
    grad_partial_kernel<T><<<grid, block, 0, ctx.stream>>>(x, dy, s.zc, dptr<float>(o.mean),
                                                           dptr<float>(o.rstd), d.R, d.C, d.G, d.C / d.G,
                                                           o.silu, rps, partial);
    KERNEL_CHECK();
    splits_kernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(partial, d.B, S, d.C, s.sums);
    KERNEL_CHECK();
    const int nt = std::max(n, d.C);
    bwd_coef_kernel<<<(nt + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
        s.sums, dptr<float>(o.gamma), dptr<float>(o.beta), dptr<float>(o.ss), dptr<float>(o.mean),
        dptr<float>(o.rstd), s.dc, dptr<float>(o.dgamma), dptr<float>(o.dbeta), dptr<float>(o.dss), d.B, d.R,
        d.C, d.G);
    KERNEL_CHECK();
    if (o.dx.defined()) {
      const size_t rows = (size_t)d.B * d.R;
      T* dx = dptr<T>(o.dx);
      const T* add = dptr<T>(o.add);
      if (wide_ok(d.C, kWide<T>, {x, dy, dx, add}))
        dx_kernel<T, kWide<T>><<<blocks_for(rows * (d.C / kWide<T>)), kThreads, 0, ctx.stream>>>(
            x, dy, dx, add, s.zc, s.dc, rows, d.R, d.C, o.silu);
      else
        dx_kernel<T, 1><<<blocks_for(rows * d.C), kThreads, 0, ctx.stream>>>(x, dy, dx, add, s.zc, s.dc, rows,
                                                                             d.R, d.C, o.silu);
      KERNEL_CHECK();
    }
  });
  rowblock::gn_bwd_column_sums(ctx, o);
}

// Two channels per reduction lane (C even: pairs stay 4/8-byte aligned, as every tensor starts
// 256-byte aligned); the scratch must hold the per-(b, c) coefficients. Vector widths of the
// element kernels are chosen per call from the pointers.
bool shapes_ok(const Tensor& x, const Tensor& mean) {
  const Dims d = dims(x, mean);
  return d.C % 2 == 0 && scratch_bytes(d.B, d.C) <= CudaCtx::kAuxFloats * 4;
}
// (The input offset, gn_has_offset, is read by "smem" and "fused" only.)
bool fwd_ok(const GroupNormFwd& o, const CudaCtx&) {
  return o.y.defined() && o.y.dtype == o.x.dtype && shapes_ok(o.x, o.mean) && !gn_has_offset(o) &&
         !o.x2.defined();
}
bool apply_ok(const GroupNormApply& o, const CudaCtx&) {
  return o.y.dtype == o.x.dtype && shapes_ok(o.x, o.mean) && !gn_has_offset(o);
}
bool bwd_ok(const GroupNormBwd& o, const CudaCtx&) {
  return o.dy.dtype == o.x.dtype && (!o.dx.defined() || o.dx.dtype == o.x.dtype) &&
         (!o.add.defined() || o.add.dtype == o.x.dtype) && shapes_ok(o.x, o.mean) &&
         rowblock::gn_bwd_column_sums_fit(o) && !gn_has_offset(o) && !o.dx2.defined() &&
         !o.add2.defined();
}

}  // namespace

void register_groupnorm_vec(CudaOps& ops) {
  ops.variants<GroupNormFwd>().push_back({"vec", fwd_ok, gn_fwd, nullptr});
  ops.variants<GroupNormApply>().push_back({"vec", apply_ok, gn_apply, nullptr});
  ops.variants<GroupNormBwd>().push_back({"vec", bwd_ok, gn_bwd, nullptr});
}

}  // namespace unet
