#include "cpu_backend.h"
namespace unet {
std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }
}
