// CPU engine, loss family: reference variant (lib/ops/loss.h in float).
#include "loss.h"

#include "cpu_engine.h"

namespace unet {
namespace {

void mse(const MseLoss& o) {
  ref::mse_fwd_bwd<float>(o.pred.f32(), o.target.f32(), o.loss.defined() ? o.loss.f32() : nullptr,
                          o.dpred.defined() ? o.dpred.f32() : nullptr, o.pred.numel());
}

}  // namespace

void register_loss_cpu(CpuOps& ops) { ops.variants<MseLoss>().push_back(cpu_ref<MseLoss, mse>()); }

}  // namespace unet
