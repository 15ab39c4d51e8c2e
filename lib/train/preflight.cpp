#include "preflight.h"

#include <algorithm>

#include "dataloader.h"
#include "op_defs.h"
#include "util.h"

namespace unet {

namespace {
// what: "model" or "classifier"; labels: required, and inside num_classes.
TrainData check_data(const std::string& path, int image_size, int in_channels, bool labels_needed,
                     int num_classes, const std::string& what, const std::string& model_src) {
  DatasetReader r(path);
  TrainData d;
  d.info = r.info();
  const DatasetInfo& info = d.info;
  if (info.count < 1) throw UserError(path + ": the dataset has no images");
  if (labels_needed && what == "classifier" && !info.has_labels)
    throw UserError(path +
                    ": the dataset has no labels; a classifier trains on labelled images "
                    "(unet prepare --labels subdirs)");
  if (info.image_size != image_size)
    throw UserError(path + ": images are " + std::to_string(info.image_size) + "x" +
                    std::to_string(info.image_size) + " but the " + what + "'s image size is " +
                    std::to_string(image_size) + " (" + model_src + ")");
  if (in_channels != 3)
    throw UserError(path + ": datasets are RGB but the " + what + " has " + std::to_string(in_channels) +
                    " input channels (" + model_src + ")");
  // What the data loader holds: the images of a small dataset (larger ones are streamed), the
  // epoch permutation, the labels.
  check_memory(DataLoader::resident_bytes(info), path + " (" + std::to_string(info.count) + " images)");
  if (labels_needed) {
    if (!info.has_labels)
      throw UserError(
          path + ": the model is class-conditional but the dataset has no labels (prepare --labels subdirs)");
    if ((int64_t)info.class_names.size() > num_classes)
      throw UserError(path + ": " + std::to_string(info.class_names.size()) + " classes but the " + what +
                      " has " + std::to_string(num_classes) + " (" + model_src + ")");
    const std::vector<int64_t> labels = r.read_labels();
    for (size_t i = 0; i < labels.size(); ++i)
      if (labels[i] < 0 || labels[i] >= num_classes)
        throw UserError(path + ": label " + std::to_string(labels[i]) + " of image " + std::to_string(i) +
                        " is outside the " + what + "'s " + std::to_string(num_classes) + " classes (" +
                        model_src + ")");
  }
  d.fingerprint = r.fingerprint();
  return d;
}
}  // namespace

TrainData check_train_data(const std::string& path, const ModelConfig& cfg, const std::string& model_src) {
  return check_data(path, cfg.image_size, cfg.in_channels, cfg.class_cond, cfg.num_classes, "model",
                    model_src);
}

TrainData check_train_data(const std::string& path, const ClassifierConfig& cfg,
                           const std::string& model_src) {
  return check_data(path, cfg.image_size, cfg.in_channels, true, cfg.num_classes, "classifier", model_src);
}

double train_host_bytes(const ParamTable& t, int ckpt_arenas, int batch, const DatasetInfo& data) {
  const double arena = (double)t.total * sizeof(float);
  const double image = (double)data.image_size * data.image_size * 3;
  const double prefetched = 4.0 * batch * image * sizeof(float) * 2;  // 4 slots of x0 + noise
  return arena * (ckpt_arenas + 4) + DataLoader::resident_bytes(data) + prefetched;
}

double sample_host_bytes(const ModelConfig& cfg, const ParamTable& t, int64_t n, bool noise, bool h5) {
  const double images = (double)n * cfg.image_size * cfg.image_size * cfg.in_channels * sizeof(float);
  double copies = 1.0 + 0.5;  // the samples + the 8-bit RGB grid made from them
  if (noise) copies += 2;     // the file's NCHW array and its NHWC copy
  if (h5) copies += 1.25;     // NCHW float copy + 8-bit images
  return (double)t.total * sizeof(float) * 2 + images * copies;
}

double eval_host_bytes(const ModelConfig& cfg, const ParamTable& t, int64_t n, int batch) {
  const double b = (double)std::min<int64_t>(n, batch > 0 ? batch : 32);
  const double numel = (double)cfg.image_size * cfg.image_size * cfg.in_channels;
  const double terms = (double)cfg.diffusion_steps * b * kLossTerms * sizeof(float);
  return (double)t.total * sizeof(float) * 2 + terms + b * numel * (1 + 2 * sizeof(float)) + 8.0 * n;
}

}  // namespace unet
