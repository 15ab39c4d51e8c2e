// Placeholder: the CUDA engine (class CudaBackend) is being written.
#include <cuda_runtime.h>

#include "backend.h"

namespace unet {
bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
std::unique_ptr<Backend> make_cuda_backend(std::string* why_not) {
  if (why_not) *why_not = cuda_available() ? "the CUDA engine is not built yet" : "no CUDA device found";
  return nullptr;
}
}  // namespace unet
