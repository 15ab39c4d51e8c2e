// CPU-only build: no CUDA engine.
#include "comm.h"
#include "engine.h"
#include "util.h"

namespace unet {
std::unique_ptr<Engine> make_cuda_engine(Precision, std::string* why_not) {
  if (why_not) *why_not = "this unet was built without CUDA";
  return nullptr;
}
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
void cap_cuda_smem_optin(int) {}  // (no CUDA variants: no block asks for shared memory)
std::string cudnn_library() { return "no cuDNN (this unet was built without CUDA)"; }
void cuda_set_device(int) { throw UserError("this unet was built without CUDA"); }
std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv&, std::unique_ptr<ControlPlane>, Engine&,
                                                     const CommOptions&) {
  throw UserError("this unet was built without CUDA: GPU ranks need NCCL");
}
}  // namespace unet
