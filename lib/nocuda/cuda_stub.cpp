// CPU-only build: no CUDA engine.
#include "backend.h"

namespace unet {
std::unique_ptr<Backend> make_cuda_backend(std::string* why_not) {
  if (why_not) *why_not = "this unet was built without CUDA";
  return nullptr;
}
bool cuda_available() { return false; }
}  // namespace unet
