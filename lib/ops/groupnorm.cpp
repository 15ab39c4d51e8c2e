// CpuBackend GroupNorm (+ fused SiLU): the float instantiation of lib/ops/groupnorm.h.
#include "groupnorm.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::groupnorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                               float* rstd, int B, int HW, int C, int G, bool silu) {
  ref::groupnorm_fwd<float>(x, gamma, beta, y, mean, rstd, B, HW, C, G, silu);
}

void CpuBackend::groupnorm_bwd(const float* x, const float* gamma, const float* beta, const float* mean,
                               const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta,
                               int B, int HW, int C, int G, bool silu) {
  ref::groupnorm_bwd<float>(x, gamma, beta, mean, rstd, dy, dx, dgamma, dbeta, B, HW, C, G, silu);
}

}  // namespace unet
