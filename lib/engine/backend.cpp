#include "backend.h"

#include <stdexcept>

#include "util.h"

namespace unet {

void Backend::adamw_dev(float*, const float*, float*, float*, size_t, const float*, float, float, float,
                        const float*) {
  throw std::logic_error(name() + ": adamw_dev is only used with CUDA graphs");
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
