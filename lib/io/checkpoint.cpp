#include "checkpoint.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>

#include "util.h"

namespace unet {

namespace {
constexpr const char* kFormat = "unet-checkpoint";
constexpr const char* kClassifierFormat = "unet-classifier";
constexpr int64_t kVersion = 1;

std::string shape_str(const std::vector<hsize_t>& v) {
  if (v.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s;
}

std::vector<hsize_t> to_hsize(const std::vector<int64_t>& v) {
  return std::vector<hsize_t>(v.begin(), v.end());
}

std::vector<int64_t> to_i64(const std::vector<int>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

// The float as the shortest decimal that reads back to it, as a double: 0.1f is stored as 0.1,
// not 0.10000000149011612, so Python sees the value the user typed.
double shortest_double(float x) {
  char buf[32];
  for (int prec = 6; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, (double)x);
    if (std::strtof(buf, nullptr) == x) return std::strtod(buf, nullptr);
  }
  return x;
}

void check_arena(const std::vector<float>& a, const ParamTable& t, const char* what) {
  if (a.size() != t.total)
    throw std::invalid_argument(std::string("save_checkpoint: ") + what + " arena has " +
                                std::to_string(a.size()) + " floats, expected " + std::to_string(t.total));
}

// Attribute readers with checkpoint-specific messages: "<file>: missing attribute 'x'".
struct AttrReader {
  h5::File& f;
  const std::string& obj;
  void need(const std::string& name) const {
    if (!h5::has_attr(f, obj, name))
      throw UserError(f.path() + ": missing attribute '" + name + "'" + (obj == "/" ? "" : " on " + obj) +
                      " (not a complete unet checkpoint)");
  }
  int64_t i64(const std::string& name) const {
    need(name);
    return h5::get_attr_i64(f, obj, name);
  }
  int i32(const std::string& name) const {
    int64_t v = i64(name);
    if (v < INT32_MIN || v > INT32_MAX)
      throw UserError(f.path() + ": attribute '" + name + "' is out of range");
    return (int)v;
  }
  // int64 0/1 as written here; also h5py's numpy.bool_ (an HDF5 enum over int8), which a
  // hand-edited checkpoint may hold and which HDF5 will not convert to an integer.
  bool flag(const std::string& name) const {
    need(name);
    {
      std::lock_guard<std::recursive_mutex> lock(h5::mutex());
      h5::Handle a(H5Aopen_by_name(f.id(), obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      h5::Handle type(a.valid() ? H5Aget_type(a.get()) : -1, H5Tclose);
      h5::Handle space(a.valid() ? H5Aget_space(a.get()) : -1, H5Sclose);
      if (type.valid() && space.valid() && H5Tget_class(type.get()) == H5T_ENUM &&
          H5Tget_size(type.get()) == 1 && H5Sget_simple_extent_npoints(space.get()) == 1) {
        int8_t v = 0;
        if (H5Aread(a.get(), type.get(), &v) < 0)
          throw UserError(f.path() + ": cannot read attribute '" + name + "'");
        return v != 0;
      }
    }
    return i64(name) != 0;
  }
  double f64(const std::string& name) const {
    need(name);
    return h5::get_attr_f64(f, obj, name);
  }
  std::string str(const std::string& name) const {
    need(name);
    return h5::get_attr_str(f, obj, name);
  }
  std::vector<int> ints(const std::string& name) const {
    need(name);
    std::vector<int> out;
    for (int64_t v : h5::get_attr_i64v(f, obj, name)) {
      if (v < INT32_MIN || v > INT32_MAX)
        throw UserError(f.path() + ": attribute '" + name + "' is out of range");
      out.push_back((int)v);
    }
    return out;
  }
};
}  // namespace

void write_config(h5::File& f, const ModelConfig& c, const std::string& obj) {
  h5::set_attr(f, obj, "format", kFormat);
  h5::set_attr(f, obj, "version", kVersion);
  h5::set_attr(f, obj, "image_size", c.image_size);
  h5::set_attr(f, obj, "in_channels", c.in_channels);
  h5::set_attr(f, obj, "num_channels", c.num_channels);
  // int64 as always when every multiplier is whole; float64 only when one is fractional (512x512).
  bool whole = true;
  for (double m : c.channel_mult) whole &= m == (double)(int64_t)m;
  if (whole)
    h5::set_attr(f, obj, "channel_mult", std::vector<int64_t>(c.channel_mult.begin(), c.channel_mult.end()));
  else
    h5::set_attr(f, obj, "channel_mult", c.channel_mult);
  h5::set_attr(f, obj, "num_res_blocks", c.num_res_blocks);
  h5::set_attr(f, obj, "attention_resolutions", to_i64(c.attention_resolutions));
  h5::set_attr(f, obj, "num_heads", c.num_heads);
  h5::set_attr(f, obj, "num_head_channels", c.num_head_channels);
  h5::set_attr(f, obj, "use_new_attention_order", c.use_new_attention_order);
  h5::set_attr(f, obj, "use_scale_shift_norm", c.use_scale_shift_norm);
  h5::set_attr(f, obj, "resblock_updown", c.resblock_updown);
  h5::set_attr(f, obj, "learn_sigma", c.learn_sigma);
  h5::set_attr(f, obj, "class_cond", c.class_cond);
  h5::set_attr(f, obj, "num_classes", c.num_classes);
  h5::set_attr(f, obj, "dropout", shortest_double(c.dropout));
  h5::set_attr(f, obj, "diffusion_steps", c.diffusion_steps);
  h5::set_attr(f, obj, "noise_schedule", c.noise_schedule);
  h5::set_attr(f, obj, "use_kl", c.use_kl);
  h5::set_attr(f, obj, "predict_xstart", c.predict_xstart);
  h5::set_attr(f, obj, "rescale_learned_sigmas", c.rescale_learned_sigmas);
  h5::set_attr(f, obj, "rescale_timesteps", c.rescale_timesteps);
  // Classifier-free guidance, only where there is a null class: a checkpoint without one stays
  // attribute for attribute what it was (and guided-diffusion-shaped).
  if (c.null_class) {
    h5::set_attr(f, obj, "null_class", c.null_class);
    h5::set_attr(f, obj, "class_dropout", c.class_dropout);
  }
}

ModelConfig read_config(h5::File& f, const std::string& obj) {
  AttrReader a{f, obj};
  if (!h5::has_attr(f, obj, "format"))
    throw UserError(f.path() + ": not a unet checkpoint (no 'format' attribute)");
  std::string fmt = h5::get_attr_str(f, obj, "format");
  if (fmt == kClassifierFormat)
    throw UserError(f.path() + ": is a classifier checkpoint (format '" + fmt +
                    "'), not a diffusion model (classifiers guide `unet sample --classifier`)");
  if (fmt != kFormat) throw UserError(f.path() + ": not a unet checkpoint (format is '" + fmt + "')");
  int64_t ver = a.i64("version");
  if (ver != kVersion)
    throw UserError(f.path() + ": checkpoint version " + std::to_string(ver) +
                    " is not supported (this unet reads " + std::to_string(kVersion) + ")");
  ModelConfig c;
  c.image_size = a.i32("image_size");
  c.in_channels = a.i32("in_channels");
  c.num_channels = a.i32("num_channels");
  a.need("channel_mult");
  c.channel_mult = h5::get_attr_f64v(f, obj, "channel_mult");  // int64 or float64
  c.num_res_blocks = a.i32("num_res_blocks");
  c.attention_resolutions = a.ints("attention_resolutions");
  c.num_heads = a.i32("num_heads");
  c.num_head_channels = a.i32("num_head_channels");
  c.use_new_attention_order = a.flag("use_new_attention_order");
  c.use_scale_shift_norm = a.flag("use_scale_shift_norm");
  c.resblock_updown = a.flag("resblock_updown");
  c.learn_sigma = a.flag("learn_sigma");
  c.class_cond = a.flag("class_cond");
  c.num_classes = a.i32("num_classes");
  c.dropout = (float)a.f64("dropout");
  c.diffusion_steps = a.i32("diffusion_steps");
  c.noise_schedule = a.str("noise_schedule");
  // The objective's flags: absent in checkpoints written before they existed (and in files
  // written by other tools), which all trained guided-diffusion's defaults: false.
  const std::pair<const char*, bool ModelConfig::*> objective[] = {
      {"use_kl", &ModelConfig::use_kl},
      {"predict_xstart", &ModelConfig::predict_xstart},
      {"rescale_learned_sigmas", &ModelConfig::rescale_learned_sigmas},
      {"rescale_timesteps", &ModelConfig::rescale_timesteps}};
  for (const auto& [name, field] : objective) c.*field = h5::has_attr(f, obj, name) && a.flag(name);
  // Classifier-free guidance: absent = no null class, no class dropout.
  c.null_class = h5::has_attr(f, obj, "null_class") && a.flag("null_class");
  if (h5::has_attr(f, obj, "class_dropout")) c.class_dropout = a.f64("class_dropout");
  std::string err = c.validate(/*attr_names=*/true);
  if (!err.empty()) throw UserError(f.path() + ": invalid model configuration: " + err);
  return c;
}

void write_classifier_config(h5::File& f, const ClassifierConfig& c, const std::string& obj) {
  h5::set_attr(f, obj, "format", kClassifierFormat);
  h5::set_attr(f, obj, "version", kVersion);
  h5::set_attr(f, obj, "image_size", c.image_size);
  h5::set_attr(f, obj, "in_channels", c.in_channels);
  h5::set_attr(f, obj, "classifier_width", c.width);
  h5::set_attr(f, obj, "classifier_depth", c.depth);
  const std::vector<double> mult = c.mult();  // stored resolved: the file describes itself
  bool whole = true;
  for (double m : mult) whole &= m == (double)(int64_t)m;
  if (whole)
    h5::set_attr(f, obj, "classifier_channel_mult", std::vector<int64_t>(mult.begin(), mult.end()));
  else
    h5::set_attr(f, obj, "classifier_channel_mult", mult);
  h5::set_attr(f, obj, "classifier_attention_resolutions", to_i64(c.attention_resolutions));
  h5::set_attr(f, obj, "classifier_use_scale_shift_norm", c.use_scale_shift_norm);
  h5::set_attr(f, obj, "classifier_resblock_updown", c.resblock_updown);
  h5::set_attr(f, obj, "classifier_pool", c.pool);
  h5::set_attr(f, obj, "classifier_num_head_channels", c.num_head_channels);
  h5::set_attr(f, obj, "num_classes", c.num_classes);
  h5::set_attr(f, obj, "diffusion_steps", c.diffusion_steps);
  h5::set_attr(f, obj, "noise_schedule", c.noise_schedule);
}

ClassifierConfig read_classifier_config(h5::File& f, const std::string& obj) {
  AttrReader a{f, obj};
  if (!h5::has_attr(f, obj, "format"))
    throw UserError(f.path() + ": not a unet classifier checkpoint (no 'format' attribute)");
  const std::string fmt = h5::get_attr_str(f, obj, "format");
  if (fmt == kFormat)
    throw UserError(f.path() + ": is a diffusion model checkpoint (format '" + fmt + "'), not a classifier");
  if (fmt != kClassifierFormat)
    throw UserError(f.path() + ": not a unet classifier checkpoint (format is '" + fmt + "')");
  const int64_t ver = a.i64("version");
  if (ver != kVersion)
    throw UserError(f.path() + ": classifier checkpoint version " + std::to_string(ver) +
                    " is not supported (this unet reads " + std::to_string(kVersion) + ")");
  ClassifierConfig c;  // guided-diffusion's values where an attribute may be left out
  c.image_size = a.i32("image_size");
  c.width = a.i32("classifier_width");
  c.depth = a.i32("classifier_depth");
  c.attention_resolutions = a.ints("classifier_attention_resolutions");
  c.use_scale_shift_norm = a.flag("classifier_use_scale_shift_norm");
  c.resblock_updown = a.flag("classifier_resblock_updown");
  c.pool = a.str("classifier_pool");
  auto has = [&](const char* n) { return h5::has_attr(f, obj, n); };
  if (has("in_channels")) c.in_channels = a.i32("in_channels");
  if (has("classifier_channel_mult")) c.channel_mult = h5::get_attr_f64v(f, obj, "classifier_channel_mult");
  if (has("classifier_num_head_channels")) c.num_head_channels = a.i32("classifier_num_head_channels");
  if (has("num_classes")) c.num_classes = a.i32("num_classes");
  if (has("diffusion_steps")) c.diffusion_steps = a.i32("diffusion_steps");
  if (has("noise_schedule")) c.noise_schedule = a.str("noise_schedule");
  const std::string err = c.validate(/*attr_names=*/true);
  if (!err.empty()) throw UserError(f.path() + ": invalid classifier configuration: " + err);
  return c;
}

std::vector<float> read_param_group(h5::File& f, const std::string& group, const ParamTable& t) {
  if (!h5::is_group(f, group)) throw UserError(f.path() + ": no '" + group + "' group");
  // Extra tensors first: a checkpoint of another configuration is reported as such, not as a
  // missing tensor somewhere in the middle.
  std::set<std::string> known;
  for (auto& p : t.params) known.insert(p.name);
  for (auto& name : h5::list(f, group))
    if (!known.count(name))
      throw UserError(f.path() + ": unexpected tensor " + group + "/" + name +
                      " (not a parameter of the configuration in the file's attributes)");
  std::vector<float> arena(t.total, 0.0f), tmp;
  for (auto& p : t.params) {
    const std::string path = group + "/" + p.name;
    if (!h5::is_dataset(f, path)) throw UserError(f.path() + ": " + path + " is missing");
    auto dt = h5::dtype(f, path);
    if (dt != h5::DType::F32 && dt != h5::DType::F64)
      throw UserError(f.path() + ": " + path + " has type " + h5::dtype_name(dt) + ", expected float32");
    auto shp = h5::shape(f, path);
    auto want = to_hsize(p.shape);
    if (shp != want)
      throw UserError(f.path() + ": " + path + " has shape " + shape_str(shp) + ", expected " +
                      shape_str(want));
    tmp.resize(p.numel);
    h5::read_f32_into(f, path, tmp.data(), tmp.size());
    torch_to_engine(p, tmp.data(), arena.data() + p.offset);
  }
  return arena;
}

void write_param_group(h5::File& f, const std::string& group, const ParamTable& t,
                       const std::vector<float>& arena) {
  if (arena.size() != t.total)
    throw std::invalid_argument("write_param_group: " + group + " arena has " + std::to_string(arena.size()) +
                                " floats, expected " + std::to_string(t.total));
  h5::create_group(f, group);
  std::vector<float> tmp;
  for (auto& p : t.params) {
    tmp.resize(p.numel);
    engine_to_torch(p, arena.data() + p.offset, tmp.data());
    h5::write_f32(f, group + "/" + p.name, tmp.data(), to_hsize(p.shape));
  }
}

ParamTable Checkpoint::table() const {
  return is_classifier ? build_param_table(ccfg) : build_param_table(cfg);
}

void save_checkpoint(const std::string& path, const Checkpoint& ck) {
  std::string err = ck.is_classifier ? ck.ccfg.validate() : ck.cfg.validate();
  if (!err.empty()) throw std::invalid_argument("save_checkpoint: invalid configuration: " + err);
  const ParamTable t = ck.table();
  check_arena(ck.model, t, "model");
  if (!ck.ema.empty()) check_arena(ck.ema, t, "ema");
  if (ck.has_optimizer) {
    check_arena(ck.opt.m, t, "optimizer m");
    check_arena(ck.opt.v, t, "optimizer v");
  }
  AtomicFile out(path);  // checks the directory; removes the temporary unless committed
  {
    h5::File f = h5::File::create(out.tmp_path(), path);
    if (ck.is_classifier)
      write_classifier_config(f, ck.ccfg);
    else
      write_config(f, ck.cfg);
    write_param_group(f, "model", t, ck.model);
    if (!ck.ema.empty()) write_param_group(f, "ema", t, ck.ema);
    if (ck.has_optimizer) {
      write_param_group(f, "optimizer/m", t, ck.opt.m);
      write_param_group(f, "optimizer/v", t, ck.opt.v);
      h5::set_attr(f, "optimizer", "step", ck.opt.step);
      h5::set_attr(f, "optimizer", "lr", ck.opt.lr);
      h5::set_attr(f, "optimizer", "beta1", ck.opt.beta1);
      h5::set_attr(f, "optimizer", "beta2", ck.opt.beta2);
      h5::set_attr(f, "optimizer", "eps", ck.opt.eps);
      h5::set_attr(f, "optimizer", "weight_decay", ck.opt.weight_decay);
    }
    if (!ck.state.empty() || !ck.state_f64.empty() || !ck.state_str.empty()) {
      h5::create_group(f, "state");
      for (auto& [k, v] : ck.state) h5::set_attr(f, "state", k, v);
      for (auto& [k, v] : ck.state_f64) h5::set_attr(f, "state", k, v);
      for (auto& [k, v] : ck.state_str) h5::set_attr(f, "state", k, v);
    }
    if (!ck.loss_counts.empty()) {
      const hsize_t T = ck.loss_counts.size();
      if (ck.loss_history.size() % T != 0)
        throw std::invalid_argument("save_checkpoint: loss_history is not [T, history]");
      h5::create_group(f, "state");
      h5::write(f, "state/loss_history", h5::DType::F64, ck.loss_history.data(),
                {T, (hsize_t)(ck.loss_history.size() / T)});
      h5::write_i64(f, "state/loss_counts", ck.loss_counts.data(), {T});
    }
    f.close();  // surfaces flush errors (disk full) before the rename
  }
  out.commit();
}

std::string nonfinite_tensor(const ParamTable& t, const std::vector<float>& arena, const std::string& group) {
  for (auto& p : t.params)
    for (size_t i = 0; i < p.numel && p.offset + i < arena.size(); ++i) {
      const float v = arena[p.offset + i];
      if (!std::isfinite(v)) return group + "/" + p.name + (std::isnan(v) ? " (NaN)" : " (Inf)");
    }
  return "";
}

void check_model_size(const ParamTable& t, int copies, const std::string& what) {
  // Kernels index one arena with 32-bit offsets in places; 2^31 floats is also 8 GB per copy.
  if (t.total > (size_t)INT32_MAX)
    throw UserError(what + ": the model has " + std::to_string(t.count / 1000000) +
                    " M parameters; at most 2147 M are supported");
  check_memory((double)t.total * sizeof(float) * copies,
               what + ": the model (" + std::to_string(t.count / 1000000) + " M parameters)");
}

namespace {
Checkpoint load_any(const std::string& path, bool need_optimizer, bool classifier) {
  h5::File f = h5::File::open(path);
  Checkpoint ck;
  ck.is_classifier = classifier;
  if (classifier)
    ck.ccfg = read_classifier_config(f);
  else
    ck.cfg = read_config(f);
  const ParamTable t = ck.table();
  if (!h5::is_group(f, "model"))
    throw UserError(path + ": no 'model' group (not a complete unet checkpoint)");
  const bool has_ema = h5::exists(f, "ema");
  // model (+ ema) (+ m, v), plus the largest tensor in flight: refuse before allocating any.
  check_model_size(t, 1 + has_ema + (need_optimizer ? 2 : 0) + 1, path);
  auto finite = [&](const std::vector<float>& arena, const char* group) {
    const std::string bad = nonfinite_tensor(t, arena, group);
    if (!bad.empty())
      throw UserError(path + ": " + bad.substr(0, bad.find(' ')) + " holds non-finite values" +
                      bad.substr(bad.find(' ')) + "; the checkpoint is unusable");
  };
  ck.model = read_param_group(f, "model", t);
  finite(ck.model, "model");
  if (has_ema) {
    ck.ema = read_param_group(f, "ema", t);
    finite(ck.ema, "ema");
  }
  if (need_optimizer) {
    if (!h5::is_group(f, "optimizer"))
      throw UserError(path + ": has no optimizer state (it cannot be resumed)");
    AttrReader a{f, "optimizer"};
    ck.opt.step = a.i64("step");
    ck.opt.lr = a.f64("lr");
    ck.opt.beta1 = a.f64("beta1");
    ck.opt.beta2 = a.f64("beta2");
    ck.opt.eps = a.f64("eps");
    ck.opt.weight_decay = a.f64("weight_decay");
    ck.opt.m = read_param_group(f, "optimizer/m", t);
    finite(ck.opt.m, "optimizer/m");
    ck.opt.v = read_param_group(f, "optimizer/v", t);
    finite(ck.opt.v, "optimizer/v");
    ck.has_optimizer = true;
  }
  if (h5::is_group(f, "state"))
    for (auto& name : h5::list_attrs(f, "state")) {
      const h5::DType dt = h5::attr_dtype(f, "state", name);
      if (dt == h5::DType::F32 || dt == h5::DType::F64)
        ck.state_f64[name] = h5::get_attr_f64(f, "state", name);
      else if (dt == h5::DType::Str)
        ck.state_str[name] = h5::get_attr_str(f, "state", name);
      else
        ck.state[name] = h5::get_attr_i64(f, "state", name);
    }
  if (h5::is_dataset(f, "state/loss_counts") || h5::is_dataset(f, "state/loss_history")) {
    const hsize_t T = (hsize_t)(classifier ? ck.ccfg.diffusion_steps : ck.cfg.diffusion_steps);
    const std::vector<hsize_t> hs =
        h5::is_dataset(f, "state/loss_history") ? h5::shape(f, "state/loss_history") : std::vector<hsize_t>{};
    const std::vector<hsize_t> cs =
        h5::is_dataset(f, "state/loss_counts") ? h5::shape(f, "state/loss_counts") : std::vector<hsize_t>{};
    if (hs.size() != 2 || hs[0] != T || hs[1] < 1 || hs[1] > 1000 || cs != std::vector<hsize_t>{T})
      throw UserError(path + ": state/loss_history and state/loss_counts must be [" + std::to_string(T) +
                      ", 10] and [" + std::to_string(T) + "] (the loss-second-moment sampler's history)");
    ck.loss_history.resize(T * hs[1]);
    ck.loss_counts.resize(T);
    h5::read(f, "state/loss_history", h5::DType::F64, ck.loss_history.data(), ck.loss_history.size());
    h5::read(f, "state/loss_counts", h5::DType::I64, ck.loss_counts.data(), ck.loss_counts.size());
  }
  return ck;
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path, bool need_optimizer) {
  return load_any(path, need_optimizer, false);
}

Checkpoint load_classifier_checkpoint(const std::string& path, bool need_optimizer) {
  return load_any(path, need_optimizer, true);
}

std::string checkpoint_format(const std::string& path) {
  h5::File f = h5::File::open(path);
  return h5::has_attr(f, "/", "format") ? h5::get_attr_str(f, "/", "format") : "";
}

ModelConfig read_checkpoint_config(const std::string& path) {
  h5::File f = h5::File::open(path);
  return read_config(f);
}

}  // namespace unet
