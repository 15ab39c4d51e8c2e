#include "control.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "util.h"

namespace unet {

namespace {

constexpr uint32_t kMagic = 0x554E4554u;  // "UNET"
constexpr uint32_t kVersion = 1;
enum Frame : uint32_t { Hello = 1, Ok = 2, Err = 3, Gather = 10, Bcast = 11, Reduce = 12 };
enum Beat : uint32_t { Heartbeat = 1, Bye = 2, Failed = 3, Abort = 4 };

struct FrameHeader {
  uint32_t magic, type;
  uint64_t len;
};
struct HelloMsg {
  uint32_t version;
  int32_t rank, world, channel;  // channel 0 = collectives, 1 = watchdog
  uint64_t token;
};
// Watchdog records: fixed size, no framing.
struct BeatMsg {
  uint32_t type;
  int32_t rank;
  int64_t progress;
  double wait_s;  // how long the main thread has been waiting on the others (0 = not waiting)
};

std::atomic<bool>& failing() {
  static std::atomic<bool> f{false};
  return f;
}
bool begin_failure() { return !failing().exchange(true); }

double now() { return now_seconds(); }

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Sends everything or returns false (peer gone).
bool send_all(int fd, const void* p, size_t n, bool nonblocking = false) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k, n -= (size_t)k;
  }
  return true;
}

enum class Rx { Ok, Eof, Timeout };
// Receives exactly n bytes before `deadline` (now_seconds()).
Rx recv_all(int fd, void* p, size_t n, double deadline) {
  char* c = static_cast<char*>(p);
  while (n) {
    const double left = deadline - now();
    if (left <= 0) return Rx::Timeout;
    pollfd pf{fd, POLLIN, 0};
    const int r = ::poll(&pf, 1, (int)std::min(1000.0, left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t k = ::recv(fd, c, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return Rx::Eof;
    c += k, n -= (size_t)k;
  }
  return Rx::Ok;
}

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", s);
  return b;
}

int listen_on(int port) {
  // Dual-stack IPv6 when available, else IPv4.
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1, zero = 0;
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons((uint16_t)port);
    if (::bind(fd, (sockaddr*)&a, sizeof a) == 0 && ::listen(fd, 1024) == 0) return fd;
    const int err = errno;
    ::close(fd);
    if (err == EADDRINUSE)
      throw UserError("port " + std::to_string(port) +
                      " (MASTER_PORT+1, where rank 0 listens) is in use on this host; choose another "
                      "MASTER_PORT");
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw UserError("cannot create a socket (" + errno_text(errno) + ")");
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons((uint16_t)port);
  if (::bind(fd, (sockaddr*)&a, sizeof a) != 0 || ::listen(fd, 1024) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EADDRINUSE)
      throw UserError("port " + std::to_string(port) +
                      " (MASTER_PORT+1, where rank 0 listens) is in use on this host; choose another "
                      "MASTER_PORT");
    throw UserError("cannot listen on port " + std::to_string(port) + " (MASTER_PORT+1): " + errno_text(err));
  }
  return fd;
}

// Connects to host:port, retrying until the deadline (rank 0 may not listen yet).
int connect_to(const std::string& host, int port, double deadline, double timeout) {
  std::string last = "no answer";
  while (true) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const int g = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (g != 0) {
      last = std::string("cannot resolve the host: ") + gai_strerror(g);
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          return fd;
        }
        last = errno_text(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (now() > deadline)
      throw UserError("cannot reach rank 0 at " + host + ":" + std::to_string(port) + " within " +
                      fmt_s(timeout) + " (" + last + "); check MASTER_ADDR/MASTER_PORT, or --dist-timeout");
    ::usleep(100 * 1000);
  }
}

}  // namespace

uint64_t command_token() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t z = s.find('\0');  // skip argv[0]: ranks may name the binary differently
  if (z != std::string::npos) s = s.substr(z + 1);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// ---- construction ------------------------------------------------------------------------------

ControlPlane::ControlPlane(const DistEnv& e, double timeout_s, uint64_t token)
    : rank_(e.rank), world_(e.world), timeout_(timeout_s) {
  if (e.master_addr.empty())
    throw UserError("MASTER_ADDR is not set: a run over several nodes needs rank 0's host name");
  try {
    connect_all(e, token);
  } catch (...) {
    for (int& fd : data_fd_) close_fd(fd);
    for (int& fd : watch_fd_) close_fd(fd);
    throw;
  }
  thread_ = std::thread([this] { watchdog(); });
}

void ControlPlane::connect_all(const DistEnv& e, uint64_t token) {
  const double deadline = now() + timeout_;
  if (rank_ != 0) {
    data_fd_.assign(1, -1), watch_fd_.assign(1, -1);
    for (int ch = 0; ch < 2; ++ch) {
      int fd = connect_to(e.master_addr, e.port, deadline, timeout_);
      (ch == 0 ? data_fd_ : watch_fd_)[0] = fd;
      set_nodelay(fd);
      HelloMsg h{kVersion, rank_, world_, ch, token};
      FrameHeader fh{kMagic, Hello, sizeof h};
      if (!send_all(fd, &fh, sizeof fh) || !send_all(fd, &h, sizeof h))
        throw UserError("rank 0 at " + e.master_addr + ":" + std::to_string(e.port) +
                        " closed the connection during the handshake");
    }
    // Rank 0 answers once every rank is in (or names the problem).
    FrameHeader fh{};
    const Rx r = recv_all(data_fd_[0], &fh, sizeof fh, deadline + 5);
    if (r != Rx::Ok || fh.magic != kMagic)
      throw UserError(r == Rx::Timeout ? "rank 0 did not see every rank connect within " + fmt_s(timeout_) +
                                             " (--dist-timeout)"
                                       : "rank 0 closed the connection during the handshake");
    std::string text(fh.len, '\0');
    if (fh.len > (1 << 20) || recv_all(data_fd_[0], text.data(), fh.len, deadline + 5) != Rx::Ok)
      throw UserError("rank 0 closed the connection during the handshake");
    if (fh.type == Err) throw UserError(text);
    return;
  }
  // Rank 0: accept 2 (world - 1) connections.
  data_fd_.assign(world_, -1), watch_fd_.assign(world_, -1);
  int lfd = listen_on(e.port);
  std::vector<int> pending;
  std::string error;
  int connected = 0;
  auto reject_all = [&](const std::string& why) {
    FrameHeader fh{kMagic, Err, why.size()};
    for (int fd : data_fd_)
      if (fd >= 0) send_all(fd, &fh, sizeof fh, true), send_all(fd, why.data(), why.size(), true);
    for (int& fd : pending) close_fd(fd);
    ::close(lfd);
    throw UserError(why);
  };
  while (connected < 2 * (world_ - 1)) {
    const double left = deadline - now();
    if (left <= 0) {
      std::string missing;
      int n = 0;
      for (int r = 1; r < world_; ++r)
        if (data_fd_[r] < 0 || watch_fd_[r] < 0) {
          if (n < 8) missing += (n ? ", " : "") + std::to_string(r);
          ++n;
        }
      if (n > 8) missing += ", ...";
      reject_all(std::to_string(n) + " of " + std::to_string(world_ - 1) +
                 " ranks did not connect to rank 0 (port " + std::to_string(e.port) + ") within " +
                 fmt_s(timeout_) + ": rank" + (n > 1 ? "s " : " ") + missing + " (--dist-timeout)");
    }
    pollfd pf{lfd, POLLIN, 0};
    if (::poll(&pf, 1, (int)std::min(500.0, left * 1000) + 1) <= 0) continue;
    int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    set_nodelay(fd);
    FrameHeader fh{};
    HelloMsg h{};
    if (recv_all(fd, &fh, sizeof fh, now() + 10) != Rx::Ok || fh.magic != kMagic || fh.type != Hello ||
        fh.len != sizeof h || recv_all(fd, &h, sizeof h, now() + 10) != Rx::Ok) {
      ::close(fd);  // not one of ours (a port scan, a stray of another run): ignore it
      continue;
    }
    pending.push_back(fd);
    if (h.version != kVersion) reject_all("rank " + std::to_string(h.rank) + " runs another unet version");
    if (h.world != world_)
      reject_all("rank " + std::to_string(h.rank) + " was started with a world size of " +
                 std::to_string(h.world) + " but rank 0 with " + std::to_string(world_) +
                 " (inconsistent launcher environment)");
    if (h.rank < 1 || h.rank >= world_ || h.channel < 0 || h.channel > 1)
      reject_all("a process claiming rank " + std::to_string(h.rank) + " connected to rank 0");
    std::vector<int>& slot = h.channel == 0 ? data_fd_ : watch_fd_;
    if (slot[h.rank] >= 0)
      reject_all("two processes claim rank " + std::to_string(h.rank) +
                 " (RANK / OMPI_COMM_WORLD_RANK / SLURM_PROCID must differ between processes)");
    if (h.token != token)
      reject_all(
          "rank " + std::to_string(h.rank) +
          " runs a different command line than rank 0 (every rank must run the same unet train command)");
    slot[h.rank] = fd;
    pending.erase(std::find(pending.begin(), pending.end(), fd));
    ++connected;
  }
  ::close(lfd);
  FrameHeader ok{kMagic, Ok, 0};
  for (int r = 1; r < world_; ++r)
    if (!send_all(data_fd_[r], &ok, sizeof ok))
      fail(peer_name(r) + " exited or was killed during the handshake");
}

ControlPlane::~ControlPlane() {
  if (!finished_.load()) {
    // A failure on this rank (an exception unwinding): tell the others, quietly; the error itself
    // is printed by the caller. Claiming the failure keeps the watchdog from exiting the process
    // before that message is printed.
    if (begin_failure()) {
      BeatMsg m{rank_ == 0 ? (uint32_t)Abort : (uint32_t)Failed, rank_, 0, 0};
      for (int fd : watch_fd_)
        if (fd >= 0) send_all(fd, &m, sizeof m, true);
    }
  }
  stop_watchdog();
  for (int& fd : data_fd_) close_fd(fd);
  for (int& fd : watch_fd_) close_fd(fd);
}

void ControlPlane::stop_watchdog() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

// ---- failure -----------------------------------------------------------------------------------

void ControlPlane::on_abort(std::function<void()> f) {
  std::lock_guard<std::mutex> lk(hooks_mu_);
  abort_hooks_.push_back(std::move(f));
}

void ControlPlane::add_health_check(std::function<std::string()> f) {
  std::lock_guard<std::mutex> lk(hooks_mu_);
  health_.push_back(std::move(f));
}

void ControlPlane::fail(const std::string& why, bool print) {
  // Another thread may already be stopping this process: it exits it shortly.
  if (!begin_failure())
    while (true) ::pause();
  exit_failed(why, print);
}

void ControlPlane::exit_failed(const std::string& why, bool print) {
  if (print) {
    std::fflush(stdout);
    std::fprintf(stderr, "unet: %s\n", one_line(why).c_str());
    std::fflush(stderr);
  }
  BeatMsg m{rank_ == 0 ? (uint32_t)Abort : (uint32_t)Failed, rank_, 0, 0};
  for (int fd : watch_fd_)
    if (fd >= 0) send_all(fd, &m, sizeof m, true);
  // Abort hooks (ncclCommAbort) get a few seconds; then the process ends regardless.
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lk(hooks_mu_);
    hooks = abort_hooks_;
  }
  if (!hooks.empty()) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([hooks, done] {
      for (auto& h : hooks) try {
          h();
        } catch (...) {
        }
      done->store(true);
    }).detach();
    for (int i = 0; i < 50 && !done->load(); ++i) ::usleep(100 * 1000);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(1);
}

// ---- the watchdog ------------------------------------------------------------------------------

ControlPlane::Wait::Wait(ControlPlane* c) : c_(c) {
  if (c_) c_->wait_since_.store(now());
}
ControlPlane::Wait::~Wait() {
  if (c_) c_->wait_since_.store(0);
}

void ControlPlane::watchdog() {
  const int peers = rank_ == 0 ? world_ - 1 : 1;
  struct State {
    double last_beat;
    int64_t progress = 0;
    double wait_s = 0;
    std::string buf;
    bool closed = false;
  };
  std::vector<State> st(world_);
  const double t0 = now();
  for (auto& s : st) s.last_beat = t0;
  double last_sent = 0;
  auto peer_fd = [&](int r) { return rank_ == 0 ? watch_fd_[r] : watch_fd_[0]; };
  auto peer_rank = [&](int i) { return rank_ == 0 ? i + 1 : 0; };
  // A detection: claim the failure (or leave quietly when someone else already has).
  auto detect = [&](const std::string& why, bool print) {
    if (finishing_.load()) return false;
    if (!begin_failure()) return true;  // the process is being stopped elsewhere: leave
    exit_failed(why, print);
  };
  while (!stop_.load()) {
    std::vector<pollfd> pf;
    for (int i = 0; i < peers; ++i) {
      const int r = peer_rank(i);
      if (!st[r].closed) pf.push_back({peer_fd(r), POLLIN, 0});
    }
    ::poll(pf.data(), pf.size(), 200);
    for (const pollfd& p : pf) {
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int r = 0;
      for (int i = 0; i < peers; ++i)
        if (peer_fd(peer_rank(i)) == p.fd) r = peer_rank(i);
      char tmp[256];
      const ssize_t k = ::recv(p.fd, tmp, sizeof tmp, MSG_DONTWAIT);
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (k <= 0) {
        st[r].closed = true;
        if (detect(peer_name(r) + " exited or was killed (its connection closed); stopping" +
                       (rank_ == 0 ? std::string(" all ranks") : " rank " + std::to_string(rank_)),
                   true))
          return;
        continue;
      }
      st[r].buf.append(tmp, (size_t)k);
      while (st[r].buf.size() >= sizeof(BeatMsg)) {
        BeatMsg m;
        std::memcpy(&m, st[r].buf.data(), sizeof m);
        st[r].buf.erase(0, sizeof m);
        st[r].last_beat = now();
        if (m.type == Heartbeat) {
          st[r].progress = m.progress;
          st[r].wait_s = m.wait_s;
        } else if (m.type == Bye) {
          st[r].closed = true;
        } else if (m.type == Failed) {
          if (detect("rank " + std::to_string(m.rank) + " failed (its error is above); stopping all ranks",
                     rank_ == 0))
            return;
        } else if (m.type == Abort) {
          if (detect("stopped by rank 0", false)) return;
        }
      }
    }
    if (stop_.load()) break;
    const double t = now();
    // Heartbeats, once a second.
    if (t - last_sent >= 1.0) {
      last_sent = t;
      const double ws = wait_since_.load();
      BeatMsg m{Heartbeat, rank_, progress_.load(), ws > 0 ? t - ws : 0.0};
      for (int i = 0; i < peers; ++i) send_all(peer_fd(peer_rank(i)), &m, sizeof m, true);
    }
    if (finishing_.load()) continue;
    for (int i = 0; i < peers; ++i) {
      const int r = peer_rank(i);
      if (!st[r].closed && t - st[r].last_beat > timeout_) {
        if (detect(peer_name(r) + " stopped responding (no heartbeat for " + fmt_s(timeout_) +
                       ", --dist-timeout); stopping",
                   true))
          return;
      }
    }
    if (rank_ == 0) {
      // A hang: some rank has waited on the others for longer than the timeout.
      const double ws = wait_since_.load();
      st[0].progress = progress_.load();
      st[0].wait_s = ws > 0 ? t - ws : 0.0;
      double longest = 0;
      for (int r = 0; r < world_; ++r) longest = std::max(longest, st[r].wait_s);
      if (longest > timeout_) {
        int culprit = -1;
        for (int r = 0; r < world_; ++r)
          if (st[r].wait_s == 0 && (culprit < 0 || st[r].progress < st[culprit].progress)) culprit = r;
        std::string why;
        if (culprit >= 0)
          why = peer_name(culprit) + " made no progress for " + fmt_s(timeout_) +
                " while the other ranks waited for it (--dist-timeout); stopping all ranks";
        else
          why = "every rank has waited on the others for " + fmt_s(timeout_) +
                " (a collective operation hangs; --dist-timeout); stopping all ranks";
        if (detect(why, true)) return;
      }
    }
    // Device-side errors (NCCL's asynchronous errors).
    std::vector<std::function<std::string()>> checks;
    {
      std::lock_guard<std::mutex> lk(hooks_mu_);
      checks = health_;
    }
    for (auto& c : checks) {
      const std::string err = c();
      if (!err.empty() && detect(err + "; stopping", true)) return;
    }
  }
}

// ---- collectives -------------------------------------------------------------------------------

void ControlPlane::send_frame(int fd, uint32_t type, const void* p, size_t n, const std::string& who) {
  FrameHeader fh{kMagic, type, n};
  if (!send_all(fd, &fh, sizeof fh) || (n && !send_all(fd, p, n)))
    fail(who + " exited or was killed (its connection closed); stopping");
}

std::string ControlPlane::recv_frame(int fd, uint32_t type, const std::string& who) {
  // The watchdog normally stops a run whose peer died or hangs; this deadline is the backstop.
  Wait w(this);
  const double deadline = now() + 2 * timeout_ + 10;
  FrameHeader fh{};
  Rx r = recv_all(fd, &fh, sizeof fh, deadline);
  std::string s;
  if (r == Rx::Ok) {
    if (fh.magic != kMagic || fh.type != type) fail("protocol error talking to " + who + "; stopping");
    s.resize(fh.len);
    r = recv_all(fd, s.data(), fh.len, deadline);
  }
  if (r == Rx::Eof) fail(who + " exited or was killed (its connection closed); stopping");
  if (r == Rx::Timeout) fail(who + " did not answer within " + fmt_s(2 * timeout_ + 10) + "; stopping");
  return s;
}

std::vector<std::string> ControlPlane::all_gather(const std::string& mine) {
  std::vector<std::string> all(world_);
  if (rank_ != 0) {
    send_frame(data_fd_[0], Gather, mine.data(), mine.size(), "rank 0");
    const std::string packed = recv_frame(data_fd_[0], Gather, "rank 0");
    size_t at = 0;
    for (int r = 0; r < world_; ++r) {
      uint64_t n = 0;
      std::memcpy(&n, packed.data() + at, 8);
      all[r] = packed.substr(at + 8, n);
      at += 8 + n;
    }
    return all;
  }
  all[0] = mine;
  for (int r = 1; r < world_; ++r) all[r] = recv_frame(data_fd_[r], Gather, peer_name(r));
  std::string packed;
  for (const std::string& s : all) {
    const uint64_t n = s.size();
    packed.append(reinterpret_cast<const char*>(&n), 8);
    packed += s;
  }
  for (int r = 1; r < world_; ++r)
    send_frame(data_fd_[r], Gather, packed.data(), packed.size(), peer_name(r));
  return all;
}

std::string ControlPlane::broadcast(const std::string& on_root) {
  if (rank_ != 0) return recv_frame(data_fd_[0], Bcast, "rank 0");
  for (int r = 1; r < world_; ++r)
    send_frame(data_fd_[r], Bcast, on_root.data(), on_root.size(), peer_name(r));
  return on_root;
}

void ControlPlane::barrier() { all_gather(std::string()); }

bool ControlPlane::any(bool flag) {
  for (const std::string& s : all_gather(flag ? "1" : "0"))
    if (s == "1") return true;
  return false;
}

void ControlPlane::all_reduce(float* data, size_t n, bool mean) {
  const size_t bytes = n * sizeof(float);
  if (rank_ != 0) {
    send_frame(data_fd_[0], Reduce, data, bytes, "rank 0");
    const std::string s = recv_frame(data_fd_[0], Reduce, "rank 0");
    if (s.size() != bytes) fail("protocol error talking to rank 0; stopping");
    std::memcpy(data, s.data(), bytes);
    return;
  }
  for (int r = 1; r < world_; ++r) {
    const std::string s = recv_frame(data_fd_[r], Reduce, peer_name(r));
    if (s.size() != bytes) fail("protocol error talking to " + peer_name(r) + "; stopping");
    const float* x = reinterpret_cast<const float*>(s.data());
    for (size_t i = 0; i < n; ++i) data[i] += x[i];
  }
  if (mean) {
    const float w = (float)world_;
    for (size_t i = 0; i < n; ++i) data[i] /= w;
  }
  for (int r = 1; r < world_; ++r) send_frame(data_fd_[r], Reduce, data, bytes, peer_name(r));
}

void ControlPlane::finish() {
  if (finished_.load()) return;
  barrier();
  finishing_.store(true);  // from now on a closed connection is a peer that is done
  barrier();
  BeatMsg m{Bye, rank_, progress_.load(), 0};
  for (int fd : watch_fd_)
    if (fd >= 0) send_all(fd, &m, sizeof m, true);
  finished_.store(true);
  stop_watchdog();
}

}  // namespace unet
