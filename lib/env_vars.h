// The UNET_* environment variables: one parser each, which refuses a malformed value with one line
// naming the variable and what it accepts (UserError), so a typo is an error before any work, not a
// value silently ignored or read as 0. check_environment() runs every parser up front; the code
// that uses a variable calls the same parser again (cheap) instead of reading getenv itself.
//
//   UNET_KERNELS       family=variant,...   (syntax here; names when an engine is made, ops.h)
//   UNET_BUCKET_MB     gradient all-reduce bucket, MB, 0 to 1e6 (0 = one all-reduce after backward)
//   UNET_STREAM_DATA   1 (stream the dataset from disk) or 0 (hold it in memory); unset = by size
//   UNET_PDL           1 or 0: programmatic dependent launch into unet's kernels in CUDA graphs
//                      (kernels launched while their predecessor drains), into every one or none;
//                      unset = every one in the network's forward graphs (sampling), in the tf32
//                      training step only those nothing runs beside (Device::GraphPdl)
//   UNET_CONV_STATS    1 or 0 (default): the convolution (or skip concatenation) in front of a
//                      GroupNorm also gives the norm's statistics (on the GPU from its epilogue's or
//                      copy's pass); opt-in until measured
//   UNET_FUSE_NORM     1 or 0 (default): a ResBlock's convs apply the GroupNorm (+ SiLU) in front of
//                      them as they read their input (ConvFwd/ConvBwdFilter norm), where variants do
//                      so (tf32 on Hopper, width 64); opt-in: slower so far (blocks.h)
//   UNET_SKIP_BRANCH   1 or 0: with lanes, a ResBlock's skip-connection data gradient on a third
//                      stream beside the main lane's chain (blocks.h); unset = in bf16 only
//   UNET_STREAM_PRIORITY 1 (default) or 0: CUDA stream priorities, main lane > side lane >
//                      optimizer (kept per kernel node in CUDA graphs)
//   UNET_CUDNN_KNOBS   1 (default) or 0: when a tf32 shape is planned, cuDNN engine configurations
//                      beyond the ones its heuristics list (tile and cluster shapes of the fastest
//                      engines) are timed too (kernels/conv/cudnn.cu)
//   UNET_CPU_COMM      tcp or mpi (CPU ranks' gradient reduction); unset = by launcher
//   UNET_CUDNN_CACHE   the cuDNN plan cache file (default $XDG_CACHE_HOME or ~/.cache
//                      /unet/cudnn-plans.txt): a regular file (or none yet), never an input
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace unet {

// UNET_BUCKET_MB in bytes; `dflt` when unset or empty.
size_t env_bucket_bytes(size_t dflt);
// UNET_STREAM_DATA: 1 or 0; -1 when unset or empty.
int env_stream_data();
// UNET_PDL: 1 for "1", 0 for "0", -1 when unset or empty.
int env_pdl();
// UNET_GRAPH_FILL: memset nodes of captured CUDA graphs replaced by fill kernels (default on).
bool env_graph_fill();
// UNET_CONV_STATS: true for "1"; false when unset, empty or "0".
bool env_conv_stats();
// UNET_SAMPLE_STEP: false for "0"; true when unset, empty or "1".
bool env_sample_step();
// UNET_FUSE_NORM: true for "1"; false when unset, empty or "0".
bool env_fuse_norm();
// UNET_CAT_NORM: false for "0"; true when unset, empty or "1".
bool env_cat_norm();
// UNET_LANES: false for "0"; true when unset, empty or "1".
bool env_lanes();
// UNET_SKIP_BRANCH: true for "1", false for "0"; dflt when unset or empty.
bool env_skip_branch(bool dflt);
// UNET_STREAM_PRIORITY: false for "0"; true when unset, empty or "1".
bool env_stream_priority();
// UNET_CUDNN_KNOBS: false for "0"; true when unset, empty or "1".
bool env_cudnn_knobs();
// UNET_CPU_COMM: "tcp", "mpi", or "" when unset.
std::string env_cpu_comm();
// Where the cuDNN plan cache lives: UNET_CUDNN_CACHE, else $XDG_CACHE_HOME/unet/cudnn-plans.txt,
// else $HOME/.cache/unet/cudnn-plans.txt; "" when none of them is set.
std::string cudnn_cache_path();

// Runs every parser above (and UNET_KERNELS's), and checks that the cuDNN cache file, which runs
// on the GPU append to, is not a directory, FIFO, device or socket nor the same file as one of
// `inputs` ({what, path}: {"dataset", "d.h5"}). UserError naming the variable.
void check_environment(const std::vector<std::pair<std::string, std::string>>& inputs = {});

}  // namespace unet
