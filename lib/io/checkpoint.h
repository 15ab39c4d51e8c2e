// HDF5 checkpoints (SPEC §2): the only place where parameters change between the engine layout
// (flat arena, conv3x3 as [Co,3,3,Ci]) and the PyTorch layout stored in files.
//
//   model/<name>                 float32, guided-diffusion state_dict name and PyTorch shape
//   ema/<name>                   same (optional)
//   optimizer/m/<name>, optimizer/v/<name>   AdamW moments (optional); attributes on "optimizer":
//                                step (int64), lr, beta1, beta2, eps, weight_decay (float64)
//   state                        group whose int64 attributes hold what exact resume needs
//   root attributes              format="unet-checkpoint", version=1, and every ModelConfig field
//                                under its guided-diffusion name (booleans int64 0/1, lists int64
//                                arrays, dropout float64, noise_schedule string)
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "h5.h"
#include "params.h"

namespace unet {

struct OptimizerState {
  int64_t step = 0;
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  std::vector<float> m, v;  // engine-layout arenas (table.total floats)
};

struct Checkpoint {
  ModelConfig cfg;
  std::vector<float> model;  // engine layout, build_param_table(cfg).total floats
  std::vector<float> ema;    // empty = absent
  bool has_optimizer = false;
  OptimizerState opt;
  std::map<std::string, int64_t> state;  // attributes of group "state" (exact resume: step, seed, ...)
};

// Writes through AtomicFile (temporary name, then rename): a failure leaves no file and never
// damages an existing one. Throws UserError on I/O problems, std::invalid_argument when an arena
// has the wrong size (a programming error).
void save_checkpoint(const std::string& path, const Checkpoint& ck);

// Reads and validates a checkpoint. The optimizer group is read only when need_optimizer (then
// its absence is a UserError); has_optimizer tells whether it was read. Every problem (not HDF5,
// wrong format, missing/invalid config attribute, missing/extra/misshapen/non-float tensor) is a
// UserError with one line naming the file and the tensor or attribute.
Checkpoint load_checkpoint(const std::string& path, bool need_optimizer = false);

// The model configuration from a checkpoint's root attributes (validated), without reading tensors.
ModelConfig read_checkpoint_config(const std::string& path);

// ---- lower-level pieces, for files that share the checkpoint conventions (golden files, ...) ----
// Root/group attributes <-> ModelConfig. read_config validates (UserError naming f.path()).
void write_config(h5::File& f, const ModelConfig& cfg, const std::string& obj_path = "/");
ModelConfig read_config(h5::File& f, const std::string& obj_path = "/");
// Every tensor of `t` under `group` (e.g. "model", "grad", "optimizer/m") converted to one
// engine-layout arena of t.total floats; missing, extra, misshapen or non-float tensors are
// UserErrors naming f.path() and group/name.
std::vector<float> read_param_group(h5::File& f, const std::string& group, const ParamTable& t);
// The reverse: one float32 dataset per tensor in PyTorch layout. arena must hold t.total floats.
void write_param_group(h5::File& f, const std::string& group, const ParamTable& t,
                       const std::vector<float>& arena);

}  // namespace unet
