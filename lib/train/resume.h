// Resuming a run: every training setting is recorded in the checkpoint's `state` group at each
// save, and `unet train --resume` takes them from there unless a flag overrides one explicitly.
//
//   state/<key>          flag                  exact?  (overriding an "exact" setting changes
//   batch_size           --batch-size          yes      the continuation, so it is warned about)
//   seed                 --seed                yes
//   lr                   --lr                  yes
//   lr_warmup            --lr-warmup           yes
//   ema_rate             --ema-rate            yes
//   grad_clip            --grad-clip           yes
//   weight_decay         --weight-decay        yes
//   flip                 --no-flip             yes
//   schedule_sampler     --schedule-sampler    yes  (+ the loss-second-moment history datasets)
//   microbatch           --microbatch          yes  (absent in older checkpoints: 0, whole batch)
//   lr_anneal_steps      --lr-anneal-steps     yes  (absent in older checkpoints: 0, no decay)
//   (root) class_dropout --class-dropout       yes  (absent in older checkpoints: 0)
//   steps                --steps               no (restored while still ahead of the step)
//   save_every, log_every, sample_every        no
//   noised               --noised              yes  (train-classifier runs only)
//   eval_every           --eval-every          no   (train-classifier runs only)
//   dataset_count, dataset_image_size, dataset_fingerprint: the dataset trained on
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "dataset.h"
#include "trainer.h"

namespace unet {

// The values a training setting may take, by its flag ("--batch-size"): the flag's validator
// (cmd/train.cpp) and the check of a value recorded in a resumed checkpoint use this one table, so
// a hand-edited or corrupt state attribute is refused like the flag would be.
struct SettingRange {
  bool integer = true;
  int64_t ilo = 0, ihi = 0;       // integers: [ilo, ihi]
  double lo = 0, hi = 0;          // reals: finite, in [lo, hi] (hi may be infinity)
  bool lo_open = false;           // reals: lo itself excluded
  std::string text() const;       // "an integer from 1 to 65536", "a finite number > 0"
  bool contains(double v) const;  // for reals; integers use contains_int
  bool contains_int(int64_t v) const;
};
SettingRange train_setting_range(const std::string& flag);
constexpr int64_t kMaxTrainBatch = 65536;  // --batch-size (and --microbatch)

// Writes o's settings (and the dataset's identity) into c's state maps; the trainer's save calls
// it next to the step and the data-order position.
void store_train_settings(const TrainOptions& o, const DatasetInfo& data, Checkpoint& c);

struct ResumeSettings {
  TrainOptions opt;                   // the options to train with
  std::vector<std::string> warnings;  // at most one line each, without the "unet: warning: " prefix
};

// `given` holds the command line's values (defaults where a flag was not given); `explicit_flags`
// the names of the flags that were given ("--lr", "--no-flip", ...). Settings come from the
// checkpoint unless given explicitly; an explicit value that differs from a recorded exact
// setting gives one warning line naming every such flag. A checkpoint written before settings
// were recorded falls back to the flags (and the optimizer's lr/weight_decay) with one warning.
// Throws UserError naming the checkpoint and the state attribute for a recorded value outside its
// setting's range (train_setting_range) and for a setting this build cannot continue (an unknown
// schedule sampler, a loss-second-moment history that does not fit the model).
ResumeSettings resolve_resume(const Checkpoint& ck, const std::string& ckpt_path, const TrainOptions& given,
                              const std::set<std::string>& explicit_flags);

// Refuses (UserError naming `data_path`) a dataset other than the one the checkpoint was trained
// on: different count, image size or fingerprint.
void check_resume_dataset(const Checkpoint& ck, const std::string& ckpt_path, const std::string& data_path,
                          const DatasetInfo& info, uint64_t fingerprint);

}  // namespace unet
