// CPU engine, loss family: reference variant (lib/ops/loss.h in float).
#include "loss.h"

#include "cpu_engine.h"

namespace unet {
namespace {

void mse(const MseLoss& o) {
  ref::mse_fwd_bwd<float>(o.pred.f32(), o.target.f32(), o.loss.defined() ? o.loss.f32() : nullptr,
                          o.dpred.defined() ? o.dpred.f32() : nullptr, o.pred.numel());
}

void dloss(const DiffusionLoss& o) {
  const int B = (int)o.x0.dim[0], C = (int)o.x0.dim[3], Co = (int)o.out.dim[3];
  ref::diffusion_loss<float>(o.out.f32(), o.x0.f32(), o.xt.f32(), o.noise.f32(), o.coef.f32(), o.terms.f32(),
                             o.dout.defined() ? o.dout.f32() : nullptr, B, (size_t)o.x0.dim[1] * o.x0.dim[2],
                             C, Co, o.predict_xstart, o.use_kl, o.clip);
}
void stats(const LossStats& o) {
  ref::loss_stats<float>(o.terms.f32(), o.coef.f32(), o.stats.f32(), (int)o.terms.dim[0]);
}

}  // namespace

void register_loss_cpu(CpuOps& ops) {
  ops.variants<MseLoss>().push_back(cpu_ref<MseLoss, mse>());
  ops.variants<DiffusionLoss>().push_back(cpu_ref<DiffusionLoss, dloss>());
  ops.variants<LossStats>().push_back(cpu_ref<LossStats, stats>());
}

}  // namespace unet
