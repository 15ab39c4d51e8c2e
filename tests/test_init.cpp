// `unet init` and init_params(): PyTorch's default initialisation (SPEC §3 Init), determinism in
// the seed, and the command's error handling.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "checkpoint.h"
#include "init.h"
#include "params.h"
#include "testutil.h"

using namespace unet;

namespace {
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Which rule guided-diffusion applies, derived from the name alone (independent of the table's
// InitRule field): zero_module() tensors, GroupNorm affine, label_emb, else PyTorch's default.
enum Expect { kUniform, kZero, kOne, kNormal };
Expect expected_rule(const std::string& n) {
  if (contains(n, ".out_layers.3.") || contains(n, ".proj_out.") || n.rfind("out.2.", 0) == 0) return kZero;
  if (n == "label_emb.weight") return kNormal;
  bool norm = contains(n, ".in_layers.0.") || contains(n, ".out_layers.0.") || contains(n, ".norm.") ||
              n.rfind("out.0.", 0) == 0;
  if (norm) return ends_with(n, ".weight") ? kOne : kZero;
  return kUniform;
}

// fan_in from the PyTorch shape of the tensor's weight (for a bias: its module's weight).
int64_t fan_in_of(const ParamTable& t, const ParamInfo& p) {
  const ParamInfo& w = ends_with(p.name, ".bias") ? t.at(p.name.substr(0, p.name.size() - 5) + ".weight") : p;
  int64_t f = 1;
  for (size_t i = 1; i < w.shape.size(); ++i) f *= w.shape[i];
  return f;
}

std::vector<float> torch_values(const ParamInfo& p, const std::vector<float>& arena) {
  std::vector<float> v(p.numel);
  engine_to_torch(p, arena.data() + p.offset, v.data());
  return v;
}

ModelConfig tiny_cond() {
  ModelConfig c = preset("tiny32");
  c.class_cond = true;
  c.num_classes = 1000;  // label_emb 1000x128: enough samples for N(0,1) statistics
  c.use_scale_shift_norm = true;
  c.resblock_updown = true;
  return c;
}
}  // namespace

TEST(Init, RulesAndStatistics) {
  for (const ModelConfig& cfg : {preset("seed64"), tiny_cond()}) {
    const ParamTable t = build_param_table(cfg);
    std::vector<float> a = init_params(t, test::test_seed());
    ASSERT_EQ(a.size(), t.total);
    size_t covered = 0;
    for (const ParamInfo& p : t.params) {
      covered += p.numel;
      const std::vector<float> v = torch_values(p, a);
      switch (expected_rule(p.name)) {
        case kZero:
          for (float x : v) ASSERT_EQ(x, 0.0f) << p.name;
          break;
        case kOne:
          for (float x : v) ASSERT_EQ(x, 1.0f) << p.name;
          break;
        case kNormal: {
          double s = 0, s2 = 0, s4 = 0;
          size_t beyond2 = 0;
          for (float x : v)
            s += x, s2 += (double)x * x, s4 += (double)x * x * x * x, beyond2 += std::fabs(x) > 2;
          const double n = v.size(), mean = s / n, var = s2 / n - mean * mean;
          EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(n)) << p.name;
          EXPECT_NEAR(std::sqrt(var), 1.0, 0.02) << p.name;
          EXPECT_NEAR(s4 / n / (var * var), 3.0, 0.1) << p.name;  // kurtosis of a normal
          EXPECT_NEAR(beyond2 / n, 0.0455, 0.004) << p.name;
          break;
        }
        case kUniform: {
          const int64_t fan_in = fan_in_of(t, p);
          EXPECT_EQ(p.fan_in, fan_in) << p.name;
          const float bound = (float)(1.0 / std::sqrt((double)fan_in));
          double s = 0, s2 = 0, mx = 0;
          size_t inner = 0;
          for (float x : v) {
            ASSERT_LE(std::fabs(x), bound) << p.name;
            s += x, s2 += (double)x * x, mx = std::max(mx, (double)std::fabs(x));
            inner += std::fabs(x) < bound / 2;
          }
          const double n = v.size(), mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
          if (n >= 100) {
            EXPECT_GT(mx, 0.9 * bound) << p.name;  // the bound is used, not a smaller one
          }
          if (n >= 10000) {
            EXPECT_NEAR(sd / (bound / std::sqrt(3.0)), 1.0, 0.03) << p.name;
            EXPECT_NEAR(mean / bound, 0.0, 5.0 / std::sqrt(3.0 * n)) << p.name;
            EXPECT_NEAR(inner / n, 0.5, 0.02) << p.name;  // flat, not bell-shaped
          }
          break;
        }
      }
    }
    EXPECT_EQ(covered, t.count);
    // Alignment padding stays zero.
    std::vector<char> used(t.total, 0);
    for (auto& p : t.params) std::memset(used.data() + p.offset, 1, p.numel);
    for (size_t i = 0; i < t.total; ++i)
      if (!used[i]) {
        ASSERT_EQ(a[i], 0.0f) << "padding at " << i;
      }
  }
}

TEST(Init, DeterministicInSeedAndThreads) {
  const ParamTable t = build_param_table(tiny_cond());
  const uint64_t seed = test::test_seed();
  std::vector<float> a = init_params(t, seed), b = init_params(t, seed), c = init_params(t, seed + 1);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> single = init_params(t, seed);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(a.data(), single.data(), a.size() * sizeof(float)), 0);
  size_t same = 0, random = 0;
  for (auto& p : t.params) {
    if (p.init != InitRule::Uniform && p.init != InitRule::Normal) continue;
    for (size_t i = 0; i < p.numel; ++i) random++, same += a[p.offset + i] == c[p.offset + i];
  }
  EXPECT_GT(random, 100000u);
  EXPECT_LT(same, random / 1000) << "different seeds must give different weights";
  // Tensors of the same shape and rule are not copies of each other.
  auto v1 = torch_values(t.at("input_blocks.1.0.in_layers.2.weight"), a);
  auto v2 = torch_values(t.at("output_blocks.0.0.emb_layers.1.weight"), a);
  auto v3 = torch_values(t.at("input_blocks.1.0.emb_layers.1.weight"), a);
  EXPECT_NE(std::memcmp(v2.data(), v3.data(), std::min(v2.size(), v3.size()) * sizeof(float)), 0);
  (void)v1;
}

// The generator is part of the reproducibility contract (`unet init --seed 0` gives the same
// weights on every machine and in every later build): pin a few values.
TEST(Init, PinnedValues) {
  const ParamTable t = build_param_table(preset("tiny32"));
  std::vector<float> a = init_params(t, 0);
  auto w = torch_values(t.at("time_embed.0.weight"), a);
  auto c = torch_values(t.at("input_blocks.0.0.weight"), a);
  const float bound_w = (float)(1.0 / std::sqrt(32.0)), bound_c = (float)(1.0 / std::sqrt(27.0));
  // As fractions of the bound, computed by an independent Python transcription of the documented
  // generator (scripts/unet_ckpt.py unet_init_state_dict).
  const double expect_w[3] = {0.17341761172131176, 0.0009996573312616164, -0.6877999602519187};
  const double expect_c[2] = {-0.06356655822520008, -0.34530473257411254};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[i] / bound_w, expect_w[i], 1e-6) << i;
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(c[i] / bound_c, expect_c[i], 1e-6) << i;
}

// ---- the command ----------------------------------------------------------------------------

namespace {
int lines(const std::string& s) {
  int n = 0;
  for (char ch : s) n += ch == '\n';
  return n;
}
}  // namespace

TEST(InitCli, WritesLoadableCheckpoint) {
  const std::string dir = test::temp_dir("init");
  const std::string out = dir + "/tiny.h5";
  const uint64_t seed = test::test_seed() % 1000000;
  auto r = test::run_unet("init -o " + out + " --preset tiny32 --seed " + std::to_string(seed));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_TRUE(contains(r.out, "0.70 M parameters")) << r.out;
  EXPECT_TRUE(contains(r.out, out)) << r.out;
  EXPECT_EQ(test::list_dir(dir), std::vector<std::string>{"tiny.h5"});
  Checkpoint ck = load_checkpoint(out);
  EXPECT_EQ(ck.cfg.describe(), preset("tiny32").describe());
  const ParamTable t = build_param_table(ck.cfg);
  std::vector<float> want = init_params(t, seed);
  ASSERT_EQ(ck.model.size(), want.size());
  EXPECT_EQ(std::memcmp(ck.model.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_TRUE(ck.ema.empty());
  EXPECT_FALSE(ck.has_optimizer);

  // Same seed -> same weights; the default seed is 0.
  auto r0 = test::run_unet("init -o " + dir + "/s0.h5 --preset tiny32");
  ASSERT_EQ(r0.code, 0) << r0.err;
  Checkpoint c0 = load_checkpoint(dir + "/s0.h5");
  std::vector<float> w0 = init_params(t, 0);
  EXPECT_EQ(std::memcmp(c0.model.data(), w0.data(), w0.size() * sizeof(float)), 0);
}

TEST(InitCli, DefaultIsSeed64) {
  const std::string dir = test::temp_dir("init");
  auto r = test::run_unet("init -o " + dir + "/s.h5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "22.08 M parameters")) << r.out;
  EXPECT_EQ(read_checkpoint_config(dir + "/s.h5").describe(), preset("seed64").describe());
}

TEST(InitCli, FlagsOverridePreset) {
  const std::string dir = test::temp_dir("init");
  auto r = test::run_unet("init -o " + dir +
                          "/c.h5 --preset tiny32 --class-cond --num-classes 7 --learn-sigma "
                          "--use-scale-shift-norm=true --resblock-updown --use-new-attention-order=false "
                          "--num-head-channels -1 --num-heads 2 --attention-resolutions 32,16 --dropout 0.25 "
                          "--noise-schedule cosine --diffusion-steps 500");
  ASSERT_EQ(r.code, 0) << r.err;
  ModelConfig want = preset("tiny32");
  want.class_cond = true, want.num_classes = 7, want.learn_sigma = true, want.use_scale_shift_norm = true;
  want.resblock_updown = true, want.use_new_attention_order = false, want.num_head_channels = -1;
  want.num_heads = 2, want.attention_resolutions = {32, 16}, want.dropout = 0.25f;
  want.noise_schedule = "cosine", want.diffusion_steps = 500;
  Checkpoint ck = load_checkpoint(dir + "/c.h5");
  EXPECT_EQ(ck.cfg.describe(), want.describe());
  EXPECT_EQ(ck.model.size(), build_param_table(want).total);
}

TEST(InitCli, ErrorsAreOneLineAndLeaveNoFile) {
  const std::string dir = test::temp_dir("init");
  const std::string out = dir + "/x.h5";
  const char* bad[] = {
      "--preset bogus",     "--num-channels 48",          "--num-head-channels 7",     "--image-size 60",
      "--channel-mult 1,x", "--noise-schedule quadratic", "--attention-resolutions 5", "--seed notanumber",
  };
  for (const char* flags : bad) {
    auto r = test::run_unet("init -o " + out + " " + flags);
    EXPECT_EQ(r.code, 1) << flags;
    EXPECT_EQ(lines(r.err), 1) << flags << ": " << r.err;
    EXPECT_EQ(r.err.rfind("unet: ", 0), 0u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_TRUE(test::list_dir(dir).empty()) << flags;
  }
  auto r = test::run_unet("init -o " + dir + "/missing/x.h5 --preset tiny32");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "missing")) << r.err;
  r = test::run_unet("init --preset tiny32");  // -o is required
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  r = test::run_unet("init -o " + dir + " --preset tiny32");  // a directory
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_TRUE(test::list_dir(dir).empty());

  // An existing checkpoint survives a failed run that names it.
  ASSERT_EQ(test::run_unet("init -o " + out + " --preset tiny32 --seed 5").code, 0);
  r = test::run_unet("init -o " + out + " --num-channels 48");
  EXPECT_EQ(r.code, 1);
  Checkpoint ck = load_checkpoint(out);
  std::vector<float> want = init_params(build_param_table(preset("tiny32")), 5);
  EXPECT_EQ(std::memcmp(ck.model.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(test::list_dir(dir), std::vector<std::string>{"x.h5"});
}
