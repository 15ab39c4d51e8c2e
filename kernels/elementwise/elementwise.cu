// Elementwise variant "cuda": SiLU, add, cast, copy, fill. Memory-bound, one pass, vector
// accesses whenever the pointers allow; f32 or bf16 storage, f32 arithmetic.
#include <cstring>

#include "cuda_engine.cuh"

namespace unet {

namespace {

template <class TX, class TY>
struct SiluFwdF {
  const TX* x;
  TY* y;
  __device__ void vec4(size_t j) const {
    const float4 v = ld4(x, j);
    st4(y, j, make_float4(siluf_(v.x), siluf_(v.y), siluf_(v.z), siluf_(v.w)));
  }
  __device__ void scalar(size_t i) const { stf(y, i, siluf_(ldf(x, i))); }
};

template <class T>
struct SiluBwdF {
  const T* x;
  const T* dy;
  T* dx;
  __device__ void vec4(size_t j) const {
    const float4 v = ld4(x, j), g = ld4(dy, j);
    st4(dx, j,
        make_float4(g.x * silu_gradf_(v.x), g.y * silu_gradf_(v.y), g.z * silu_gradf_(v.z),
                    g.w * silu_gradf_(v.w)));
  }
  __device__ void scalar(size_t i) const { stf(dx, i, ldf(dy, i) * silu_gradf_(ldf(x, i))); }
};

template <class T>
struct AddF {
  const T* a;
  const T* b;
  T* y;
  __device__ void vec4(size_t j) const {
    const float4 u = ld4(a, j), v = ld4(b, j);
    st4(y, j, make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w));
  }
  __device__ void scalar(size_t i) const { stf(y, i, ldf(a, i) + ldf(b, i)); }
};

template <class TX, class TY>
struct CastF {
  const TX* x;
  TY* y;
  __device__ void vec4(size_t j) const { st4(y, j, ld4(x, j)); }
  __device__ void scalar(size_t i) const { stf(y, i, ldf(x, i)); }
};

template <class T>
__global__ void fill_kernel(T* x, T v, size_t n) {
  pdl_entry();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = v;
}

void silu_fwd(const SiluFwd& o, CudaCtx& ctx) {
  with_act(o.x.dtype, [&](auto tx) {
    using TX = decltype(tx);
    with_act(o.y.dtype, [&](auto ty) {
      using TY = decltype(ty);
      launch_map(SiluFwdF<TX, TY>{dptr<TX>(o.x), dptr<TY>(o.y)}, o.x.numel(),
                 vec4_ok<TX>(o.x.data) && vec4_ok<TY>(o.y.data), ctx.stream);
    });
  });
}
void silu_bwd(const SiluBwd& o, CudaCtx& ctx) {
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(SiluBwdF<T>{dptr<T>(o.x), dptr<T>(o.dy), dptr<T>(o.dx)}, o.x.numel(),
               vec4_ok<T>(o.x.data) && vec4_ok<T>(o.dy.data) && vec4_ok<T>(o.dx.data), ctx.stream);
  });
}
bool silu_bwd_ok(const SiluBwd& o, const CudaCtx&) {
  return o.dy.dtype == o.x.dtype && o.dx.dtype == o.x.dtype;
}

void add(const Add& o, CudaCtx& ctx) {
  with_act(o.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(AddF<T>{dptr<T>(o.a), dptr<T>(o.b), dptr<T>(o.y)}, o.y.numel(),
               vec4_ok<T>(o.a.data) && vec4_ok<T>(o.b.data) && vec4_ok<T>(o.y.data), ctx.stream);
  });
}

void cast(const Cast& o, CudaCtx& ctx) {
  with_act(o.x.dtype, [&](auto tx) {
    using TX = decltype(tx);
    with_act(o.y.dtype, [&](auto ty) {
      using TY = decltype(ty);
      launch_map(CastF<TX, TY>{dptr<TX>(o.x), dptr<TY>(o.y)}, o.x.numel(),
                 vec4_ok<TX>(o.x.data) && vec4_ok<TY>(o.y.data), ctx.stream);
    });
  });
}

void copy(const Copy& o, CudaCtx& ctx) {
  if (o.x.data == o.y.data || !o.x.bytes()) return;
  CUDA_CHECK(cudaMemcpyAsync(o.y.data, o.x.data, o.x.bytes(), cudaMemcpyDeviceToDevice, ctx.stream));
}

void fill(const Fill& o, CudaCtx& ctx) {
  const size_t n = o.y.numel();
  if (!n) return;
  uint32_t bits;
  std::memcpy(&bits, &o.value, 4);
  if (bits == 0) {  // +0.0 is all-zero bytes in every dtype
    CUDA_CHECK(cudaMemsetAsync(o.y.data, 0, o.y.bytes(), ctx.stream));
    return;
  }
  if (o.y.dtype == DType::BF16)
    fill_kernel<bf16>
        <<<grid_for(n), kThreads, 0, ctx.stream>>>(dptr<bf16>(o.y), __float2bfloat16_rn(o.value), n);
  else if (o.y.dtype == DType::I32)
    fill_kernel<int32_t><<<grid_for(n), kThreads, 0, ctx.stream>>>(dptr<int32_t>(o.y), (int32_t)o.value, n);
  else
    fill_kernel<float><<<grid_for(n), kThreads, 0, ctx.stream>>>(dptr<float>(o.y), o.value, n);
  KERNEL_CHECK();
}

}  // namespace

void register_elementwise_cuda(CudaOps& ops) {
  ops.variants<SiluFwd>().push_back({"cuda", nullptr, silu_fwd, nullptr});
  ops.variants<SiluBwd>().push_back({"cuda", silu_bwd_ok, silu_bwd, nullptr});
  ops.variants<Add>().push_back({"cuda", nullptr, add, nullptr});
  ops.variants<Cast>().push_back({"cuda", nullptr, cast, nullptr});
  ops.variants<Copy>().push_back({"cuda", nullptr, copy, nullptr});
  ops.variants<Fill>().push_back({"cuda", nullptr, fill, nullptr});
}

}  // namespace unet
