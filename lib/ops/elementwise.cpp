// CpuBackend elementwise ops: the float instantiations of lib/ops/elementwise.h.
#include "elementwise.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::silu_fwd(const float* x, float* y, size_t n) { ref::silu_fwd<float>(x, y, n); }
void CpuBackend::silu_bwd(const float* x, const float* dy, float* dx, size_t n) {
  ref::silu_bwd<float>(x, dy, dx, n);
}
void CpuBackend::add(const float* a, const float* b, float* y, size_t n) { ref::add<float>(a, b, y, n); }
void CpuBackend::scale(float* x, float s, size_t n) { ref::scale<float>(x, s, n); }
void CpuBackend::add_bcast_fwd(float* h, const float* e, int B, int HW, int C) {
  ref::add_bcast_fwd<float>(h, e, B, HW, C);
}
void CpuBackend::add_bcast_bwd(const float* dh, float* de, int B, int HW, int C) {
  ref::add_bcast_bwd<float>(dh, de, B, HW, C);
}
void CpuBackend::scale_shift_fwd(const float* x, const float* ss, float* y, int B, int HW, int C) {
  ref::scale_shift_fwd<float>(x, ss, y, B, HW, C);
}
void CpuBackend::scale_shift_bwd(const float* x, const float* ss, const float* dy, float* dx, float* dss,
                                 int B, int HW, int C) {
  ref::scale_shift_bwd<float>(x, ss, dy, dx, dss, B, HW, C);
}

}  // namespace unet
