// Data-parallel pieces that need no second process: the launchers' environments (and the clean
// errors for inconsistent ones), Slurm's host lists, the global-batch slicing of the data loader,
// the streaming image reader, the control plane's collectives between threads, and the model's
// grad-ready hook that the bucketed all-reduce relies on.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "comm.h"
#include "control.h"
#include "dataloader.h"
#include "dataset.h"
#include "h5.h"
#include "image_reader.h"
#include "init.h"
#include "launch.h"
#include "model.h"
#include "spawn.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {

DistEnv parse(const std::map<std::string, std::string>& m) {
  return parse_dist_env([&m](const char* n) -> const char* {
    auto it = m.find(n);
    return it == m.end() ? nullptr : it->second.c_str();
  });
}

// The UserError text of parse(m) ("" when it parses).
std::string error_of(const std::map<std::string, std::string>& m) {
  try {
    parse(m);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Launch, NoEnvironmentIsOneProcess) {
  DistEnv e = parse({});
  EXPECT_EQ(e.world, 1);
  EXPECT_EQ(e.rank, 0);
  EXPECT_FALSE(e.distributed());
  // A Slurm batch script (no srun step) is one process too, whatever the allocation's size.
  e = parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_NODELIST", "gpu[1-2]"}});
  EXPECT_EQ(e.world, 1);
}

TEST(Launch, Torchrun) {
  DistEnv e = parse({{"RANK", "5"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "4"},
                     {"MASTER_ADDR", "node0"},
                     {"MASTER_PORT", "29500"}});
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world, 4);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.port, 29501);  // torchrun's store holds MASTER_PORT
  EXPECT_EQ(e.launcher, "torchrun");
  e = parse({{"RANK", "1"},
             {"WORLD_SIZE", "2"},
             {"LOCAL_RANK", "1"},
             {"LOCAL_WORLD_SIZE", "2"},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", "4000"},
             {"UNET_LAUNCHER", "unet --gpus"}});
  EXPECT_EQ(e.launcher, "unet --gpus");
}

TEST(Launch, OpenMpi) {
  DistEnv e = parse({{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                     {"OMPI_MCA_ess_base_jobid", "12345"}});
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.master_addr, "127.0.0.1");  // one node
  EXPECT_GT(e.port, 20000);
  // The port is a function of the job: every rank of the job computes the same one.
  EXPECT_EQ(e.port, parse({{"OMPI_COMM_WORLD_RANK", "0"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                           {"OMPI_MCA_ess_base_jobid", "12345"}})
                        .port);
  // Several nodes, no MASTER_ADDR: left to MPI (empty here).
  e = parse({{"OMPI_COMM_WORLD_RANK", "3"},
             {"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(e.master_addr, "");
  e = parse({{"OMPI_COMM_WORLD_RANK", "3"},
             {"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
             {"MASTER_ADDR", "h0"},
             {"MASTER_PORT", "7000"}});
  EXPECT_EQ(e.master_addr, "h0");
  EXPECT_EQ(e.port, 7001);
}

TEST(Launch, Slurm) {
  DistEnv e = parse({{"SLURM_PROCID", "5"},
                     {"SLURM_STEP_ID", "0"},
                     {"SLURM_JOB_ID", "777"},
                     {"SLURM_STEP_NUM_TASKS", "7"},
                     {"SLURM_NTASKS", "16"},  // the allocation's; the step's count wins
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_NODEID", "1"},
                     {"SLURM_STEP_TASKS_PER_NODE", "4,3"},
                     {"SLURM_STEP_NODELIST", "gpu[07-08]"}});
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world, 7);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world, 3);
  EXPECT_EQ(e.master_addr, "gpu07");
  e = parse({{"SLURM_PROCID", "2"},
             {"SLURM_STEPID", "3"},
             {"SLURM_NTASKS", "4"},
             {"SLURM_LOCALID", "0"},
             {"SLURM_NTASKS_PER_NODE", "2"},
             {"SLURM_JOB_NODELIST", "a-[1-2]x,b"}});
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.local_world, 2);
  EXPECT_EQ(e.master_addr, "a-1x");
  // torchrun started inside an srun step: torchrun's variables win.
  e = parse({{"SLURM_PROCID", "0"},
             {"SLURM_STEP_ID", "0"},
             {"SLURM_NTASKS", "1"},
             {"SLURM_LOCALID", "0"},
             {"RANK", "1"},
             {"WORLD_SIZE", "2"},
             {"LOCAL_RANK", "1"},
             {"LOCAL_WORLD_SIZE", "2"},
             {"MASTER_ADDR", "x"},
             {"MASTER_PORT", "1"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.world, 2);
}

TEST(Launch, InconsistentEnvironmentsNameTheVariable) {
  const std::map<std::string, std::string> ok = {{"RANK", "1"},        {"WORLD_SIZE", "2"},
                                                 {"LOCAL_RANK", "1"},  {"LOCAL_WORLD_SIZE", "2"},
                                                 {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  EXPECT_EQ(error_of(ok), "");
  auto with = [&](const std::string& k, const char* v) {
    auto m = ok;
    if (v)
      m[k] = v;
    else
      m.erase(k);
    return error_of(m);
  };
  struct Case {
    std::string var;
    const char* value;
    std::string needle;
  };
  const Case cases[] = {
      {"WORLD_SIZE", nullptr, "WORLD_SIZE"},
      {"RANK", nullptr, "RANK"},
      {"RANK", "2", "RANK=2"},
      {"RANK", "-1", "RANK"},
      {"RANK", "one", "RANK='one'"},
      {"WORLD_SIZE", "0", "WORLD_SIZE"},
      {"LOCAL_RANK", "2", "LOCAL_RANK=2"},
      {"LOCAL_RANK", nullptr, "LOCAL_RANK"},
      {"LOCAL_WORLD_SIZE", "3", "LOCAL_WORLD_SIZE=3"},
      {"MASTER_ADDR", nullptr, "MASTER_ADDR"},
      {"MASTER_PORT", nullptr, "MASTER_PORT"},
      {"MASTER_PORT", "65535", "MASTER_PORT"},
      {"MASTER_PORT", "80x", "MASTER_PORT"},
  };
  for (const Case& c : cases) {
    const std::string err = with(c.var, c.value);
    EXPECT_NE(err.find(c.needle), std::string::npos)
        << c.var << "=" << (c.value ? c.value : "(unset)") << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  // Two launchers' variables that disagree.
  auto m = ok;
  m["OMPI_COMM_WORLD_RANK"] = "0";
  m["OMPI_COMM_WORLD_SIZE"] = "2";
  m["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  m["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  EXPECT_NE(error_of(m).find("OMPI_COMM_WORLD_RANK"), std::string::npos) << error_of(m);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "0"}}).find("OMPI_COMM_WORLD_SIZE"), std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "4"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}})
                .find("OMPI_COMM_WORLD_RANK=4"),
            std::string::npos);
  // Slurm: a node index past the tasks-per-node list; a malformed list.
  const std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "0"},
                                                    {"SLURM_STEP_ID", "0"},
                                                    {"SLURM_STEP_NUM_TASKS", "2"},
                                                    {"SLURM_LOCALID", "0"},
                                                    {"SLURM_NODEID", "2"},
                                                    {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                                                    {"SLURM_STEP_NODELIST", "n[1-2]"}};
  EXPECT_NE(error_of(slurm).find("SLURM_NODEID"), std::string::npos) << error_of(slurm);
  auto s2 = slurm;
  s2["SLURM_NODEID"] = "0";
  s2["SLURM_STEP_TASKS_PER_NODE"] = "2(x";
  EXPECT_NE(error_of(s2).find("SLURM_STEP_TASKS_PER_NODE"), std::string::npos) << error_of(s2);
  s2["SLURM_STEP_TASKS_PER_NODE"] = "2";
  s2["SLURM_STEP_NODELIST"] = "n[1-";
  EXPECT_NE(error_of(s2).find("SLURM_STEP_NODELIST"), std::string::npos) << error_of(s2);
}

TEST(Launch, SlurmHostLists) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_hostlist("gpu[01-04,07],login1", "L"),
            (V{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"}));
  EXPECT_EQ(expand_hostlist("node7", "L"), (V{"node7"}));
  EXPECT_EQ(expand_hostlist("r[1-2]-n[08-09]", "L"), (V{"r1-n08", "r1-n09", "r2-n08", "r2-n09"}));
  EXPECT_EQ(expand_hostlist("a[9-10]b", "L"), (V{"a9b", "a10b"}));
  for (const char* bad : {"gpu[01-", "gpu]", "gpu[4-2]", "gpu[x]", "a,,b", ""}) {
    try {
      expand_hostlist(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << bad;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(expand_tasks_per_node("2(x3),1", "T"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("8", "T"), (std::vector<int>{8}));
  EXPECT_THROW(expand_tasks_per_node("2(x)", "T"), UserError);
  EXPECT_THROW(expand_tasks_per_node("a", "T"), UserError);
}

TEST(Launch, GpuOfARank) {
  DistEnv e;
  e.world = 4, e.local_world = 2, e.local_rank = 1;
  EXPECT_EQ(gpu_for_rank(e, 2), 1);
  EXPECT_EQ(gpu_for_rank(e, 8), 1);
  EXPECT_EQ(gpu_for_rank(e, 1), 0);  // CUDA_VISIBLE_DEVICES gives each rank its own GPU
  e.local_world = 4, e.local_rank = 3;
  EXPECT_THROW(gpu_for_rank(e, 2), UserError);
  EXPECT_THROW(gpu_for_rank(e, 0), UserError);
}

TEST(Launch, GpusFlagIsDroppedForTheRanks) {
  using V = std::vector<std::string>;
  EXPECT_EQ(drop_gpus_flag(V{"unet", "train", "d.h5", "--gpus", "2", "--steps", "3"}),
            (V{"unet", "train", "d.h5", "--steps", "3"}));
  EXPECT_EQ(drop_gpus_flag(V{"unet", "train", "--gpus=4", "d.h5"}), (V{"unet", "train", "d.h5"}));
}

// ---- global batch slicing ----

namespace {
struct Toy {
  DatasetInfo info;
  std::vector<uint8_t> images;
  std::vector<int64_t> labels;
};
Toy toy(int N, int S, uint64_t seed) {
  Toy t;
  t.info.count = N;
  t.info.image_size = S;
  t.info.has_labels = true;
  t.info.class_names = {"a", "b", "c"};
  auto u = test::randu(size_t(N) * S * S * 3, seed, 0.0f, 256.0f);
  for (float x : u) t.images.push_back(uint8_t(std::min(255.0f, x)));
  for (int i = 0; i < N; ++i) t.labels.push_back(i % 3);
  return t;
}
}  // namespace

TEST(GlobalBatch, RanksSliceTheBatchOfOneProcess) {
  const uint64_t seed = test::test_seed();
  const int N = 13, S = 4, B = 12;
  Toy t = toy(N, S, seed);
  const size_t numel = size_t(S) * S * 3;
  for (int world : {2, 3, 4}) {
    DataLoader one(t.info, t.images, t.labels, B, 1000, seed, true, 7);
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < world; ++r)
      ranks.push_back(std::make_unique<DataLoader>(t.info, t.images, t.labels, B, 1000, seed, true, 7, 3,
                                                   nullptr, r, world));
    for (int s = 7; s < 12; ++s) {  // across an epoch boundary (13 images, 12 per step)
      Batch* a = one.next();
      const int b = B / world;
      for (int r = 0; r < world; ++r) {
        Batch* x = ranks[r]->next();
        ASSERT_EQ(ranks[r]->local_batch(), b);
        ASSERT_EQ(x->t.size(), size_t(b));
        for (int j = 0; j < b; ++j) {
          const int g = r * b + j;
          EXPECT_EQ(x->t[j], a->t[g]) << world << " " << r << " " << j;
          EXPECT_EQ(x->labels[j], a->labels[g]);
          for (size_t k = 0; k < numel; ++k)
            ASSERT_EQ(x->x0[j * numel + k], a->x0[g * numel + k]) << "x0 world " << world << " rank " << r;
        }
      }
    }
  }
  try {
    DataLoader bad(t.info, t.images, t.labels, 10, 1000, seed, true, 0, 3, nullptr, 0, 4);
    ADD_FAILURE() << "batch 10 on 4 ranks accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--batch-size 10"), std::string::npos) << e.what();
  }
}

// ---- streaming ----

namespace {
bool same(const Batch& a, const Batch& b) {
  return a.step == b.step && a.x0 == b.x0 && a.t == b.t && a.labels == b.labels;
}
using EnvGuard = test::ScopedEnv;
}  // namespace

TEST(Streaming, StreamedBatchesEqualResidentOnes) {
  const uint64_t seed = test::test_seed();
  const int N = 150, S = 8;
  Toy t = toy(N, S, seed);
  const std::string dir = test::temp_dir("stream");
  // The layouts a dataset may have: prepare's (small chunks), an older one (64 images a chunk),
  // contiguous, chunked without compression.
  const std::string fresh = dir + "/fresh.h5";
  {
    DatasetWriter w(fresh, S, true, t.info.class_names);
    for (int i = 0; i < N; ++i) w.append(t.images.data() + size_t(i) * S * S * 3, t.labels[i]);
    w.commit();
  }
  auto variant = [&](const std::string& name, int chunk, int gzip) {
    const std::string p = dir + "/" + name;
    h5::File f = h5::File::create(p);
    const std::vector<hsize_t> shape{(hsize_t)N, (hsize_t)S, (hsize_t)S, 3};
    if (chunk > 0)
      h5::write_u8(f, "images", t.images.data(), shape, {(hsize_t)chunk, (hsize_t)S, (hsize_t)S, 3}, gzip);
    else
      h5::write_u8(f, "images", t.images.data(), shape);
    h5::write_i64(f, "labels", t.labels.data(), {(hsize_t)N});
    h5::set_attr(f, "labels", "class_names", t.info.class_names);
    h5::set_attr(f, "/", "format", "unet-dataset");
    h5::set_attr(f, "/", "version", 1);
    h5::set_attr(f, "/", "image_size", S);
    h5::set_attr(f, "/", "count", (int64_t)N);
    f.close();
    return p;
  };
  const std::string files[] = {fresh, variant("old.h5", 64, 4), variant("raw.h5", 0, 0),
                               variant("nozip.h5", 7, 0)};
  for (const std::string& p : files) {
    ImageReader r(p, 1 << 12);  // a tiny cache: evictions happen
    EXPECT_TRUE(r.parallel()) << p;
    std::vector<uint8_t> img(r.image_bytes());
    for (int i : {0, 1, 63, 64, 65, 149, 7, 0}) {
      r.read(i, img.data());
      ASSERT_TRUE(std::equal(img.begin(), img.end(), t.images.begin() + size_t(i) * img.size()))
          << p << " " << i;
    }
    EXPECT_THROW(r.read(N, img.data()), UserError);
    DataLoader mem(t.info, t.images, t.labels, 6, 1000, seed, true, 3, 3, nullptr, 1, 2);
    std::unique_ptr<DataLoader> streamed;
    {
      EnvGuard g("UNET_STREAM_DATA", "1");
      streamed = std::make_unique<DataLoader>(p, 6, 1000, seed, true, 3, 3, nullptr, 1, 2);
    }
    EXPECT_TRUE(streamed->streaming());
    for (int s = 3; s < 40; ++s) ASSERT_TRUE(same(*mem.next(), *streamed->next())) << p << " step " << s;
  }
  // Never-written chunks read as the fill value (zeros).
  const std::string sparse = dir + "/sparse.h5";
  {
    h5::File f = h5::File::create(sparse);
    h5::create_extendible(f, "images", h5::DType::U8, {(hsize_t)S, (hsize_t)S, 3}, 1, 4);
    h5::append_rows(f, "images", h5::DType::U8, t.images.data(), 1);
    {
      std::lock_guard<std::recursive_mutex> lk(h5::mutex());
      hid_t d = H5Dopen2(f.id(), "images", H5P_DEFAULT);
      const hsize_t dims[4] = {1000, (hsize_t)S, (hsize_t)S, 3};
      ASSERT_GE(H5Dset_extent(d, dims), 0);
      H5Dclose(d);
    }
    f.close();
  }
  ImageReader r(sparse);
  EXPECT_EQ(r.count(), 1000);
  std::vector<uint8_t> img(r.image_bytes(), 7);
  r.read(0, img.data());
  EXPECT_TRUE(std::equal(img.begin(), img.end(), t.images.begin()));
  r.read(999, img.data());
  EXPECT_EQ(*std::max_element(img.begin(), img.end()), 0);
}

// ---- the control plane, ranks as threads ----

TEST(ControlPlane, CollectivesBetweenThreads) {
  // A free port: bind 0, read it back.
  DistEnv base;
  base.world = 3, base.local_world = 3, base.master_addr = "127.0.0.1", base.launcher = "test";
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(::bind(fd, (sockaddr*)&a, sizeof a), 0);
    ::getsockname(fd, (sockaddr*)&a, &len);
    base.port = ntohs(a.sin_port);
    ::close(fd);
  }
  std::vector<std::string> gathered[3];
  std::string bcast[3];
  std::vector<float> sums[3];
  bool anys[3][2];
  std::vector<std::thread> th;
  for (int r = 0; r < 3; ++r)
    th.emplace_back([&, r] {
      DistEnv e = base;
      e.rank = e.local_rank = r;
      ControlPlane cp(e, 20, 42);
      gathered[r] = cp.all_gather("rank" + std::to_string(r));
      bcast[r] = cp.broadcast(r == 0 ? "from zero" : "ignored");
      sums[r] = {1.0f + r, r == 0 ? 1e8f : r == 1 ? 1.0f : -1e8f, 0.5f};
      cp.all_reduce(sums[r].data(), sums[r].size(), false);
      anys[r][0] = cp.any(false);
      anys[r][1] = cp.any(r == 2);
      cp.barrier();
      cp.finish();
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(gathered[r], (std::vector<std::string>{"rank0", "rank1", "rank2"}));
    EXPECT_EQ(bcast[r], "from zero");
    // Rank order: (1e8 + 1) + -1e8 = 0 in float (another order would give 1), on every rank.
    EXPECT_EQ(sums[r], (std::vector<float>{6.0f, 0.0f, 1.5f}));
    EXPECT_FALSE(anys[r][0]);
    EXPECT_TRUE(anys[r][1]);
  }
}

// ---- the grad-ready hook ----

TEST(GradReadyHook, GradientsAtOrAboveTheOffsetAreFinal) {
  ModelConfig c;
  c.image_size = 8;
  c.num_channels = 32;
  c.channel_mult = {1, 2};
  c.num_res_blocks = 1;
  c.attention_resolutions = {4};
  c.num_head_channels = 16;
  c.class_cond = true;
  c.num_classes = 3;
  c.learn_sigma = true;
  auto eng = make_cpu_engine();
  Model m(c, *eng);
  const int B = 2;
  m.plan(B, Mode::Train);
  std::vector<float> p = init_params(m.table(), 3);
  for (float& x : p) x += 0.01f;  // zero-initialised layers would give zero gradients
  eng->upload(m.params(), p.data());
  const int R = c.image_size;
  Tensor x = eng->alloc(DType::F32, {B, R, R, 3}), t = eng->alloc(DType::F32, {B}),
         y = eng->alloc(DType::I32, {B}), out = eng->alloc(DType::F32, {B, R, R, 6}),
         dout = eng->alloc(DType::F32, {B, R, R, 6});
  auto xr = test::randn(x.numel(), 1), dr = test::randn(dout.numel(), 2);
  std::vector<float> tr = {10.f, 500.f};
  std::vector<int32_t> yr = {0, 2};
  eng->upload(x, xr.data()), eng->upload(dout, dr.data()), eng->upload(t, tr.data()),
      eng->upload(y, yr.data());
  // Snapshots at every call: the CPU engine runs ops synchronously, so what is in the arena at
  // the call is what a side stream would read.
  std::vector<std::pair<size_t, std::vector<float>>> snaps;
  const size_t P = m.arena_floats();
  // (between the lanes' joins too, as the trainer asks for a data-parallel model)
  m.set_grad_ready_hook(
      [&](size_t first) {
        std::vector<float> g(P);
        eng->download(g.data(), m.grads());
        snaps.emplace_back(first, std::vector<float>(g.begin() + first, g.end()));
      },
      true);
  // Poison the arena so that a gradient written after its hook call would show.
  eng->ops().run(Fill{m.grads(), 12345.0f});
  m.forward(x, t, y, out, true);
  m.backward(dout);
  std::vector<float> g(P);
  eng->download(g.data(), m.grads());
  // (during the backward, not only at its end: the output layers', then every kReadyEvery = 5
  // layers' (lib/model/model.cpp), then the last call with 0)
  ASSERT_GE(snaps.size(), 4u);
  EXPECT_EQ(snaps.back().first, 0u);
  for (size_t i = 0; i < snaps.size(); ++i) {
    if (i) {
      EXPECT_LE(snaps[i].first, snaps[i - 1].first);
    }
    const auto& [first, part] = snaps[i];
    for (size_t k = 0; k < part.size(); ++k)
      ASSERT_EQ(part[k], g[first + k]) << "call " << i << " offset " << first + k;
  }
  // And the hook is silent when planning (the tracer runs backward without data).
  Model m2(c, *eng);
  int calls = 0;
  m2.set_grad_ready_hook([&](size_t) { ++calls; });
  m2.plan(B, Mode::Train);
  EXPECT_EQ(calls, 0);
}
