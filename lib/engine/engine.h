// An engine: a Device and its op table, built for one precision.
//
// The precision is fixed when the engine is made (DESIGN: a build-wide policy, not flipped
// later): fp32 (IEEE on CUDA cores), tf32 (f32 tensors, tensor-core GEMMs) or bf16 (activations
// and GEMM inputs in bf16 with f32 accumulation; weights, gradients' reduction, optimizer state,
// GroupNorm statistics, softmax and losses stay f32). The CPU engine runs fp32 and emulates bf16's
// rounding points exactly (slow: for tests).
#pragma once
#include <memory>
#include <string>

#include "device.h"
#include "ops.h"

namespace unet {

class Engine {
 public:
  Engine(std::unique_ptr<Device> dev, std::unique_ptr<Ops> ops, Precision p);
  ~Engine();
  Device& device() { return *dev_; }
  // The op table in use: the engine's own, or a wrapper installed by set_ops (the profiler's
  // counter). Callers fetch it per call, so a wrapper takes effect at once.
  Ops& ops() { return *active_; }
  Ops& base_ops() { return *ops_; }
  void set_ops(Ops* wrapper) { active_ = wrapper ? wrapper : ops_.get(); }
  Precision precision() const { return prec_; }
  // Storage type of activations (and of conv/linear weights as the GEMMs read them).
  DType act_dtype() const { return prec_ == Precision::BF16 ? DType::BF16 : DType::F32; }
  bool is_cuda() const { return dev_->is_cuda(); }
  std::string name() const { return dev_->name() + ", " + precision_name(prec_); }

  // Convenience: allocate a tensor / copy to and from host vectors of floats.
  Tensor alloc(DType t, std::initializer_list<int64_t> dims);
  void upload(const Tensor& dst, const void* host);
  void download(void* host, const Tensor& src);

 private:
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Ops> ops_;
  Ops* active_;
  Precision prec_;
};

std::unique_ptr<Engine> make_cpu_engine(Precision p = Precision::FP32);
// nullptr (and why_not set) when no CUDA device is present or the build has no CUDA.
std::unique_ptr<Engine> make_cuda_engine(Precision p, std::string* why_not = nullptr);
bool cuda_available();
// GPUs visible to this process (0 without CUDA), and the one the next CUDA work uses (a rank of a
// data-parallel run picks its own before anything else touches CUDA). UserError when it fails.
int cuda_device_count();
void cuda_set_device(int index);
// The cuDNN the CUDA engine's convolutions load (loading it if nothing has yet): "cuDNN 9.14.0
// (/path/libcudnn.so.9)", or "no cuDNN (why)" (a build without CUDA too). unet profile prints
// it: which cuDNN a process found decides its convolutions' speed (docs/speed-log.md, 2026-11-29).
std::string cudnn_library();
// Tests: caps the shared memory a block may opt into below the GPU's own limit (0: no cap), as a
// GPU with less would allow (99 KB on consumer Ampere, Ada and Blackwell against Hopper's 227), so
// the variants whose blocks need more decline the ops they would otherwise take.
void cap_cuda_smem_optin(int bytes);

}  // namespace unet
