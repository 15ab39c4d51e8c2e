// The device side of an engine: memory, the stream's ordering (fences), CUDA graphs and profiler
// ranges. The op table is the other half (ops.h); an Engine (engine.h) holds one of each.
//
//  * Memory is planned: alloc() is called when a model, optimizer or sampler is set up, never
//    inside a step, and is freed with the device. Pointers are 256-byte aligned.
//  * Work is asynchronous on CUDA (one stream); upload() of pinned memory (alloc_host) is too,
//    so callers fence() before reusing the host buffer; download() and sync() block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace unet {

enum class Precision { FP32, TF32, BF16 };
Precision parse_precision(const std::string& s);  // throws UserError
const char* precision_name(Precision p);

class Device {
 public:
  virtual ~Device() = default;
  virtual bool is_cuda() const = 0;
  virtual std::string name() const = 0;  // "cpu" or "cuda (NVIDIA H100 ...)"

  virtual void* alloc(size_t bytes) = 0;
  // Host memory for staging uploads (pinned on CUDA), owned by the device.
  virtual void* alloc_host(size_t bytes) { return alloc(bytes); }
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;  // blocks
  virtual void sync() = 0;
  virtual size_t bytes_held() const = 0;  // everything allocated: planned memory + fixed workspaces
  // Bytes that could still be allocated (CUDA: free device memory; CPU: available host memory).
  virtual size_t bytes_free() const = 0;

  // fence() marks the point after all work enqueued so far; fence_wait(id) blocks until the
  // device has passed it. CPU: work is synchronous, both are no-ops.
  virtual uint64_t fence() { return 0; }
  virtual void fence_wait(uint64_t id) { (void)id; }
  // Milliseconds the device took from fence a to fence b, both passed (CUDA events); -1 where it
  // cannot say (the CPU, a fence not yet passed or too old to be held).
  virtual double fence_ms(uint64_t a, uint64_t b) {
    (void)a, (void)b;
    return -1.0;
  }

  // CUDA graphs: work issued between graph_begin() and graph_end() is recorded (not run) and
  // replayed by graph_launch(). Nothing inside may synchronise the host or allocate.
  // Programmatic dependent launch in a captured graph (a kernel launched while the one before it
  // drains): into every unet kernel with a kernel as its one predecessor (All), only into those no
  // other kernel can run beside (Alone), or none. The caller's choice is the default; UNET_PDL=1
  // makes it All, 0 Off.
  enum class GraphPdl { Off, Alone, All };
  virtual bool supports_graphs() const { return false; }
  virtual void graph_begin() {}
  virtual void graph_end(GraphPdl pdl = GraphPdl::Off) { (void)pdl; }
  virtual void graph_launch() {}
  // Waits for the stream and destroys the captured graph. Before a communicator whose collectives
  // were captured is destroyed: NCCL holds resources for the graph until it is gone.
  virtual void graph_drop() {}
  virtual bool capturing() const { return false; }
  // The native stream the work runs on (cudaStream_t on CUDA; nullptr on the CPU), for the
  // communicator (lib/dist), which enqueues its collectives in the same order.
  virtual void* native_stream() { return nullptr; }

  // Named regions (layers) for NVTX and the profiler: the default tells the profiler's listener
  // (profile_hooks.h), when one is installed.
  virtual void range_push(const char* name);
  virtual void range_pop();
};

// The training step's graph: programmatic launch only into the kernels nothing runs beside, in
// tf32 (H200, seed64: 11.03 -> 10.97 ms; bf16 7.01 -> 7.03, so off; into every kernel the second
// lane's kernels slowed: tf32 10.9 -> 12.2 ms). The network's forward alone (sampling) takes All.
inline Device::GraphPdl step_graph_pdl(Precision p) {
  return p == Precision::TF32 ? Device::GraphPdl::Alone : Device::GraphPdl::Off;
}

// A profiler range for the lifetime of the object.
class ScopedRange {
 public:
  ScopedRange(Device& d, const char* name) : d_(d) { d_.range_push(name); }
  ~ScopedRange() { d_.range_pop(); }
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  Device& d_;
};

}  // namespace unet
