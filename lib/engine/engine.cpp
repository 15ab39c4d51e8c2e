// Engine plumbing shared by both engines, the CPU device, and the kernel-variant overrides.
#include "engine.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <set>

#include "cpu_engine.h"
#include "profile_hooks.h"
#include "util.h"

namespace unet {

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::FP32;
  if (s == "tf32") return Precision::TF32;
  if (s == "bf16") return Precision::BF16;
  throw UserError("unknown precision '" + s + "' (fp32, tf32 or bf16)");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::TF32:
      return "tf32";
    case Precision::BF16:
      return "bf16";
  }
  return "?";
}

void Device::range_push(const char* name) {
  if (RangeListener* l = range_listener()) l->push(name);
}
void Device::range_pop() {
  if (RangeListener* l = range_listener()) l->pop();
}

Engine::Engine(std::unique_ptr<Device> dev, std::unique_ptr<Ops> ops, Precision p)
    : dev_(std::move(dev)), ops_(std::move(ops)), active_(ops_.get()), prec_(p) {}

Engine::~Engine() {
  // Work in flight may still read memory the device owns; the device goes last.
  if (dev_) dev_->sync();
  ops_.reset();
}

Tensor Engine::alloc(DType t, std::initializer_list<int64_t> dims) {
  Tensor x(nullptr, t, dims);
  x.data = dev_->alloc(x.bytes());
  return x;
}
void Engine::upload(const Tensor& dst, const void* host) { dev_->upload(dst.data, host, dst.bytes()); }
void Engine::download(void* host, const Tensor& src) { dev_->download(host, src.data, src.bytes()); }

// ---- kernel overrides ----------------------------------------------------------------------

namespace {
std::map<std::string, std::string>& overrides() {
  static std::map<std::string, std::string> m;
  return m;
}
// Where each override came from ("UNET_KERNELS" or "--kernels"), for messages.
std::map<std::string, std::string>& override_source() {
  static std::map<std::string, std::string> m;
  return m;
}
std::once_flag env_once;
void parse_into(const std::string& spec, std::map<std::string, std::string>& m, const char* what) {
  size_t i = 0;
  while (i <= spec.size()) {
    size_t j = spec.find(',', i);
    if (j == std::string::npos) j = spec.size();
    std::string item = spec.substr(i, j - i);
    if (!item.empty()) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
        throw UserError(std::string(what) + ": '" + item + "' is not family=variant (e.g. conv=im2col)");
      m[item.substr(0, eq)] = item.substr(eq + 1);
      override_source()[item.substr(0, eq)] = what;
    }
    i = j + 1;
  }
}
}  // namespace

// The overrides in force: UNET_KERNELS, then the flag's entries on top (the flag wins).
void set_kernel_overrides(const std::string& spec) {
  std::map<std::string, std::string> m;
  parse_into(spec, m, "--kernels");
  kernel_overrides();  // the environment's, parsed once
  static std::map<std::string, std::string> env = overrides();
  std::map<std::string, std::string> all = env;
  for (auto& kv : m) all[kv.first] = kv.second;
  overrides() = all;
}

const std::map<std::string, std::string>& kernel_overrides() {
  std::call_once(env_once, [] {
    if (const char* e = std::getenv("UNET_KERNELS")) parse_into(e, overrides(), "UNET_KERNELS");
  });
  return overrides();
}

void check_kernel_overrides(Ops& ops) {
  const auto& ov = kernel_overrides();
  if (ov.empty()) return;
  const std::map<std::string, std::vector<std::string>> names = ops.variant_names();
  if (names.empty()) return;  // not a variant table
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  for (const auto& [key, variant] : ov) {
    const auto src = override_source().find(key);
    const std::string what = src != override_source().end() ? src->second : "UNET_KERNELS";
    const auto it = names.find(key);
    if (it == names.end()) {
      std::set<std::string> fam;
#define UNET_X(Op) fam.insert(Op::kFamily);
      UNET_OP_LIST(UNET_X)
#undef UNET_X
      const std::vector<std::string> families(fam.begin(), fam.end());
      throw UserError(what + ": no kernel family or op '" + key + "' (families: " + join(families) + ")");
    }
    bool found = false;
    for (const std::string& n : it->second) found |= n == variant;
    if (!found)
      throw UserError(what + ": kernel variant " + key + "=" + variant + " does not exist (" + key +
                      " has: " + join(it->second) + ")");
  }
}

void kernel_notice_once(const std::string& msg) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(msg).second) std::fprintf(stderr, "%s\n", msg.c_str());
}

void throw_forced_missing(const std::string& key, const std::string& name, const std::string& names) {
  throw UserError("kernel variant " + key + "=" + name + " does not exist (" + key + " has: " + names + ")");
}

void throw_no_variant(const std::string& what) {
  throw std::logic_error("no kernel variant supports " + what);
}

// ---- the CPU engine --------------------------------------------------------------------------

namespace {

class CpuDevice final : public Device {
 public:
  bool is_cuda() const override { return false; }
  std::string name() const override { return "cpu"; }
  void* alloc(size_t bytes) override {
    const size_t rounded = (bytes + 255) / 256 * 256 + (bytes == 0 ? 256 : 0);
    void* p = std::aligned_alloc(256, rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);  // touch it now: failures surface here, not mid-step
    blocks_.emplace_back(p);
    bytes_ += rounded;
    return p;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void sync() override {}
  size_t bytes_held() const override { return bytes_; }
  size_t bytes_free() const override {
    // What this process can still allocate: MemAvailable, the cgroup limit, ulimit -v / -d.
    const uint64_t avail = available_memory();
    return avail ? (size_t)avail : SIZE_MAX / 4;
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<void, Free>> blocks_;
  size_t bytes_ = 0;
};

// The context is a base declared before CpuOps, so it exists before CpuOps keeps a reference.
struct CpuCtxHolder {
  CpuCtx ctx;
};

class CpuEngineOps final : private CpuCtxHolder, public CpuOps {
 public:
  explicit CpuEngineOps(Precision p) : CpuCtxHolder{CpuCtx{p}}, CpuOps(CpuCtxHolder::ctx) {
    register_conv_cpu(*this);
    register_linear_cpu(*this);
    register_groupnorm_cpu(*this);
    register_elementwise_cpu(*this);
    register_resample_cpu(*this);
    register_concat_cpu(*this);
    register_embedding_cpu(*this);
    register_attention_cpu(*this);
    register_pool_cpu(*this);
    register_dropout_cpu(*this);
    register_loss_cpu(*this);
    register_diffusion_cpu(*this);
    register_optimizer_cpu(*this);
  }
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(Precision p) {
  // tf32 has no meaning on the CPU: it computes in fp32.
  if (p == Precision::TF32) p = Precision::FP32;
  return std::make_unique<Engine>(std::make_unique<CpuDevice>(), std::make_unique<CpuEngineOps>(p), p);
}

}  // namespace unet
