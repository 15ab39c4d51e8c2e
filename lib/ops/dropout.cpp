// CpuBackend dropout: the float instantiations of lib/ops/dropout.h.
#include "dropout.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::dropout_fwd(const float* x, float* y, size_t n, float p, uint64_t seed) {
  ref::dropout_fwd<float>(x, y, n, p, seed);
}
void CpuBackend::dropout_bwd(const float* dy, float* dx, size_t n, float p, uint64_t seed) {
  ref::dropout_bwd<float>(dy, dx, n, p, seed);
}

}  // namespace unet
