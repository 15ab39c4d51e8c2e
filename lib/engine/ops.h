// The op table: one `run` per op of UNET_OP_LIST, and the variant mechanism engines build it with.
//
//  * Ops is the interface the model, trainer and sampler call (ops.run(ConvFwd{...})). Wrappers
//    that treat every op alike (the planner's tracer, the profiler's counter) derive from
//    OpsAdapter and write one template `handle(const Op&)`.
//  * An engine's ops are VariantOps: per op, a list of Variants {name, supports, run, workspace}
//    in priority order. The chooser picks one per op signature (shapes, dtypes, integer
//    parameters) the first time it sees it — when memory is planned, via prepare() — and caches
//    the choice. UNET_KERNELS=family=variant[,...] (or --kernels) forces a variant, e.g.
//    UNET_KERNELS=conv=im2col; a forced variant that cannot run an op falls back, saying so once.
//  * Adding a variant is adding an entry to its family's list in its engine; the model does not
//    change.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "op_defs.h"

namespace unet {

class Ops {
 public:
  virtual ~Ops() = default;
#define UNET_X(Op)                                                                      \
  virtual void run(const Op& op) = 0;                                                   \
  /* plan time: choose the op's variant; returns its workspace bytes */                 \
  virtual size_t prepare(const Op& op) {                                                \
    (void)op;                                                                           \
    return 0;                                                                           \
  }                                                                                     \
  /* the name of the variant that runs (or would run) op */                             \
  virtual std::string variant(const Op& op) {                                           \
    (void)op;                                                                           \
    return "";                                                                          \
  }                                                                                     \
  /* every variant that can run op (tests run each) */                                  \
  virtual std::vector<std::string> variants_for(const Op& op) { return {variant(op)}; } \
  /* runs op with the named variant */                                                  \
  virtual void run_variant(const Op& op, const std::string& name) {                     \
    (void)name;                                                                         \
    run(op);                                                                            \
  }
  UNET_OP_LIST(UNET_X)
#undef UNET_X
  // After planning: allocate what prepare() asked for (the largest workspace). Never inside a step.
  virtual void finalize() {}
  // Lanes (concurrency inside a step). lane(true): the ops that follow run on the side lane, after
  // everything issued so far on the main lane; lane(false): back on the main lane, the ops that
  // follow may run concurrently with the side lane's; join(): what follows on the main lane waits
  // for everything issued on the side lane. The caller keeps the two lanes' ops independent (no
  // op on one reads or writes what the other writes); the planner keeps every buffer used between
  // the first lane(true) and the join live over that whole span. Engines without lanes (the CPU)
  // run everything in issue order.
  virtual void lane(bool side) { (void)side; }
  virtual void join() {}
  // The optimizer's lane: aside(true): the ops that follow run on a third stream, after
  // everything issued so far on the main lane and on the side lane (so between joins too) and
  // concurrently with both lanes' later ops, until aside(false);
  // join_aside(): what follows on the main lane waits for it (join() does not; the engine joins
  // it before the host reads or syncs). Only for ops that need nothing of a lane but its stream
  // (the optimizer's elementwise updates), issued from the main lane.
  virtual void aside(bool on) { (void)on; }
  virtual void join_aside() {}
  // A branch off the main lane: branch(true): the ops that follow run on a stream of their own
  // (a third lane with its own workspace), after everything issued so far on the main lane and
  // concurrently with both lanes' later ops, until branch(false); join_branch(): what follows on
  // the main lane waits for them (join() does not). For a short data path beside the main lane's
  // chain (a ResBlock's skip connection), issued from the main lane; the caller keeps it
  // independent of what the lanes do before the join_branch().
  virtual void branch(bool on) { (void)on; }
  virtual void join_branch() {}
  // Every op name and family this table knows -> the names of its variants (what UNET_KERNELS /
  // --kernels may force). Empty: not a variant table (a wrapper), nothing to check against.
  virtual std::map<std::string, std::vector<std::string>> variant_names() { return {}; }
};

// Every Ops override forwarded to D::handle(op) (and D::handle_prepare / D::handle_variant).
template <class D>
class OpsAdapter : public Ops {
 public:
#define UNET_X(Op)                                                                            \
  void run(const Op& op) override { static_cast<D*>(this)->handle(op); }                      \
  size_t prepare(const Op& op) override { return static_cast<D*>(this)->handle_prepare(op); } \
  std::string variant(const Op& op) override { return static_cast<D*>(this)->handle_variant(op); }
  UNET_OP_LIST(UNET_X)
#undef UNET_X
};

// ---- kernel variants ----------------------------------------------------------------------

template <class Op, class Ctx>
struct Variant {
  const char* name;
  bool (*supports)(const Op&, const Ctx&) = nullptr;  // nullptr: every op
  void (*run)(const Op&, Ctx&) = nullptr;
  size_t (*workspace)(const Op&, const Ctx&) = nullptr;  // nullptr: none
};

// UNET_KERNELS / --kernels: "conv=im2col,groupnorm_fwd=onepass" (family or op name = variant).
// set_kernel_overrides replaces the flag's entries (UNET_KERNELS stays underneath; "" = env only).
void set_kernel_overrides(const std::string& spec);  // throws UserError on a malformed spec
const std::map<std::string, std::string>& kernel_overrides();
// The override for an op (its name's entry, else its family's), as {key, variant}; nullptr if none.
inline const std::pair<const std::string, std::string>* kernel_override_for(const char* op, const char* family) {
  const auto& ov = kernel_overrides();
  auto f = ov.find(op);
  if (f == ov.end()) f = ov.find(family);
  return f == ov.end() ? nullptr : &*f;
}
// Refuses (UserError naming UNET_KERNELS or --kernels) an override whose family/op or variant the
// table does not have. The commands call it on the engine they made (DeviceFlags::make, profile):
// before any work, not at the first op it forces.
void check_kernel_overrides(Ops& ops);
// Prints (once per message) a line about a forced variant that could not be used.
void kernel_notice_once(const std::string& msg);

[[noreturn]] void throw_forced_missing(const std::string& key, const std::string& name,
                                       const std::string& names);
[[noreturn]] void throw_no_variant(const std::string& what);

// Ctx must provide: void need_workspace(size_t bytes) — at plan time, grows the workspace it
// will allocate in finalize(); at run time, checks (or grows, outside graph capture).
template <class Ctx>
class VariantOps : public Ops {
 public:
  explicit VariantOps(Ctx& ctx) : ctx_(ctx) {}

  template <class Op>
  std::vector<Variant<Op, Ctx>>& variants() {
    return table(Tag<Op>{}).list;
  }

  template <class Op>
  const Variant<Op, Ctx>& choose(const Op& op) {
    auto& t = table(Tag<Op>{});
    const uint64_t key = op_key(op);
    auto it = t.cache.find(key);
    if (it != t.cache.end()) return t.list[it->second];
    const int i = pick(t.list, op);
    t.cache.emplace(key, i);
    return t.list[i];
  }

#define UNET_X(Op)                                                       \
  void run(const Op& op) override {                                      \
    const auto& v = choose(op);                                          \
    if (v.workspace) ctx_.need_workspace(v.workspace(op, ctx_));         \
    v.run(op, ctx_);                                                     \
  }                                                                      \
  size_t prepare(const Op& op) override {                                \
    const auto& v = choose(op);                                          \
    const size_t ws = v.workspace ? v.workspace(op, ctx_) : 0;           \
    ctx_.need_workspace(ws);                                             \
    return ws;                                                           \
  }                                                                      \
  std::string variant(const Op& op) override { return choose(op).name; } \
  std::vector<std::string> variants_for(const Op& op) override {         \
    std::vector<std::string> r;                                          \
    for (const auto& v : variants<Op>())                                 \
      if (!v.supports || v.supports(op, ctx_)) r.push_back(v.name);      \
    return r;                                                            \
  }                                                                      \
  void run_variant(const Op& op, const std::string& name) override {     \
    for (const auto& v : variants<Op>())                                 \
      if (name == v.name) {                                              \
        if (v.workspace) ctx_.need_workspace(v.workspace(op, ctx_));     \
        return v.run(op, ctx_);                                          \
      }                                                                  \
    throw_no_variant(name + " for " + describe(op));                     \
  }
  UNET_OP_LIST(UNET_X)
#undef UNET_X

  std::map<std::string, std::vector<std::string>> variant_names() override {
    std::map<std::string, std::vector<std::string>> m;
    auto add = [&m](const char* key, const char* name) {
      auto& v = m[key];
      for (const std::string& n : v)
        if (n == name) return;
      v.push_back(name);
    };
#define UNET_X(Op)                          \
  (void)m[Op::kName], (void)m[Op::kFamily]; \
  for (const auto& v : variants<Op>()) {    \
    add(Op::kName, v.name);                 \
    add(Op::kFamily, v.name);               \
  }
    UNET_OP_LIST(UNET_X)
#undef UNET_X
    return m;
  }

 protected:
  Ctx& ctx_;

 private:
  template <class Op>
  struct Tag {};
  template <class Op>
  struct Table {
    std::vector<Variant<Op, Ctx>> list;
    std::unordered_map<uint64_t, int> cache;
  };
#define UNET_X(Op)     \
  Table<Op> t_##Op##_; \
  Table<Op>& table(Tag<Op>) { return t_##Op##_; }
  UNET_OP_LIST(UNET_X)
#undef UNET_X

  template <class Op>
  int pick(const std::vector<Variant<Op, Ctx>>& list, const Op& op) {
    auto ok = [&](int i) { return !list[i].supports || list[i].supports(op, ctx_); };
    if (const auto* f = kernel_override_for(Op::kName, Op::kFamily)) {
      int found = -1;
      std::string names;
      for (int i = 0; i < (int)list.size(); ++i) {
        names += (i ? ", " : "") + std::string(list[i].name);
        if (f->second == list[i].name) found = i;
      }
      if (found < 0) forced_missing(f->first, f->second, names);
      if (ok(found)) return found;
      kernel_notice_once("unet: kernel variant " + f->first + "=" + f->second + " cannot run " +
                         describe(op) + "; using the default there");
    }
    for (int i = 0; i < (int)list.size(); ++i)
      if (ok(i)) return i;
    no_variant(describe(op));
  }
  [[noreturn]] static void forced_missing(const std::string& key, const std::string& name,
                                          const std::string& names);
  [[noreturn]] static void no_variant(const std::string& what);
};

template <class Ctx>
void VariantOps<Ctx>::forced_missing(const std::string& key, const std::string& name,
                                     const std::string& names) {
  throw_forced_missing(key, name, names);
}
template <class Ctx>
void VariantOps<Ctx>::no_variant(const std::string& what) {
  throw_no_variant(what);
}

}  // namespace unet
