// Collectives of a data-parallel run, outside the op table (DESIGN): they work on the flat
// gradient arena and a few small tensors. One interface, four implementations:
//
//   single  one process: every operation is a no-op
//   nccl    CUDA ranks: libnccl.so.2 loaded at run time (kernels/device/nccl_comm.cpp), on the
//           engine's stream and captured in the step's CUDA graph; gradients reduced in buckets
//           on a side stream while backward still runs
//   mpi     CPU ranks started by mpirun: Open MPI's libmpi loaded at run time (mpi.cpp)
//   tcp     CPU ranks started otherwise: rank 0 adds the ranks' arrays in rank order (control.h)
//
// Every multi-rank communicator owns the control plane (control.h): the host collectives, the
// watchdog that stops all ranks when one dies or hangs, and the stop-at-the-same-step consensus.
// Reductions are deterministic: the same inputs give the same bits on every run and every rank.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "control.h"
#include "engine.h"
#include "launch.h"

namespace unet {

enum class ReduceOp { Sum, Mean };

struct CommOptions {
  double timeout_s = 60;                   // --dist-timeout
  size_t bucket_bytes = size_t(25) << 20;  // gradient bucket (NCCL); UNET_BUCKET_MB overrides, 0 = no overlap
};

class Communicator {
 public:
  virtual ~Communicator();
  int rank() const { return env_.rank; }
  int size() const { return env_.world; }
  bool root() const { return env_.rank == 0; }
  const DistEnv& env() const { return env_; }
  virtual std::string backend() const = 0;  // "single", "nccl 2.21.5", "mpi", "tcp"

  // ---- device tensors (f32, in place), in the engine's stream order ----
  virtual void all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;

  // ---- the gradient average of a training step ----
  // begin_grads before the model's backward, grads_ready(first) from the model's hook (every
  // gradient at arena offset >= first is final once the engine's current stream has done what it
  // was given so far: a backend may start reducing it after that), end_grads after backward (on
  // the main lane): then every rank holds the mean gradient. The default reduces all at the end.
  virtual void begin_grads(const Tensor& grads) { grads_ = grads; }
  virtual void grads_ready(size_t first_final) { (void)first_final; }
  virtual void end_grads() { all_reduce(grads_, ReduceOp::Mean); }
  // Early optimizer updates beside the backward (StepBase): the lowest arena offset from which
  // the mean gradient is enqueued before end_grads (SIZE_MAX: none), and wait_reduced(): what the
  // engine's current stream is given next waits for those reductions.
  virtual size_t reduced_from() const { return SIZE_MAX; }
  virtual void wait_reduced() {}
  // Whether the step may be captured in a CUDA graph with these operations inside.
  virtual bool capturable() const { return true; }

  // ---- host values (blocking; every rank calls them in the same order) ----
  std::vector<std::string> all_gather(const std::string& mine);
  std::string broadcast_host(const std::string& on_root);
  void barrier();
  bool any(bool flag);  // true on every rank when it is true on one

  // ---- the watchdog ----
  void set_progress(int64_t step);
  // Marks the calling thread as waiting on the other ranks (a device sync after a collective),
  // so a rank that hangs is found and named.
  ControlPlane::Wait waiting() { return ControlPlane::Wait(cp_.get()); }
  ControlPlane* control() { return cp_.get(); }
  // The clean end of a run (all ranks): no rank takes another's exit for a failure.
  void finish();

 protected:
  Communicator(DistEnv e, std::unique_ptr<ControlPlane> cp) : env_(std::move(e)), cp_(std::move(cp)) {}
  DistEnv env_;
  std::unique_ptr<ControlPlane> cp_;
  Tensor grads_;
};

// The control plane of this rank (nullptr for one process), connected early so that a rank that
// fails its checks stops the others at once. For mpirun over several nodes without MASTER_ADDR,
// rank 0's host is found through MPI.
std::unique_ptr<ControlPlane> connect_control_plane(DistEnv& e, double timeout_s);

// The communicator for an engine: single, nccl (CUDA engine), mpi (CPU ranks under mpirun with
// libmpi available; UNET_CPU_COMM=tcp|mpi forces one) or tcp. Throws UserError when a backend
// cannot be loaded (no libnccl.so.2: names where it looked).
std::unique_ptr<Communicator> make_communicator(const DistEnv& e, std::unique_ptr<ControlPlane> cp,
                                                Engine& eng, const CommOptions& o);

// Backend factories (nccl: kernels/device/nccl_comm.cpp, or the CPU-only build's stub).
std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv& e, std::unique_ptr<ControlPlane> cp,
                                                     Engine& eng, const CommOptions& o);
std::unique_ptr<Communicator> make_mpi_communicator(const DistEnv& e, std::unique_ptr<ControlPlane> cp,
                                                    Engine& eng);
// Open MPI (libmpi.so.40) loaded and initialised; false (why set) when it cannot be.
bool mpi_available(std::string* why = nullptr);
// Rank 0's host name, broadcast through MPI (initialises MPI).
std::string mpi_root_hostname();
// MPI_Finalize when MPI was initialised: after a clean end only (Communicator::finish); a failing
// rank leaves without it and mpirun stops the rest.
void mpi_finalize();

}  // namespace unet
