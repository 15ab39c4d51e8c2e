// CPU-only build: no CUDA engine.
#include "engine.h"

namespace unet {
std::unique_ptr<Engine> make_cuda_engine(Precision, std::string* why_not) {
  if (why_not) *why_not = "this unet was built without CUDA";
  return nullptr;
}
bool cuda_available() { return false; }
}  // namespace unet
