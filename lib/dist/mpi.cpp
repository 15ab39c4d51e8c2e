// MPI for CPU ranks, loaded at run time: the unet binary must also run where no MPI is installed
// (the GPU machines), so it never links libmpi. Open MPI's ABI: handles are addresses of its
// predefined objects (ompi_mpi_comm_world, ompi_mpi_float, ompi_mpi_op_sum), MPI_IN_PLACE is 1.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "comm.h"
#include "util.h"

namespace unet {

namespace {

using Handle = void*;
struct Mpi {
  void* lib = nullptr;
  int (*Initialized)(int*) = nullptr;
  int (*Init_thread)(int*, char***, int, int*) = nullptr;
  int (*Finalize)() = nullptr;
  int (*Comm_rank)(Handle, int*) = nullptr;
  int (*Comm_size)(Handle, int*) = nullptr;
  int (*Allreduce)(const void*, void*, int, Handle, Handle, Handle) = nullptr;
  int (*Bcast)(void*, int, Handle, int, Handle) = nullptr;
  Handle comm_world = nullptr, f32 = nullptr, chr = nullptr, sum = nullptr;
  std::string error;
  bool initialised = false;
};

Mpi& mpi() {
  static Mpi m;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* names[] = {"libmpi.so.40", "libmpi.so"};
    std::string tried;
    for (const char* n : names) {
      m.lib = dlopen(n, RTLD_NOW | RTLD_GLOBAL);  // Open MPI's plugins need its symbols global
      if (m.lib) break;
      tried += std::string(tried.empty() ? "" : ", ") + n;
    }
    if (!m.lib) {
      m.error = "Open MPI's library is not installed (looked for " + tried + "; Debian: openmpi-bin)";
      return;
    }
    auto sym = [&](const char* s) {
      void* p = dlsym(m.lib, s);
      if (!p && m.error.empty()) m.error = std::string("libmpi lacks ") + s + " (not Open MPI?)";
      return p;
    };
    m.Initialized = (int (*)(int*))sym("MPI_Initialized");
    m.Init_thread = (int (*)(int*, char***, int, int*))sym("MPI_Init_thread");
    m.Finalize = (int (*)())sym("MPI_Finalize");
    m.Comm_rank = (int (*)(Handle, int*))sym("MPI_Comm_rank");
    m.Comm_size = (int (*)(Handle, int*))sym("MPI_Comm_size");
    m.Allreduce = (int (*)(const void*, void*, int, Handle, Handle, Handle))sym("MPI_Allreduce");
    m.Bcast = (int (*)(void*, int, Handle, int, Handle))sym("MPI_Bcast");
    m.comm_world = sym("ompi_mpi_comm_world");
    m.f32 = sym("ompi_mpi_float");
    m.chr = sym("ompi_mpi_char");
    m.sum = sym("ompi_mpi_op_sum");
  });
  return m;
}

Mpi& mpi_init() {
  Mpi& m = mpi();
  if (!m.error.empty()) throw UserError("MPI: " + m.error);
  if (!m.initialised) {
    int done = 0;
    m.Initialized(&done);
    if (!done) {
      int provided = 0;
      if (m.Init_thread(nullptr, nullptr, /*MPI_THREAD_FUNNELED*/ 1, &provided) != 0)
        throw UserError("MPI_Init failed");
    }
    m.initialised = true;
  }
  return m;
}

constexpr int kChunk = INT_MAX / 4;

class MpiComm final : public Communicator {
 public:
  MpiComm(const DistEnv& e, std::unique_ptr<ControlPlane> cp, Engine& eng)
      : Communicator(e, std::move(cp)), eng_(eng), m_(mpi_init()) {
    int r = -1, n = -1;
    m_.Comm_rank(m_.comm_world, &r);
    m_.Comm_size(m_.comm_world, &n);
    if (r != e.rank || n != e.world)
      throw UserError("MPI says rank " + std::to_string(r) + " of " + std::to_string(n) +
                      " but the environment says rank " + std::to_string(e.rank) + " of " +
                      std::to_string(e.world));
  }
  std::string backend() const override { return "mpi"; }
  void all_reduce(const Tensor& t, ReduceOp op) override {
    if (t.dtype != DType::F32) throw std::logic_error("all_reduce: f32 tensors only");
    host_.resize(t.numel());
    eng_.download(host_.data(), t);
    auto w = waiting();
    for (size_t at = 0; at < host_.size(); at += kChunk) {
      const int n = (int)std::min<size_t>(kChunk, host_.size() - at);
      if (m_.Allreduce(reinterpret_cast<void*>(1) /*MPI_IN_PLACE*/, host_.data() + at, n, m_.f32, m_.sum,
                       m_.comm_world) != 0)
        cp_->fail("MPI_Allreduce failed; stopping");
    }
    if (op == ReduceOp::Mean) {
      const float s = (float)size();
      for (float& x : host_) x /= s;
    }
    eng_.upload(t, host_.data());
  }
  void broadcast(const Tensor& t, int root) override {
    std::string bytes(t.bytes(), '\0');
    eng_.device().download(bytes.data(), t.data, bytes.size());
    auto w = waiting();
    for (size_t at = 0; at < bytes.size(); at += kChunk) {
      const int n = (int)std::min<size_t>(kChunk, bytes.size() - at);
      if (m_.Bcast(bytes.data() + at, n, m_.chr, root, m_.comm_world) != 0)
        cp_->fail("MPI_Bcast failed; stopping");
    }
    eng_.device().upload(t.data, bytes.data(), bytes.size());
    eng_.device().sync();
  }

 private:
  Engine& eng_;
  Mpi& m_;
  std::vector<float> host_;
};

}  // namespace

bool mpi_available(std::string* why) {
  Mpi& m = mpi();
  if (why) *why = m.error;
  return m.error.empty();
}

void mpi_finalize() {
  Mpi& m = mpi();
  if (m.initialised) m.Finalize();
  m.initialised = false;
}

std::string mpi_root_hostname() {
  Mpi& m = mpi_init();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  m.Bcast(host, sizeof host, m.chr, 0, m.comm_world);
  host[sizeof host - 1] = 0;
  return host;
}

std::unique_ptr<Communicator> make_mpi_communicator(const DistEnv& e, std::unique_ptr<ControlPlane> cp,
                                                    Engine& eng) {
  return std::make_unique<MpiComm>(e, std::move(cp), eng);
}

}  // namespace unet
