// CpuBackend MSE loss: the float instantiation of lib/ops/loss.h.
#include "loss.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::mse_fwd_bwd(const float* pred, const float* target, float* loss, float* dpred, size_t n) {
  ref::mse_fwd_bwd<float>(pred, target, loss, dpred, n);
}

}  // namespace unet
