// Planned memory: every buffer of a mode (train at batch B, sample at batch B) packed into one
// arena by lifetime.
//
// How a model plans (Model::plan):
//  1. declare: it declares its buffers (name, dtype, shape). Each gets a placeholder address
//     (a non-canonical pointer that encodes the buffer's id; nothing may dereference it);
//  2. trace: it runs its forward (and backward) through tracer(), which executes nothing but
//     records, op by op, which buffers each op reads and writes — so lifetimes come from the
//     code that runs, not from hand-kept annotations — and asks the engine to choose each op's
//     kernel variant (and its workspace);
//  3. pack: buffers whose lifetimes [first write, last use] overlap get disjoint memory; the
//     others share (greedy by size, first fit, 256-byte alignment). verify() re-checks every
//     pair, and the tracer refuses a read of a buffer nothing wrote before;
//  4. bind: with the arena allocated, the model declares the same buffers again, in the same
//     order, and now receives real addresses.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops.h"

namespace unet {

class Planner {
 public:
  Planner();
  ~Planner();
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Phase 1 (placeholder addresses) before bind(), phase 4 (real ones) after.
  Tensor declare(const std::string& name, DType t, std::initializer_list<int64_t> dims);

  // Phase 2: an op table that records buffer uses and forwards prepare() to `engine_ops`.
  Ops& tracer(Ops& engine_ops);
  // Phase 3.
  void pack();
  size_t arena_bytes() const { return arena_; }
  size_t declared_bytes() const;  // sum of all buffer sizes (what no reuse would need)
  void verify() const;            // throws std::logic_error on an overlap of live buffers
  // Phase 4: declare() returns arena + offset from now on, checking the same sequence.
  void bind(void* arena);

  // A table of the largest buffers and the arena's use, for --verbose output and tests.
  std::string report(size_t top = 12) const;

  struct Buffer {
    std::string name;
    size_t bytes = 0;
    int first = -1, last = -1;  // op indices of the first write and the last use (-1: unused)
    size_t offset = 0;
  };
  const std::vector<Buffer>& buffers() const { return bufs_; }
  int ops_traced() const { return nops_; }

  // For the tracer: the buffer a placeholder address belongs to, or -1 (a real pointer).
  int buffer_of(const void* p) const;
  void use(int id, int op, bool write, const std::string& what);
  void next_op() { ++nops_; }
  // Lanes (Ops::lane/join): lane_side(true) / (false): the ops that follow are the side lane's /
  // the main lane's; lanes_joined(): at the join.
  void lane_side(bool side) { side_ = side; }
  void lanes_joined();
  // The branch (Ops::branch/join_branch), as the side lane.
  void lane_branch(bool on) { branch_ = on; }
  void branch_joined();

 private:
  std::vector<Buffer> bufs_;
  size_t arena_ = 0;
  char* base_ = nullptr;  // bound arena
  size_t bound_ = 0;      // declare() calls seen since bind()
  int nops_ = 0;
  bool side_ = false;         // the ops being traced are the side lane's
  std::vector<int> touched_;  // buffers the side lane's ops used since the last join
  bool branch_ = false;
  std::vector<int> branch_touched_;  // the branch's, since its last join
  void keep_live_to_now(std::vector<int>& ids);
  class Tracer;
  std::unique_ptr<Tracer> tracer_;
};

}  // namespace unet
