// HDF5 checkpoints (SPEC §2): the only place where parameters change between the engine layout
// (flat arena, conv3x3 as [Co,3,3,Ci]) and the PyTorch layout stored in files.
//
//   model/<name>                 float32, guided-diffusion state_dict name and PyTorch shape
//   ema/<name>                   same (optional)
//   optimizer/m/<name>, optimizer/v/<name>   AdamW moments (optional); attributes on "optimizer":
//                                step (int64), lr, beta1, beta2, eps, weight_decay (float64)
//   state                        group whose attributes hold what exact resume needs; datasets
//                                loss_history, loss_counts (loss-second-moment sampler)
//   root attributes              format="unet-checkpoint", version=1, and every ModelConfig field
//                                under its guided-diffusion name (booleans int64 0/1, lists int64
//                                arrays, dropout float64, noise_schedule string); with a null
//                                class (classifier-free guidance) also null_class = 1 and
//                                class_dropout (float64), and label_emb has num_classes + 1 rows
//
// A classifier checkpoint (`unet init --classifier`, `unet train-classifier`) has the same groups
// with the classifier's state_dict names, and root attributes format="unet-classifier", version=1,
// image_size, in_channels, classifier_width, classifier_depth, classifier_channel_mult,
// classifier_attention_resolutions, classifier_use_scale_shift_norm, classifier_resblock_updown,
// classifier_pool, classifier_num_head_channels, num_classes, diffusion_steps, noise_schedule.
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
  // A classifier checkpoint (format "unet-classifier"): ccfg describes it and cfg is unused.
  bool is_classifier = false;
  ClassifierConfig ccfg;
  ParamTable table() const;  // the parameters of cfg or ccfg
  std::vector<float> model;  // engine layout, table().total floats
  std::vector<float> ema;    // empty = absent
  bool has_optimizer = false;
  OptimizerState opt;
  // Attributes of group "state" by type: what exact resume needs (step, seed, batch_size, ...)
  // and the run's training settings (lr, ema_rate, ...; see resume.h).
  std::map<std::string, int64_t> state;
  std::map<std::string, double> state_f64;
  std::map<std::string, std::string> state_str;
  // The loss-second-moment schedule sampler's state (datasets state/loss_history float64
  // [diffusion_steps, 10], oldest first, and state/loss_counts int64 [diffusion_steps]); empty =
  // absent (the uniform sampler).
  std::vector<double> loss_history;
  std::vector<int64_t> loss_counts;
};

// Writes through AtomicFile (temporary name, then rename): a failure leaves no file and never
// damages an existing one. Throws UserError on I/O problems, std::invalid_argument when an arena
// has the wrong size (a programming error).
void save_checkpoint(const std::string& path, const Checkpoint& ck);

// Reads and validates a checkpoint. The optimizer group is read only when need_optimizer (then
// its absence is a UserError); has_optimizer tells whether it was read. Every problem (not HDF5,
// wrong format, missing/invalid/out-of-range config attribute, missing/extra/misshapen/non-float
// tensor, a NaN or Inf in any tensor, more memory than the host has) is a UserError with one line
// naming the file and the tensor or attribute. Memory is checked before any tensor is read.
// A classifier checkpoint is refused here (one line saying what the file is).
Checkpoint load_checkpoint(const std::string& path, bool need_optimizer = false);
// The same for a classifier checkpoint (a diffusion model's is refused).
Checkpoint load_classifier_checkpoint(const std::string& path, bool need_optimizer = false);

// The first tensor of `arena` (engine layout of t) holding a NaN or Inf, as "<group>/<name>"
// followed by " (NaN)" or " (Inf)"; "" when every value is finite.
std::string nonfinite_tensor(const ParamTable& t, const std::vector<float>& arena, const std::string& group);

// Refuses a model too large for the engine (more than 2^31 - 1 floats in one arena) or for the
// host (`copies` arenas of it in memory): UserError "<what>: ...".
void check_model_size(const ParamTable& t, int copies, const std::string& what);

// The model configuration from a checkpoint's root attributes (validated), without reading tensors.
ModelConfig read_checkpoint_config(const std::string& path);
// "unet-checkpoint", "unet-classifier", or "" (no format attribute); UserError when not HDF5.
std::string checkpoint_format(const std::string& path);

// ---- lower-level pieces, for files that share the checkpoint conventions (golden files, ...) ----
// Root/group attributes <-> ModelConfig. read_config validates (UserError naming f.path()).
void write_config(h5::File& f, const ModelConfig& cfg, const std::string& obj_path = "/");
ModelConfig read_config(h5::File& f, const std::string& obj_path = "/");
void write_classifier_config(h5::File& f, const ClassifierConfig& cfg, const std::string& obj_path = "/");
ClassifierConfig read_classifier_config(h5::File& f, const std::string& obj_path = "/");
// Every tensor of `t` under `group` (e.g. "model", "grad", "optimizer/m") converted to one
// engine-layout arena of t.total floats; missing, extra, misshapen or non-float tensors are
// UserErrors naming f.path() and group/name.
std::vector<float> read_param_group(h5::File& f, const std::string& group, const ParamTable& t);
// The reverse: one float32 dataset per tensor in PyTorch layout. arena must hold t.total floats.
void write_param_group(h5::File& f, const std::string& group, const ParamTable& t,
                       const std::vector<float>& arena);

}  // namespace unet
