// The NCCL communicator of GPU ranks. libnccl.so.2 is loaded at run time (never linked): it ships
// with PyTorch's Python packages (nvidia-nccl-cu*) or the CUDA toolkit, so the binary carries no
// NCCL and still runs where it is absent, until a multi-GPU run asks for it.
//
// Collectives run on the engine's stream, so a step captured as a CUDA graph captures them too.
// Gradients are reduced in buckets: the model's backward says, layer by layer, from which arena
// offset on the gradients are final; once a bucket's worth is final, its all-reduce starts on a
// side stream (forked from the engine's stream by an event) while backward goes on; end_grads
// reduces the rest and joins the side stream back. Bucket boundaries depend on the model only,
// so every step (and every replay) reduces the same ranges in the same order: deterministic.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "comm.h"
#include "util.h"

namespace unet {

namespace {

// The few declarations of nccl.h used here (its ABI is stable since NCCL 2.0).
using ncclComm_t = struct ncclComm*;
struct ncclUniqueId {
  char internal[128];
};
using ncclResult_t = int;
constexpr ncclResult_t kSuccess = 0, kInProgress = 7;
constexpr int kFloat32 = 7, kUint8 = 1;
constexpr int kSum = 0, kAvg = 4;

struct Nccl {
  void* lib = nullptr;
  std::string path, error;
  int version = 0;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
};

// Where to look when UNET_NCCL_LIBRARY names no library.
std::vector<std::string> candidates() {
  std::vector<std::string> c;
  c.push_back("libnccl.so.2");  // LD_LIBRARY_PATH, the binary's run path, ldconfig
  for (const char* d : {"/usr/local/cuda/lib", "/usr/local/cuda/lib64",
                        "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"})
    c.push_back(std::string(d) + "/libnccl.so.2");
  // Python's NVIDIA wheels (nvidia-nccl-cu12/13), where PyTorch finds NCCL.
  for (const char* pat : {"/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                          "/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                          "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                          "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2"}) {
    glob_t g{};
    if (glob(pat, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) c.push_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return c;
}

// The python3 on PATH, asked where its nvidia.nccl package lives (last resort: slow).
std::string from_python() {
  FILE* p = popen(
      "python3 -c 'import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], \"lib\", "
      "\"libnccl.so.2\"))' 2>/dev/null",
      "r");
  if (!p) return "";
  char buf[4096] = {};
  const size_t k = fread(buf, 1, sizeof buf - 1, p);
  pclose(p);
  std::string s(buf, k);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

Nccl& nccl() {
  static Nccl n;
  static std::once_flag once;
  std::call_once(once, [] {
    const LoadedLibrary found = load_library("UNET_NCCL_LIBRARY", candidates());
    if (!found.error.empty()) {  // the library it names did not load: no other is tried
      n.error = found.error;
      return;
    }
    n.lib = found.handle, n.path = found.path;
    if (!n.lib) {
      const std::string py = from_python();
      if (!py.empty() && (n.lib = dlopen(py.c_str(), RTLD_NOW | RTLD_LOCAL))) n.path = py;
    }
    if (!n.lib) {
      n.error =
          "NCCL (libnccl.so.2) not found: looked in LD_LIBRARY_PATH, /usr/local/cuda/lib*, and python3's "
          "nvidia.nccl package (pip install nvidia-nccl-cu12); or set "
          "UNET_NCCL_LIBRARY=/path/to/libnccl.so.2";
      return;
    }
    auto sym = [&](const char* s) {
      void* p = dlsym(n.lib, s);
      if (!p && n.error.empty()) n.error = n.path + ": lacks " + s + " (not NCCL?)";
      return p;
    };
    n.GetVersion = (ncclResult_t(*)(int*))sym("ncclGetVersion");
    n.GetUniqueId = (ncclResult_t(*)(ncclUniqueId*))sym("ncclGetUniqueId");
    n.CommInitRank = (ncclResult_t(*)(ncclComm_t*, int, ncclUniqueId, int))sym("ncclCommInitRank");
    n.CommDestroy = (ncclResult_t(*)(ncclComm_t))sym("ncclCommDestroy");
    n.CommAbort = (ncclResult_t(*)(ncclComm_t))sym("ncclCommAbort");
    n.CommGetAsyncError = (ncclResult_t(*)(ncclComm_t, ncclResult_t*))sym("ncclCommGetAsyncError");
    n.GetErrorString = (const char* (*)(ncclResult_t))sym("ncclGetErrorString");
    n.AllReduce =
        (ncclResult_t(*)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t))sym("ncclAllReduce");
    n.Broadcast =
        (ncclResult_t(*)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t))sym("ncclBroadcast");
    if (!n.error.empty()) return;
    n.GetVersion(&n.version);
    if (n.version < 21000)
      n.error = n.path + " is NCCL " + std::to_string(n.version) + "; unet needs NCCL 2.10 or newer";
  });
  return n;
}

std::string version_text(int v) {
  // 2.10 and later: major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

class NcclComm final : public Communicator {
 public:
  NcclComm(const DistEnv& e, std::unique_ptr<ControlPlane> cp, Engine& eng, const CommOptions& o)
      : Communicator(e, std::move(cp)), api_(nccl()), dev_(eng.device()), bucket_floats_(o.bucket_bytes / 4) {
    if (!api_.error.empty()) throw UserError(api_.error);
    // NVLink SHARP (multicast) stays off: on shared hosts it can take the GPUs out of service.
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    stream_ = static_cast<cudaStream_t>(eng.device().native_stream());
    if (!stream_) throw std::logic_error("NcclComm: the engine has no CUDA stream");
    // The all-reduce's stream as urgent as the engine's main lane: its kernels wait for peers, so
    // any delay in scheduling them holds back every rank.
    int prio = 0;
    check(cudaStreamGetPriority(stream_, &prio), "cudaStreamGetPriority");
    check(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, prio), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming), "cudaEventCreate");
    // Bootstrap: rank 0's unique id travels over the control plane.
    ncclUniqueId id{};
    if (rank() == 0) nccl_check(api_.GetUniqueId(&id), "ncclGetUniqueId");
    const std::string s = cp_->broadcast(std::string(id.internal, sizeof id.internal));
    std::copy(s.begin(), s.end(), id.internal);
    {
      auto w = waiting();
      nccl_check(api_.CommInitRank(&comm_, size(), id, rank()), "ncclCommInitRank");
    }
    ncclComm_t c = comm_;
    Nccl* api = &api_;
    cp_->on_abort([api, c] { api->CommAbort(c); });
    const int r = rank();
    cp_->add_health_check([api, c, r]() -> std::string {
      ncclResult_t err = kSuccess;
      if (api->CommGetAsyncError(c, &err) != kSuccess || err == kSuccess || err == kInProgress) return "";
      return "NCCL error on rank " + std::to_string(r) + ": " + api->GetErrorString(err);
    });
  }
  ~NcclComm() override {
    if (comm_) {
      cudaStreamSynchronize(stream_);
      cudaStreamSynchronize(side_);
      api_.CommDestroy(comm_);
    }
    if (fork_) cudaEventDestroy(fork_);
    if (join_) cudaEventDestroy(join_);
    if (reduced_) cudaEventDestroy(reduced_);
    if (side_) cudaStreamDestroy(side_);
  }
  std::string backend() const override { return "nccl " + version_text(api_.version); }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    if (t.dtype != DType::F32) throw std::logic_error("all_reduce: f32 tensors only");
    nccl_check(api_.AllReduce(t.data, t.data, t.numel(), kFloat32, op == ReduceOp::Mean ? kAvg : kSum, comm_,
                              stream_),
               "ncclAllReduce");
  }
  void broadcast(const Tensor& t, int root) override {
    nccl_check(api_.Broadcast(t.data, t.data, t.bytes(), kUint8, root, comm_, stream_), "ncclBroadcast");
  }

  void begin_grads(const Tensor& grads) override {
    grads_ = grads;
    pending_end_ = grads.numel();
    forked_ = false;
  }
  void grads_ready(size_t first_final) override {
    // bucket_floats_ 0 (UNET_BUCKET_MB=0): no overlap, one all-reduce after backward.
    if (bucket_floats_ && first_final < pending_end_ && pending_end_ - first_final >= bucket_floats_) {
      bucket(first_final, pending_end_);
      pending_end_ = first_final;
    }
  }
  size_t reduced_from() const override { return forked_ ? pending_end_ : SIZE_MAX; }
  void wait_reduced() override {
    if (!forked_) return;
    check(cudaEventRecord(reduced_, side_), "cudaEventRecord");
    check(cudaStreamWaitEvent(current(), reduced_, 0), "cudaStreamWaitEvent");
  }
  void end_grads() override {
    if (pending_end_ > 0) bucket(0, pending_end_);
    pending_end_ = 0;
    if (forked_) {
      check(cudaEventRecord(join_, side_), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream_, join_, 0), "cudaStreamWaitEvent");
    }
  }

 private:
  void bucket(size_t lo, size_t hi) {
    // Everything the engine's current stream has done so far (the gradients of [lo, hi)) precedes
    // it: the main lane at a join, the optimizer's stream (after both lanes) between joins.
    check(cudaEventRecord(fork_, current()), "cudaEventRecord");
    check(cudaStreamWaitEvent(side_, fork_, 0), "cudaStreamWaitEvent");
    float* p = static_cast<float*>(grads_.data) + lo;
    nccl_check(api_.AllReduce(p, p, hi - lo, kFloat32, kAvg, comm_, side_), "ncclAllReduce");
    forked_ = true;
  }
  // The engine's current stream (a lane, or the optimizer's stream inside Ops::aside); the CUDA
  // device always has one (the constructor checked its main lane).
  cudaStream_t current() { return static_cast<cudaStream_t>(dev_.native_stream()); }
  void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
    }
  }
  void nccl_check(ncclResult_t r, const char* what) {
    if (r != kSuccess && r != kInProgress)
      cp_->fail(std::string(what) + " failed on rank " + std::to_string(rank()) + ": " +
                api_.GetErrorString(r) + "; stopping");
  }

  Nccl& api_;
  Device& dev_;
  size_t bucket_floats_;
  cudaStream_t stream_ = nullptr, side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr, reduced_ = nullptr;
  ncclComm_t comm_ = nullptr;
  size_t pending_end_ = 0;  // gradients [pending_end_, n) are reduced or in flight
  bool forked_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv& e, std::unique_ptr<ControlPlane> cp,
                                                     Engine& eng, const CommOptions& o) {
  return std::make_unique<NcclComm>(e, std::move(cp), eng, o);
}

}  // namespace unet
