// Linear layers on cuBLAS, plus the bias epilogue / bias gradient the convolutions share.
// x [N,I], w [O,I] (PyTorch layout), y [N,O]:  y = x w^T + b;  dx = dy w;  dw = dy^T x;
// db = column sums of dy. The linears of this model are tiny (N = batch); the cost that matters
// is in the convolutions that reuse add_bias_rows / bias_grad.
#include "cuda_backend.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

struct BiasAdd {  // vec4 needs C % 4 == 0
  float* y;
  const float* bias;
  int C;
  __device__ void vec4(size_t j) const {
    const float4 b = *reinterpret_cast<const float4*>(bias + (int)((4 * j) % C));
    float4 v = ld4(y, j);
    st4(y, j, make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w));
  }
  __device__ void scalar(size_t i) const { y[i] += bias[(int)(i % C)]; }
};

struct DyCol {
  const float* dy;
  int C;
  __device__ float2 operator()(int, int r, int c) const { return make_float2(dy[(size_t)r * C + c], 0.f); }
};

struct WriteBias {
  float* db;
  __device__ void operator()(int, int c, double x, double) const { db[c] = (float)x; }
};

}  // namespace

void add_bias_rows(CudaBackend& be, float* y, const float* bias, size_t rows, int C) {
  if (!bias) return;
  launch_map(BiasAdd{y, bias, C}, rows * C, C % 4 == 0 && aligned16(y) && aligned16(bias), be.stream());
}

void bias_grad(CudaBackend& be, const float* dy, float* db, int rows, int C) {
  if (!db) return;
  colsum2(be, DyCol{dy, C}, WriteBias{db}, 1, rows, C);
}

void CudaBackend::linear_fwd(const float* x, const float* w, const float* b, float* y, int N, int I, int O) {
  gemm(false, true, N, O, I, 1.f, x, I, w, I, 0.f, y, O);
  add_bias_rows(*this, y, b, (size_t)N, O);
}

void CudaBackend::linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                             int N, int I, int O) {
  if (dx) gemm(false, false, N, I, O, 1.f, dy, O, w, I, 0.f, dx, I);
  if (dw) gemm(true, false, O, I, N, 1.f, dy, O, x, I, 0.f, dw, I);
  bias_grad(*this, dy, db, N, O);
}

}  // namespace unet
