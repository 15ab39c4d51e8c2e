// The control plane of a data-parallel run: every rank holds two TCP connections to rank 0 —
// one for small blocking collectives (all-gather, broadcast, barrier, the CPU all-reduce), one
// for a watchdog thread's heartbeats — so that any failure stops every rank within a bounded
// time, with one line naming the rank, instead of a silent hang:
//
//  * a rank that dies closes its connections: rank 0 sees it at once, tells the others, and
//    everybody exits 1 (rank 0 prints "unet: rank R exited or was killed ...");
//  * a rank frozen for --dist-timeout seconds stops sending heartbeats;
//  * a rank that hangs while alive (its main thread stuck) is found by progress: the others wait
//    on it (Wait scopes) for --dist-timeout seconds while its step counter is the lowest;
//  * device errors (NCCL's asynchronous errors) are polled through health checks.
// On a failure, abort hooks (ncclCommAbort) run for at most a few seconds, then the process
// exits 1 with _exit: checkpoints are written atomically, so the last good one stays intact.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "launch.h"

namespace unet {

class ControlPlane {
 public:
  // Connects every rank to rank 0 (which listens on e.port) within timeout_s. `token` must be the
  // same on every rank (a hash of the command line): UserError naming the odd rank otherwise.
  ControlPlane(const DistEnv& e, double timeout_s, uint64_t token);
  // Without finish(): tells the others this rank failed, so they stop too.
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  double timeout() const { return timeout_; }

  // ---- blocking collectives (main thread only; every rank calls them in the same order) ----
  std::vector<std::string> all_gather(const std::string& mine);
  std::string broadcast(const std::string& on_root);  // from rank 0
  void barrier();
  bool any(bool flag);
  // In place; rank 0 adds the ranks' arrays in rank order (deterministic), mean divides by world.
  void all_reduce(float* data, size_t n, bool mean);

  // ---- the watchdog ----
  void set_progress(int64_t p) { progress_.store(p); }
  // Marks the main thread as waiting on the other ranks (a device sync after a collective).
  class Wait {
   public:
    explicit Wait(ControlPlane* c);
    ~Wait();
    Wait(const Wait&) = delete;
    Wait& operator=(const Wait&) = delete;

   private:
    ControlPlane* c_;
  };
  void on_abort(std::function<void()> f);                 // run (bounded) before exiting on failure
  void add_health_check(std::function<std::string()> f);  // polled; non-empty = fatal error text
  // Stops the run on every rank: prints "unet: <why>" (when print), tells the others, exits 1.
  [[noreturn]] void fail(const std::string& why, bool print = true);

  // The clean end: two barriers (so no rank mistakes another's exit for a failure), then the
  // watchdog stops and the connections close.
  void finish();

 private:
  struct Peer;
  void connect_all(const DistEnv& e, uint64_t token);
  void watchdog();
  void send_frame(int fd, uint32_t type, const void* p, size_t n, const std::string& who);
  std::string recv_frame(int fd, uint32_t type, const std::string& who);
  std::string peer_name(int r) const { return "rank " + std::to_string(r); }
  void stop_watchdog();
  [[noreturn]] void exit_failed(const std::string& why, bool print);

  int rank_, world_;
  double timeout_;
  std::vector<int> data_fd_, watch_fd_;  // rank 0: per peer (index = rank); others: [0] = rank 0
  std::thread thread_;
  std::atomic<bool> stop_{false}, finishing_{false}, finished_{false};
  std::atomic<int64_t> progress_{0};
  std::atomic<double> wait_since_{0};
  std::mutex hooks_mu_;
  std::vector<std::function<void()>> abort_hooks_;
  std::vector<std::function<std::string()>> health_;
};

// A 64-bit hash of this process's command line without argv[0] (/proc/self/cmdline), the token
// that tells ranks of one run from strays.
uint64_t command_token();

}  // namespace unet
