// Model and diffusion configuration: guided-diffusion's flags, presets, validation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace unet {

struct ModelConfig {
  // Names and meaning follow guided-diffusion's script flags.
  int image_size = 64;
  int in_channels = 3;
  int num_channels = 64;
  // Per level; fractional values are allowed because guided-diffusion's 512x512 model starts at 0.5.
  std::vector<double> channel_mult = {1, 2, 3, 4};
  int num_res_blocks = 2;
  std::vector<int> attention_resolutions = {16, 8};  // image resolutions, e.g. 16 = 16x16 maps
  int num_heads = 1;
  int num_head_channels = 32;  // -1: use num_heads
  bool use_new_attention_order = true;
  bool use_scale_shift_norm = false;
  bool resblock_updown = false;
  bool learn_sigma = false;
  bool class_cond = false;
  int num_classes = 1000;
  // Classifier-free guidance (Ho & Salimans): label_emb has one extra row, num_classes, the null
  // class ("no label"); class_dropout is the probability with which training replaces a label by
  // it (the default of `unet train`, recorded as trained). Checkpoint attributes null_class and
  // class_dropout; absent = false / 0 (guided-diffusion's models have no null class).
  bool null_class = false;
  double class_dropout = 0.0;
  float dropout = 0.0f;
  int diffusion_steps = 1000;
  std::string noise_schedule = "linear";  // linear | cosine
  // The training objective (guided-diffusion's create_gaussian_diffusion flags): loss = vb x T
  // alone (RESCALED_KL), the model predicts x0 instead of eps, vb x T/1000 in the hybrid loss
  // (RESCALED_MSE), the model sees t x 1000/T instead of t.
  bool use_kl = false;
  bool predict_xstart = false;
  bool rescale_learned_sigmas = false;
  bool rescale_timesteps = false;

  // Channels of level l: int(mult * num_channels), truncating like guided-diffusion's int().
  int level_channels(size_t level) const { return (int)(channel_mult[level] * num_channels); }
  int out_channels() const { return learn_sigma ? 2 * in_channels : in_channels; }
  // Rows of label_emb: the classes, plus the null class when there is one (its label is num_classes).
  int label_rows() const { return num_classes + (null_class ? 1 : 0); }
  int time_embed_dim() const { return 4 * num_channels; }
  // Heads of an attention block with `ch` channels (guided-diffusion's rule).
  int heads_for(int ch) const { return num_head_channels == -1 ? num_heads : ch / num_head_channels; }
  // Returns "" when valid, else a one-line description of the problem, naming the value by its
  // flag (--num-res-blocks) or, with attr_names, by its checkpoint attribute (num_res_blocks).
  // Every size is bounded (ModelLimits) before anything is computed from it.
  std::string validate(bool attr_names = false) const;
  // guided-diffusion style description, e.g. "image_size=64 num_channels=64 ...".
  std::string describe() const;
};

// Upper bounds of validate(): far beyond any published guided-diffusion model (the largest,
// 512x512, has 7 levels, 256 channels x mult 4, 2 res blocks, 1000 classes, 4000 steps).
struct ModelLimits {
  int image_size = 4096;
  int in_channels = 64;
  int num_channels = 4096;
  int channels = 16384;  // num_channels x any channel_mult entry
  int levels = 12;       // entries of channel_mult (and of attention_resolutions)
  int num_res_blocks = 64;
  int num_classes = 1000000;
  int diffusion_steps = 100000;
};
inline constexpr ModelLimits kModelLimits{};

// Presets: "seed64" (default), "tiny32", and the configurations of OpenAI's released
// guided-diffusion models: "imagenet64", "imagenet128", "imagenet256", "imagenet256-uncond",
// "imagenet512", "lsun256". Throws UserError on unknown name.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// guided-diffusion's noisy-image classifier, EncoderUNetModel as create_classifier builds it: the
// UNet's input blocks and middle block (the same blocks, same names), then GroupNorm, SiLU and an
// attention pool (AttentionPool2d) to num_classes logits. Flags are create_classifier's
// (--classifier-width ...); defaults are guided-diffusion's classifier_defaults(). Fixed there and
// here: one head per 64 channels (num_head_channels; a flag here for small models), legacy
// attention order, no dropout, no class input. channel_mult empty = create_classifier's choice
// for the image size (64, 128, 256, 512). The diffusion flags are those the classifier is trained
// under (train-classifier noises its inputs with them).
struct ClassifierConfig {
  int image_size = 64;
  int in_channels = 3;
  int width = 128;                   // classifier_width (model_channels)
  int depth = 2;                     // classifier_depth (num_res_blocks)
  std::vector<double> channel_mult;  // empty: by image size
  std::vector<int> attention_resolutions = {32, 16, 8};
  bool use_scale_shift_norm = true;
  bool resblock_updown = true;
  std::string pool = "attention";
  int num_head_channels = 64;
  int num_classes = 1000;  // out_channels
  int diffusion_steps = 1000;
  std::string noise_schedule = "linear";

  // create_classifier's channel_mult for the image size ({} when it has none).
  static std::vector<double> default_channel_mult(int image_size);
  std::vector<double> mult() const {
    return channel_mult.empty() ? default_channel_mult(image_size) : channel_mult;
  }
  // The UNet configuration whose input and middle blocks are the classifier's trunk.
  ModelConfig body() const;
  int trunk_channels() const;   // channels into the head (deepest level)
  int pool_resolution() const;  // feature-map size into the head (image_size / 2^(levels-1))
  int pool_heads() const { return trunk_channels() / num_head_channels; }  // AttentionPool2d's rule
  // "" when valid, else one line naming the flag (--classifier-width) or attribute (classifier_width).
  std::string validate(bool attr_names = false) const;
  std::string describe() const;
};

// Classifier presets (`--classifier --preset NAME`): "default" (guided-diffusion's
// classifier_defaults()), "tiny32" (tests and demos), and the classifiers OpenAI released next to
// the models of the same preset names: "imagenet64" (64x64_classifier.pt, depth 4),
// "imagenet128", "imagenet256", "imagenet512" (guided-diffusion's README flags). Throws UserError
// on an unknown name.
ClassifierConfig classifier_preset(const std::string& name);
std::vector<std::string> classifier_preset_names();

// "1,2,3,4" <-> vector; parse throws UserError with `what` in the message.
std::vector<int> parse_int_list(const std::string& s, const std::string& what);
std::string format_int_list(const std::vector<int>& v);
// Channel multipliers: "0.5,1,2" <-> vector; integers print without a decimal point.
std::vector<double> parse_mult_list(const std::string& s, const std::string& what);
std::string format_mult_list(const std::vector<double>& v);

}  // namespace unet
