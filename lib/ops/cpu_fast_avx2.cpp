// The fast CPU kernels compiled for AVX2 + FMA: see cpu_fast_impl.h.
#define UNET_FAST_AVX2 1
#define UNET_FAST_NAME "avx2"
#include "cpu_fast_impl.h"

namespace unet::cpufast {
extern const Kernels kAvx2Kernels;
const Kernels kAvx2Kernels = UNET_FAST_TABLE;
}  // namespace unet::cpufast
