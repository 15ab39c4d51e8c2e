// 2-D convolution, NHWC, weights [Co, k, k, Ci] (K = k*k*Ci contiguous), padding k/2.
//
//  * 1x1, stride 1: a plain GEMM over the B*H*W pixel rows, no copies.
//  * otherwise: im2col into the fixed workspace (patch matrix [rows, K] in the weight's (ky,kx,ci)
//    order), then one cuBLAS GEMM per batch chunk; the batch is chunked so a chunk's patch matrix
//    fits the workspace.
//  * dW accumulates the chunks' GEMMs with beta = 1 in chunk order (deterministic).
//  * dX: GEMM dcol = dy * W into the workspace, then a col2im GATHER: every input pixel sums its
//    (at most k*k) contributions in tap order — no atomics, deterministic.
//
// Where the time goes (the later speed work replaces this with a tensor-core implicit GEMM): the
// patch matrix is written and read once per GEMM (9x the activation for 3x3), and dcol is written
// and read again for dX — for the 64x64 layers at batch 32 that is ~0.3 GB of traffic per pass,
// several times the GEMM's own minimum bytes.
#include <string>

#include "cuda_backend.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

template <int V>
struct VecT;
template <>
struct VecT<1> {
  using T = float;
  __device__ static T zero() { return 0.f; }
  __device__ static void acc(T& a, T b) { a += b; }
};
template <>
struct VecT<4> {
  using T = float4;
  __device__ static T zero() { return make_float4(0.f, 0.f, 0.f, 0.f); }
  __device__ static void acc(T& a, T b) {
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
  }
};

// col[m, (ky*k + kx)*Ci + ci] = x[b, oy*s - p + ky, ox*s - p + kx, ci] (0 outside), m = (b, oy, ox)
// of the chunk. Thread idx handles V channels; its col offset is exactly idx*V.
template <int V>
__global__ void im2col_kernel(const float* __restrict__ x, float* __restrict__ col, int nb, int H, int W,
                              int Ci, int k, int s, int Ho, int Wo) {
  using T = typename VecT<V>::T;
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
    T v = VecT<V>::zero();
    if (iy >= 0 && iy < H && ix >= 0 && ix < W)
      v = *reinterpret_cast<const T*>(x + ((b * H + iy) * W + ix) * Ci + (size_t)cv * V);
    reinterpret_cast<T*>(col)[idx] = v;
  }
}

// dx[b, iy, ix, ci] = sum over taps (ky, kx) with oy = (iy + p - ky)/s, ox = (ix + p - kx)/s exact
// and in range of dcol[(b, oy, ox), (ky*k + kx)*Ci + ci]; taps in order. dx offset = idx*V.
template <int V>
__global__ void col2im_kernel(const float* __restrict__ dcol, float* __restrict__ dx, int nb, int H, int W,
                              int Ci, int k, int s, int Ho, int Wo) {
  using T = typename VecT<V>::T;
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
    T acc = VecT<V>::zero();
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
        const float* src = dcol + ((b * Ho + oy) * Wo + ox) * K + (size_t)(ky * k + kx) * Ci + (size_t)cv * V;
        VecT<V>::acc(acc, *reinterpret_cast<const T*>(src));
      }
    }
    reinterpret_cast<T*>(dx)[idx] = acc;
  }
}

void check_conv_args(int k, int stride) {
  if ((k != 1 && k != 3) || (stride != 1 && stride != 2))
    throw std::invalid_argument("conv2d: unsupported kernel " + std::to_string(k) + " / stride " +
                                std::to_string(stride));
}

}  // namespace

namespace {
struct ConvGeom {
  int pad, Ho, Wo, K;
  size_t per_sample;  // patch-matrix floats of one sample
};
ConvGeom conv_geom(int H, int W, int Ci, int k, int stride) {
  ConvGeom g;
  g.pad = k / 2;
  g.Ho = (H + 2 * g.pad - k) / stride + 1;
  g.Wo = (W + 2 * g.pad - k) / stride + 1;
  g.K = k * k * Ci;
  g.per_sample = (size_t)g.Ho * g.Wo * g.K;
  return g;
}
int conv_chunk(const CudaBackend& be, const ConvGeom& g, int B) {
  const size_t bc = be.ws_floats() / std::max<size_t>(1, g.per_sample);
  if (bc == 0)
    throw std::runtime_error("conv2d: one sample's patch matrix (" + std::to_string(g.per_sample * 4 >> 20) +
                             " MiB) exceeds the CUDA workspace (" + std::to_string(be.ws_floats() * 4 >> 20) +
                             " MiB)");
  return (int)std::min<size_t>(bc, (size_t)B);
}
void launch_im2col(CudaBackend& be, const float* x, float* col, int nb, int H, int W, int Ci, int k, int s,
                   const ConvGeom& g) {
  const bool v4 = Ci % 4 == 0 && aligned16(x) && aligned16(col);
  const size_t total = (size_t)nb * g.per_sample / (v4 ? 4 : 1);
  if (!total) return;
  if (v4)
    im2col_kernel<4><<<grid_for(total), kThreads, 0, be.stream()>>>(x, col, nb, H, W, Ci, k, s, g.Ho, g.Wo);
  else
    im2col_kernel<1><<<grid_for(total), kThreads, 0, be.stream()>>>(x, col, nb, H, W, Ci, k, s, g.Ho, g.Wo);
  KERNEL_CHECK();
}
void launch_col2im(CudaBackend& be, const float* dcol, float* dx, int nb, int H, int W, int Ci, int k, int s,
                   const ConvGeom& g) {
  const bool v4 = Ci % 4 == 0 && aligned16(dcol) && aligned16(dx);
  const size_t total = (size_t)nb * H * W * Ci / (v4 ? 4 : 1);
  if (!total) return;
  if (v4)
    col2im_kernel<4><<<grid_for(total), kThreads, 0, be.stream()>>>(dcol, dx, nb, H, W, Ci, k, s, g.Ho, g.Wo);
  else
    col2im_kernel<1><<<grid_for(total), kThreads, 0, be.stream()>>>(dcol, dx, nb, H, W, Ci, k, s, g.Ho, g.Wo);
  KERNEL_CHECK();
}
}  // namespace

void CudaBackend::conv2d_fwd(const float* x, const float* w, const float* bias, float* y, int B, int H, int W,
                             int Ci, int Co, int k, int stride) {
  check_conv_args(k, stride);
  const ConvGeom g = conv_geom(H, W, Ci, k, stride);
  if (B <= 0 || g.Ho <= 0 || g.Wo <= 0) return;
  if (k == 1 && stride == 1) {
    gemm(false, true, B * H * W, Co, Ci, 1.f, x, Ci, w, Ci, 0.f, y, Co);
  } else {
    const int Bc = conv_chunk(*this, g, B);
    for (int b0 = 0; b0 < B; b0 += Bc) {
      const int nb = std::min(Bc, B - b0);
      launch_im2col(*this, x + (size_t)b0 * H * W * Ci, ws_, nb, H, W, Ci, k, stride, g);
      gemm(false, true, nb * g.Ho * g.Wo, Co, g.K, 1.f, ws_, g.K, w, g.K, 0.f,
           y + (size_t)b0 * g.Ho * g.Wo * Co, Co);
    }
  }
  add_bias_rows(*this, y, bias, (size_t)B * g.Ho * g.Wo, Co);
}

void CudaBackend::conv2d_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                             int B, int H, int W, int Ci, int Co, int k, int stride) {
  check_conv_args(k, stride);
  const ConvGeom g = conv_geom(H, W, Ci, k, stride);
  if (B <= 0 || g.Ho <= 0 || g.Wo <= 0) return;
  const int rows = B * g.Ho * g.Wo;
  bias_grad(*this, dy, db, rows, Co);
  if (k == 1 && stride == 1) {
    if (dx) gemm(false, false, rows, Ci, Co, 1.f, dy, Co, w, Ci, 0.f, dx, Ci);
    if (dw) gemm(true, false, Co, Ci, rows, 1.f, dy, Co, x, Ci, 0.f, dw, Ci);
    return;
  }
  if (!dx && !dw) return;
  const int Bc = conv_chunk(*this, g, B);
  for (int b0 = 0; b0 < B; b0 += Bc) {
    const int nb = std::min(Bc, B - b0);
    const int Mc = nb * g.Ho * g.Wo;
    const float* dyc = dy + (size_t)b0 * g.Ho * g.Wo * Co;
    if (dw) {  // dw[Co, K] (+)= dy_c^T [Co, Mc] * col [Mc, K]
      launch_im2col(*this, x + (size_t)b0 * H * W * Ci, ws_, nb, H, W, Ci, k, stride, g);
      gemm(true, false, Co, g.K, Mc, 1.f, dyc, Co, ws_, g.K, b0 == 0 ? 0.f : 1.f, dw, g.K);
    }
    if (dx) {  // dcol [Mc, K] = dy_c [Mc, Co] * w [Co, K], then gather
      gemm(false, false, Mc, g.K, Co, 1.f, dyc, Co, w, g.K, 0.f, ws_, g.K);
      launch_col2im(*this, ws_, dx + (size_t)b0 * H * W * Ci, nb, H, W, Ci, k, stride, g);
    }
  }
}

}  // namespace unet
