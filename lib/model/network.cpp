#include "network.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "blocks.h"
#include "planner.h"
#include "util.h"

namespace unet {

namespace {
std::string gib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GB", b / 1e9);
  return s;
}
}  // namespace

Network::Network(Engine& eng, ParamTable table) : eng_(eng), table_(std::move(table)) {
  params_ = Tensor(eng_.device().alloc(table_.total * 4), DType::F32, {(int64_t)table_.total});
  if (eng_.act_dtype() == DType::BF16)
    shadow_ = Tensor(eng_.device().alloc(table_.total * 2), DType::BF16, {(int64_t)table_.total});
}

Network::~Network() = default;

size_t Network::plan_bytes(int B, Mode m) {
  if (B < 1) throw UserError("batch size must be >= 1, got " + std::to_string(B));
  if (planned_) throw std::logic_error("Network::plan_bytes: after plan()");
  if (m == Mode::Train) throw std::logic_error("Network::plan_bytes: training plans need the gradient arena");
  return plan_pass(B, m)->arena_bytes();
}

std::unique_ptr<Planner> Network::plan_pass(int B, Mode m) {
  auto pl = std::make_unique<Planner>();
  declare(*pl, B, m);
  trace(pl->tracer(eng_.ops()), B, m);
  pl->pack();
  return pl;
}

bool Network::recompute_to_fit() {
  Blocks* bk = blocks();
  if (!bk || !bk->keep) return false;
  bk->keep = false;
  return true;
}

void Network::plan(int B, Mode m) {
  if (B < 1) throw UserError("batch size must be >= 1, got " + std::to_string(B));
  if (planned_) {
    const bool covered = m == mode_ || m == Mode::Sample || (m == Mode::InputGrad && mode_ == Mode::Train);
    if (B <= planned_ && covered) return;
    throw std::logic_error("Network::plan: already planned for a smaller batch or another mode");
  }
  if (m == Mode::Train && !grads_.defined()) {
    // The gradient arena is planned memory too (its own allocation: the all-reduce of
    // several GPUs and the optimizer read it as one flat tensor).
    grads_ = Tensor(eng_.device().alloc(table_.total * 4), DType::F32, {(int64_t)table_.total});
  }
  const char* rc = std::getenv("UNET_RECOMPUTE");
  bool recomputed = m == Mode::Train && rc && *rc && std::string(rc) != "0" && recompute_to_fit();
  std::unique_ptr<Planner> pl = plan_pass(B, m);
  size_t need = pl->arena_bytes();
  const size_t free = eng_.device().bytes_free();
  if (need > free && m == Mode::Train && recompute_to_fit()) {  // the slower plan that needs less
    recomputed = true;
    pl = plan_pass(B, m);
    need = pl->arena_bytes();
  }
  if (need > free)
    throw UserError(std::string(m == Mode::Train ? "training" : "sampling") + " at batch size " +
                    std::to_string(B) + " needs " + gib(need + eng_.device().bytes_held()) + " of " +
                    (eng_.is_cuda() ? "GPU" : "host") + " memory, " + gib(free + eng_.device().bytes_held()) +
                    " available; use a smaller --batch-size");
  void* arena = eng_.device().alloc(need);
  pl->bind(arena);
  declare(*pl, B, m);
  eng_.ops().finalize();
  report_ = pl->report();
  if (recomputed) report_ += "backward recomputes the normalized activations (less memory, slower)\n";
  if (const Blocks* bk = blocks(); bk && bk->bias_links)
    report_ += std::to_string(bk->bias_links) + " conv bias gradients from the next layer's norm backward\n";
  if (const Blocks* bk = blocks(); bk && bk->filter_sums)
    report_ += std::to_string(bk->filter_sums) + " ResBlocks' bias gradients from their filter gradients\n";
  if (const Blocks* bk = blocks(); bk && bk->cat_norms)
    report_ += std::to_string(bk->cat_norms) +
               " skip concatenations written by the GroupNorm after them (UNET_CAT_NORM)\n";
  if (const Blocks* bk = blocks(); bk && bk->fused_norms)
    report_ += std::to_string(bk->fused_norms) +
               " ResBlock convs apply their GroupNorm + SiLU as they read (not stored; UNET_FUSE_NORM)\n";
  arena_bytes_ = need;
  planned_ = B;
  mode_ = m;
  if (m == Mode::Train) eng_.ops().run(Fill{grads_, 0.f});
}

}  // namespace unet
