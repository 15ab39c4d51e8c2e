// Linear variant "cublas": x [N,I], w [O,I] (PyTorch layout), y [N,O]: y = x w^T + b; dx = dy w;
// dw = dy^T x (f32); db = column sums of dy. Also the bias epilogue / bias gradient the
// convolutions share. The linears of this model are tiny (N = batch); the bias pieces matter more.
#include "cuda_engine.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

template <class T>
struct BiasAdd {  // vec4 needs C % 4 == 0
  T* y;
  const float* bias;
  int C;
  __device__ void vec4(size_t j) const {
    const float4 b = *reinterpret_cast<const float4*>(bias + (int)((4 * j) % C));
    const float4 v = ld4(y, j);
    st4(y, j, make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w));
  }
  __device__ void scalar(size_t i) const { stf(y, i, ldf(y, i) + bias[(int)(i % C)]); }
};

template <class T>
struct DyCol {
  const T* dy;
  int C;
  __device__ float2 operator()(int, int r, int c) const {
    return make_float2(ldf(dy, (size_t)r * C + c), 0.f);
  }
};
struct WriteBias {
  float* db;
  __device__ void operator()(int, int c, double x, double) const { db[c] = (float)x; }
};

void linear_fwd(const LinearFwd& o, CudaCtx& ctx) {
  const int N = (int)o.x.dim[0], I = (int)o.x.dim[1], O = (int)o.w.dim[0];
  ctx.gemm(false, true, N, O, I, 1.f, {o.x.data, o.x.dtype, I}, {o.w.data, o.w.dtype, I}, 0.f,
           {o.y.data, o.y.dtype, O});
  add_bias_rows(ctx, o.y, o.b, (size_t)N, O);
}

void linear_bwd(const LinearBwd& o, CudaCtx& ctx) {
  const int N = (int)o.x.dim[0], I = (int)o.x.dim[1], O = (int)o.w.dim[0];
  const DType t = o.x.dtype;
  if (o.dx.defined())
    ctx.gemm(false, false, N, I, O, 1.f, {o.dy.data, t, O}, {o.w.data, t, I}, 0.f,
             {o.dx.data, o.dx.dtype, I});
  if (o.dw.defined())
    ctx.gemm(true, false, O, I, N, 1.f, {o.dy.data, t, O}, {o.x.data, t, I}, 0.f, {o.dw.data, DType::F32, I});
  bias_grad(ctx, o.dy, o.db, N, O);
}

// The group ops as one linear_fwd / linear_bwd per linear (dx summed by the GEMMs' beta, last
// linear first): the baseline "tiled" is tested and measured against.
void group_fwd(const LinearGroupFwd& o, CudaCtx& ctx) {
  for (int k = 0, n = o.count(); k < n; ++k) linear_fwd(LinearFwd{o.x, o.w[k], o.b[k], o.y[k]}, ctx);
}
void group_bwd(const LinearGroupBwd& o, CudaCtx& ctx) {
  const int N = (int)o.x.dim[0], I = (int)o.x.dim[1];
  if (o.dx.defined() && o.dx_in.defined() && o.dx_in.data != o.dx.data)
    CUDA_CHECK(cudaMemcpyAsync(o.dx.data, o.dx_in.data, o.dx.bytes(), cudaMemcpyDeviceToDevice, ctx.stream));
  bool first = !o.dx_in.defined();
  for (int k = o.count(); k-- > 0;) {
    const int O = (int)o.w[k].dim[0];
    if (o.dx.defined())
      ctx.gemm(false, false, N, I, O, 1.f, {o.dy[k].data, DType::F32, O}, {o.w[k].data, DType::F32, I},
               first ? 0.f : 1.f, {o.dx.data, DType::F32, I});
    first = false;
    linear_bwd(LinearBwd{o.x, o.w[k], o.dy[k], {}, o.dw[k], o.db[k]}, ctx);
  }
}

}  // namespace

void add_bias_rows(CudaCtx& ctx, const Tensor& y, const Tensor& bias, size_t rows, int C) {
  if (!bias.defined()) return;
  with_act(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(BiasAdd<T>{dptr<T>(y), dptr<float>(bias), C}, rows * C,
               C % 4 == 0 && vec4_ok<T>(y.data) && aligned16(bias.data), ctx.stream);
  });
}

void bias_grad(CudaCtx& ctx, const Tensor& dy, const Tensor& db, int rows, int C) {
  if (!db.defined()) return;
  with_act(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    colsum2(ctx, DyCol<T>{dptr<T>(dy), C}, WriteBias{dptr<float>(db)}, 1, rows, C);
  });
}

void register_linear_cuda(CudaOps& ops) {
  ops.variants<LinearFwd>().push_back({"cublas", nullptr, linear_fwd, nullptr});
  ops.variants<LinearBwd>().push_back({"cublas", nullptr, linear_bwd, nullptr});
  ops.variants<LinearGroupFwd>().push_back({"cublas", nullptr, group_fwd, nullptr});
  ops.variants<LinearGroupBwd>().push_back({"cublas", nullptr, group_bwd, nullptr});
}

}  // namespace unet
