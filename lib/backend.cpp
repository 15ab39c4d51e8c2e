#include "backend.h"

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <vector>

#include "util.h"

namespace unet {

void Backend::adamw_dev(float*, const float*, float*, float*, size_t, const float*, float, float, float,
                        const float*) {
  throw std::logic_error(name() + ": adamw_dev is only used with CUDA graphs");
}

void* Backend::alloc_host(size_t bytes) {
  // Lives as long as the process: staging buffers are few and planned once.
  static std::vector<std::unique_ptr<char[]>> blocks;
  blocks.emplace_back(new char[bytes + 256]);
  char* p = blocks.back().get();
  return p + (256 - reinterpret_cast<uintptr_t>(p) % 256) % 256;
}

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::FP32;
  if (s == "tf32") return Precision::TF32;
  if (s == "bf16") return Precision::BF16;
  throw UserError("unknown precision '" + s + "' (fp32, tf32 or bf16)");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::TF32:
      return "tf32";
    case Precision::BF16:
      return "bf16";
  }
  return "?";
}

}  // namespace unet
