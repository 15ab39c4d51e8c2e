#include "resume.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

#include "objective.h"
#include "util.h"

namespace unet {

std::string SettingRange::text() const {
  auto g = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  if (integer) return "an integer from " + std::to_string(ilo) + " to " + std::to_string(ihi);
  if (std::isinf(hi)) return "a finite number " + std::string(lo_open ? "> " : ">= ") + g(lo);
  return "a finite number " + std::string(lo_open ? "in (" : "in [") + g(lo) + ", " + g(hi) + "]";
}

bool SettingRange::contains(double v) const {
  return std::isfinite(v) && v >= lo && !(lo_open && v == lo) && v <= hi;
}

bool SettingRange::contains_int(int64_t v) const { return v >= ilo && v <= ihi; }

SettingRange train_setting_range(const std::string& flag) {
  auto I = [](int64_t lo, int64_t hi) {
    SettingRange r;
    r.integer = true, r.ilo = lo, r.ihi = hi;
    return r;
  };
  auto R = [](double lo, double hi, bool open = false) {
    SettingRange r;
    r.integer = false, r.lo = lo, r.hi = hi, r.lo_open = open;
    return r;
  };
  static const std::map<std::string, SettingRange> m = {{"--batch-size", I(1, kMaxTrainBatch)},
                                                        {"--microbatch", I(0, kMaxTrainBatch)},
                                                        {"--seed", I(0, INT64_MAX)},
                                                        {"--lr", R(0, INFINITY, true)},
                                                        {"--lr-warmup", I(0, INT64_MAX)},
                                                        {"--lr-anneal-steps", I(0, INT64_MAX)},
                                                        {"--ema-rate", R(0, 1)},
                                                        {"--grad-clip", R(0, INFINITY)},
                                                        {"--weight-decay", R(0, INFINITY)},
                                                        {"--steps", I(1, INT64_MAX)},
                                                        {"--save-every", I(0, INT64_MAX)},
                                                        {"--log-every", I(0, INT64_MAX)},
                                                        {"--sample-every", I(0, INT64_MAX)},
                                                        {"--no-flip", I(0, 1)},
                                                        // train-classifier
                                                        {"--noised", I(0, 1)},
                                                        {"--eval-every", I(1, INT64_MAX)}};
  const auto it = m.find(flag);
  if (it == m.end()) throw std::logic_error("train_setting_range: no setting " + flag);
  return it->second;
}

namespace {
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// One setting: its flag, its state key, where it lives in TrainOptions, and whether changing it
// on resume breaks the exact continuation.
struct Setting {
  const char* flag;
  const char* key;
  enum Kind { Int, Real, Flip } kind;
  bool exact;
  int64_t TrainOptions::*i = nullptr;
  double TrainOptions::*r = nullptr;
  bool TrainOptions::*b = nullptr;  // Flip kind: a boolean other than flip
  bool classifier_only = false;     // a setting of train-classifier runs only
};

int64_t get_int(const TrainOptions& o, const Setting& s) {
  if (s.kind == Setting::Flip) return (s.b ? o.*s.b : o.flip) ? 1 : 0;
  if (s.i) return o.*s.i;
  if (std::string(s.key) == "batch_size") return o.batch_size;
  return (int64_t)o.seed;
}
void set_int(TrainOptions& o, const Setting& s, int64_t v) {
  if (s.kind == Setting::Flip)
    (s.b ? o.*s.b : o.flip) = v != 0;
  else if (s.i)
    o.*s.i = v;
  else if (std::string(s.key) == "batch_size")
    o.batch_size = (int)v;
  else
    o.seed = (uint64_t)v;
}
std::string show(const TrainOptions& o, const Setting& s) {
  if (s.kind == Setting::Real) return num(o.*s.r);
  if (s.kind == Setting::Flip && s.b) return std::string(s.key) + (o.*s.b ? " on" : " off");
  if (s.kind == Setting::Flip) return o.flip ? "flips on" : "flips off";
  return std::to_string(get_int(o, s));
}

const std::vector<Setting>& settings() {
  static const std::vector<Setting> v = [] {
    std::vector<Setting> s;
    s.push_back({"--batch-size", "batch_size", Setting::Int, true});
    s.push_back({"--seed", "seed", Setting::Int, true});
    s.push_back({"--lr", "lr", Setting::Real, true, nullptr, &TrainOptions::lr});
    s.push_back({"--lr-warmup", "lr_warmup", Setting::Int, true, &TrainOptions::lr_warmup});
    s.push_back({"--ema-rate", "ema_rate", Setting::Real, true, nullptr, &TrainOptions::ema_rate});
    s.push_back({"--grad-clip", "grad_clip", Setting::Real, true, nullptr, &TrainOptions::grad_clip});
    s.push_back(
        {"--weight-decay", "weight_decay", Setting::Real, true, nullptr, &TrainOptions::weight_decay});
    s.push_back({"--no-flip", "flip", Setting::Flip, true});
    s.push_back({"--save-every", "save_every", Setting::Int, false, &TrainOptions::save_every});
    s.push_back({"--log-every", "log_every", Setting::Int, false, &TrainOptions::log_every});
    s.push_back({"--sample-every", "sample_every", Setting::Int, false, &TrainOptions::sample_every});
    s.push_back({"--noised", "noised", Setting::Flip, true, nullptr, nullptr, &TrainOptions::noised, true});
    s.push_back({"--eval-every", "eval_every", Setting::Int, false, &TrainOptions::eval_every, nullptr,
                 nullptr, true});
    return s;
  }();
  return v;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " and " : ", ") + v[i];
  return s;
}
}  // namespace

void store_train_settings(const TrainOptions& o, const DatasetInfo& data, Checkpoint& c) {
  for (const Setting& s : settings()) {
    if (s.classifier_only && !c.is_classifier) continue;
    if (s.kind == Setting::Real)
      c.state_f64[s.key] = o.*s.r;
    else
      c.state[s.key] = get_int(o, s);
  }
  c.state["steps"] = o.steps;
  c.state_str["schedule_sampler"] = o.schedule_sampler;
  c.state["microbatch"] = o.microbatch;
  c.state["lr_anneal_steps"] = o.lr_anneal_steps;
  c.state["dataset_count"] = data.count;
  c.state["dataset_image_size"] = data.image_size;
  if (o.dataset_fingerprint) c.state["dataset_fingerprint"] = (int64_t)o.dataset_fingerprint;
}

ResumeSettings resolve_resume(const Checkpoint& ck, const std::string& ckpt_path, const TrainOptions& given,
                              const std::set<std::string>& explicit_flags) {
  ResumeSettings r;
  r.opt = given;
  std::vector<std::string> changed, missing;
  for (const Setting& s : settings()) {
    if (s.classifier_only && !ck.is_classifier) continue;
    const bool is_explicit = explicit_flags.count(s.flag) > 0;
    const bool real = s.kind == Setting::Real;
    bool have = real ? ck.state_f64.count(s.key) > 0 : ck.state.count(s.key) > 0;
    TrainOptions rec = given;  // the recorded value, in an options struct for uniform access
    std::string where = std::string("state attribute ") + s.key;
    if (have) {
      if (real)
        rec.*s.r = ck.state_f64.at(s.key);
      else
        set_int(rec, s, ck.state.at(s.key));
    } else if (ck.has_optimizer && (std::string(s.key) == "lr" || std::string(s.key) == "weight_decay")) {
      // Older checkpoints: the optimizer group has always recorded these two.
      rec.*s.r = std::string(s.key) == "lr" ? ck.opt.lr : ck.opt.weight_decay;
      where = std::string("optimizer attribute ") + s.key;
      have = true;
    }
    // A recorded value the flag could not have given (a damaged or hand-edited checkpoint) is
    // refused, unless the flag replaces it.
    if (have && !is_explicit && s.kind != Setting::Flip) {
      const SettingRange range = train_setting_range(s.flag);
      const bool ok = real ? range.contains(rec.*s.r) : range.contains_int(ck.state.at(s.key));
      if (!ok)
        throw UserError(ckpt_path + ": " + where + " = " +
                        (real ? num(rec.*s.r) : std::to_string(ck.state.at(s.key))) + " is not " +
                        range.text() + " (" + s.flag + "'s range); give " + s.flag + " to replace it");
    }
    if (!have) {
      if (s.exact && !is_explicit) missing.push_back(s.flag);
      continue;  // keep the flag's value (or its default)
    }
    if (is_explicit) {
      const bool differs = real ? rec.*s.r != given.*s.r : get_int(rec, s) != get_int(given, s);
      if (differs && s.exact)
        changed.push_back(s.kind == Setting::Flip ? show(given, s) + " (checkpoint: " + show(rec, s) + ")"
                                                  : std::string(s.flag) + " " + show(given, s) +
                                                        " (checkpoint: " + show(rec, s) + ")");
      continue;
    }
    if (real)
      r.opt.*s.r = rec.*s.r;
    else
      set_int(r.opt, s, get_int(rec, s));
  }
  // The stopping step: a target still ahead of the checkpoint carries over; a reached one does not
  // (a finished run resumed without --steps trains on until interrupted, as before).
  const int64_t at = ck.state.count("step") ? ck.state.at("step") : 0;
  if (at < 0 || at == INT64_MAX)
    throw UserError(ckpt_path + ": state attribute step = " + std::to_string(at) + " is not a training step");
  if (!explicit_flags.count("--steps") && ck.state.count("steps") && ck.state.at("steps") > at)
    r.opt.steps = ck.state.at("steps");
  // Not recorded: written when uniform was the only sampler.
  const std::string ss =
      ck.state_str.count("schedule_sampler") ? ck.state_str.at("schedule_sampler") : "uniform";
  if (ss != "uniform" && ss != "loss-second-moment")
    throw UserError(ckpt_path + ": trained with schedule sampler '" + ss +
                    "', which this unet cannot continue (it has uniform and loss-second-moment)");
  if (!explicit_flags.count("--schedule-sampler"))
    r.opt.schedule_sampler = ss;
  else if (given.schedule_sampler != ss)
    changed.push_back("--schedule-sampler " + given.schedule_sampler + " (checkpoint: " + ss + ")");
  // Settings newer than some checkpoints, 0 where not recorded: microbatch (written before
  // micro-batches: whole batches), lr_anneal_steps (before the learning rate could anneal: none).
  auto newer = [&](const char* flag, const char* key, int64_t TrainOptions::*field) {
    const int64_t v = ck.state.count(key) ? ck.state.at(key) : 0;
    const SettingRange range = train_setting_range(flag);
    if (!explicit_flags.count(flag) && !range.contains_int(v))
      throw UserError(ckpt_path + ": state attribute " + key + " = " + std::to_string(v) + " is not " +
                      range.text() + " (" + flag + "'s range); give " + flag + " to replace it");
    if (!explicit_flags.count(flag))
      r.opt.*field = v;
    else if (given.*field != v)
      changed.push_back(std::string(flag) + " " + std::to_string(given.*field) + " (checkpoint: " +
                        std::to_string(v) + ")");
  };
  newer("--microbatch", "microbatch", &TrainOptions::microbatch);
  newer("--lr-anneal-steps", "lr_anneal_steps", &TrainOptions::lr_anneal_steps);
  // The class dropout of classifier-free guidance is the checkpoint's root attribute class_dropout
  // (absent: 0, no dropout), which every save writes with the rate trained at.
  const double cd = ck.cfg.class_dropout;
  if (!explicit_flags.count("--class-dropout"))
    r.opt.class_dropout = cd;
  else if (given.class_dropout != cd)
    changed.push_back("--class-dropout " + num(given.class_dropout) + " (checkpoint: " + num(cd) + ")");
  // The loss-second-moment history the run continues from must fit the model (checked here, before
  // anything is printed or written, not when the trainer restores it).
  if (r.opt.schedule_sampler == "loss-second-moment" && !ck.loss_counts.empty())
    LossSecondMomentResampler(ck.cfg.diffusion_steps).load(ck.loss_history, ck.loss_counts, ckpt_path);
  if (!changed.empty())
    r.warnings.push_back("resuming with " + join(changed) +
                         ": the run will not continue exactly as it would have uninterrupted");
  if (!missing.empty())
    r.warnings.push_back(ckpt_path + " does not record " + join(missing) +
                         " (written by an older unet); using the flags or their defaults");
  return r;
}

void check_resume_dataset(const Checkpoint& ck, const std::string& ckpt_path, const std::string& data_path,
                          const DatasetInfo& info, uint64_t fingerprint) {
  auto refuse = [&](const std::string& why) {
    throw UserError(data_path + ": not the dataset " + ckpt_path + " was trained on (" + why +
                    "); resume with that dataset, or start a new run from the weights with --init");
  };
  if (ck.state.count("dataset_count") && ck.state.at("dataset_count") != info.count)
    refuse(std::to_string(info.count) + " images, the run's had " +
           std::to_string(ck.state.at("dataset_count")));
  if (ck.state.count("dataset_image_size") && ck.state.at("dataset_image_size") != info.image_size)
    refuse(std::to_string(info.image_size) + "x" + std::to_string(info.image_size) +
           " images, the run's were " + std::to_string(ck.state.at("dataset_image_size")));
  if (ck.state.count("dataset_fingerprint") && (uint64_t)ck.state.at("dataset_fingerprint") != fingerprint)
    refuse("same size, different images or labels");
}

}  // namespace unet
