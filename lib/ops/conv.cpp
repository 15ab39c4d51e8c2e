// CpuBackend convolution: the float instantiation of lib/ops/conv.h.
#include "conv.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::conv2d_fwd(const float* x, const float* w, const float* bias, float* y, int B, int H, int W,
                            int Ci, int Co, int k, int stride) {
  ref::conv2d_fwd<float>(x, w, bias, y, B, H, W, Ci, Co, k, stride);
}

void CpuBackend::conv2d_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                            int B, int H, int W, int Ci, int Co, int k, int stride) {
  ref::conv2d_bwd<float>(x, w, dy, dx, dw, db, B, H, W, Ci, Co, k, stride);
}

}  // namespace unet
