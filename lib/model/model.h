// The guided-diffusion UNet, written once against the op table (engine/ops.h).
//
// Forward saves what backward needs; backward is explicit, layer by layer in reverse order. Every
// activation, scratch and gradient buffer is declared to a Planner and packed by lifetime into
// one arena per mode (plan()): sampling plans no gradient or saved-for-backward memory.
//
// Precision follows the engine: activations (and the GEMMs' weights, a bf16 copy of the master
// weights refreshed at each forward) in the engine's activation dtype; the timestep-embedding MLP,
// the embedding projections, GroupNorm statistics, biases and every gradient of a parameter in f32.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "arch.h"
#include "config.h"
#include "engine.h"
#include "params.h"

namespace unet {

enum class Mode { Train, Sample };

class Model {
 public:
  // The UNet of cfg.
  Model(const ModelConfig& cfg, Engine& eng);
  // A network of one layer of the UNet (`unet profile --layer resblock|attention`): the same
  // layer code as the UNet, with the timestep embedding replaced by an input (emb_input()).
  Model(const ModelConfig& cfg, Engine& eng, const Layer& only);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  const Arch& arch() const { return arch_; }
  Engine& engine() { return eng_; }

  // Flat f32 arenas [table().total] in engine memory, engine layout, offsets from table().
  Tensor params() const { return params_; }
  Tensor grads() const { return grads_; }  // absent until plan(B, Mode::Train)
  size_t arena_floats() const { return table_.total; }

  // Plans and allocates the buffers for batches up to B in mode m (once per Model: a second
  // call must ask for no more than the first, in the same mode or Sample after Train). Throws
  // UserError when the device lacks the memory, naming what is needed and what is free.
  void plan(int B, Mode m);
  int planned_batch() const { return planned_; }
  Mode mode() const { return mode_; }
  size_t activation_bytes() const;  // the planned arena
  std::string plan_report() const;

  // x [B,H,W,Cin] f32, t [B] f32 (original timesteps), labels i32 [B] (absent unless
  // class-conditional) -> out [B,H,W,Cout] f32. train: save for backward, apply dropout.
  void forward(const Tensor& x, const Tensor& t, const Tensor& labels, const Tensor& out, bool train,
               uint64_t dropout_seed = 0);
  // Parameter gradients (overwrites grads()) from dout = dL/dout [B,H,W,Cout] f32; follows a
  // forward(train=true) of the same batch.
  void backward(const Tensor& dout);
  // Data-parallel training (lib/dist): during backward(), after each layer, the hook gets the
  // lowest arena offset from which on every gradient is final (enqueued), so their all-reduce can
  // start while backward goes on. Offsets only decrease; the last call passes 0.
  void set_grad_ready_hook(std::function<void(size_t first_final)> hook);

  // Single-layer networks: x is the layer's input in the activation dtype, `out` is left absent
  // (the layer's output stays inside), backward's dout is in the activation dtype. The SiLU'd
  // embedding [B, 4 * num_channels] the layer reads (f32) is filled by the caller after plan().
  Tensor emb_input() const;

  struct Impl;

 private:
  ModelConfig cfg_;
  Engine& eng_;
  ParamTable table_;
  Arch arch_;
  bool single_ = false;
  Tensor params_, shadow_, grads_;
  int planned_ = 0;
  Mode mode_ = Mode::Sample;
  size_t arena_bytes_ = 0;
  std::string report_;
  std::unique_ptr<Impl> impl_;
  std::function<void(size_t)> grad_ready_;
};

}  // namespace unet
