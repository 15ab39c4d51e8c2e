#include "config.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "util.h"

namespace unet {

namespace {
// guided-diffusion's model_and_diffusion_defaults() where they differ from ours, plus the flags
// every released model's MODEL_FLAGS share (guided-diffusion README), and create_model's
// channel_mult for the image size.
ModelConfig released(int image_size) {
  ModelConfig c;
  c.image_size = image_size;
  c.num_channels = 256;
  c.num_res_blocks = 2;
  c.attention_resolutions = {32, 16, 8};
  c.num_heads = 4;
  c.num_head_channels = -1;
  c.use_new_attention_order = false;
  c.use_scale_shift_norm = true;
  c.resblock_updown = true;
  c.learn_sigma = true;
  c.num_classes = 1000;
  c.diffusion_steps = 1000;
  c.noise_schedule = "linear";
  if (image_size == 512) c.channel_mult = {0.5, 1, 1, 2, 2, 4, 4};
  if (image_size == 256) c.channel_mult = {1, 1, 2, 2, 4, 4};
  if (image_size == 128) c.channel_mult = {1, 1, 2, 3, 4};
  if (image_size == 64) c.channel_mult = {1, 2, 3, 4};
  return c;
}
}  // namespace

ModelConfig preset(const std::string& name) {
  ModelConfig c;  // defaults are seed64
  if (name == "seed64") return c;
  if (name == "tiny32") {
    c.image_size = 32;
    c.num_channels = 32;
    c.channel_mult = {1, 2};
    c.num_res_blocks = 1;
    c.attention_resolutions = {16};
    c.num_head_channels = 16;
    return c;
  }
  // OpenAI's released models: the MODEL_FLAGS of guided-diffusion's README (use_fp16 is a
  // run-time precision there, not part of the model).
  if (name == "imagenet64") {
    c = released(64);
    c.num_channels = 192;
    c.num_res_blocks = 3;
    c.num_head_channels = 64;
    c.use_new_attention_order = true;
    c.class_cond = true;
    c.dropout = 0.1f;
    c.noise_schedule = "cosine";
    return c;
  }
  if (name == "imagenet128") {
    c = released(128);  // 4 heads of any width, legacy attention order
    c.class_cond = true;
    return c;
  }
  if (name == "imagenet256" || name == "imagenet256-uncond" || name == "imagenet512") {
    c = released(name == "imagenet512" ? 512 : 256);
    c.num_head_channels = 64;
    c.class_cond = name != "imagenet256-uncond";
    return c;
  }
  if (name == "lsun256") {  // bedroom, cat and horse
    c = released(256);
    c.num_head_channels = 64;
    c.dropout = 0.1f;
    return c;
  }
  std::string names;
  for (auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw UserError("unknown preset '" + name + "' (choose " + names + ")");
}

std::vector<std::string> preset_names() {
  return {"seed64",      "tiny32", "imagenet64", "imagenet128", "imagenet256", "imagenet256-uncond",
          "imagenet512", "lsun256"};
}

std::vector<int> parse_int_list(const std::string& s, const std::string& what) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      int v = std::stoi(item, &pos);
      if (pos != item.size()) throw std::invalid_argument("trailing");
      out.push_back(v);
    } catch (const std::exception&) {
      throw UserError(what + ": '" + s + "' is not a comma-separated list of integers");
    }
  }
  if (out.empty()) throw UserError(what + ": empty list");
  return out;
}

std::string format_int_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::vector<double> parse_mult_list(const std::string& s, const std::string& what) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    double v = item.empty() ? 0 : std::strtod(item.c_str(), &end);
    if (item.empty() || *end || !std::isfinite(v))
      throw UserError(what + ": '" + s + "' is not a comma-separated list of numbers");
    out.push_back(v);
  }
  if (out.empty()) throw UserError(what + ": empty list");
  return out;
}

std::string format_mult_list(const std::vector<double>& v) {
  std::string s;
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.17g", v[i]);
    for (int prec = 1; prec < 17; ++prec) {  // shortest form that reads back exactly: 0.5, not 0.50000...
      char b[32];
      std::snprintf(b, sizeof b, "%.*g", prec, v[i]);
      if (std::strtod(b, nullptr) == v[i]) {
        std::snprintf(buf, sizeof buf, "%s", b);
        break;
      }
    }
    s += (i ? "," : "") + std::string(buf);
  }
  return s;
}

std::string ModelConfig::validate(bool attr_names) const {
  // Sizes are bounded first (checkpoint attributes are untrusted input), so nothing below can
  // overflow and nothing built from a valid configuration can hang; memory is checked elsewhere.
  // Flag names for the command line, attribute names for a checkpoint's root attributes.
  auto nm = [attr_names](const char* flag) {
    std::string n = flag;
    if (!attr_names) return n;
    n = n.substr(2);
    for (char& c : n)
      if (c == '-') c = '_';
    return n;
  };
  auto bad = [](const std::string& s) { return s; };
  auto range = [&](const char* flag, long long v, long long lo, long long hi) {
    if (v >= lo && v <= hi) return std::string();
    return nm(flag) + " " + std::to_string(v) + " is out of range (" + std::to_string(lo) + " to " +
           std::to_string(hi) + ")";
  };
  const ModelLimits& L = kModelLimits;
  for (const std::string& e : {range("--image-size", image_size, 1, L.image_size),
                               range("--in-channels", in_channels, 1, L.in_channels),
                               range("--num-channels", num_channels, 1, L.num_channels),
                               range("--num-res-blocks", num_res_blocks, 1, L.num_res_blocks),
                               range("--diffusion-steps", diffusion_steps, 2, L.diffusion_steps)})
    if (!e.empty()) return e;
  if (channel_mult.empty()) return bad(nm("--channel-mult") + " is empty");
  if ((int)channel_mult.size() > L.levels)
    return bad(nm("--channel-mult") + " has " + std::to_string(channel_mult.size()) + " levels (at most " +
               std::to_string(L.levels) + ")");
  for (size_t l = 0; l < channel_mult.size(); ++l) {
    const double m = channel_mult[l];
    if (!(m > 0)) return bad(nm("--channel-mult") + " values must be positive");
    // Fractional multipliers are fine as long as int(m * num_channels) is a usable channel count.
    if (!(m * num_channels >= 1) || m * num_channels > L.channels)
      return bad("channels " + format_mult_list({m * num_channels}) + " (" + nm("--num-channels") + " " +
                 std::to_string(num_channels) + " x mult " + format_mult_list({m}) +
                 ") are out of range (1 to " + std::to_string(L.channels) + ")");
    if (level_channels(l) % 32 != 0)
      return bad("channels " + std::to_string(level_channels(l)) + " (num_channels " +
                 std::to_string(num_channels) + " x mult " + format_mult_list({m}) +
                 ") are not divisible by GroupNorm's 32 groups");
  }
  const int levels = (int)channel_mult.size();
  if (image_size % (1 << (levels - 1)) != 0)
    return bad(nm("--image-size") + " " + std::to_string(image_size) + " is not divisible by 2^" +
               std::to_string(levels - 1) + " (" + std::to_string(levels) + " levels in " +
               nm("--channel-mult") + ")");
  if ((int)attention_resolutions.size() > L.levels)
    return bad(nm("--attention-resolutions") + " lists " + std::to_string(attention_resolutions.size()) +
               " sizes (at most " + std::to_string(L.levels) + ")");
  for (int r : attention_resolutions) {
    bool ok = false;
    for (int l = 0; l < levels; ++l) ok |= (image_size >> l) == r && (image_size % (1 << l)) == 0;
    if (!ok)
      return bad(nm("--attention-resolutions") + " " + std::to_string(r) +
                 " is not a feature-map size of this model (sizes are " + std::to_string(image_size) +
                 " halved per level)");
  }
  if (num_head_channels == 0 || num_head_channels < -1)
    return bad(nm("--num-head-channels") + " must be positive or -1");
  if (num_head_channels > L.channels) return range("--num-head-channels", num_head_channels, -1, L.channels);
  if (num_head_channels == -1 && num_heads < 1) return bad(nm("--num-heads") + " must be positive");
  if (num_heads > L.channels) return range("--num-heads", num_heads, 1, L.channels);
  // Attention runs at the listed resolutions and in the middle block (deepest level).
  for (int l = 0; l < levels; ++l) {
    int res = image_size >> l, ch = level_channels(l);
    bool attn = l == levels - 1;
    for (int r : attention_resolutions) attn |= r == res;
    if (!attn) continue;
    if (num_head_channels != -1 && ch % num_head_channels != 0)
      return bad(nm("--num-head-channels") + " " + std::to_string(num_head_channels) + " does not divide " +
                 std::to_string(ch) + " attention channels");
    if (num_head_channels == -1 && ch % num_heads != 0)
      return bad(nm("--num-heads") + " " + std::to_string(num_heads) + " does not divide " +
                 std::to_string(ch) + " attention channels");
  }
  if (class_cond && num_classes < 1) return bad(nm("--num-classes") + " must be positive with --class-cond");
  if (num_classes > L.num_classes) return range("--num-classes", num_classes, 1, L.num_classes);
  if (!(class_dropout >= 0.0 && class_dropout < 1.0))
    return bad(nm("--class-dropout") + " must be in [0, 1)");
  if (null_class && !class_cond)
    return bad(attr_names ? "null_class needs class_cond (the null class is a row of label_emb)"
                          : "--class-dropout needs --class-cond (the null class is a row of label_emb)");
  if (class_dropout > 0 && !null_class)
    return bad(nm("--class-dropout") + " needs a null class (a label_emb row beyond the classes)");
  if (!(dropout >= 0.0f && dropout < 1.0f)) return bad(nm("--dropout") + " must be in [0, 1)");
  // The linear schedule's last beta is 0.02*1000/T: T <= 20 makes it >= 1 (a zero alpha-bar).
  if (noise_schedule == "linear" && diffusion_steps <= 20)
    return bad(
        nm("--diffusion-steps") + " " + std::to_string(diffusion_steps) +
        " is too few for the linear schedule (its last beta, 20/T, must stay below 1; use > 20 or cosine)");
  if (noise_schedule != "linear" && noise_schedule != "cosine")
    return bad(nm("--noise-schedule") + " must be linear or cosine, not '" + noise_schedule + "'");
  return "";
}

std::string ModelConfig::describe() const {
  std::ostringstream o;
  o << "image_size=" << image_size << " in_channels=" << in_channels << " num_channels=" << num_channels
    << " channel_mult=" << format_mult_list(channel_mult) << " num_res_blocks=" << num_res_blocks
    << " attention_resolutions=" << format_int_list(attention_resolutions) << " num_heads=" << num_heads
    << " num_head_channels=" << num_head_channels
    << " use_new_attention_order=" << (use_new_attention_order ? "true" : "false")
    << " use_scale_shift_norm=" << (use_scale_shift_norm ? "true" : "false")
    << " resblock_updown=" << (resblock_updown ? "true" : "false")
    << " learn_sigma=" << (learn_sigma ? "true" : "false")
    << " class_cond=" << (class_cond ? "true" : "false");
  if (class_cond) o << " num_classes=" << num_classes;
  if (null_class) o << " null_class=true class_dropout=" << class_dropout;
  o << " dropout=" << dropout << " diffusion_steps=" << diffusion_steps
    << " noise_schedule=" << noise_schedule;
  if (use_kl) o << " use_kl=true";
  if (predict_xstart) o << " predict_xstart=true";
  if (rescale_learned_sigmas) o << " rescale_learned_sigmas=true";
  if (rescale_timesteps) o << " rescale_timesteps=true";
  return o.str();
}

}  // namespace unet

namespace unet {

// ---- the classifier ----

std::vector<double> ClassifierConfig::default_channel_mult(int image_size) {
  switch (image_size) {  // guided-diffusion's create_classifier
    case 512:
      return {0.5, 1, 1, 2, 2, 4, 4};
    case 256:
      return {1, 1, 2, 2, 4, 4};
    case 128:
      return {1, 1, 2, 3, 4};
    case 64:
      return {1, 2, 3, 4};
  }
  return {};
}

ModelConfig ClassifierConfig::body() const {
  ModelConfig c;
  c.image_size = image_size;
  c.in_channels = in_channels;
  c.num_channels = width;
  c.channel_mult = mult();
  c.num_res_blocks = depth;
  c.attention_resolutions = attention_resolutions;
  c.num_heads = 1;
  c.num_head_channels = num_head_channels;
  c.use_new_attention_order = false;  // EncoderUNetModel's default, kept by create_classifier
  c.use_scale_shift_norm = use_scale_shift_norm;
  c.resblock_updown = resblock_updown;
  c.learn_sigma = false;
  c.class_cond = false;
  c.num_classes = num_classes;
  c.dropout = 0.0f;
  c.diffusion_steps = diffusion_steps;
  c.noise_schedule = noise_schedule;
  return c;
}

int ClassifierConfig::trunk_channels() const {
  const std::vector<double> m = mult();
  return m.empty() ? 0 : (int)(m.back() * width);
}

int ClassifierConfig::pool_resolution() const {
  const size_t levels = mult().size();
  return levels ? image_size >> (levels - 1) : 0;
}

std::string ClassifierConfig::validate(bool attr_names) const {
  // The trunk is a UNet's: its validation, with the UNet's flag names turned into the classifier's.
  static const std::pair<const char*, const char*> kNames[] = {
      {"num-channels", "classifier-width"},
      {"num-res-blocks", "classifier-depth"},
      {"channel-mult", "classifier-channel-mult"},
      {"attention-resolutions", "classifier-attention-resolutions"},
      {"num-head-channels", "classifier-num-head-channels"}};
  auto word = [](char ch) { return std::isalnum((unsigned char)ch) || ch == '_' || ch == '-'; };
  auto replace_word = [&](std::string& e, const std::string& from, const std::string& to) {
    for (size_t at = 0; (at = e.find(from, at)) != std::string::npos;) {
      const size_t end = at + from.size();
      if ((at > 0 && word(e[at - 1]) && e[at - 1] != '-') || (end < e.size() && word(e[end]))) {
        ++at;  // part of a longer name
        continue;
      }
      e.replace(at, from.size(), to);
      at += to.size();
    }
  };
  auto rename = [&](std::string e) {
    for (auto [from, to] : kNames) {
      std::string fu = from, tu = to;  // attribute spellings
      for (std::string* s : {&fu, &tu})
        for (char& ch : *s)
          if (ch == '-') ch = '_';
      replace_word(e, std::string("--") + from, std::string("--") + to);
      replace_word(e, fu, tu);
    }
    return e;
  };
  auto nm = [&](const char* flag) {
    std::string n = flag;
    if (!attr_names) return n;
    n = n.substr(2);
    for (char& ch : n)
      if (ch == '-') ch = '_';
    return n;
  };
  if (channel_mult.empty() && default_channel_mult(image_size).empty())
    return nm("--image-size") + " " + std::to_string(image_size) +
           " has no default channel multipliers (guided-diffusion's create_classifier knows 64, 128, 256 and "
           "512); give " +
           nm("--classifier-channel-mult");
  if (pool != "attention")
    return nm("--classifier-pool") + " '" + pool +
           "': unet's classifier has the attention pool only (guided-diffusion's default, used by all its "
           "released classifiers); adaptive, spatial and spatial_v2 are refused";
  if (num_head_channels < 1) return nm("--classifier-num-head-channels") + " must be positive";
  if (num_classes < 1 || num_classes > kModelLimits.num_classes)
    return nm("--num-classes") + " " + std::to_string(num_classes) + " is out of range (1 to " +
           std::to_string(kModelLimits.num_classes) + ")";
  std::string e = body().validate(attr_names);
  if (!e.empty()) return rename(e);
  const int C = trunk_channels();
  if (C < num_head_channels)
    return nm("--classifier-num-head-channels") + " " + std::to_string(num_head_channels) + " exceeds the " +
           std::to_string(C) + " channels of the attention pool";
  if (C % pool_heads() != 0)
    return "the attention pool's " + std::to_string(C) + " channels do not split into " +
           std::to_string(pool_heads()) + " heads (" + std::to_string(C) + " / " +
           nm("--classifier-num-head-channels") + " " + std::to_string(num_head_channels) + ")";
  return "";
}

std::string ClassifierConfig::describe() const {
  std::ostringstream o;
  o << "image_size=" << image_size << " in_channels=" << in_channels << " classifier_width=" << width
    << " classifier_depth=" << depth << " classifier_channel_mult=" << format_mult_list(mult())
    << " classifier_attention_resolutions=" << format_int_list(attention_resolutions)
    << " classifier_use_scale_shift_norm=" << (use_scale_shift_norm ? "true" : "false")
    << " classifier_resblock_updown=" << (resblock_updown ? "true" : "false") << " classifier_pool=" << pool
    << " classifier_num_head_channels=" << num_head_channels << " num_classes=" << num_classes
    << " diffusion_steps=" << diffusion_steps << " noise_schedule=" << noise_schedule;
  return o.str();
}

ClassifierConfig classifier_preset(const std::string& name) {
  ClassifierConfig c;  // classifier_defaults(): 64x64, width 128, depth 2, attention 32,16,8, ...
  if (name == "default") return c;
  if (name == "tiny32") {
    c.image_size = 32;
    c.width = 32;
    c.depth = 1;
    c.channel_mult = {1, 2, 2};
    c.attention_resolutions = {16, 8};
    c.num_head_channels = 32;
    c.num_classes = 10;
    return c;
  }
  // OpenAI's released classifiers: guided-diffusion README's flags over classifier_defaults().
  // The 64x64 one guides (and so was trained on the noise of) the cosine-schedule 64x64 model: its
  // README command line carries --noise_schedule cosine with the model's flags.
  if (name == "imagenet64") {
    c.depth = 4;
    c.noise_schedule = "cosine";
    return c;
  }
  if (name == "imagenet128" || name == "imagenet256" || name == "imagenet512") {
    c.image_size = std::stoi(name.substr(8));
    return c;
  }
  std::string names;
  for (auto& n : classifier_preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw UserError("unknown classifier preset '" + name + "' (choose " + names + ")");
}

std::vector<std::string> classifier_preset_names() {
  return {"default", "tiny32", "imagenet64", "imagenet128", "imagenet256", "imagenet512"};
}

}  // namespace unet
