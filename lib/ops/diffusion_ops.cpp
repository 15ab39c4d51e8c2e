// CpuBackend diffusion helpers: the float instantiations of lib/ops/diffusion_ops.h.
#include "diffusion_ops.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::q_sample(const float* x0, const float* noise, const float* sqrt_ab, const float* sqrt_1mab,
                          float* xt, int B, size_t n_per) {
  ref::q_sample<float>(x0, noise, sqrt_ab, sqrt_1mab, xt, B, n_per);
}
void CpuBackend::axpbypcz(float a, const float* x, float b, float* y, float c, const float* z, size_t n) {
  ref::axpbypcz<float>(a, x, b, y, c, z, n);
}
void CpuBackend::clamp(float* x, float lo, float hi, size_t n) { ref::clamp<float>(x, lo, hi, n); }

}  // namespace unet
