// The guided-diffusion UNet, written on the op table (engine/ops.h) from the shared blocks
// (blocks.h) and the shared arenas and planned memory (network.h).
//
// Forward saves what backward needs; backward is explicit, layer by layer in reverse order. Every
// activation, scratch and gradient buffer is declared to a Planner and packed by lifetime into
// one arena per mode (plan()): sampling plans no gradient or saved-for-backward memory.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "arch.h"
#include "config.h"
#include "engine.h"
#include "network.h"
#include "params.h"

namespace unet {

class Model : public Network {
 public:
  // The UNet of cfg.
  Model(const ModelConfig& cfg, Engine& eng);
  // A network of one layer of the UNet (`unet profile --layer resblock|attention`): the same
  // layer code as the UNet, with the timestep embedding replaced by an input (emb_input()).
  Model(const ModelConfig& cfg, Engine& eng, const Layer& only);
  ~Model() override;

  const ModelConfig& config() const { return cfg_; }
  const Arch& arch() const { return arch_; }

  // x [B,H,W,Cin] f32, t [B] f32 (original timesteps), labels i32 [B] (absent unless
  // class-conditional) -> out [B,H,W,Cout] f32. train: save for backward, apply dropout.
  void forward(const Tensor& x, const Tensor& t, const Tensor& labels, const Tensor& out, bool train,
               uint64_t dropout_seed = 0);
  // Parameter gradients (overwrites grads()) from dout = dL/dout [B,H,W,Cout] f32; follows a
  // forward(train=true) of the same batch.
  void backward(const Tensor& dout);
  // While on, the weights are taken not to change between forwards (a sampler's steps): the bf16
  // copy the GEMMs read is made by the first forward only. Off (the default): every forward makes
  // it. Each call to turn it on starts afresh.
  void hold_weights(bool on);
  // Training whose optimizer writes that bf16 copy with each update (Optimizer::keep_shadow): a
  // forward makes it only when it is stale (the first after this call or after hold_weights), so a
  // captured training step holds no cast. Whoever changes the weights otherwise (uploads, copies)
  // calls refresh_weights() before the next step.
  void weights_kept_by_optimizer(bool on);
  // Makes the bf16 copy now, from the weights as they are (no-op with f32 activations).
  void refresh_weights();
  // Before plan(): whether the conv bias gradients come from the next layer's norm backward
  // (Blocks::link_bias; default with bf16 activations). Tests compare the two.
  void set_bias_from_next_norm(bool on);
  // Before plan(): whether a ResBlock's bias and embedding gradients come from its filter
  // gradients (Blocks::bias_in_filter; default where those run on "wgmma" in tf32). Tests compare.
  void set_bias_from_filter_grads(bool on);
  // How many layers the backward runs between joins of its two lanes (the filter gradients' side
  // lane waits for nothing until then); the grad-ready hook hears of gradients at the joins (and
  // every few layers between them where it asks to). Taken by the next plan(). kJoinLayers:
  // fastest on one GPU (H100, seed64), and with data parallelism (2 H200s).
  static constexpr int kJoinLayers = 28;
  void set_backward_joins(int layers);

  // Single-layer networks: x is the layer's input in the activation dtype, `out` is left absent
  // (the layer's output stays inside), backward's dout is in the activation dtype. The SiLU'd
  // embedding [B, 4 * num_channels] the layer reads (f32) is filled by the caller after plan().
  Tensor emb_input() const;

  struct Impl;

 protected:
  void declare(Planner& pl, int B, Mode m) override;
  void trace(Ops& tracer, int B, Mode m) override;
  Blocks* blocks() override;

 private:
  ModelConfig cfg_;
  Arch arch_;
  bool single_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace unet
