#include "comm.h"

#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "env_vars.h"
#include "util.h"

namespace unet {

Communicator::~Communicator() = default;

std::vector<std::string> Communicator::all_gather(const std::string& mine) {
  if (!cp_) return {mine};
  return cp_->all_gather(mine);
}

std::string Communicator::broadcast_host(const std::string& on_root) {
  return cp_ ? cp_->broadcast(on_root) : on_root;
}

void Communicator::barrier() {
  if (cp_) cp_->barrier();
}

bool Communicator::any(bool flag) { return cp_ ? cp_->any(flag) : flag; }

void Communicator::set_progress(int64_t step) {
  if (cp_) cp_->set_progress(step);
}

void Communicator::finish() {
  if (cp_) cp_->finish();
  mpi_finalize();
}

namespace {

class SingleComm final : public Communicator {
 public:
  explicit SingleComm(const DistEnv& e) : Communicator(e, nullptr) {}
  std::string backend() const override { return "single"; }
  void all_reduce(const Tensor&, ReduceOp) override {}
  void broadcast(const Tensor&, int) override {}
  void end_grads() override {}
};

// CPU ranks without MPI: the control plane's all-reduce (rank 0 adds in rank order).
class TcpComm final : public Communicator {
 public:
  TcpComm(const DistEnv& e, std::unique_ptr<ControlPlane> cp, Engine& eng)
      : Communicator(e, std::move(cp)), eng_(eng) {}
  std::string backend() const override { return "tcp"; }
  void all_reduce(const Tensor& t, ReduceOp op) override {
    if (t.dtype != DType::F32) throw std::logic_error("all_reduce: f32 tensors only");
    host_.resize(t.numel());
    eng_.download(host_.data(), t);
    cp_->all_reduce(host_.data(), host_.size(), op == ReduceOp::Mean);
    eng_.upload(t, host_.data());
  }
  void broadcast(const Tensor& t, int root) override {
    if (root != 0) throw std::logic_error("broadcast: from rank 0 only");
    std::string bytes(t.bytes(), '\0');
    if (rank() == 0) eng_.device().download(bytes.data(), t.data, bytes.size());
    bytes = cp_->broadcast(bytes);
    if (rank() != 0) eng_.device().upload(t.data, bytes.data(), bytes.size());
    eng_.device().sync();
  }

 private:
  Engine& eng_;
  std::vector<float> host_;
};

}  // namespace

std::unique_ptr<ControlPlane> connect_control_plane(DistEnv& e, double timeout_s) {
  if (!e.distributed()) return nullptr;
  if (e.master_addr.empty()) {
    // mpirun over several nodes without MASTER_ADDR: rank 0's host comes through MPI.
    std::string why;
    if (!mpi_available(&why))
      throw UserError("MASTER_ADDR is not set and MPI cannot tell rank 0's host (" + why +
                      "); run mpirun -x MASTER_ADDR=<host of rank 0>");
    e.master_addr = mpi_root_hostname();
  }
  return std::make_unique<ControlPlane>(e, timeout_s, command_token());
}

std::unique_ptr<Communicator> make_communicator(const DistEnv& e, std::unique_ptr<ControlPlane> cp,
                                                Engine& eng, const CommOptions& o) {
  if (!e.distributed()) return std::make_unique<SingleComm>(e);
  if (!cp) throw std::logic_error("make_communicator: a multi-rank run needs its control plane");
  if (eng.is_cuda()) return make_nccl_communicator(e, std::move(cp), eng, o);
  const std::string want = env_cpu_comm();  // "", tcp or mpi
  if (want == "mpi" || (want.empty() && e.launcher == "mpirun")) {
    std::string why;
    if (mpi_available(&why)) return make_mpi_communicator(e, std::move(cp), eng);
    if (want == "mpi") throw UserError("UNET_CPU_COMM=mpi: " + why);
  }
  return std::make_unique<TcpComm>(e, std::move(cp), eng);
}

}  // namespace unet
