// The library side of issue 14: output safety (special files, same-file inputs, symlinks, stale
// temporaries), the run-directory lock, memory checks, model bounds, and resume-setting
// resolution. The end-to-end faults (disk full, ulimits, two processes) are in
// test_reliability.py.
#include <gtest/gtest.h>
#include <iconv.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "checkpoint.h"
#include "config.h"
#include "engine.h"
#include "env_vars.h"
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

// glibc's iconv as the independent judge of UTF-8 (it refuses overlong forms and surrogates):
// the code points, or false.
static bool decode_utf8(const std::string& s, std::vector<char32_t>& cps) {
  iconv_t cd = iconv_open("UTF-32LE", "UTF-8");
  if (cd == (iconv_t)-1) return false;
  std::string in = s;
  std::vector<char32_t> out(s.size() + 2);
  char *ip = in.data(), *op = reinterpret_cast<char*>(out.data());
  size_t il = in.size(), ol = out.size() * sizeof(char32_t);
  const bool ok = iconv(cd, &ip, &il, &op, &ol) != (size_t)-1 && il == 0;
  iconv_close(cd);
  cps.assign(out.begin(), out.begin() + (out.size() - ol / sizeof(char32_t)));
  return ok;
}

// A code point that ends a line or moves the terminal for some reader.
static bool line_breaking(char32_t c) {
  return c < 0x20 || (c >= 0x7f && c < 0xa0) || c == 0x2028 || c == 0x2029;
}

TEST(Errors, OneLineEscapesControlCharactersAndBytesThatAreNotUtf8) {
  EXPECT_EQ(one_line("d.h5: format is 'a\nb'"), "d.h5: format is 'a\\x0ab'");
  EXPECT_EQ(one_line("\x1b[31mred\r\t\x7f"), "\\x1b[31mred\\x0d\\x09\\x7f");
  EXPECT_EQ(one_line("ünïcode 日本 \xf0\x9f\x99\x82"), "ünïcode 日本 \xf0\x9f\x99\x82");  // kept
  EXPECT_EQ(one_line("\xe3("), "\\xe3(");                                                 // cut sequence
  EXPECT_EQ(one_line("\xc0\xaf"), "\\xc0\\xaf");                                          // overlong '/'
  EXPECT_EQ(one_line("\xed\xa0\x80"), "\\xed\\xa0\\x80");                                 // a surrogate
  EXPECT_EQ(one_line("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");                        // past U+10FFFF
  EXPECT_EQ(one_line("ab\xe6\x97"), "ab\\xe6\\x97");                                      // ends mid-sequence
  EXPECT_EQ(one_line("a\xc2\x85"
                     "b\xe2\x80\xa8"
                     "c"),
            "a\\xc2\\x85b\\xe2\\x80\\xa8c");  // NEL, U+2028
  EXPECT_EQ(one_line(std::string("a\0b", 3)), "a\\x00b");
  // Random bytes: the result is UTF-8 without a line-breaking code point, and a string that
  // already was (as iconv decodes it) comes back unchanged.
  std::mt19937_64 rng(test::test_seed());
  for (int i = 0; i < 4000; ++i) {
    std::string s(rng() % 24, ' ');
    for (char& c : s) c = (char)(i % 2 ? rng() % 256 : 0x80 + rng() % 128);  // odd: any byte
    const std::string o = one_line(s);
    std::vector<char32_t> cps;
    ASSERT_TRUE(decode_utf8(o, cps)) << i;
    for (char32_t c : cps) ASSERT_FALSE(line_breaking(c)) << i << " U+" << std::hex << (uint32_t)c;
    bool plain = decode_utf8(s, cps);
    for (char32_t c : cps) plain = plain && !line_breaking(c);
    if (plain)
      EXPECT_EQ(o, s) << i;
    else
      EXPECT_NE(o, s) << i;
  }
}

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

// load_library (cuDNN's and NCCL's loader): unset, the first of the search list that loads; a
// library the variable names is the only one tried, and one that does not load is reported with
// the loader's message, not replaced by the search list's.
TEST(Libraries, ANamedLibraryIsTheOnlyOneTried) {
  const char* var = "UNET_TEST_LIBRARY";
  {
    const test::ScopedEnv unset(var, nullptr);
    const LoadedLibrary l = load_library(var, {"libunet-no-such-library.so", "libm.so.6"});
    EXPECT_NE(l.handle, nullptr);
    EXPECT_EQ(l.path, "libm.so.6");
    EXPECT_EQ(l.error, "");
    const LoadedLibrary none = load_library(var, {"libunet-no-such-library.so"});
    EXPECT_EQ(none.handle, nullptr);
    EXPECT_EQ(none.error, "");
  }
  {
    const test::ScopedEnv named(var, "/bin/sh");  // a file, not a shared library
    const LoadedLibrary l = load_library(var, {"libm.so.6"});
    EXPECT_EQ(l.handle, nullptr);
    EXPECT_EQ(l.path, "");
    EXPECT_EQ(l.error.rfind("UNET_TEST_LIBRARY=/bin/sh: ", 0), 0u) << l.error;
  }
  {
    const test::ScopedEnv named(var, "libm.so.6");
    const LoadedLibrary l = load_library(var, {"libunet-no-such-library.so"});
    EXPECT_NE(l.handle, nullptr);
    EXPECT_EQ(l.path, "libm.so.6");
  }
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
  o.lr_anneal_steps = 12;
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
  EXPECT_EQ(r.opt.lr_anneal_steps, 12);
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
  TrainOptions given;
  given.lr_anneal_steps = 99;  // (not recorded: no anneal, whatever the default would be)
  ResumeSettings r = resolve_resume(ck, "old.h5", given, {});
  EXPECT_EQ(r.opt.lr_anneal_steps, 0);
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
  EXPECT_NE(error_of([&] { resolve_resume(ck, "c.h5", TrainOptions(), {}); }).find("'beta'"),
            std::string::npos);
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
  EXPECT_NE(r.warnings[0].find("--schedule-sampler uniform (checkpoint: loss-second-moment)"),
            std::string::npos)
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

// A damaged or hand-edited checkpoint: every recorded setting is checked against the range of its
// flag (one table for both), naming the file and the attribute, unless the flag replaces it.
TEST(Resume, RecordedValuesOutsideTheirRangeAreRefused) {
  struct Case {
    const char* key;
    double value;
    bool real;
  };
  const Case cases[] = {{"batch_size", 0, false},
                        {"batch_size", 1e9, false},
                        {"seed", -1, false},
                        {"lr_warmup", -3, false},
                        {"lr_anneal_steps", -2, false},
                        {"microbatch", -1, false},
                        {"microbatch", 70000, false},
                        {"save_every", -1, false},
                        {"log_every", -1, false},
                        {"sample_every", -9, false},
                        {"lr", NAN, true},
                        {"lr", 0, true},
                        {"ema_rate", 1.5, true},
                        {"grad_clip", INFINITY, true},
                        {"weight_decay", -0.1, true}};
  for (const Case& c : cases) {
    Checkpoint ck = recorded(trained());
    if (c.real)
      ck.state_f64[c.key] = c.value;
    else
      ck.state[c.key] = (int64_t)c.value;
    const std::string e = error_of([&] { resolve_resume(ck, "c.h5", TrainOptions(), {}); });
    EXPECT_NE(e.find(std::string("c.h5: state attribute ") + c.key), std::string::npos) << c.key << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  Checkpoint ck = recorded(trained());
  ck.state["batch_size"] = 0;
  TrainOptions given;
  given.batch_size = 4;
  EXPECT_EQ(resolve_resume(ck, "c.h5", given, {"--batch-size"}).opt.batch_size, 4);
  ck = recorded(trained());
  ck.state["step"] = -1;
  EXPECT_NE(error_of([&] { resolve_resume(ck, "c.h5", TrainOptions(), {}); }).find("step = -1"),
            std::string::npos);
  Checkpoint old;  // an older checkpoint: lr from the optimizer group, checked alike
  old.has_optimizer = true;
  old.opt.lr = NAN;
  old.state = {{"step", 4}};
  EXPECT_NE(
      error_of([&] { resolve_resume(old, "old.h5", TrainOptions(), {}); }).find("optimizer attribute lr"),
      std::string::npos);
}

// train-classifier's own settings (noised, eval_every) are recorded in classifier checkpoints only
// and checked like the others.
TEST(Resume, ClassifierSettingsAreRecordedAndChecked) {
  TrainOptions o = trained();
  o.noised = false, o.eval_every = 3;
  Checkpoint ck = recorded(o);
  EXPECT_EQ(ck.state.count("eval_every"), 0u) << "a diffusion run records no classifier setting";
  Checkpoint c;
  c.is_classifier = true;
  c.has_optimizer = true;
  DatasetInfo info;
  info.count = 60;
  info.image_size = 8;
  store_train_settings(o, info, c);
  c.state["step"] = 4;
  ResumeSettings r = resolve_resume(c, "c.h5", TrainOptions(), {});
  EXPECT_FALSE(r.opt.noised);
  EXPECT_EQ(r.opt.eval_every, 3);
  for (int64_t bad : {0, -3}) {
    Checkpoint d = c;
    d.state["eval_every"] = bad;
    const std::string e = error_of([&] { resolve_resume(d, "c.h5", TrainOptions(), {}); });
    EXPECT_NE(e.find("c.h5: state attribute eval_every = " + std::to_string(bad)), std::string::npos) << e;
    EXPECT_NE(e.find("--eval-every"), std::string::npos) << e;
    TrainOptions given;
    given.eval_every = 2;
    EXPECT_EQ(resolve_resume(d, "c.h5", given, {"--eval-every"}).opt.eval_every, 2);
  }
  EXPECT_EQ(train_setting_range("--eval-every").text(), "an integer from 1 to 9223372036854775807");
  EXPECT_TRUE(train_setting_range("--noised").contains_int(1));
}

TEST(Resume, FlagsAndRecordedValuesShareOneRange) {
  EXPECT_EQ(train_setting_range("--batch-size").text(), "an integer from 1 to 65536");
  EXPECT_EQ(train_setting_range("--lr").text(), "a finite number > 0");
  EXPECT_EQ(train_setting_range("--ema-rate").text(), "a finite number in [0, 1]");
  EXPECT_FALSE(train_setting_range("--grad-clip").contains(INFINITY));
  EXPECT_FALSE(train_setting_range("--lr").contains(0));
  EXPECT_TRUE(train_setting_range("--microbatch").contains_int(0));
  EXPECT_THROW(train_setting_range("--nope"), std::logic_error);
}

TEST(Resume, LossSecondMomentHistoryIsCheckedBeforeTraining) {
  TrainOptions o = trained();
  o.schedule_sampler = "loss-second-moment";
  const Checkpoint good = [&] {
    Checkpoint ck = recorded(o);
    ck.loss_history.assign((size_t)ck.cfg.diffusion_steps * 10, 0.5);
    ck.loss_counts.assign(ck.cfg.diffusion_steps, 10);
    return ck;
  }();
  EXPECT_EQ(error_of([&] { resolve_resume(good, "c.h5", TrainOptions(), {}); }), "");
  Checkpoint ck = good;
  ck.loss_counts[3] = 11;
  EXPECT_NE(error_of([&] { resolve_resume(ck, "c.h5", TrainOptions(), {}); }).find("c.h5: state/loss_counts"),
            std::string::npos);
  ck = good;
  ck.loss_history[7] = NAN;
  EXPECT_NE(
      error_of([&] { resolve_resume(ck, "c.h5", TrainOptions(), {}); }).find("c.h5: state/loss_history"),
      std::string::npos);
  ck = good;
  ck.loss_history.resize(ck.loss_history.size() / 2);
  EXPECT_NE(error_of([&] { resolve_resume(ck, "c.h5", TrainOptions(), {}); }).find("state/loss_history"),
            std::string::npos);
  // The uniform sampler does not use the history: resuming with it is a warning, not an error.
  TrainOptions given;
  given.schedule_sampler = "uniform";
  ResumeSettings r = resolve_resume(ck, "c.h5", given, {"--schedule-sampler"});
  EXPECT_EQ(r.opt.schedule_sampler, "uniform");
  EXPECT_EQ(r.warnings.size(), 1u);
}

// ---- the environment ----------------------------------------------------------------------------
using EnvVar = test::ScopedEnv;

TEST(Environment, EveryVariableIsParsedOrRefusedNamingIt) {
  {
    EnvVar v("UNET_BUCKET_MB", nullptr);
    EXPECT_EQ(env_bucket_bytes(7), 7u);
  }
  for (const char* ok : {"25", "0", "0.5", "1000000"}) {
    EnvVar v("UNET_BUCKET_MB", ok);
    EXPECT_EQ(env_bucket_bytes(7), (size_t)(std::atof(ok) * (1 << 20))) << ok;
  }
  for (const char* bad : {"abc", "-1", "nan", "inf", "1e7", " 5", "5 ", "25MB"}) {
    EnvVar v("UNET_BUCKET_MB", bad);
    EXPECT_NE(error_of([] { env_bucket_bytes(0); }).find("UNET_BUCKET_MB='"), std::string::npos) << bad;
    EXPECT_NE(error_of([] { check_environment(); }).find("UNET_BUCKET_MB"), std::string::npos) << bad;
  }
  {
    EnvVar v("UNET_STREAM_DATA", "1");
    EXPECT_EQ(env_stream_data(), 1);
  }
  for (const char* bad : {"yes", "2", "true"}) {
    EnvVar v("UNET_STREAM_DATA", bad);
    EXPECT_NE(error_of([] { env_stream_data(); }).find("UNET_STREAM_DATA"), std::string::npos) << bad;
  }
  {
    EnvVar v("UNET_CPU_COMM", "mpi");
    EXPECT_EQ(env_cpu_comm(), "mpi");
  }
  {
    EnvVar v("UNET_CPU_COMM", "nccl");
    EXPECT_NE(error_of([] { env_cpu_comm(); }).find("UNET_CPU_COMM='nccl'"), std::string::npos);
  }
}

TEST(Environment, CudnnCacheIsNoSpecialFileNorAnInput) {
  const std::string d = test::temp_dir("cache");
  ASSERT_EQ(mkfifo((d + "/fifo").c_str(), 0644), 0);
  spit(d + "/in.h5", "x");
  fs::create_symlink(d + "/in.h5", d + "/link");
  const std::vector<std::pair<std::string, std::string>> inputs = {{"dataset", d + "/in.h5"}};
  auto err = [&](const char* cache) {
    EnvVar v("UNET_CUDNN_CACHE", cache);
    return error_of([&] { check_environment(inputs); });
  };
  EXPECT_NE(err((d + "/fifo").c_str()).find("is a FIFO"), std::string::npos);
  EXPECT_NE(err(d.c_str()).find("is a directory"), std::string::npos);
  EXPECT_NE(err((d + "/in.h5").c_str()).find("same file as the dataset"), std::string::npos);
  EXPECT_NE(err((d + "/link").c_str()).find("UNET_CUDNN_CACHE="), std::string::npos);
  EXPECT_EQ(err((d + "/plans.txt").c_str()), "");
  EnvVar none("UNET_CUDNN_CACHE", nullptr);
  EnvVar xdg("XDG_CACHE_HOME", d.c_str());
  EXPECT_EQ(cudnn_cache_path(), d + "/unet/cudnn-plans.txt");
}

// A forced variant the engine lacks is refused once the engine is made (DeviceFlags::make,
// profile), naming where it came from.
TEST(KernelOverrides, UnknownNamesAreRefusedAgainstTheEngine) {
  auto eng = make_cpu_engine();
  auto check = [&] { check_kernel_overrides(eng->base_ops()); };
  set_kernel_overrides("conv=nope");
  const std::string e = error_of(check);
  EXPECT_NE(e.find("--kernels: kernel variant conv=nope does not exist (conv has: "), std::string::npos) << e;
  EXPECT_NE(e.find("ref"), std::string::npos) << e;
  set_kernel_overrides("nosuch=ref");
  EXPECT_NE(error_of(check).find("no kernel family or op 'nosuch'"), std::string::npos);
  set_kernel_overrides("conv_fwd=ref,groupnorm=ref");
  EXPECT_EQ(error_of(check), "");
  set_kernel_overrides("");
  EXPECT_EQ(error_of(check), "");
}
