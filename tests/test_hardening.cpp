// The library side of issue 14: output safety (special files, same-file inputs, symlinks, stale
// temporaries), the run-directory lock, memory checks, model bounds, and resume-setting
// resolution. The end-to-end faults (disk full, ulimits, two processes) are in
// test_reliability.py.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "checkpoint.h"
#include "config.h"
#include "resume.h"
#include "testutil.h"
#include "util.h"

using namespace unet;
namespace fs = std::filesystem;

namespace {
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

pid_t dead_pid() {
  pid_t p = fork();
  if (p == 0) _exit(0);
  waitpid(p, nullptr, 0);
  return p;
}
}  // namespace

TEST(Outputs, SpecialFilesAreNeverReplaced) {
  const std::string d = test::temp_dir("special");
  ASSERT_EQ(mkfifo((d + "/fifo").c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { AtomicFile f(d + "/fifo"); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { check_writable_dir_for(d); }).find("is a directory"), std::string::npos);
  EXPECT_NE(error_of([&] { check_writable_dir_for(d + "/no/x.h5"); }).find("does not exist"),
            std::string::npos);
  struct stat st;
  ASSERT_EQ(stat((d + "/fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(Outputs, SameFileThroughLinks) {
  const std::string d = test::temp_dir("same");
  spit(d + "/in", "x");
  fs::create_symlink(d + "/in", d + "/sym");
  fs::create_hard_link(d + "/in", d + "/hard");
  EXPECT_TRUE(same_file(d + "/in", d + "/sym"));
  EXPECT_TRUE(same_file(d + "/in", d + "/hard"));
  EXPECT_FALSE(same_file(d + "/in", d + "/missing"));
  EXPECT_FALSE(same_file(d + "/missing", d + "/missing"));
  EXPECT_NE(error_of([&] { check_not_input(d + "/sym", d + "/in", "checkpoint"); }).find("checkpoint"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { check_not_input(d + "/new", d + "/in", "checkpoint"); }), "");
}

TEST(Outputs, AtomicFileWritesThroughSymlinkAndKeepsIt) {
  const std::string d = test::temp_dir("symlink");
  spit(d + "/target", "old");
  fs::create_symlink(d + "/target", d + "/link");
  AtomicFile f(d + "/link");
  spit(f.tmp_path(), "new");
  f.commit();
  EXPECT_TRUE(fs::is_symlink(d + "/link"));
  EXPECT_EQ(slurp(d + "/target"), "new");
}

TEST(Outputs, StaleTemporariesOfDeadProcessesAreRemoved) {
  const std::string d = test::temp_dir("stale");
  const std::string dead = std::to_string(dead_pid()), me = std::to_string(getpid());
  for (const std::string& n :
       {"a.h5.tmp-" + dead, "b.png.tmp-" + dead, "c.h5.tmp-" + me, std::string("keep.tmp-x")})
    spit(d + "/" + n, "partial");
  remove_stale_temps(d);
  EXPECT_FALSE(fs::exists(d + "/a.h5.tmp-" + dead));
  EXPECT_FALSE(fs::exists(d + "/b.png.tmp-" + dead));
  EXPECT_TRUE(fs::exists(d + "/c.h5.tmp-" + me));  // this process's own
  EXPECT_TRUE(fs::exists(d + "/keep.tmp-x"));      // not a temporary name
}

TEST(Outputs, CopyFileAtomicReportsTheCause) {
  const std::string d = test::temp_dir("copy");
  spit(d + "/src", std::string(100000, 'z'));
  copy_file_atomic(d + "/src", d + "/dst");
  EXPECT_EQ(slurp(d + "/dst"), slurp(d + "/src"));
  EXPECT_NE(error_of([&] { copy_file_atomic(d + "/missing", d + "/dst2"); }).find("cannot read"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(d + "/dst2"));
}

TEST(DirLock, SecondHolderIsRefusedUntilReleased) {
  const std::string d = test::temp_dir("lock");
  {
    DirLock a(d, "unet train");
    // flock locks belong to the open file description: a second open conflicts, even here.
    const std::string e = error_of([&] { DirLock b(d, "unet train"); });
    EXPECT_NE(e.find("in use by another unet train (pid " + std::to_string(getpid()) + ")"),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(error_of([&] { DirLock c(d, "unet train"); }), "");
}

TEST(Memory, ChecksAndFormats) {
  EXPECT_GT(available_memory(), 0u);
  EXPECT_EQ(format_bytes(41e9), "41 GB");
  EXPECT_EQ(format_bytes(2.5e9), "2.5 GB");
  EXPECT_EQ(format_bytes(950e6), "950 MB");
  EXPECT_EQ(error_of([] { check_memory(1e6, "x"); }), "");
  const std::string e = error_of([] { check_memory(2e15, "sampling"); });
  EXPECT_EQ(e.rfind("sampling needs 2.0 PB of memory, ", 0), 0u) << e;
}

TEST(ModelBounds, AbsurdSizesAreOutOfRangeNotOverflows) {
  auto err = [](auto set, bool attr = false) {
    ModelConfig c = preset("tiny32");
    set(c);
    return c.validate(attr);
  };
  EXPECT_EQ(err([](ModelConfig& c) { c.num_res_blocks = 1000000; }),
            "--num-res-blocks 1000000 is out of range (1 to 64)");
  EXPECT_EQ(err([](ModelConfig& c) { c.num_res_blocks = 1000000; }, true),
            "num_res_blocks 1000000 is out of range (1 to 64)");
  EXPECT_NE(err([](ModelConfig& c) { c.num_classes = 2147483647; }).find("out of range"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.diffusion_steps = 1000000000; }).find("out of range"),
            std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.num_channels = 1 << 30; }).find("out of range"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.image_size = 8192; }).find("out of range"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.channel_mult.assign(100, 1); }).find("levels"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) {
              c.channel_mult = {1, 1 << 20};
            }).find("out of range"),
            std::string::npos);
  EXPECT_EQ(err([](ModelConfig&) {}), "");
  EXPECT_EQ(preset("imagenet64").validate(), "");
}

TEST(Checkpoint, NonFiniteTensorIsNamed) {
  const ParamTable t = build_param_table(preset("tiny32"));
  std::vector<float> a(t.total, 0.5f);
  EXPECT_EQ(nonfinite_tensor(t, a, "model"), "");
  a[t.params.back().offset] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(nonfinite_tensor(t, a, "ema"), "ema/" + t.params.back().name + " (Inf)");
}

// ---- resume -------------------------------------------------------------------------------------
namespace {
Checkpoint recorded(const TrainOptions& o) {
  Checkpoint ck;
  ck.has_optimizer = true;
  DatasetInfo info;
  info.count = 60;
  info.image_size = 8;
  store_train_settings(o, info, ck);
  ck.state["step"] = 4;
  return ck;
}
TrainOptions trained() {
  TrainOptions o;
  o.batch_size = 3, o.lr = 3e-3, o.lr_warmup = 5, o.ema_rate = 0.9, o.grad_clip = 0.5, o.weight_decay = 0.01;
  o.flip = false, o.seed = 7, o.steps = 8, o.save_every = 2, o.log_every = 1, o.sample_every = 4;
  return o;
}
}  // namespace

TEST(Resume, EverySettingComesFromTheCheckpoint) {
  const TrainOptions want = trained();
  ResumeSettings r = resolve_resume(recorded(want), "c.h5", TrainOptions(), {});
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_EQ(r.opt.batch_size, 3);
  EXPECT_EQ(r.opt.lr, 3e-3);
  EXPECT_EQ(r.opt.lr_warmup, 5);
  EXPECT_EQ(r.opt.ema_rate, 0.9);
  EXPECT_EQ(r.opt.grad_clip, 0.5);
  EXPECT_EQ(r.opt.weight_decay, 0.01);
  EXPECT_FALSE(r.opt.flip);
  EXPECT_EQ(r.opt.seed, 7u);
  EXPECT_EQ(r.opt.steps, 8);  // still ahead of step 4
  EXPECT_EQ(r.opt.save_every, 2);
  EXPECT_EQ(r.opt.log_every, 1);
  EXPECT_EQ(r.opt.sample_every, 4);
  EXPECT_EQ(r.opt.schedule_sampler, "uniform");
}

TEST(Resume, ExplicitFlagsOverrideWithOneWarning) {
  TrainOptions given;
  given.lr = 1e-3, given.seed = 9, given.log_every = 5, given.ema_rate = 0.9;
  ResumeSettings r =
      resolve_resume(recorded(trained()), "c.h5", given, {"--lr", "--seed", "--log-every", "--ema-rate"});
  EXPECT_EQ(r.opt.lr, 1e-3);
  EXPECT_EQ(r.opt.seed, 9u);
  EXPECT_EQ(r.opt.log_every, 5);
  EXPECT_EQ(r.opt.batch_size, 3);
  ASSERT_EQ(r.warnings.size(), 1u);
  // lr and seed change the continuation; the log interval and an unchanged EMA rate do not.
  EXPECT_NE(r.warnings[0].find("--lr 0.001 (checkpoint: 0.003)"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("--seed 9 (checkpoint: 7)"), std::string::npos) << r.warnings[0];
  EXPECT_EQ(r.warnings[0].find("--log-every"), std::string::npos) << r.warnings[0];
  EXPECT_EQ(r.warnings[0].find("--ema-rate"), std::string::npos) << r.warnings[0];
}

TEST(Resume, ReachedTargetDoesNotCarryOver) {
  TrainOptions o = trained();
  o.steps = 4;
  EXPECT_EQ(resolve_resume(recorded(o), "c.h5", TrainOptions(), {}).opt.steps, 0);
}

TEST(Resume, OlderCheckpointFallsBackWithOneWarning) {
  Checkpoint ck;
  ck.has_optimizer = true;
  ck.opt.lr = 2e-4;
  ck.opt.weight_decay = 0.05;
  ck.state = {{"step", 4}, {"seed", 7}, {"batch_size", 3}, {"flip", 1}, {"dataset_count", 60}};
  ResumeSettings r = resolve_resume(ck, "old.h5", TrainOptions(), {});
  EXPECT_EQ(r.opt.lr, 2e-4);
  EXPECT_EQ(r.opt.weight_decay, 0.05);
  EXPECT_EQ(r.opt.seed, 7u);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("old.h5 does not record --lr-warmup, --ema-rate and --grad-clip"),
            std::string::npos)
      << r.warnings[0];
}

TEST(Resume, UnknownScheduleSamplerIsRefused) {
  Checkpoint ck = recorded(trained());
  ck.state_str["schedule_sampler"] = "beta";
  EXPECT_NE(error_of([&] { resolve_resume(ck, "c.h5", TrainOptions(), {}); }).find("'beta'"), std::string::npos);
}

TEST(Resume, ScheduleSamplerAndMicrobatchComeFromTheCheckpoint) {
  TrainOptions o = trained();
  o.schedule_sampler = "loss-second-moment", o.microbatch = 1;
  ResumeSettings r = resolve_resume(recorded(o), "c.h5", TrainOptions(), {});
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_EQ(r.opt.schedule_sampler, "loss-second-moment");
  EXPECT_EQ(r.opt.microbatch, 1);
  // Changing either changes the continuation: one warning naming both.
  TrainOptions given;
  given.schedule_sampler = "uniform", given.microbatch = 3;
  r = resolve_resume(recorded(o), "c.h5", given, {"--schedule-sampler", "--microbatch"});
  EXPECT_EQ(r.opt.schedule_sampler, "uniform");
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("--schedule-sampler uniform (checkpoint: loss-second-moment)"), std::string::npos)
      << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("--microbatch 3 (checkpoint: 1)"), std::string::npos) << r.warnings[0];
}

TEST(Resume, OtherDatasetIsRefused) {
  Checkpoint ck = recorded(trained());
  ck.state["dataset_fingerprint"] = 1234;
  DatasetInfo info;
  info.count = 60, info.image_size = 8;
  EXPECT_EQ(error_of([&] { check_resume_dataset(ck, "c.h5", "d.h5", info, 1234); }), "");
  EXPECT_NE(error_of([&] { check_resume_dataset(ck, "c.h5", "d.h5", info, 99); }).find("different images"),
            std::string::npos);
  info.count = 30;
  EXPECT_NE(error_of([&] { check_resume_dataset(ck, "c.h5", "d.h5", info, 1234); }).find("30 images"),
            std::string::npos);
}
