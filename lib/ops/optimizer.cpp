// CpuBackend optimizer ops: the float instantiations of lib/ops/optimizer.h.
#include "optimizer.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::sum_squares(const float* x, float* out, size_t n) { ref::sum_squares<float>(x, out, n); }
void CpuBackend::adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                       float beta2, float eps, float wd, float bc1, float bc2, const float* grad_scale) {
  ref::adamw<float>(p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale);
}
void CpuBackend::clip_scale(const float* sumsq, float clip, float* norm, float* grad_scale) {
  ref::clip_scale<float>(sumsq, clip, norm, grad_scale);
}
void CpuBackend::ema(float* ema, const float* p, float rate, size_t n) { ref::ema<float>(ema, p, rate, n); }

}  // namespace unet
