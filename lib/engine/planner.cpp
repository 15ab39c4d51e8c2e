#include "planner.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace unet {

namespace {
// Placeholder address of byte `off` of buffer `id`: bits 48..63 hold id + 1. User-space pointers
// on x86-64 and AArch64 stay below 2^48, so a real pointer never decodes as a buffer.
constexpr int kShift = 48;
constexpr uintptr_t kOffMask = (uintptr_t(1) << kShift) - 1;
constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

class Planner::Tracer final : public OpsAdapter<Planner::Tracer> {
 public:
  Tracer(Planner& p, Ops& inner) : p_(p), inner_(inner) {}
  template <class Op>
  void handle(const Op& op) {
    op.check();
    inner_.prepare(op);
    const int k = p_.nops_;
    // Reads first: an op that reads and writes one buffer (in place) must find it written.
    for_each_tensor(op, [&](const char* n, const Tensor& t, Role r) {
      if (r == Role::Out) return;
      const int id = p_.buffer_of(t.data);
      if (id >= 0) p_.use(id, k, false, std::string(Op::kName) + " " + n);
    });
    for_each_tensor(op, [&](const char* n, const Tensor& t, Role r) {
      if (r == Role::In) return;
      const int id = p_.buffer_of(t.data);
      if (id >= 0) p_.use(id, k, true, std::string(Op::kName) + " " + n);
    });
    p_.next_op();
  }
  // The engine sees the lanes too (a side lane plans its own workspace).
  void lane(bool side) override {
    p_.lane_side(side);
    inner_.lane(side);
  }
  void join() override {
    p_.lanes_joined();
    inner_.join();
  }
  void aside(bool on) override { inner_.aside(on); }
  void join_aside() override { inner_.join_aside(); }
  void branch(bool on) override {
    p_.lane_branch(on);
    inner_.branch(on);
  }
  void join_branch() override {
    p_.branch_joined();
    inner_.join_branch();
  }
  template <class Op>
  size_t handle_prepare(const Op& op) {
    return inner_.prepare(op);
  }
  template <class Op>
  std::string handle_variant(const Op& op) {
    return inner_.variant(op);
  }

 private:
  Planner& p_;
  Ops& inner_;
};

Planner::Planner() = default;
Planner::~Planner() = default;

Tensor Planner::declare(const std::string& name, DType t, std::initializer_list<int64_t> dims) {
  Tensor shape(nullptr, t, dims);
  const size_t bytes = shape.bytes();
  if (!base_) {
    const int id = (int)bufs_.size();
    if (id >= (1 << 15)) throw std::logic_error("Planner: too many buffers");
    Buffer b;
    b.name = name;
    b.bytes = bytes;
    bufs_.push_back(b);
    shape.data = reinterpret_cast<void*>((uintptr_t)(id + 1) << kShift);
    return shape;
  }
  if (bound_ >= bufs_.size() || bufs_[bound_].name != name || bufs_[bound_].bytes != bytes)
    throw std::logic_error("Planner::declare after bind: buffer " + name +
                           " differs from the planned sequence");
  shape.data = base_ + bufs_[bound_++].offset;
  return shape;
}

int Planner::buffer_of(const void* p) const {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  const uintptr_t hi = u >> kShift;
  if (hi == 0 || hi > bufs_.size()) return -1;
  const int id = (int)hi - 1;
  if ((u & kOffMask) >= std::max<size_t>(bufs_[id].bytes, 1)) return -1;
  return id;
}

void Planner::use(int id, int op, bool write, const std::string& what) {
  Buffer& b = bufs_[id];
  if (b.first < 0) {
    if (!write)
      throw std::logic_error("memory plan: " + what + " reads buffer " + b.name +
                             " before anything writes it");
    b.first = op;
  }
  b.last = std::max(b.last, op);
  if (side_) touched_.push_back(id);
  if (branch_) branch_touched_.push_back(id);
}

// A side-lane op runs after every main-lane op issued before it (lane(true) forks there) and
// before every one issued after the join, but in no fixed order against the main lane's ops in
// between: every buffer a side op uses stays live from its first use to the join, so nothing the
// main lane uses after that op shares its memory. Buffers only the main lane uses keep their own
// lifetimes (its ops run in order). (Before, every buffer used in the span was live over all of
// it; deferring joins over several layers then cost 0.3-0.8 GB on seed64 at batch 32.)
void Planner::lanes_joined() {
  keep_live_to_now(touched_);
  side_ = false;
}

// The branch's ops likewise: their buffers stay live to the join_branch().
void Planner::branch_joined() {
  keep_live_to_now(branch_touched_);
  branch_ = false;
}

// The buffers in `ids` live until the last op traced so far; `ids` emptied.
void Planner::keep_live_to_now(std::vector<int>& ids) {
  for (int id : ids) bufs_[id].last = std::max(bufs_[id].last, nops_ - 1);
  ids.clear();
}

Ops& Planner::tracer(Ops& engine_ops) {
  tracer_ = std::make_unique<Tracer>(*this, engine_ops);
  return *tracer_;
}

void Planner::pack() {
  lanes_joined();  // a trace that ended before a join
  branch_joined();
  std::vector<int> order;
  for (int i = 0; i < (int)bufs_.size(); ++i)
    if (bufs_[i].first >= 0 && bufs_[i].bytes) order.push_back(i);
  // Largest first (ties: earlier first, so the result does not depend on sort stability).
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    if (bufs_[a].bytes != bufs_[b].bytes) return bufs_[a].bytes > bufs_[b].bytes;
    return a < b;
  });
  std::vector<int> placed;
  arena_ = 0;
  for (int i : order) {
    Buffer& b = bufs_[i];
    const size_t need = align_up(b.bytes);
    // Ranges taken by placed buffers whose lifetimes overlap b's, by offset.
    std::vector<std::pair<size_t, size_t>> busy;
    for (int j : placed) {
      const Buffer& o = bufs_[j];
      if (o.first <= b.last && b.first <= o.last) busy.push_back({o.offset, o.offset + align_up(o.bytes)});
    }
    std::sort(busy.begin(), busy.end());
    size_t off = 0;
    for (auto& r : busy) {
      if (r.first >= off + need) break;  // fits in the gap before r
      off = std::max(off, r.second);
    }
    b.offset = off;
    arena_ = std::max(arena_, off + need);
    placed.push_back(i);
  }
  for (auto& b : bufs_)
    if (b.first < 0) b.offset = 0;  // never used: any valid address will do
  verify();
}

size_t Planner::declared_bytes() const {
  size_t s = 0;
  for (auto& b : bufs_) s += align_up(b.bytes);
  return s;
}

void Planner::verify() const {
  for (size_t i = 0; i < bufs_.size(); ++i) {
    const Buffer& a = bufs_[i];
    if (a.first < 0 || !a.bytes) continue;
    if (a.offset + a.bytes > arena_) throw std::logic_error("memory plan: " + a.name + " exceeds the arena");
    for (size_t j = i + 1; j < bufs_.size(); ++j) {
      const Buffer& b = bufs_[j];
      if (b.first < 0 || !b.bytes) continue;
      const bool live = a.first <= b.last && b.first <= a.last;
      const bool mem = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
      if (live && mem)
        throw std::logic_error("memory plan: live buffers " + a.name + " and " + b.name + " overlap");
    }
  }
}

void Planner::bind(void* arena) {
  base_ = static_cast<char*>(arena);
  bound_ = 0;
  tracer_.reset();
}

std::string Planner::report(size_t top) const {
  std::vector<const Buffer*> v;
  for (auto& b : bufs_) v.push_back(&b);
  std::sort(v.begin(), v.end(), [](const Buffer* a, const Buffer* b) { return a->bytes > b->bytes; });
  char line[256];
  std::snprintf(line, sizeof line, "arena %.1f MiB for %zu buffers (%.1f MiB without reuse), %d ops\n",
                arena_ / 1048576.0, bufs_.size(), declared_bytes() / 1048576.0, nops_);
  std::string s = line;
  for (size_t i = 0; i < v.size() && i < top; ++i) {
    std::snprintf(line, sizeof line, "  %-44s %9.2f MiB  ops %5d..%-5d at %.1f MiB\n", v[i]->name.c_str(),
                  v[i]->bytes / 1048576.0, v[i]->first, v[i]->last, v[i]->offset / 1048576.0);
    s += line;
  }
  return s;
}

}  // namespace unet
