// CpuBackend channel concat: the float instantiations of lib/ops/concat.h.
#include "concat.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::concat_fwd(const float* a, const float* b, float* y, int B, int HW, int Ca, int Cb) {
  ref::concat_fwd<float>(a, b, y, B, HW, Ca, Cb);
}
void CpuBackend::concat_bwd(const float* dy, float* da, float* db, int B, int HW, int Ca, int Cb) {
  ref::concat_bwd<float>(dy, da, db, B, HW, Ca, Cb);
}

}  // namespace unet
