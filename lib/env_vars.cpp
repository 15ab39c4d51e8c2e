#include "env_vars.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ops.h"
#include "util.h"

namespace unet {

namespace {
// The value of a set, non-empty variable, else nullptr.
const char* value(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

[[noreturn]] void refuse(const char* name, const std::string& v, const std::string& want) {
  throw UserError(std::string(name) + "='" + v + "': " + want);
}

// A 0/1 switch: -1 when unset or empty, else 1 for "1", 0 for "0"; anything else is refused with
// `want`.
int switch_or_unset(const char* name, const std::string& want) {
  const char* v = value(name);
  if (!v) return -1;
  if (std::strcmp(v, "1") == 0) return 1;
  if (std::strcmp(v, "0") == 0) return 0;
  refuse(name, v, want);
}
// The same with dflt when unset or empty.
bool switch_var(const char* name, bool dflt, const std::string& want) {
  const int s = switch_or_unset(name, want);
  return s < 0 ? dflt : s == 1;
}
}  // namespace

size_t env_bucket_bytes(size_t dflt) {
  const char* v = value("UNET_BUCKET_MB");
  if (!v) return dflt;
  char* end = nullptr;
  errno = 0;
  const double mb = std::strtod(v, &end);
  if (*end || errno == ERANGE || std::isspace((unsigned char)v[0]) || !std::isfinite(mb) || mb < 0 ||
      mb > 1e6)
    refuse("UNET_BUCKET_MB", v,
           "must be a number of megabytes from 0 to 1000000 (0: one all-reduce after backward)");
  return (size_t)(mb * (1 << 20));
}

int env_stream_data() {
  return switch_or_unset("UNET_STREAM_DATA", "must be 1 (stream the dataset from disk) or 0 (hold it in memory)");
}

bool env_skip_branch(bool dflt) {
  return switch_var("UNET_SKIP_BRANCH", dflt,
                    "must be 1 (a ResBlock's skip-connection gradient on a third stream) or 0 (on the main lane)");
}

int env_pdl() {
  return switch_or_unset("UNET_PDL",
                         "must be 1 (programmatic dependent launch into every kernel in CUDA graphs) or 0 "
                         "(none); unset: as each graph's kind decides");
}

bool env_graph_fill() {
  return switch_var("UNET_GRAPH_FILL", true,
                    "must be 1 (memsets in captured CUDA graphs run as kernels; the default) or 0 (as memset "
                    "nodes)");
}

bool env_sample_step() {
  return switch_var("UNET_SAMPLE_STEP", true,
                    "must be 1 (a sampler step's arithmetic as one op, in the forward's CUDA graph; the "
                    "default) or 0 (as separate ops after it)");
}

bool env_conv_stats() {
  return switch_var("UNET_CONV_STATS", false,
                    "must be 1 (a convolution gives the statistics of the GroupNorm after it) or 0 (off; the "
                    "default)");
}

bool env_fuse_norm() {
  return switch_var("UNET_FUSE_NORM", false,
                    "must be 1 (ResBlock convs apply their GroupNorm + SiLU as they read their input, where a "
                    "kernel does so) or 0 (a separate pass; the default)");
}

bool env_cat_norm() {
  return switch_var("UNET_CAT_NORM", true,
                    "must be 1 (a training step's skip concatenations written by the GroupNorm after them; "
                    "the default) or 0 (a copy pass of their own)");
}

bool env_lanes() {
  return switch_var("UNET_LANES", true,
                    "must be 1 (filter gradients and skip convolutions on a second stream; the default) or 0 "
                    "(one stream)");
}

bool env_stream_priority() {
  return switch_var("UNET_STREAM_PRIORITY", true,
                    "must be 1 (the main lane's kernels first, then the side lane's, the optimizer's last; "
                    "the default) or 0 (one priority for all)");
}

bool env_cudnn_knobs() {
  return switch_var(
      "UNET_CUDNN_KNOBS", true,
      "must be 1 (in tf32, cuDNN's tile and cluster shapes searched around its heuristics' choice; "
      "the default) or 0 (its listed configurations only)");
}

std::string env_cpu_comm() {
  const char* v = value("UNET_CPU_COMM");
  if (!v) return "";
  const std::string s = v;
  if (s != "tcp" && s != "mpi") refuse("UNET_CPU_COMM", s, "must be tcp or mpi");
  return s;
}

std::string cudnn_cache_path() {
  if (const char* e = value("UNET_CUDNN_CACHE")) return e;
  std::string base;
  if (const char* x = value("XDG_CACHE_HOME"))
    base = x;
  else if (const char* h = value("HOME"))
    base = std::string(h) + "/.cache";
  else
    return "";
  return base + "/unet/cudnn-plans.txt";
}

void check_environment(const std::vector<std::pair<std::string, std::string>>& inputs) {
  kernel_overrides();  // UNET_KERNELS's syntax (its names: when the engine is made)
  env_bucket_bytes(0);
  env_stream_data();
  env_pdl();
  env_graph_fill();
  env_stream_priority();
  env_conv_stats();
  env_fuse_norm();
  env_cat_norm();
  env_lanes();
  env_skip_branch(false);
  env_cudnn_knobs();
  env_cpu_comm();
  // The libraries named explicitly: a file that is not there is refused here (the loaders then
  // take what they name and nothing else, so a mistyped path never loads another library).
  const std::pair<const char*, const char*> libs[] = {
      {"UNET_CUDNN", "cuDNN library to load, e.g. /usr/lib/x86_64-linux-gnu/libcudnn.so.9"},
      {"UNET_NCCL_LIBRARY", "NCCL library to load, e.g. .../nvidia/nccl/lib/libnccl.so.2"}};
  for (const auto& [var, what] : libs) {
    const char* v = value(var);
    struct stat ls;
    if (v && *v && (stat(v, &ls) != 0 || !S_ISREG(ls.st_mode)))
      throw UserError(std::string(var) + "=" + v + ": not a file (it names the " + what + ")");
  }
  const std::string cache = cudnn_cache_path();
  if (cache.empty()) return;
  const char* name = value("UNET_CUDNN_CACHE") ? "UNET_CUDNN_CACHE" : "the cuDNN plan cache";
  struct stat st;
  if (stat(cache.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw UserError(std::string(name) + "=" + cache + ": is " +
                    (S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "a device") +
                    ", not a regular file (the cache is appended to)");
  for (const auto& [what, path] : inputs)
    if (same_file(cache, path))
      throw UserError(std::string(name) + "=" + cache + ": is the same file as the " + what + " " + path +
                      "; refusing to append to an input");
}

}  // namespace unet
