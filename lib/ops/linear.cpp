// CpuBackend linear layer: the float instantiation of lib/ops/linear.h.
#include "linear.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::linear_fwd(const float* x, const float* w, const float* b, float* y, int N, int I, int O) {
  ref::linear_fwd<float>(x, w, b, y, N, I, O);
}

void CpuBackend::linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                            int N, int I, int O) {
  ref::linear_bwd<float>(x, w, dy, dx, dw, db, N, I, O);
}

}  // namespace unet
