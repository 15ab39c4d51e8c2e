// Checks that `unet train` and `unet sample` run before any long work, before the device is
// initialised and before anything is written: the dataset against the model, and the host
// memory a run needs against what the machine (or ulimit / cgroup) allows. Device memory is the
// memory planner's business, not this file's.
#pragma once
#include <cstdint>
#include <string>

#include "config.h"
#include "dataset.h"
#include "params.h"

namespace unet {

struct TrainData {
  DatasetInfo info;
  uint64_t fingerprint = 0;  // DatasetReader::fingerprint()
};

// Opens the dataset and checks it against the model: image size, RGB, labels for a
// class-conditional model, and every label inside the model's classes. `model_src` names where
// the model comes from in messages ("init.h5", "the model flags"). UserError naming the dataset.
TrainData check_train_data(const std::string& path, const ModelConfig& cfg, const std::string& model_src);
// The same for a classifier (unet train-classifier): labels are required.
TrainData check_train_data(const std::string& path, const ClassifierConfig& cfg,
                           const std::string& model_src);

// Lower bounds of the host memory (bytes) of the big buffers of a run, from its configuration:
// train: the starting checkpoint (`ckpt_arenas` arenas of the model), the copy every save makes
// (model, EMA, AdamW moments), the data loader's (DataLoader::resident_bytes) and the prefetched batches;
// sample: the checkpoint's weights, the images in float, and the copies the outputs are made from.
double train_host_bytes(const ParamTable& t, int ckpt_arenas, int batch, const DatasetInfo& data);
double sample_host_bytes(const ModelConfig& cfg, const ParamTable& t, int64_t n, bool noise, bool h5);
// eval of n images at `batch` per model call (0 = min(n, 32)): the checkpoint's weights, the
// per-timestep terms of a batch, a batch of images and noise, one total per image.
double eval_host_bytes(const ModelConfig& cfg, const ParamTable& t, int64_t n, int batch);

}  // namespace unet
