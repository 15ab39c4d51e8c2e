// Loss variant "cuda": the MSE and its gradient in one pass, the sum in double in a fixed order.
#include "cuda_engine.cuh"
#include "reduce.cuh"

namespace unet {

namespace {

// Sum over items of (pred-target)^2 in double, writing dpred = k (pred - target) on the way.
// Items 0..n4-1 are float4 groups, the rest single trailing elements.
struct MseItem {
  const float* pred;
  const float* target;
  float* dpred;
  float k;
  size_t n4;
  __device__ double one(size_t i) const {
    const float p = pred[i], t = target[i];
    if (dpred) dpred[i] = k * (p - t);
    const double d = (double)p - (double)t;
    return d * d;
  }
  __device__ double operator()(size_t it) const {
    if (it >= n4) return one(4 * n4 + (it - n4));
    const float4 p = ld4(pred, it), t = ld4(target, it);
    if (dpred)
      st4(dpred, it, make_float4(k * (p.x - t.x), k * (p.y - t.y), k * (p.z - t.z), k * (p.w - t.w)));
    const double a = (double)p.x - t.x, b = (double)p.y - t.y, c = (double)p.z - t.z, d = (double)p.w - t.w;
    return a * a + b * b + c * c + d * d;
  }
};

struct MseGrad {  // dpred only (no loss requested)
  const float* pred;
  const float* target;
  float* dpred;
  float k;
  __device__ void vec4(size_t j) const {
    const float4 p = ld4(pred, j), t = ld4(target, j);
    st4(dpred, j, make_float4(k * (p.x - t.x), k * (p.y - t.y), k * (p.z - t.z), k * (p.w - t.w)));
  }
  __device__ void scalar(size_t i) const { dpred[i] = k * (pred[i] - target[i]); }
};

void mse(const MseLoss& o, CudaCtx& ctx) {
  const size_t n = o.pred.numel();
  if (!n) return;
  const float k = 2.0f / (float)n;
  float* dpred = dptr<float>(o.dpred);
  const bool vec = aligned16(o.pred.data) && aligned16(o.target.data) && (!dpred || aligned16(dpred));
  if (o.loss.defined()) {
    const size_t n4 = vec ? n / 4 : 0;
    full_sum(ctx, MseItem{dptr<float>(o.pred), dptr<float>(o.target), dpred, k, n4}, n4 + (n - 4 * n4),
             1.0 / (double)n, dptr<float>(o.loss));
  } else if (dpred) {
    launch_map(MseGrad{dptr<float>(o.pred), dptr<float>(o.target), dpred, k}, n, vec, ctx.stream);
  }
}

}  // namespace

void register_diffusion_loss_cuda(CudaOps& ops);  // diffusion_loss.cu

void register_loss_cuda(CudaOps& ops) {
  ops.variants<MseLoss>().push_back({"cuda", nullptr, mse, nullptr});
  register_diffusion_loss_cuda(ops);
}

}  // namespace unet
