#include "config.h"

#include <sstream>

#include "util.h"

namespace unet {

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
  if (name == "imagenet64") {
    // OpenAI's released ImageNet 64x64 model (guided-diffusion README MODEL_FLAGS).
    c.num_channels = 192;
    c.channel_mult = {1, 2, 3, 4};
    c.num_res_blocks = 3;
    c.attention_resolutions = {32, 16, 8};
    c.num_heads = 4;
    c.num_head_channels = 64;
    c.use_new_attention_order = true;
    c.use_scale_shift_norm = true;
    c.resblock_updown = true;
    c.learn_sigma = true;
    c.class_cond = true;
    c.num_classes = 1000;
    c.noise_schedule = "cosine";
    c.dropout = 0.1f;
    return c;
  }
  throw UserError("unknown preset '" + name + "' (choose seed64, tiny32 or imagenet64)");
}

std::vector<std::string> preset_names() { return {"seed64", "tiny32", "imagenet64"}; }

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
  for (int m : channel_mult) {
    if (m < 1) return bad(nm("--channel-mult") + " values must be positive");
    if ((long long)m * num_channels > L.channels)
      return bad("channels " + std::to_string((long long)m * num_channels) + " (" + nm("--num-channels") +
                 " " + std::to_string(num_channels) + " x mult " + std::to_string(m) +
                 ") are out of range (at most " + std::to_string(L.channels) + ")");
    if ((m * num_channels) % 32 != 0)
      return bad("channels " + std::to_string(m * num_channels) + " (num_channels " +
                 std::to_string(num_channels) + " x mult " + std::to_string(m) +
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
    int res = image_size >> l, ch = channel_mult[l] * num_channels;
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
    << " channel_mult=" << format_int_list(channel_mult) << " num_res_blocks=" << num_res_blocks
    << " attention_resolutions=" << format_int_list(attention_resolutions) << " num_heads=" << num_heads
    << " num_head_channels=" << num_head_channels
    << " use_new_attention_order=" << (use_new_attention_order ? "true" : "false")
    << " use_scale_shift_norm=" << (use_scale_shift_norm ? "true" : "false")
    << " resblock_updown=" << (resblock_updown ? "true" : "false")
    << " learn_sigma=" << (learn_sigma ? "true" : "false")
    << " class_cond=" << (class_cond ? "true" : "false");
  if (class_cond) o << " num_classes=" << num_classes;
  o << " dropout=" << dropout << " diffusion_steps=" << diffusion_steps
    << " noise_schedule=" << noise_schedule;
  return o.str();
}

}  // namespace unet
