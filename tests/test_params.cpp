// Parameter names and PyTorch shapes for the three spec configurations, against
// ../shared/spec/params_*.txt (guided-diffusion's own state_dict dumps).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "params.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {
struct SpecFile {
  std::string header;
  std::vector<std::pair<std::string, std::string>> rows;  // name, "AxB"
};

SpecFile read_spec(const std::string& name) {
  SpecFile s;
  for (std::string dir : {test::source_dir() + "/testdata/spec", test::source_dir() + "/../shared/spec"}) {
    std::ifstream f(dir + "/params_" + name + ".txt");
    if (!f) continue;
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      if (line[0] == '#') {
        if (s.header.empty()) s.header = line;
        continue;
      }
      std::istringstream ls(line);
      std::string n, shp;
      ls >> n >> shp;
      s.rows.push_back({n, shp});
    }
    return s;
  }
  ADD_FAILURE() << "spec file params_" << name << ".txt not found";
  return s;
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s;
}

void check(const ModelConfig& cfg, const std::string& name, size_t expect_count) {
  ASSERT_EQ(cfg.validate(), "");
  SpecFile spec = read_spec(name);
  ParamTable t = build_param_table(cfg);
  ASSERT_EQ(t.params.size(), spec.rows.size()) << name;
  for (size_t i = 0; i < spec.rows.size(); ++i) {
    EXPECT_EQ(t.params[i].name, spec.rows[i].first) << name << " row " << i;
    EXPECT_EQ(shape_str(t.params[i].shape), spec.rows[i].second) << spec.rows[i].first;
  }
  EXPECT_EQ(t.count, expect_count);
}
}  // namespace

TEST(Params, Seed64MatchesGuidedDiffusion) { check(preset("seed64"), "seed64", 22080323); }
TEST(Params, Tiny32MatchesGuidedDiffusion) { check(preset("tiny32"), "tiny32", 702499); }

TEST(Params, Full32MatchesGuidedDiffusion) {
  ModelConfig c = preset("tiny32");
  c.num_heads = 2;
  c.num_head_channels = -1;
  c.use_new_attention_order = false;
  c.use_scale_shift_norm = true;
  c.resblock_updown = true;
  c.learn_sigma = true;
  c.class_cond = true;
  c.num_classes = 10;
  check(c, "full32", 829638);
}

TEST(Params, LayoutRoundTrip) {
  ParamTable t = build_param_table(preset("tiny32"));
  const ParamInfo& p = t.at("input_blocks.1.0.in_layers.2.weight");
  ASSERT_TRUE(p.conv3x3);
  auto src = test::randn(p.numel, test::test_seed());
  std::vector<float> eng(p.numel), back(p.numel);
  torch_to_engine(p, src.data(), eng.data());
  // engine [o][ky][kx][i] == torch [o][i][ky][kx]
  const int64_t I = p.shape[1];
  EXPECT_EQ(eng[(2 * 9 + 4) * I + 5], src[(2 * I + 5) * 9 + 4]);
  engine_to_torch(p, eng.data(), back.data());
  EXPECT_EQ(src, back);
}

TEST(Config, ValidateRejectsBadCombinations) {
  ModelConfig c = preset("seed64");
  EXPECT_EQ(c.validate(), "");
  c.diffusion_steps = 20;  // linear betas reach 20/T = 1
  EXPECT_NE(c.validate().find("too few"), std::string::npos);
  c.diffusion_steps = 21;
  EXPECT_EQ(c.validate(), "");
  c.noise_schedule = "cosine", c.diffusion_steps = 10;
  EXPECT_EQ(c.validate(), "");
  ModelConfig d = preset("seed64");
  d.num_channels = 48;  // 48*1 not divisible by 32 groups
  EXPECT_NE(d.validate().find("32 groups"), std::string::npos);
  d = preset("seed64");
  d.num_head_channels = 40;  // does not divide 128-channel attention
  EXPECT_NE(d.validate().find("does not divide"), std::string::npos);
  d = preset("seed64");
  d.image_size = 60;  // 4 levels need a multiple of 8
  EXPECT_NE(d.validate().find("not divisible"), std::string::npos);
  d = preset("seed64");
  d.attention_resolutions = {12};
  EXPECT_NE(d.validate().find("not a feature-map size"), std::string::npos);
}

// OpenAI's released models: parameter counts of guided-diffusion's UNetModel for the README's
// MODEL_FLAGS (tests/test_released_models.py compares every name and shape with PyTorch).
TEST(Params, ReleasedPresets) {
  const std::pair<const char*, size_t> want[] = {
      {"imagenet64", 295904454},         {"imagenet128", 421529606}, {"imagenet256", 553838086},
      {"imagenet256-uncond", 552814086}, {"imagenet512", 558997638}, {"lsun256", 552814086},
  };
  for (auto& [name, count] : want) {
    ModelConfig c = preset(name);
    EXPECT_EQ(c.validate(), "") << name;
    EXPECT_EQ(build_param_table(c).count, count) << name;
  }
  // 512x512 starts at half width: int(0.5 * 256) = 128 channels.
  ParamTable t = build_param_table(preset("imagenet512"));
  EXPECT_EQ(shape_str(t.at("input_blocks.0.0.weight").shape), "128x3x3x3");
  EXPECT_EQ(shape_str(t.at("out.2.weight").shape), "6x128x3x3");
  EXPECT_EQ(shape_str(t.at("output_blocks.18.0.skip_connection.weight").shape), "128x384x1x1");
  EXPECT_EQ(shape_str(t.at("output_blocks.20.0.skip_connection.weight").shape), "128x256x1x1");
  EXPECT_EQ(preset("imagenet256-uncond").class_cond, false);
  EXPECT_EQ(preset("imagenet128").num_head_channels, -1);
  EXPECT_EQ(preset("imagenet256").use_new_attention_order, false);  // only the 64x64 model uses the new order
  EXPECT_EQ(preset("imagenet64").use_new_attention_order, true);
  EXPECT_EQ(preset_names().size(), 8u);
  for (auto& n : preset_names()) EXPECT_EQ(preset(n).validate(), "") << n;
}

TEST(Config, FractionalChannelMult) {
  EXPECT_EQ(parse_mult_list("0.5,1,2", "--channel-mult"), (std::vector<double>{0.5, 1, 2}));
  EXPECT_EQ(format_mult_list({0.5, 1, 1, 2, 2, 4, 4}), "0.5,1,1,2,2,4,4");
  EXPECT_EQ(format_mult_list({1.25, 3}), "1.25,3");
  EXPECT_THROW(parse_mult_list("1,x", "--channel-mult"), UserError);
  EXPECT_THROW(parse_mult_list("1,,2", "--channel-mult"), UserError);
  EXPECT_THROW(parse_mult_list("1,inf", "--channel-mult"), UserError);
  ModelConfig c = preset("tiny32");
  c.channel_mult = {1.5, 2};  // 48 channels: not a multiple of 32
  EXPECT_NE(c.validate().find("32 groups"), std::string::npos);
  c.num_channels = 64;  // 96, 128
  EXPECT_EQ(c.validate(), "");
  EXPECT_EQ(c.level_channels(0), 96);
  c.channel_mult = {0, 1};
  EXPECT_NE(c.validate().find("positive"), std::string::npos);
  c.channel_mult = {1e300, 1};
  EXPECT_NE(c.validate().find("out of range"), std::string::npos);
}
