// Checkpoint save/load (SPEC §2): bitwise round trip of every part, the PyTorch layout on disk,
// one-line UserErrors for every kind of bad file, and atomic writes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint.h"
#include "h5.h"
#include "params.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {
uint64_t seed_counter = 0;
uint64_t fresh_seed() { return test::test_seed() * 1000 + seed_counter++; }

// Random values in every parameter slot, zero padding (padding is not stored in files).
std::vector<float> random_arena(const ParamTable& t) {
  std::vector<float> a(t.total, 0.0f);
  std::vector<float> r = test::randn(t.count, fresh_seed());
  size_t k = 0;
  for (auto& p : t.params)
    for (size_t i = 0; i < p.numel; ++i) a[p.offset + i] = r[k++];
  return a;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

ModelConfig small_config() {
  ModelConfig c = preset("tiny32");
  c.class_cond = true;
  c.num_classes = 5;
  c.learn_sigma = true;
  c.use_scale_shift_norm = true;
  c.resblock_updown = true;
  c.use_new_attention_order = false;
  c.num_head_channels = -1;
  c.num_heads = 2;
  c.dropout = 0.1f;
  c.diffusion_steps = 250;
  c.noise_schedule = "cosine";
  return c;
}

Checkpoint full_checkpoint(const ModelConfig& cfg) {
  const ParamTable t = build_param_table(cfg);
  Checkpoint ck;
  ck.cfg = cfg;
  ck.model = random_arena(t);
  ck.ema = random_arena(t);
  ck.has_optimizer = true;
  ck.opt.m = random_arena(t);
  ck.opt.v = random_arena(t);
  ck.opt.step = 123456789012345;
  ck.opt.lr = 3.0e-4;
  ck.opt.beta1 = 0.8;
  ck.opt.beta2 = 0.95;
  ck.opt.eps = 1e-6;
  ck.opt.weight_decay = 0.05;
  ck.state = {{"step", 1234}, {"seed", -7}, {"rng", INT64_MIN}, {"data_pos", INT64_MAX}};
  return ck;
}

// Runs fn, which must throw UserError; returns its message. Checks that nothing was printed
// (HDF5's error stack must stay silent).
template <class F>
std::string user_error(F fn) {
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  std::string msg = "<no exception>";
  try {
    fn();
  } catch (const UserError& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    msg = std::string("<wrong exception type> ") + e.what();
  }
  std::string err = testing::internal::GetCapturedStderr();
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(err, "") << msg;
  EXPECT_EQ(out, "") << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  return msg;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
}  // namespace

TEST(Checkpoint, RoundTripEverything) {
  for (const ModelConfig& cfg : {small_config(), preset("tiny32")}) {
    const std::string path = test::temp_dir("ck") + "/full.h5";
    const Checkpoint ck = full_checkpoint(cfg);
    save_checkpoint(path, ck);
    Checkpoint back = load_checkpoint(path, /*need_optimizer=*/true);
    EXPECT_EQ(back.cfg.describe(), cfg.describe());
    EXPECT_EQ(back.cfg.dropout, cfg.dropout);
    EXPECT_TRUE(same_bits(back.model, ck.model));
    EXPECT_TRUE(same_bits(back.ema, ck.ema));
    ASSERT_TRUE(back.has_optimizer);
    EXPECT_TRUE(same_bits(back.opt.m, ck.opt.m));
    EXPECT_TRUE(same_bits(back.opt.v, ck.opt.v));
    EXPECT_EQ(back.opt.step, ck.opt.step);
    EXPECT_EQ(back.opt.lr, ck.opt.lr);
    EXPECT_EQ(back.opt.beta1, ck.opt.beta1);
    EXPECT_EQ(back.opt.beta2, ck.opt.beta2);
    EXPECT_EQ(back.opt.eps, ck.opt.eps);
    EXPECT_EQ(back.opt.weight_decay, ck.opt.weight_decay);
    EXPECT_EQ(back.state, ck.state);

    // Without need_optimizer the moments are not read.
    Checkpoint light = load_checkpoint(path);
    EXPECT_FALSE(light.has_optimizer);
    EXPECT_TRUE(light.opt.m.empty());
    EXPECT_TRUE(same_bits(light.model, ck.model));
    EXPECT_EQ(read_checkpoint_config(path).describe(), cfg.describe());
  }
}

TEST(Checkpoint, MinimalAndOddConfigs) {
  // No ema, optimizer or state; no attention resolutions at all (empty list attribute).
  ModelConfig cfg = preset("tiny32");
  cfg.attention_resolutions = {};
  cfg.channel_mult = {1, 1, 2};
  const ParamTable t = build_param_table(cfg);
  Checkpoint ck;
  ck.cfg = cfg;
  ck.model = random_arena(t);
  const std::string path = test::temp_dir("ck") + "/min.h5";
  save_checkpoint(path, ck);
  Checkpoint back = load_checkpoint(path);
  EXPECT_EQ(back.cfg.describe(), cfg.describe());
  EXPECT_TRUE(back.cfg.attention_resolutions.empty());
  EXPECT_TRUE(same_bits(back.model, ck.model));
  EXPECT_TRUE(back.ema.empty());
  EXPECT_TRUE(back.state.empty());
  EXPECT_FALSE(back.has_optimizer);
  std::string msg = user_error([&] { load_checkpoint(path, /*need_optimizer=*/true); });
  EXPECT_TRUE(contains(msg, path) && contains(msg, "optimizer")) << msg;
}

TEST(Checkpoint, FileUsesPyTorchLayoutAndNames) {
  const ModelConfig cfg = small_config();
  const ParamTable t = build_param_table(cfg);
  Checkpoint ck;
  ck.cfg = cfg;
  ck.model = random_arena(t);
  const std::string path = test::temp_dir("ck") + "/layout.h5";
  save_checkpoint(path, ck);

  h5::File f = h5::File::open(path);
  EXPECT_EQ(h5::get_attr_str(f, "/", "format"), "unet-checkpoint");
  EXPECT_EQ(h5::get_attr_i64(f, "/", "version"), 1);
  EXPECT_EQ(h5::get_attr_i64(f, "/", "num_channels"), 32);
  EXPECT_EQ(h5::get_attr_i64v(f, "/", "channel_mult"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(h5::get_attr_i64v(f, "/", "attention_resolutions"), (std::vector<int64_t>{16}));
  EXPECT_EQ(h5::get_attr_i64(f, "/", "class_cond"), 1);
  EXPECT_EQ(h5::get_attr_i64(f, "/", "use_new_attention_order"), 0);
  EXPECT_EQ(h5::get_attr_str(f, "/", "noise_schedule"), "cosine");
  EXPECT_EQ(h5::get_attr_f64(f, "/", "dropout"), 0.1);  // the decimal the user typed, not 0.1f

  std::vector<std::string> names;
  for (auto& p : t.params) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(h5::list(f, "model"), names);
  // A 3x3 conv: element [o][i][ky][kx] of the file is engine element [o][ky][kx][i].
  const ParamInfo& p = t.at("input_blocks.1.0.in_layers.2.weight");
  ASSERT_TRUE(p.conv3x3);
  EXPECT_EQ(h5::shape(f, "model/" + p.name), (std::vector<hsize_t>{32, 32, 3, 3}));
  std::vector<float> disk = h5::read_f32(f, "model/" + p.name);
  const int64_t O = p.shape[0], I = p.shape[1];
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i)
      for (int k = 0; k < 9; ++k)
        ASSERT_EQ(disk[(o * I + i) * 9 + k], ck.model[p.offset + (o * 9 + k) * I + i])
            << o << " " << i << " " << k;
  // A non-conv tensor is stored as is.
  const ParamInfo& q = t.at("input_blocks.2.0.emb_layers.1.weight");
  std::vector<float> dq = h5::read_f32(f, "model/" + q.name);
  EXPECT_EQ(std::memcmp(dq.data(), ck.model.data() + q.offset, q.numel * sizeof(float)), 0);
  EXPECT_EQ(h5::dtype(f, "model/" + q.name), h5::DType::F32);
}

namespace {
// A valid tiny checkpoint at a fresh path, modified by `edit` through the raw h5 layer.
template <class Edit>
std::string broken(const std::string& tag, Edit edit) {
  const std::string path = test::temp_dir("bad") + "/" + tag + ".h5";
  Checkpoint ck = full_checkpoint(preset("tiny32"));
  save_checkpoint(path, ck);
  h5::File f = h5::File::open(path, /*writable=*/true);
  edit(f);
  f.close();
  return path;
}
}  // namespace

TEST(Checkpoint, ValidationErrors) {
  const std::string dir = test::temp_dir("bad");
  auto load = [](const std::string& p, bool opt = false) { return [p, opt] { load_checkpoint(p, opt); }; };
  std::string msg, p;

  msg = user_error(load(dir + "/nonexistent.h5"));
  EXPECT_TRUE(contains(msg, dir + "/nonexistent.h5")) << msg;

  p = dir + "/text.h5";
  std::ofstream(p) << "this is not HDF5\n";
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "HDF5")) << msg;

  p = broken("format", [](h5::File& f) { h5::set_attr(f, "/", "format", "unet-dataset"); });
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "not a unet checkpoint")) << msg;
  msg = user_error([&] { read_checkpoint_config(p); });
  EXPECT_TRUE(contains(msg, "not a unet checkpoint")) << msg;

  p = broken("noattr", [](h5::File& f) { H5Adelete(f.id(), "num_res_blocks"); });
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "num_res_blocks")) << msg;

  p = broken("badcfg", [](h5::File& f) { h5::set_attr(f, "/", "num_channels", 48); });
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "invalid model configuration")) << msg;

  p = broken("version", [](h5::File& f) { h5::set_attr(f, "/", "version", 2); });
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "version 2")) << msg;

  p = broken("missing", [](h5::File& f) { H5Ldelete(f.id(), "model/out.2.bias", H5P_DEFAULT); });
  msg = user_error(load(p));
  EXPECT_EQ(msg, p + ": model/out.2.bias is missing");

  p = broken("shape", [](h5::File& f) {
    std::vector<float> w(64 * 32 * 9, 0.5f);
    h5::write_f32(f, "model/input_blocks.1.0.in_layers.2.weight", w.data(), {64, 32, 3, 3});
  });
  msg = user_error(load(p));
  EXPECT_EQ(msg, p + ": model/input_blocks.1.0.in_layers.2.weight has shape 64x32x3x3, expected 32x32x3x3");

  p = broken("extra", [](h5::File& f) {
    float x[2] = {1, 2};
    h5::write_f32(f, "model/input_blocks.9.0.weight", x, {2});
  });
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "unexpected tensor model/input_blocks.9.0.weight")) << msg;

  p = broken("dtype", [](h5::File& f) {
    std::vector<int64_t> b(32, 1);
    h5::write_i64(f, "model/time_embed.2.bias", b.data(), {32});
  });
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "model/time_embed.2.bias") && contains(msg, "int64")) << msg;

  // Attributes of a different model than the tensors: reported as an unexpected/missing tensor.
  p = broken("othercfg", [](h5::File& f) { h5::set_attr(f, "/", "num_res_blocks", 2); });
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "model/")) << msg;

  p = broken("ema", [](h5::File& f) {
    std::vector<float> w(10, 0.0f);
    h5::write_f32(f, "ema/out.2.bias", w.data(), {10});
  });
  msg = user_error(load(p));
  EXPECT_EQ(msg, p + ": ema/out.2.bias has shape 10, expected 3");

  p = broken("nomodel", [](h5::File& f) { H5Ldelete(f.id(), "model", H5P_DEFAULT); });
  msg = user_error(load(p));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "model")) << msg;

  // Optimizer problems matter only when the optimizer is needed.
  p = broken("optm", [](h5::File& f) { H5Ldelete(f.id(), "optimizer/v/time_embed.0.weight", H5P_DEFAULT); });
  EXPECT_NO_THROW(load_checkpoint(p));
  msg = user_error(load(p, true));
  EXPECT_EQ(msg, p + ": optimizer/v/time_embed.0.weight is missing");
  p = broken("optattr", [](h5::File& f) { H5Adelete_by_name(f.id(), "optimizer", "beta2", H5P_DEFAULT); });
  msg = user_error(load(p, true));
  EXPECT_TRUE(contains(msg, p) && contains(msg, "beta2")) << msg;
}

// A checkpoint written by PyTorch + h5py (scripts/unet_ckpt.py save_checkpoint) loads, with every
// value where the engine layout puts it. Tensor k (state_dict order), element i (PyTorch order)
// holds k * 4099 + i % 4093, exact in float32.
TEST(Checkpoint, LoadsPythonWrittenCheckpoint) {
  if (!test::have_torch()) GTEST_SKIP() << "no python3 with torch and h5py";
  const std::string dir = test::temp_dir("py");
  const std::string path = dir + "/py.h5", script = dir + "/make.py";
  std::ofstream(script)
      << "import sys\n"
         "import torch, h5py\n"
         "from unet_ckpt import save_checkpoint\n"
         "from unet_torch import create_model\n"
         "flags = dict(image_size=32, num_channels=32, channel_mult='1,2', num_res_blocks=1,\n"
         "  attention_resolutions='16', num_heads=2, num_head_channels=-1,\n"
         "  use_new_attention_order=False, use_scale_shift_norm=True, resblock_updown=True,\n"
         "  learn_sigma=True, class_cond=True, num_classes=10, dropout=0.25,\n"
         "  noise_schedule='cosine', diffusion_steps=300)\n"
         "m = create_model(flags)\n"
         "with torch.no_grad():\n"
         "    for k, p in enumerate(m.parameters()):\n"
         "        p.copy_((k * 4099 + torch.arange(p.numel()) % 4093).float().reshape(p.shape))\n"
         "save_checkpoint(m, flags, sys.argv[1])\n"
         "with h5py.File(sys.argv[1], 'r+') as f:  # booleans as h5py writes Python bools\n"
         "    f.attrs['learn_sigma'] = True\n"
         "    f.attrs['use_new_attention_order'] = False\n";
  const std::string cmd = "PYTHONPATH=" + test::source_dir() + "/scripts " + test::torch_python() + " " +
                          script + " " + path + " >" + dir + "/log.txt 2>&1";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "python failed, see " << dir << "/log.txt";

  ModelConfig want = preset("tiny32");
  want.num_heads = 2, want.num_head_channels = -1, want.use_new_attention_order = false;
  want.use_scale_shift_norm = true, want.resblock_updown = true, want.learn_sigma = true;
  want.class_cond = true, want.num_classes = 10, want.dropout = 0.25f, want.noise_schedule = "cosine";
  want.diffusion_steps = 300;
  Checkpoint ck = load_checkpoint(path);
  EXPECT_EQ(ck.cfg.describe(), want.describe());
  EXPECT_TRUE(ck.ema.empty());
  EXPECT_TRUE(ck.state.empty());
  const ParamTable t = build_param_table(ck.cfg);
  ASSERT_EQ(t.params.size(), 145u);  // params_full32.txt
  std::vector<float> v;
  for (size_t k = 0; k < t.params.size(); ++k) {
    const ParamInfo& p = t.params[k];
    v.resize(p.numel);
    engine_to_torch(p, ck.model.data() + p.offset, v.data());
    for (size_t i = 0; i < p.numel; ++i) ASSERT_EQ(v[i], (float)(k * 4099 + i % 4093)) << p.name << " " << i;
  }
}

TEST(Checkpoint, FailedSaveLeavesNoFileAndKeepsTheOld) {
  const std::string dir = test::temp_dir("atomic");
  const std::string path = dir + "/ck.h5";
  Checkpoint good = full_checkpoint(preset("tiny32"));
  save_checkpoint(path, good);

  std::string msg = user_error([&] { save_checkpoint(dir + "/no/such/dir/ck.h5", good); });
  EXPECT_TRUE(contains(msg, "no/such/dir")) << msg;

  // The temporary name is occupied by a directory: creating the file fails mid-save.
  Checkpoint other = full_checkpoint(preset("tiny32"));
  std::filesystem::create_directory(path + ".tmp-" + std::to_string(getpid()));
  std::filesystem::create_directory(path + ".tmp-" + std::to_string(getpid()) + "/x");  // not removable
  msg = user_error([&] { save_checkpoint(path, other); });
  EXPECT_TRUE(contains(msg, path)) << msg;
  std::filesystem::remove_all(path + ".tmp-" + std::to_string(getpid()));
  Checkpoint back = load_checkpoint(path, true);
  EXPECT_TRUE(same_bits(back.model, good.model));
  EXPECT_TRUE(same_bits(back.opt.v, good.opt.v));
  EXPECT_EQ(test::list_dir(dir), std::vector<std::string>{"ck.h5"});

  // A programming error (wrong arena size) is not a UserError, and writes nothing.
  Checkpoint wrong = good;
  wrong.ema.resize(7);
  EXPECT_THROW(save_checkpoint(dir + "/wrong.h5", wrong), std::invalid_argument);
  EXPECT_EQ(test::list_dir(dir), std::vector<std::string>{"ck.h5"});

  // Overwriting an existing checkpoint replaces it completely.
  save_checkpoint(path, other);
  back = load_checkpoint(path, true);
  EXPECT_TRUE(same_bits(back.model, other.model));
}
