// CpuBackend timestep and label embeddings: the float instantiations of lib/ops/embedding.h.
#include "embedding.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::timestep_embedding(const float* t, float* y, int B, int dim) {
  ref::timestep_embedding<float>(t, y, B, dim);
}
void CpuBackend::embedding_add_fwd(const int32_t* labels, const float* table, float* y, int B, int D) {
  ref::embedding_add_fwd<float>(labels, table, y, B, D);
}
void CpuBackend::embedding_bwd(const int32_t* labels, const float* dy, float* dtable, int B, int K, int D) {
  ref::embedding_bwd<float>(labels, dy, dtable, B, K, D);
}

}  // namespace unet
