// FLOPs and minimum bytes per op — the two axes of the roofline — and the counting op table.
//
// Conventions (stated in `unet profile --help` and the report):
//  * FLOPs are each op's flops() (op_defs.cpp): 2 per multiply-add for GEMM-shaped work,
//    including the taps of a 3x3 convolution that fall on zero padding, a few per element for
//    memory-bound ops;
//  * minimum bytes = every input tensor read once + every output written once, at its storage
//    size (bf16 tensors count 2 bytes an element); in-place tensors count twice. Fusion across
//    ops can go below this.
#pragma once
#include <functional>
#include <string>

#include "device.h"
#include "ops.h"

namespace unet::flops {

struct Cost {
  double flops = 0;
  double bytes = 0;
  Cost& operator+=(const Cost& o) {
    flops += o.flops;
    bytes += o.bytes;
    return *this;
  }
};
inline Cost operator+(Cost a, const Cost& b) { return a += b; }

template <class Op>
Cost cost(const Op& op) {
  Cost c;
  c.flops = op.flops();
  for_each_tensor(op, [&](const char*, const Tensor& t, Role r) {
    c.bytes += (double)t.bytes() * (r == Role::InOut ? 2 : 1);
  });
  return c;
}

// An op table that reports every op's name, chosen variant and cost to `sink` before forwarding
// it to `inner`. With op_ranges, every op is also wrapped in a device range named
// "<op>[<variant>]", so a profile resolves down to single ops.
class CountingOps final : public OpsAdapter<CountingOps> {
 public:
  using Sink = std::function<void(const char* op, const std::string& variant, const Cost& c)>;
  CountingOps(Ops& inner, Device& dev, Sink sink, bool op_ranges = false)
      : in_(inner), dev_(dev), sink_(std::move(sink)), op_ranges_(op_ranges) {}
  void set_counting(bool on) { counting_ = on; }

  template <class Op>
  void handle(const Op& op) {
    std::string v;
    if (op_ranges_ || (counting_ && sink_)) v = in_.variant(op);
    if (op_ranges_) dev_.range_push((std::string(Op::kName) + "[" + v + "]").c_str());
    if (counting_ && sink_) sink_(Op::kName, v, cost(op));
    in_.run(op);
    if (op_ranges_) dev_.range_pop();
  }
  template <class Op>
  size_t handle_prepare(const Op& op) {
    return in_.prepare(op);
  }
  template <class Op>
  std::string handle_variant(const Op& op) {
    return in_.variant(op);
  }
  void finalize() override { in_.finalize(); }
  void lane(bool side) override { in_.lane(side); }
  void join() override { in_.join(); }
  void aside(bool on) override { in_.aside(on); }
  void join_aside() override { in_.join_aside(); }
  void branch(bool on) override { in_.branch(on); }
  void join_branch() override { in_.join_branch(); }

 private:
  Ops& in_;
  Device& dev_;
  Sink sink_;
  bool op_ranges_;
  bool counting_ = true;
};

}  // namespace unet::flops
