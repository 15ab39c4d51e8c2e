#include "spawn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "util.h"

extern char** environ;

namespace unet {

namespace {

std::atomic<int> g_signals{0};
std::atomic<int> g_last_signal{0};
void on_launcher_signal(int sig) {
  g_last_signal.store(sig);
  g_signals.fetch_add(1);
}

std::vector<std::string> own_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> v;
  size_t at = 0;
  while (at < s.size()) {
    const size_t z = s.find('\0', at);
    v.push_back(s.substr(at, z - at));
    if (z == std::string::npos) break;
    at = z + 1;
  }
  return v;
}

// A port Q with Q free now; MASTER_PORT is Q-1 (ranks listen on MASTER_PORT+1).
int free_port() {
  for (int attempt = 0; attempt < 20; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, (sockaddr*)&a, sizeof a) == 0 && ::getsockname(fd, (sockaddr*)&a, &len) == 0)
      port = ntohs(a.sin_port);
    ::close(fd);
    if (port > 1) return port;
  }
  throw UserError("--gpus: cannot find a free TCP port on this host");
}

}  // namespace

std::vector<std::string> drop_gpus_flag(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--gpus") {
      ++i;  // and its value
      continue;
    }
    if (argv[i].rfind("--gpus=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

int run_local_ranks(int n, double grace_s) {
  const std::vector<std::string> args = drop_gpus_flag(own_argv());
  const int port = free_port();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::fflush(stdout);
  std::fflush(stderr);

  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);

  // Everything a rank's exec needs is prepared here: after fork() only async-signal-safe calls.
  std::vector<char*> av;
  for (const std::string& a : args) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  std::vector<std::vector<std::string>> envs(n);
  std::vector<std::vector<char*>> envp(n);
  const char* omp = std::getenv("OMP_NUM_THREADS");
  for (int r = 0; r < n; ++r) {
    const std::pair<std::string, std::string> set[] = {
        {"RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(n)},
        {"LOCAL_RANK", std::to_string(r)},
        {"LOCAL_WORLD_SIZE", std::to_string(n)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(port - 1)},
        {"UNET_LAUNCHER", "unet --gpus"},
        {"NCCL_NVLS_ENABLE", "0"},
        // CPU ranks share the cores (OpenMP would otherwise give each rank all of them).
        {"OMP_NUM_THREADS", omp ? std::string(omp) : std::to_string(std::max(1u, hw / (unsigned)n))}};
    for (char** e = environ; *e; ++e) {
      bool replaced = false;
      for (const auto& kv : set)
        replaced |= std::strncmp(*e, (kv.first + "=").c_str(), kv.first.size() + 1) == 0;
      if (!replaced) envs[r].push_back(*e);
    }
    for (const auto& kv : set) envs[r].push_back(kv.first + "=" + kv.second);
    for (std::string& e : envs[r]) envp[r].push_back(const_cast<char*>(e.c_str()));
    envp[r].push_back(nullptr);
  }

  std::vector<pid_t> pids(n, -1);
  const pid_t parent = getpid();
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      throw UserError("--gpus: cannot start rank " + std::to_string(r) + " (" + errno_text(errno) + ")");
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // the ranks stop (and save) when the launcher dies
      if (getppid() != parent) _exit(1);
      signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
      execve("/proc/self/exe", av.data(), envp[r].data());
      const char msg[] = "unet: --gpus: cannot start a rank (exec failed)\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(127);
    }
    pids[r] = pid;
  }

  int result = 0, first_failed = -1, alive = n, handled_signals = 0;
  double failed_at = 0;
  bool killed = false;
  while (alive > 0) {
    int status = 0;
    const pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < n; ++r)
        if (pids[r] == p) {
          pids[r] = -1;
          --alive;
          const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          if (code != 0 && first_failed < 0) {
            first_failed = r;
            result = code;
            failed_at = now_seconds();
          }
        }
      continue;
    }
    if (p < 0 && errno != EINTR) break;
    const int sigs = g_signals.load();
    if (sigs > handled_signals) {
      handled_signals = sigs;
      const int sig = sigs >= 2 ? SIGKILL : g_last_signal.load();
      for (pid_t q : pids)
        if (q > 0) kill(q, sig);
    }
    // A failed rank: the others stop by themselves within moments (their watchdog); any that do
    // not are killed after the grace period.
    if (first_failed >= 0 && !killed && now_seconds() - failed_at > grace_s) {
      std::string names;
      for (int r = 0; r < n; ++r)
        if (pids[r] > 0) {
          names += (names.empty() ? "" : ", ") + std::to_string(r);
          kill(pids[r], SIGKILL);
        }
      std::fprintf(stderr, "unet: --gpus: rank %s did not stop within %.0f s of rank %d's failure; killed\n",
                   names.c_str(), grace_s, first_failed);
      killed = true;
    }
    usleep(50 * 1000);
  }
  for (int s : {SIGINT, SIGTERM, SIGHUP}) signal(s, SIG_DFL);
  return result;
}

}  // namespace unet
