// The fast CPU kernels compiled for AVX-512 (F, DQ, VL, BW) + FMA: see cpu_fast_impl.h.
#define UNET_FAST_AVX512 1
#define UNET_FAST_NAME "avx512"
#include "cpu_fast_impl.h"

namespace unet::cpufast {
extern const Kernels kAvx512Kernels;
const Kernels kAvx512Kernels = UNET_FAST_TABLE;
}  // namespace unet::cpufast
