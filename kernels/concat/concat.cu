// Concat variant "cuda": channel concat of two NHWC tensors (a first) and its split backward,
// f32 or bf16; pure data movement with vector accesses when both channel counts allow.
#include "cuda_engine.cuh"

namespace unet {

namespace {

// y [R, Ca+Cb] = a [R, Ca] ++ b [R, Cb]; vec4 needs Ca % 4 == 0 and Cb % 4 == 0.
template <class T>
struct ConcatF {
  const T* a;
  const T* b;
  T* y;
  int Ca, Cb;
  __device__ const T* src(size_t i) const {
    const int C = Ca + Cb;
    const size_t r = i / C;
    const int c = (int)(i % C);
    return c < Ca ? a + r * Ca + c : b + r * Cb + (c - Ca);
  }
  __device__ void vec4(size_t j) const { st4(y, j, ld4(src(4 * j), 0)); }
  __device__ void scalar(size_t i) const { y[i] = *src(i); }
};

template <class T>
struct SplitF {
  const T* dy;
  T* da;
  T* db;
  int Ca, Cb;
  __device__ T* dst(size_t i) const {  // nullptr when that part is not wanted
    const int C = Ca + Cb;
    const size_t r = i / C;
    const int c = (int)(i % C);
    if (c < Ca) return da ? da + r * Ca + c : nullptr;
    return db ? db + r * Cb + (c - Ca) : nullptr;
  }
  __device__ void vec4(size_t j) const {
    if (T* d = dst(4 * j)) st4(d, 0, ld4(dy, j));
  }
  __device__ void scalar(size_t i) const {
    if (T* d = dst(i)) *d = dy[i];
  }
};

void concat_fwd(const ConcatFwd& o, CudaCtx& ctx) {
  const int Ca = (int)o.a.last(), Cb = (int)o.b.last();
  with_act(o.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(
        ConcatF<T>{dptr<T>(o.a), dptr<T>(o.b), dptr<T>(o.y), Ca, Cb}, o.y.numel(),
        Ca % 4 == 0 && Cb % 4 == 0 && vec4_ok<T>(o.a.data) && vec4_ok<T>(o.b.data) && vec4_ok<T>(o.y.data),
        ctx.stream);
  });
}

void concat_bwd(const ConcatBwd& o, CudaCtx& ctx) {
  const int C = (int)o.dy.last();
  const int Ca = o.da.defined() ? (int)o.da.last() : C - (int)o.db.last(), Cb = C - Ca;
  with_act(o.dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(SplitF<T>{dptr<T>(o.dy), dptr<T>(o.da), dptr<T>(o.db), Ca, Cb}, o.dy.numel(),
               Ca % 4 == 0 && Cb % 4 == 0 && vec4_ok<T>(o.dy.data) &&
                   (!o.da.defined() || vec4_ok<T>(o.da.data)) && (!o.db.defined() || vec4_ok<T>(o.db.data)),
               ctx.stream);
  });
}

}  // namespace

void register_concat_cuda(CudaOps& ops) {
  ops.variants<ConcatFwd>().push_back({"cuda", nullptr, concat_fwd, nullptr});
  ops.variants<ConcatBwd>().push_back({"cuda", nullptr, concat_bwd, nullptr});
}

}  // namespace unet
