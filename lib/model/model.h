// The guided-diffusion UNet, written once against the Backend op interface.
// Forward saves what backward needs in activation buffers planned once per batch size;
// backward is explicit, block by block in reverse order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arch.h"
#include "backend.h"
#include "config.h"
#include "params.h"

namespace unet {

class Model {
 public:
  Model(const ModelConfig& cfg, Backend& be);
  ~Model();
  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  const Arch& arch() const { return arch_; }
  Backend& backend() { return be_; }

  // Flat arenas in backend memory, engine layout, offsets from table().
  float* params() { return params_; }
  float* grads() { return grads_; }
  size_t arena_floats() const { return table_.total; }

  // Allocates activation memory for batches up to B (no-op if already planned for >= B).
  void plan(int B);
  int planned_batch() const { return planned_; }

  // x [B,H,W,Cin] NHWC in [-1,1]-ish, t [B] timesteps as floats, labels [B] int32 (required iff
  // class_cond, else ignored) -> out [B,H,W,Cout]. All pointers in backend memory.
  // train=true saves activations for backward and applies dropout (mask from dropout_seed).
  void forward(const float* x, const float* t, const int32_t* labels, float* out, int B, bool train,
               uint64_t dropout_seed = 0);
  // Gradient of the loss w.r.t. every parameter (overwrites grads()) from dout = dL/dout.
  // Must follow a forward(train=true) with the same B.
  void backward(const float* dout, int B);

  struct Impl;

 private:
  ModelConfig cfg_;
  Backend& be_;
  ParamTable table_;
  Arch arch_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  int planned_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace unet
