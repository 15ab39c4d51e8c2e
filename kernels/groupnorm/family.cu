// The groupnorm family's CUDA variants in priority order.
#include "cuda_engine.cuh"

namespace unet {

void register_groupnorm_cuda(CudaOps& ops) {
  register_groupnorm_fused(ops);
  register_groupnorm_vec(ops);
  register_groupnorm_threepass(ops);
}

}  // namespace unet
