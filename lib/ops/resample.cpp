// CpuBackend up/downsampling: the float instantiations of lib/ops/resample.h.
#include "resample.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::upsample2x_fwd(const float* x, float* y, int B, int H, int W, int C) {
  ref::upsample2x_fwd<float>(x, y, B, H, W, C);
}
void CpuBackend::upsample2x_bwd(const float* dy, float* dx, int B, int H, int W, int C) {
  ref::upsample2x_bwd<float>(dy, dx, B, H, W, C);
}
void CpuBackend::avgpool2x2_fwd(const float* x, float* y, int B, int H, int W, int C) {
  ref::avgpool2x2_fwd<float>(x, y, B, H, W, C);
}
void CpuBackend::avgpool2x2_bwd(const float* dy, float* dx, int B, int H, int W, int C) {
  ref::avgpool2x2_bwd<float>(dy, dx, B, H, W, C);
}

}  // namespace unet
