#include "launch.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util.h"

namespace unet {

namespace {

struct Env {
  const EnvLookup& get;
  const char* raw(const char* name) const {
    const char* v = get(name);
    return v && *v ? v : nullptr;
  }
  bool has(const char* name) const { return raw(name) != nullptr; }
  // An integer in [lo, hi]; UserError naming the variable otherwise.
  long long num(const char* name, long long lo, long long hi) const {
    const char* v = raw(name);
    if (!v) throw UserError(std::string(name) + " is not set");
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(v, &end, 10);
    if (*end || errno == ERANGE) throw UserError(std::string(name) + "='" + v + "' is not an integer");
    if (x < lo || x > hi)
      throw UserError(std::string(name) + "=" + v + " is out of range (" + std::to_string(lo) + " to " +
                      std::to_string(hi) + ")");
    return x;
  }
};

constexpr long long kMaxRanks = 1 << 20;

void check_ranks(const DistEnv& e, const char* rank, const char* world, const char* lrank,
                 const char* lworld) {
  if (e.rank >= e.world)
    throw UserError(std::string(rank) + "=" + std::to_string(e.rank) + " is not below " + world + "=" +
                    std::to_string(e.world));
  if (e.local_world > e.world)
    throw UserError(std::string(lworld) + "=" + std::to_string(e.local_world) + " exceeds " + world + "=" +
                    std::to_string(e.world));
  if (e.local_rank >= e.local_world)
    throw UserError(std::string(lrank) + "=" + std::to_string(e.local_rank) + " is not below " + lworld +
                    "=" + std::to_string(e.local_world));
  if (e.local_rank > e.rank)
    throw UserError(std::string(lrank) + "=" + std::to_string(e.local_rank) + " exceeds " + rank + "=" +
                    std::to_string(e.rank));
}

// A port derived from a job id, for launchers that give none: 20000..59999, so +1 stays valid.
int port_from(const std::string& id) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  return 20000 + (int)(h % 40000);
}

void master_port(const Env& env, DistEnv& e, const std::string& job_id) {
  if (env.has("MASTER_PORT"))
    e.port = (int)env.num("MASTER_PORT", 1, 65534) + 1;
  else
    e.port = port_from(job_id);
}

DistEnv from_torchrun(const Env& env) {
  DistEnv e;
  e.launcher = env.has("UNET_LAUNCHER") ? env.raw("UNET_LAUNCHER") : "torchrun";
  e.world = (int)env.num("WORLD_SIZE", 1, kMaxRanks);
  e.rank = (int)env.num("RANK", 0, kMaxRanks);
  if (e.rank >= e.world)
    throw UserError("RANK=" + std::to_string(e.rank) + " is not below WORLD_SIZE=" + std::to_string(e.world));
  if (env.has("LOCAL_RANK"))
    e.local_rank = (int)env.num("LOCAL_RANK", 0, kMaxRanks);
  else if (e.world == 1)
    e.local_rank = 0;
  else
    throw UserError("RANK and WORLD_SIZE are set but LOCAL_RANK is not (which GPU of this node?)");
  if (env.has("LOCAL_WORLD_SIZE"))
    e.local_world = (int)env.num("LOCAL_WORLD_SIZE", 1, kMaxRanks);
  else if (e.local_rank == e.rank)
    e.local_world = e.world;  // one node
  else
    throw UserError("LOCAL_WORLD_SIZE is not set (ranks per node; torchrun sets it)");
  check_ranks(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  if (e.world > 1) {
    if (!env.has("MASTER_ADDR")) throw UserError("MASTER_ADDR is not set (the host of rank 0)");
    if (!env.has("MASTER_PORT")) throw UserError("MASTER_PORT is not set (rank 0's port)");
    e.master_addr = env.raw("MASTER_ADDR");
    master_port(env, e, "");
  }
  return e;
}

DistEnv from_ompi(const Env& env) {
  DistEnv e;
  e.launcher = "mpirun";
  e.world = (int)env.num("OMPI_COMM_WORLD_SIZE", 1, kMaxRanks);
  e.rank = (int)env.num("OMPI_COMM_WORLD_RANK", 0, kMaxRanks);
  e.local_rank = (int)env.num("OMPI_COMM_WORLD_LOCAL_RANK", 0, kMaxRanks);
  e.local_world = (int)env.num("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMaxRanks);
  check_ranks(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (env.has("MASTER_ADDR"))
    e.master_addr = env.raw("MASTER_ADDR");
  else if (e.local_world == e.world)
    e.master_addr = "127.0.0.1";  // every rank on this node
  // else: found through MPI (comm.cpp) or refused there
  std::string job;
  for (const char* v : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid",
                        "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_NODE_RANK"})
    if (env.has(v)) {
      job = std::string(v) + "=" + env.raw(v);
      break;
    }
  master_port(env, e, "ompi " + job);
  return e;
}

DistEnv from_slurm(const Env& env) {
  DistEnv e;
  e.launcher = "srun";
  const char* ntasks = env.has("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  e.world = (int)env.num(ntasks, 1, kMaxRanks);
  e.rank = (int)env.num("SLURM_PROCID", 0, kMaxRanks);
  e.local_rank = (int)env.num("SLURM_LOCALID", 0, kMaxRanks);
  // Ranks on this node: the step's tasks-per-node list at this node's index, or a uniform count.
  const char* tpn = env.has("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                    : env.has("SLURM_TASKS_PER_NODE")    ? "SLURM_TASKS_PER_NODE"
                                                         : nullptr;
  const char* lw = "SLURM_NTASKS_PER_NODE";
  if (env.has("SLURM_NTASKS_PER_NODE")) {
    e.local_world = (int)env.num("SLURM_NTASKS_PER_NODE", 1, kMaxRanks);
  } else if (tpn) {
    const std::vector<int> per = expand_tasks_per_node(env.raw(tpn), tpn);
    const int node = env.has("SLURM_NODEID") ? (int)env.num("SLURM_NODEID", 0, kMaxRanks) : 0;
    if (node >= (int)per.size())
      throw UserError(std::string("SLURM_NODEID=") + std::to_string(node) + " but " + tpn + "='" +
                      env.raw(tpn) + "' lists " + std::to_string(per.size()) + " nodes");
    e.local_world = per[node];
    lw = tpn;
  } else if (e.world == 1) {
    e.local_world = 1;
  } else {
    throw UserError("SLURM_STEP_TASKS_PER_NODE is not set (ranks per node; srun sets it)");
  }
  check_ranks(e, "SLURM_PROCID", ntasks, "SLURM_LOCALID", lw);
  if (env.has("MASTER_ADDR")) {
    e.master_addr = env.raw("MASTER_ADDR");
  } else {
    const char* list = env.has("SLURM_STEP_NODELIST")  ? "SLURM_STEP_NODELIST"
                       : env.has("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                       : env.has("SLURM_NODELIST")     ? "SLURM_NODELIST"
                                                       : nullptr;
    if (!list && e.world > 1)
      throw UserError("SLURM_JOB_NODELIST is not set (needed to find rank 0's host; or set MASTER_ADDR)");
    if (list) e.master_addr = expand_hostlist(env.raw(list), list).at(0);
  }
  std::string job = std::string("slurm ") + (env.has("SLURM_JOB_ID") ? env.raw("SLURM_JOB_ID") : "") + "." +
                    (env.has("SLURM_STEP_ID") ? env.raw("SLURM_STEP_ID") : "");
  master_port(env, e, job);
  return e;
}

}  // namespace

DistEnv parse_dist_env(const EnvLookup& lookup) {
  Env env{lookup};
  const bool torch = env.has("RANK") || env.has("WORLD_SIZE");
  const bool ompi = env.has("OMPI_COMM_WORLD_RANK") || env.has("OMPI_COMM_WORLD_SIZE");
  // Inside an srun step (SLURM_STEP_ID); a batch script alone also has SLURM_PROCID=0 and the
  // allocation's SLURM_NTASKS, which must not make one process wait for absent peers.
  const bool slurm = env.has("SLURM_PROCID") && (env.has("SLURM_STEP_ID") || env.has("SLURM_STEPID"));
  if (torch) {
    if (!env.has("RANK")) throw UserError("WORLD_SIZE is set but RANK is not");
    if (!env.has("WORLD_SIZE")) throw UserError("RANK is set but WORLD_SIZE is not");
    DistEnv e = from_torchrun(env);
    if (ompi && env.has("OMPI_COMM_WORLD_RANK") && env.has("OMPI_COMM_WORLD_SIZE")) {
      // Both sets present: they must describe the same process.
      DistEnv o = from_ompi(env);
      if (o.world != e.world || o.rank != e.rank)
        throw UserError("RANK/WORLD_SIZE (" + std::to_string(e.rank) + "/" + std::to_string(e.world) +
                        ") disagree with OMPI_COMM_WORLD_RANK/SIZE (" + std::to_string(o.rank) + "/" +
                        std::to_string(o.world) + "): two launchers' variables are set");
    }
    return e;
  }
  if (ompi) {
    if (!env.has("OMPI_COMM_WORLD_RANK"))
      throw UserError("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
    if (!env.has("OMPI_COMM_WORLD_SIZE"))
      throw UserError("OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    return from_ompi(env);
  }
  if (slurm) return from_slurm(env);
  return DistEnv{};
}

DistEnv parse_dist_env() {
  return parse_dist_env([](const char* n) -> const char* { return std::getenv(n); });
}

namespace {
// Splits at commas outside brackets.
std::vector<std::string> split_top(const std::string& s, const std::string& var) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw UserError(var + "='" + s + "': unbalanced ']'");
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw UserError(var + "='" + s + "': unbalanced '['");
  out.push_back(cur);
  return out;
}

void expand_one(const std::string& item, const std::string& var, const std::string& whole,
                std::vector<std::string>& out) {
  const size_t lb = item.find('[');
  if (lb == std::string::npos) {
    out.push_back(item);
    return;
  }
  const size_t rb = item.find(']', lb);
  const std::string prefix = item.substr(0, lb), body = item.substr(lb + 1, rb - lb - 1),
                    rest = item.substr(rb + 1);
  auto bad = [&](const std::string& why) { throw UserError(var + "='" + whole + "': " + why); };
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    const std::string r = body.substr(start, comma - start);
    const size_t dash = r.find('-');
    const std::string a = r.substr(0, dash), b = dash == std::string::npos ? a : r.substr(dash + 1);
    auto digits = [](const std::string& x) {
      return !x.empty() && x.size() < 10 && x.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(a) || !digits(b)) bad("'" + r + "' is not a number or range");
    const long lo = std::stol(a), hi = std::stol(b);
    if (hi < lo) bad("range '" + r + "' runs backwards");
    if (hi - lo > 100000) bad("range '" + r + "' is too long");
    for (long v = lo; v <= hi; ++v) {
      std::string n = std::to_string(v);
      if (n.size() < a.size()) n = std::string(a.size() - n.size(), '0') + n;  // zero padding
      expand_one(prefix + n + rest, var, whole, out);
    }
    start = comma + 1;
  }
}
}  // namespace

std::vector<std::string> expand_hostlist(const std::string& s, const std::string& var) {
  std::vector<std::string> out;
  for (const std::string& item : split_top(s, var)) {
    if (item.empty()) throw UserError(var + "='" + s + "': empty host name");
    expand_one(item, var, s, out);
  }
  return out;
}

std::vector<int> expand_tasks_per_node(const std::string& s, const std::string& var) {
  std::vector<int> out;
  size_t start = 0;
  auto bad = [&]() -> void {
    throw UserError(var + "='" + s + "' is not a tasks-per-node list like 2(x3),1");
  };
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(start, comma - start);
    const size_t paren = item.find("(x");
    const std::string n = item.substr(0, paren);
    if (n.empty() || n.size() > 7 || n.find_first_not_of("0123456789") != std::string::npos) bad();
    long rep = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') bad();
      const std::string r = item.substr(paren + 2, item.size() - paren - 3);
      if (r.empty() || r.size() > 7 || r.find_first_not_of("0123456789") != std::string::npos) bad();
      rep = std::stol(r);
    }
    if ((long long)out.size() + rep > kMaxRanks)
      throw UserError(var + "='" + s + "' lists more than " + std::to_string(kMaxRanks) + " nodes");
    for (long i = 0; i < rep; ++i) out.push_back(std::stoi(n));
    start = comma + 1;
  }
  return out;
}

int gpu_for_rank(const DistEnv& e, int visible) {
  if (visible < 1) throw UserError("no GPU visible to rank " + std::to_string(e.rank));
  if (visible == 1) return 0;  // one GPU, or the launcher gave each rank its own (CUDA_VISIBLE_DEVICES)
  if (e.local_world > visible)
    throw UserError(std::to_string(e.local_world) + " ranks on this node but only " +
                    std::to_string(visible) +
                    " GPUs are visible (CUDA_VISIBLE_DEVICES); start at most one rank per GPU");
  return e.local_rank;
}

}  // namespace unet
