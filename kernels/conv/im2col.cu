// Convolution variant "im2col": NHWC, weights [Co, k, k, Ci] (K = k*k*Ci contiguous), padding
// k/2, f32 or bf16 storage.
//
//  * 1x1, stride 1: a plain GEMM over the B*H*W pixel rows, no copies.
//  * otherwise: im2col into the workspace (patch matrix [rows, K] in the weight's (ky,kx,ci)
//    order), then one cuBLAS GEMM per batch chunk; the batch is chunked so a chunk's patch matrix
//    fits the workspace (at most 128 MiB is asked for).
//  * ConvFwd's epilogue (bias, per-sample embedding, residual) is one elementwise pass after the
//    GEMM; ConvBwdFilter's db and demb are column reductions of dy.
//  * dW accumulates the chunks' GEMMs with beta = 1 in chunk order (deterministic).
//  * dX: GEMM dcol = dy * W into the workspace, then a col2im GATHER: every input pixel sums its
//    (at most k*k) contributions in tap order — no atomics, deterministic.
//
// Where the time goes: the patch matrix is written and read once per GEMM (9x the activation for
// 3x3), and dcol is written and read again for dX. This is the portable baseline the faster
// variants are tested against.
#include <algorithm>
#include <string>

#include "cuda_engine.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

constexpr size_t kMaxWorkspace = size_t(128) << 20;

// col[m, (ky*k + kx)*Ci + ci] = x[b, oy*s - p + ky, ox*s - p + kx, ci] (0 outside), m = (b, oy, ox)
// of the chunk. Thread idx handles V channels; its col offset is exactly idx*V.
template <class T, int V>
__global__ void im2col_kernel(const T* __restrict__ x, T* __restrict__ col, int nb, int H, int W, int Ci,
                              int k, int s, int Ho, int Wo) {
  pdl_entry();
  const int pad = k / 2, Cv = Ci / V, kk2 = k * k;
  const size_t total = (size_t)nb * Ho * Wo * kk2 * Cv;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const int cv = (int)(idx % Cv);
    size_t r = idx / Cv;
    const int kk = (int)(r % kk2);
    const size_t m = r / kk2;
    const int ox = (int)(m % Wo);
    const size_t t = m / Wo;
    const int oy = (int)(t % Ho);
    const size_t b = t / Ho;
    const int iy = oy * s - pad + kk / k, ix = ox * s - pad + kk % k;
    const bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
    const size_t src = ((b * H + iy) * W + ix) * Ci + (size_t)cv * V;
    if (V == 4) {
      const float4 v = in ? ld4(x, src / 4) : make_float4(0.f, 0.f, 0.f, 0.f);
      st4(col, idx, v);
    } else {
      col[idx] = in ? x[src] : T(0.f);
    }
  }
}

// dx[b, iy, ix, ci] = sum over taps (ky, kx) with oy = (iy + p - ky)/s, ox = (ix + p - kx)/s exact
// and in range of dcol[(b, oy, ox), (ky*k + kx)*Ci + ci]; taps in order, f32 sums.
template <class T, int V>
__global__ void col2im_kernel(const T* __restrict__ dcol, T* __restrict__ dx, int nb, int H, int W, int Ci,
                              int k, int s, int Ho, int Wo) {
  pdl_entry();
  const int pad = k / 2, Cv = Ci / V;
  const size_t K = (size_t)k * k * Ci;
  const size_t total = (size_t)nb * H * W * Cv;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const int cv = (int)(idx % Cv);
    size_t p = idx / Cv;
    const int ix = (int)(p % W);
    p /= W;
    const int iy = (int)(p % H);
    const size_t b = p / H;
    float acc[V] = {};
    for (int ky = 0; ky < k; ++ky) {
      const int ny = iy + pad - ky;
      if (ny < 0 || ny % s) continue;
      const int oy = ny / s;
      if (oy >= Ho) continue;
      for (int kx = 0; kx < k; ++kx) {
        const int nx = ix + pad - kx;
        if (nx < 0 || nx % s) continue;
        const int ox = nx / s;
        if (ox >= Wo) continue;
        const size_t src = ((b * Ho + oy) * Wo + ox) * K + (size_t)(ky * k + kx) * Ci + (size_t)cv * V;
        if (V == 4) {
          const float4 v = ld4(dcol, src / 4);
          acc[0] += v.x, acc[1] += v.y, acc[2] += v.z, acc[3] += v.w;
        } else {
          acc[0] += ldf(dcol, src);
        }
      }
    }
    if (V == 4)
      st4(dx, idx, make_float4(acc[0], acc[1], acc[2], acc[3]));
    else
      stf(dx, idx, acc[0]);
  }
}

struct ConvGeom {
  int B, H, W, Ci, Co, k, s, Ho, Wo, K;
  size_t per_sample;  // patch-matrix elements of one sample
};
ConvGeom geom(const Tensor& x, const Tensor& w, const Tensor& y, int stride) {
  ConvGeom g;
  g.B = (int)x.dim[0], g.H = (int)x.dim[1], g.W = (int)x.dim[2], g.Ci = (int)x.dim[3];
  g.Co = (int)w.dim[0], g.k = (int)w.dim[1], g.s = stride, g.Ho = (int)y.dim[1], g.Wo = (int)y.dim[2];
  g.K = g.k * g.k * g.Ci;
  g.per_sample = (size_t)g.Ho * g.Wo * g.K;
  return g;
}
bool direct(const ConvGeom& g) { return g.k == 1 && g.s == 1; }

// Workspace bytes: the whole patch matrix when it fits in kMaxWorkspace, else as many samples as do.
size_t ws_bytes(const ConvGeom& g, DType t) {
  if (direct(g)) return 0;
  const size_t one = g.per_sample * dtype_size(t);
  const size_t n =
      std::max<size_t>(1, std::min<size_t>((size_t)g.B, kMaxWorkspace / std::max<size_t>(one, 1)));
  return n * one;
}
int chunk(const CudaCtx& ctx, const ConvGeom& g, DType t) {
  const size_t bc = ctx.ws_bytes / std::max<size_t>(1, g.per_sample * dtype_size(t));
  if (bc == 0) throw std::logic_error("conv im2col: workspace smaller than one sample's patch matrix");
  return (int)std::min<size_t>(bc, (size_t)g.B);
}

template <class T>
void launch_im2col(CudaCtx& ctx, const T* x, T* col, int nb, const ConvGeom& g) {
  const bool v4 = g.Ci % 4 == 0 && vec4_ok<T>(x) && vec4_ok<T>(col);
  const size_t total = (size_t)nb * g.per_sample / (v4 ? 4 : 1);
  if (!total) return;
  if (v4)
    im2col_kernel<T, 4>
        <<<grid_for(total), kThreads, 0, ctx.stream>>>(x, col, nb, g.H, g.W, g.Ci, g.k, g.s, g.Ho, g.Wo);
  else
    im2col_kernel<T, 1>
        <<<grid_for(total), kThreads, 0, ctx.stream>>>(x, col, nb, g.H, g.W, g.Ci, g.k, g.s, g.Ho, g.Wo);
  KERNEL_CHECK();
}
template <class T>
void launch_col2im(CudaCtx& ctx, const T* dcol, T* dx, int nb, const ConvGeom& g) {
  const bool v4 = g.Ci % 4 == 0 && vec4_ok<T>(dcol) && vec4_ok<T>(dx);
  const size_t total = (size_t)nb * g.H * g.W * g.Ci / (v4 ? 4 : 1);
  if (!total) return;
  if (v4)
    col2im_kernel<T, 4>
        <<<grid_for(total), kThreads, 0, ctx.stream>>>(dcol, dx, nb, g.H, g.W, g.Ci, g.k, g.s, g.Ho, g.Wo);
  else
    col2im_kernel<T, 1>
        <<<grid_for(total), kThreads, 0, ctx.stream>>>(dcol, dx, nb, g.H, g.W, g.Ci, g.k, g.s, g.Ho, g.Wo);
  KERNEL_CHECK();
}

// y[b, p, c] (+)= bias[c] + emb[b, c] + res[b, p, c], in f32, one pass.
template <class TY>
struct Epilogue {
  TY* y;
  const float* bias;
  const float* emb;
  const TY* res;
  size_t HWC;
  int C;
  __device__ float one(size_t i, float v) const {
    const int c = (int)(i % C);
    if (bias) v += bias[c];
    if (emb) v += emb[(i / HWC) * C + c];
    if (res) v += ldf(res, i);
    return v;
  }
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float4 u = ld4(y, j);
    st4(y, j, make_float4(one(i, u.x), one(i + 1, u.y), one(i + 2, u.z), one(i + 3, u.w)));
  }
  __device__ void scalar(size_t i) const { stf(y, i, one(i, ldf(y, i))); }
};

void conv_fwd(const ConvFwd& o, CudaCtx& ctx) {
  const ConvGeom g = geom(o.x, o.w, o.y, o.stride);
  const DType t = o.x.dtype;
  const size_t esz = dtype_size(t);
  const int rows = g.B * g.Ho * g.Wo;
  if (direct(g)) {
    ctx.gemm(false, true, rows, g.Co, g.Ci, 1.f, {o.x.data, t, g.Ci}, {o.w.data, t, g.Ci}, 0.f,
             {o.y.data, o.y.dtype, g.Co});
  } else {
    const int Bc = chunk(ctx, g, t);
    const size_t ysz = dtype_size(o.y.dtype);
    for (int b0 = 0; b0 < g.B; b0 += Bc) {
      const int nb = std::min(Bc, g.B - b0);
      const char* xc = static_cast<const char*>(o.x.data) + (size_t)b0 * g.H * g.W * g.Ci * esz;
      with_act(t, [&](auto tag) {
        using T = decltype(tag);
        launch_im2col<T>(ctx, reinterpret_cast<const T*>(xc), static_cast<T*>(ctx.ws), nb, g);
      });
      ctx.gemm(false, true, nb * g.Ho * g.Wo, g.Co, g.K, 1.f, {ctx.ws, t, g.K}, {o.w.data, t, g.K}, 0.f,
               {static_cast<char*>(o.y.data) + (size_t)b0 * g.Ho * g.Wo * g.Co * ysz, o.y.dtype, g.Co});
    }
  }
  if (!o.bias.defined() && !o.emb.defined() && !o.res.defined()) return;
  with_act(o.y.dtype, [&](auto tag) {
    using TY = decltype(tag);
    Epilogue<TY> e{dptr<TY>(o.y),   dptr<float>(o.bias),        dptr<float>(o.emb),
                   dptr<TY>(o.res), (size_t)g.Ho * g.Wo * g.Co, g.Co};
    const bool v = g.Co % 4 == 0 && vec4_ok<TY>(o.y.data) && (!o.res.defined() || vec4_ok<TY>(o.res.data));
    launch_map(e, o.y.numel(), v, ctx.stream);
  });
}

void conv_bwd_data(const ConvBwdData& o, CudaCtx& ctx) {
  const ConvGeom g = geom(o.dx, o.w, o.dy, o.stride);
  const DType t = o.dy.dtype;
  const size_t esz = dtype_size(t);
  const int rows = g.B * g.Ho * g.Wo;
  if (direct(g)) {
    ctx.gemm(false, false, rows, g.Ci, g.Co, 1.f, {o.dy.data, t, g.Co}, {o.w.data, t, g.Ci}, 0.f,
             {o.dx.data, t, g.Ci});
    return;
  }
  const int Bc = chunk(ctx, g, t);
  for (int b0 = 0; b0 < g.B; b0 += Bc) {
    const int nb = std::min(Bc, g.B - b0);
    const char* dyc = static_cast<const char*>(o.dy.data) + (size_t)b0 * g.Ho * g.Wo * g.Co * esz;
    // dcol [Mc, K] = dy_c [Mc, Co] * w [Co, K], then gather
    ctx.gemm(false, false, nb * g.Ho * g.Wo, g.K, g.Co, 1.f, {dyc, t, g.Co}, {o.w.data, t, g.K}, 0.f,
             {ctx.ws, t, g.K});
    with_act(t, [&](auto tag) {
      using T = decltype(tag);
      launch_col2im<T>(ctx, static_cast<const T*>(ctx.ws), dptr<T>(o.dx) + (size_t)b0 * g.H * g.W * g.Ci, nb,
                       g);
    });
  }
}

// Column sums of dy: db (over all rows) and demb (per sample).
template <class T>
struct DyRows {
  const T* dy;
  int R, C;
  __device__ float2 operator()(int b, int r, int c) const {
    return make_float2(ldf(dy, ((size_t)b * R + r) * C + c), 0.f);
  }
};
struct WriteRow {
  float* out;
  int C;
  __device__ void operator()(int b, int c, double x, double) const { out[(size_t)b * C + c] = (float)x; }
};

void conv_bwd_filter(const ConvBwdFilter& o, CudaCtx& ctx) {
  const DType t = o.dy.dtype;
  const int B = (int)o.dy.dim[0], HWo = (int)(o.dy.dim[1] * o.dy.dim[2]), Co = (int)o.dy.dim[3];
  if (o.db.defined()) bias_grad(ctx, o.dy, o.db, B * HWo, Co);
  if (o.demb.defined())
    with_act(t, [&](auto tag) {
      using T = decltype(tag);
      colsum2(ctx, DyRows<T>{dptr<T>(o.dy), HWo, Co}, WriteRow{dptr<float>(o.demb), Co}, B, HWo, Co);
    });
  if (!o.dw.defined()) return;
  const ConvGeom g = geom(o.x, o.dw, o.dy, o.stride);
  const size_t esz = dtype_size(t);
  const int rows = g.B * g.Ho * g.Wo;
  if (direct(g)) {  // dw [Co, Ci] = dy^T x
    ctx.gemm(true, false, g.Co, g.Ci, rows, 1.f, {o.dy.data, t, g.Co}, {o.x.data, t, g.Ci}, 0.f,
             {o.dw.data, DType::F32, g.Ci});
    return;
  }
  const int Bc = chunk(ctx, g, t);
  for (int b0 = 0; b0 < g.B; b0 += Bc) {
    const int nb = std::min(Bc, g.B - b0);
    const char* xc = static_cast<const char*>(o.x.data) + (size_t)b0 * g.H * g.W * g.Ci * esz;
    const char* dyc = static_cast<const char*>(o.dy.data) + (size_t)b0 * g.Ho * g.Wo * g.Co * esz;
    with_act(t, [&](auto tag) {
      using T = decltype(tag);
      launch_im2col<T>(ctx, reinterpret_cast<const T*>(xc), static_cast<T*>(ctx.ws), nb, g);
    });
    // dw[Co, K] (+)= dy_c^T [Co, Mc] * col [Mc, K]
    ctx.gemm(true, false, g.Co, g.K, nb * g.Ho * g.Wo, 1.f, {dyc, t, g.Co}, {ctx.ws, t, g.K},
             b0 == 0 ? 0.f : 1.f, {o.dw.data, DType::F32, g.K});
  }
}

bool fwd_ok(const ConvFwd& o, const CudaCtx&) { return o.y.dtype == o.x.dtype || o.y.dtype == DType::F32; }
size_t fwd_ws(const ConvFwd& o, const CudaCtx&) { return ws_bytes(geom(o.x, o.w, o.y, o.stride), o.x.dtype); }
size_t data_ws(const ConvBwdData& o, const CudaCtx&) {
  return ws_bytes(geom(o.dx, o.w, o.dy, o.stride), o.dy.dtype);
}
size_t filter_ws(const ConvBwdFilter& o, const CudaCtx&) {
  return o.dw.defined() ? ws_bytes(geom(o.x, o.dw, o.dy, o.stride), o.dy.dtype) : 0;
}

}  // namespace

void register_conv_im2col(CudaOps& ops) {
  ops.variants<ConvFwd>().push_back({"im2col", no_norm<ConvFwd, stats_ok<ConvFwd, fwd_ok>>, then_stats<ConvFwd, conv_fwd>, fwd_ws});
  ops.variants<ConvBwdData>().push_back({"im2col", nullptr, conv_bwd_data, data_ws});
  ops.variants<ConvBwdFilter>().push_back({"im2col", no_norm<ConvBwdFilter>, conv_bwd_filter, filter_ws});
}

}  // namespace unet
