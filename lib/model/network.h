// What the guided-diffusion networks (the UNet, model.h, and the noisy-image classifier,
// classifier.h) share besides their blocks: the flat parameter arenas (f32 master weights, their
// bf16 copy in the bf16 engine, gradients) and planned activation memory — every buffer declared
// to a Planner, lifetimes traced from one pass, packed into one arena per mode.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine.h"
#include "params.h"

namespace unet {

class Planner;
struct Blocks;

// What a plan holds: Train = forward saves for backward, backward computes every parameter
// gradient; Sample = forward only; InputGrad = backward to the network's input only, no parameter
// gradients and no gradient arena (classifier guidance).
enum class Mode { Train, Sample, InputGrad };

class Network {
 public:
  virtual ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  Engine& engine() { return eng_; }
  const ParamTable& table() const { return table_; }
  // Flat f32 arenas [table().total] in engine memory, engine layout, offsets from table().
  Tensor params() const { return params_; }
  Tensor grads() const { return grads_; }  // absent until plan(B, Mode::Train)
  Tensor shadow() const { return shadow_; }  // the weights' bf16 copy (bf16 activations only)
  size_t arena_floats() const { return table_.total; }

  // Plans and allocates the buffers for batches up to B in mode m (once per network: a second
  // call must ask for no more than the first, in the same mode, Sample after any, or InputGrad
  // after Train). Throws UserError when the device lacks the memory, naming what is needed and
  // what is free.
  void plan(int B, Mode m);
  // The activation arena a plan(B, m) would need (bytes), from the same planning passes without
  // allocating or binding anything; every planned buffer scales with B, so plan_bytes(1) is the
  // memory per sample (`unet sample` picks its largest batch from it). Before plan() only; Sample
  // and InputGrad modes.
  size_t plan_bytes(int B, Mode m);
  int planned_batch() const { return planned_; }
  Mode mode() const { return mode_; }
  size_t activation_bytes() const { return arena_bytes_; }  // the planned arena
  std::string plan_report() const { return report_; }

  // Data-parallel training (lib/dist) and early optimizer updates: during backward(), at its lane
  // joins, the hook gets the lowest arena offset from which on every gradient is final (enqueued),
  // so their all-reduce or update can start while backward goes on. Offsets only decrease; the
  // last call passes 0. between_joins: the hook's work waits for both lanes (it issues it through
  // Ops::aside), so the backward may call it between its joins too (every few layers).
  void set_grad_ready_hook(std::function<void(size_t first_final)> hook, bool between_joins = false) {
    grad_ready_ = std::move(hook);
    ready_between_joins_ = between_joins;
  }

 protected:
  Network(Engine& eng, ParamTable table);
  // The same buffer declarations in both planner phases.
  virtual void declare(Planner& pl, int B, Mode m) = 0;
  // One pass of mode m at batch B through `tracer` on absent-data inputs (forward, and backward
  // unless Sample): the planner learns every buffer's lifetime from it.
  virtual void trace(Ops& tracer, int B, Mode m) = 0;
  // The blocks the network is built of (their `keep` choice), nullptr if none.
  virtual Blocks* blocks() { return nullptr; }
  // Trades speed for memory when a training plan does not fit (the blocks recompute what they
  // kept for backward); false when there is nothing left to trade.
  bool recompute_to_fit();
  // declare + trace + pack of one plan at batch B in mode m, nothing allocated.
  std::unique_ptr<Planner> plan_pass(int B, Mode m);

  Engine& eng_;
  ParamTable table_;
  Tensor params_, shadow_, grads_;
  int planned_ = 0;
  Mode mode_ = Mode::Sample;
  size_t arena_bytes_ = 0;
  std::string report_;
  std::function<void(size_t)> grad_ready_;
  bool ready_between_joins_ = false;
};

}  // namespace unet
