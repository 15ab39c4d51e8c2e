// Dropout variant "cuda": the mask of element i is a pure function of (seed, i) (lib/rng.h), the
// same on the CPU; backward applies the same mask and scale.
#include "cuda_engine.cuh"
#include "rng.h"

namespace unet {

namespace {

// keep iff u >= p, kept values times s = 1/(1-p).
template <class T>
struct DropoutF {
  const T* x;
  T* y;
  float p, s;
  uint64_t seed;
  __device__ float one(size_t i, float v) const {
    return uniform01(seed, Stream::Dropout, i) >= p ? v * s : 0.f;
  }
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float4 u = ld4(x, j);
    st4(y, j, make_float4(one(i, u.x), one(i + 1, u.y), one(i + 2, u.z), one(i + 3, u.w)));
  }
  __device__ void scalar(size_t i) const { stf(y, i, one(i, ldf(x, i))); }
};

void apply(const Tensor& x, const Tensor& y, float p, uint64_t seed, CudaCtx& ctx) {
  const float s = 1.0f / (1.0f - p);
  with_act(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(DropoutF<T>{dptr<T>(x), dptr<T>(y), p, s, seed}, x.numel(),
               vec4_ok<T>(x.data) && vec4_ok<T>(y.data), ctx.stream);
  });
}
void drop_fwd(const DropoutFwd& o, CudaCtx& ctx) { apply(o.x, o.y, o.p, o.seed, ctx); }
void drop_bwd(const DropoutBwd& o, CudaCtx& ctx) { apply(o.dy, o.dx, o.p, o.seed, ctx); }

}  // namespace

void register_dropout_cuda(CudaOps& ops) {
  ops.variants<DropoutFwd>().push_back({"cuda", nullptr, drop_fwd, nullptr});
  ops.variants<DropoutBwd>().push_back({"cuda", nullptr, drop_bwd, nullptr});
}

}  // namespace unet
