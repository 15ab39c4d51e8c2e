// `unet profile` on a real GPU: CUPTI records attributed to layer ranges, kernel-time sum vs CUDA
// events (within 10%), and the CLI's table / CSV / JSON / Chrome trace. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine.h"
#include "flops.h"
#include "profile_report.h"
#include "profiler_cupti.h"
#include "testutil.h"

using namespace unet;
using json = nlohmann::json;

namespace {

bool have_gpu(std::string* why) {
  if (!cuda_available()) {
    *why = "no CUDA device";
    return false;
  }
  auto eng = make_cuda_engine(Precision::TF32, why);
  return eng != nullptr;
}

#define NEED_GPU()                              \
  do {                                          \
    std::string why_;                           \
    if (!have_gpu(&why_)) GTEST_SKIP() << why_; \
  } while (0)

// Chrome trace-event format (JSON object form) as Perfetto / chrome://tracing read it.
// kernels / memsets: those of the eager pass; replay_kernels: those of the process "GPU: CUDA-graph
// replays".
void validate_trace(const json& t, size_t* kernels, size_t* layers, size_t* replay_kernels, size_t* memsets) {
  ASSERT_TRUE(t.is_object());
  ASSERT_TRUE(t.contains("traceEvents") && t["traceEvents"].is_array());
  *kernels = *layers = *replay_kernels = *memsets = 0;
  int replay_pid = -1;
  for (const auto& e : t["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name" &&
        e["args"].value("name", "") == "GPU: CUDA-graph replays")
      replay_pid = e["pid"];
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
  std::map<std::string, std::vector<std::pair<double, double>>> spans;  // layer ranges by path
  for (const auto& e : t["traceEvents"]) {
    ASSERT_TRUE(e.is_object());
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e.dump();
    const std::string ph = e["ph"];
    ASSERT_TRUE(ph == "X" || ph == "M") << e.dump();
    if (ph == "M") {
      ASSERT_TRUE(e.contains("args") && e["args"].is_object()) << e.dump();
      continue;
    }
    ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
    ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const std::string cat = e.value("cat", "");
    if (cat == "kernel") ++*(e["pid"].get<int>() == replay_pid ? replay_kernels : kernels);
    if (cat == "memset" && e["pid"].get<int>() != replay_pid) ++*memsets;
    if (cat == "layer") {
      ++*layers;
      ASSERT_TRUE(e.contains("args") && e["args"].contains("path")) << e.dump();
      const std::string path = e["args"]["path"];
      spans[path].push_back({e["ts"].get<double>(), e["dur"].get<double>()});
    }
    // Kernels of one stream may overlap on Hopper: cuBLAS's and cuDNN's kernels use programmatic
    // dependent launch, starting before their predecessor ends, and so may the GPU spans of
    // sibling layer ranges (measured: 0.1-5 us where a range starts with a cuDNN kernel). A layer
    // range's span must lie within one of its parent's (checked below); the host's ranges nest.
    if (cat != "range") continue;
    tracks[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back(
        {e["ts"].get<double>(), e["dur"].get<double>()});
  }
  for (const auto& kv : spans) {
    const size_t slash = kv.first.rfind('/');
    if (slash == std::string::npos) continue;
    const auto parent = spans.find(kv.first.substr(0, slash));
    ASSERT_NE(parent, spans.end()) << "no parent range for " << kv.first;
    for (const auto& c : kv.second) {
      bool inside = false;
      for (const auto& p : parent->second)
        inside = inside || (c.first >= p.first - 1e-3 && c.first + c.second <= p.first + p.second + 1e-3);
      EXPECT_TRUE(inside) << kv.first << " at " << c.first << " outside every " << parent->first;
    }
  }
  for (auto& kv : tracks) {
    auto& ev = kv.second;
    std::sort(ev.begin(), ev.end(),
              [](auto& a, auto& b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<double> ends;
    for (auto& e : ev) {
      while (!ends.empty() && ends.back() <= e.first + 1e-3) ends.pop_back();
      if (!ends.empty()) {
        EXPECT_LE(e.first + e.second, ends.back() + 1e-3)
            << "overlapping events on track " << kv.first.first << "/" << kv.first.second;
      }
      ends.push_back(e.first + e.second);
    }
  }
}

std::string read_file(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

const json* find_layer(const json& j, const std::string& path) {
  for (const auto& l : j["layers"])
    if (l["path"] == path) return &l;
  return nullptr;
}

// The checks every JSON report must pass.
void check_report(const json& j, int iters) {
  ASSERT_FALSE(j["kernels"].empty());
  uint64_t total = 0;
  for (auto& k : j["kernels"]) {
    EXPECT_GT(k["instances"].get<uint64_t>(), 0u);
    EXPECT_LE(k["min_ns"].get<uint64_t>(), k["max_ns"].get<uint64_t>());
    total += k["total_ns"].get<uint64_t>();
  }
  for (auto& k : j["memops"]) total += k["total_ns"].get<uint64_t>();
  const auto& tm = j["timing"];
  EXPECT_NEAR(tm["kernel_sum_ms_per_iter"].get<double>(), (double)total / 1e6 / iters, 1e-6);
  EXPECT_GT(tm["cuda_events_ms_per_iter"].get<double>(), 0.0);
  EXPECT_EQ(j["dropped_records"].get<uint64_t>(), 0u);
  // The CUDA events bracket the same region as the CUPTI records: hardly any event time lies
  // outside the span of the recorded activities (else work went unrecorded or the clocks differ).
  const double events = tm["cuda_events_ms_per_iter"].get<double>();
  EXPECT_LT(std::fabs(tm["outside_kernel_span_ms_per_iter"].get<double>()), 0.03 * events) << tm.dump();
  // The busy time (union of intervals) is at most the kernel sum: equal on one stream, less where
  // kernels of the two lanes (UNET_LANES) overlap.
  const double busy = tm["gpu_busy_ms_per_iter"].get<double>(), ksum = tm["kernel_sum_ms_per_iter"].get<double>();
  EXPECT_LE(busy, 1.001 * ksum) << tm.dump();
  EXPECT_GT(busy, 0.5 * ksum) << tm.dump();
  EXPECT_GT(j["peaks"]["tflops"].get<double>(), 0.0);
  EXPECT_GT(j["peaks"]["gbps"].get<double>(), 0.0);
}

}  // namespace

// The profiler API directly: every kernel of a convolution loop lands in its range, and the
// summed kernel time matches CUDA events around the same region.
TEST(ProfileGpu, ApiKernelsAttributedAndSumMatchesEvents) {
  NEED_GPU();
  std::string why;
  auto eng = make_cuda_engine(Precision::TF32, &why);
  ASSERT_TRUE(eng) << why;
  auto gp = prof::make_gpu_profiler(&why);
  ASSERT_TRUE(gp) << why;
  prof::RangeTracker tracker([&] { return gp->timestamp(); });
  tracker.on_push = [&](uint64_t id) { gp->push_range(id); };
  tracker.on_pop = [&] { gp->pop_range(); };
  set_range_listener(&tracker);
  flops::CountingOps ops(eng->base_ops(), eng->device(),
                         [&](const char*, const std::string& v, const flops::Cost& c) {
                           tracker.add_cost(c.flops, c.bytes);
                           tracker.add_variant(v);
                         });
  Device& dev = eng->device();
  // Big enough that each convolution runs far longer than its launch takes (cuDNN's are fast).
  const int B = 32, H = 64, C = 256;
  const size_t n = (size_t)B * H * H * C;
  auto hx = test::randn(n, test::test_seed());
  auto hw = test::randn((size_t)C * 9 * C, test::test_seed() + 1, 0.03f);
  Tensor x = eng->alloc(DType::F32, {B, H, H, C}), w = eng->alloc(DType::F32, {C, 3, 3, C});
  Tensor y = eng->alloc(DType::F32, {B, H, H, C});
  eng->upload(x, hx.data());
  eng->upload(w, hw.data());
  const ConvFwd conv{x, w, {}, {}, {}, y, 1};
  const int iters = 20;
  gp->start();
  for (int i = 0; i < 3; ++i) ops.run(conv);
  gp->region_begin();
  tracker.clear();
  for (int i = 0; i < iters; ++i) {
    dev.range_push("outer");
    dev.range_push("conv");
    ops.run(conv);
    dev.range_pop();
    dev.range_pop();
  }
  const double ms = gp->region_end();
  gp->stop();
  set_range_listener(nullptr);
  auto acts = gp->take_activities();
  ASSERT_GE(acts.size(), (size_t)iters);
  uint64_t sum = 0;
  for (size_t i = 0; i < acts.size(); ++i) {
    sum += acts[i].duration();
    EXPECT_NE(acts[i].range, 0u) << acts[i].name << " has no layer range";
    EXPECT_EQ(prof::range_path(tracker, acts[i].range), "outer/conv") << acts[i].name;
    if (i) {
      EXPECT_GE(acts[i].start, acts[i - 1].start);
    }
  }
  EXPECT_EQ(gp->dropped(), 0u);
  const double ksum = sum / 1e6;
  std::printf("kernel sum %.3f ms, CUDA events %.3f ms (%zu activities)\n", ksum, ms, acts.size());
  EXPECT_NEAR(ksum / ms, 1.0, 0.10);
  EXPECT_LE(ksum, ms * 1.001) << "kernels cannot take longer than the region they ran in";
  auto rows = prof::aggregate_layers(tracker.instances(), acts);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].time_ns, sum);
  EXPECT_EQ(rows[1].calls, (uint64_t)iters);
  EXPECT_DOUBLE_EQ(rows[1].flops, iters * conv.flops());
  ASSERT_EQ(rows[1].variants.size(), 1u);  // the variant that ran is recorded on its layer
  EXPECT_EQ(rows[1].variants[0], eng->base_ops().variant(conv));
}

// CUPTI with CUDA graphs: replays of a captured convolution loop produce one kernel record per
// kernel node per replay (counted once, none missing), and their sum matches CUDA events.
TEST(ProfileGpu, ApiGraphReplaysRecordedOnce) {
  NEED_GPU();
  std::string why;
  auto eng = make_cuda_engine(Precision::TF32, &why);
  ASSERT_TRUE(eng) << why;
  auto gp = prof::make_gpu_profiler(&why);
  ASSERT_TRUE(gp) << why;
  Device& dev = eng->device();
  Ops& ops = eng->ops();
  const int B = 32, H = 64, C = 256, per_graph = 4, replays = 10;
  const size_t n = (size_t)B * H * H * C;
  auto hx = test::randn(n, test::test_seed());
  auto hw = test::randn((size_t)C * 9 * C, test::test_seed() + 1, 0.03f);
  Tensor x = eng->alloc(DType::F32, {B, H, H, C}), w = eng->alloc(DType::F32, {C, 3, 3, C});
  Tensor y = eng->alloc(DType::F32, {B, H, H, C});
  eng->upload(x, hx.data());
  eng->upload(w, hw.data());
  const ConvFwd conv{x, w, {}, {}, {}, y, 1};
  gp->start();
  // Eager: how many activities one convolution is.
  ops.run(conv);
  gp->region_begin();
  ops.run(conv);
  gp->region_end();
  const size_t per_conv = gp->take_activities().size();
  ASSERT_GE(per_conv, 1u);
  ASSERT_TRUE(dev.supports_graphs());
  dev.graph_begin();
  for (int i = 0; i < per_graph; ++i) ops.run(conv);
  dev.graph_end();
  dev.graph_launch();
  gp->region_begin();
  for (int i = 0; i < replays; ++i) dev.graph_launch();
  const double ms = gp->region_end();
  gp->stop();
  auto acts = gp->take_activities();
  EXPECT_EQ(acts.size(), per_conv * per_graph * replays);
  uint64_t sum = 0;
  for (size_t i = 0; i < acts.size(); ++i) {
    sum += acts[i].duration();
    if (i) {
      EXPECT_GE(acts[i].start, acts[i - 1].start);
    }
  }
  EXPECT_EQ(gp->dropped(), 0u);
  std::printf("graph: kernel sum %.3f ms, CUDA events %.3f ms (%zu activities)\n", sum / 1e6, ms,
              acts.size());
  EXPECT_NEAR(sum / 1e6 / ms, 1.0, 0.10);
  EXPECT_LE(sum / 1e6, ms * 1.001);
}

// The done criterion: the resblock profile, JSON + trace, kernel sum vs CUDA events.
// How far the CUDA events lie from the GPU's busy time, in % of the events: the kernel sum's
// "difference" no longer measures launch gaps where lanes overlap kernels.
static double busy_diff_pct(const json& j) {
  const double ev = j["timing"]["cuda_events_ms_per_iter"].get<double>();
  return 100.0 * (ev - j["timing"]["gpu_busy_ms_per_iter"].get<double>()) / ev;
}

TEST(ProfileGpu, ResblockJsonAndTrace) {
  NEED_GPU();
  const std::string trace = test::temp_dir("profile") + "/resblock.json";
  auto r = test::run_unet(
      "profile --layer resblock --batch-size 32 --resolution 64 --in-channels 192 "
      "--out-channels 64 --iters 20 --format json --trace " +
      trace);
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  check_report(j, 20);
  const double diff = j["timing"]["difference_pct"].get<double>();
  std::printf("resblock: kernel sum %.3f ms/iter, CUDA events %.3f ms/iter (%.1f%%)\n",
              j["timing"]["kernel_sum_ms_per_iter"].get<double>(),
              j["timing"]["cuda_events_ms_per_iter"].get<double>(), diff);
  EXPECT_LT(std::fabs(busy_diff_pct(j)), 10.0) << j["timing"].dump();
  for (const char* p :
       {"resblock fwd", "resblock fwd/in_layers", "resblock fwd/emb_layers", "resblock fwd/out_layers",
        "resblock fwd/skip_connection", "resblock bwd", "resblock bwd/in_layers"}) {
    const json* l = find_layer(j, p);
    ASSERT_TRUE(l) << p;
    EXPECT_NEAR((*l)["calls_per_iter"].get<double>(), 1.0, 1e-9) << p;
    EXPECT_GT((*l)["ms_per_iter"].get<double>(), 0.0) << p;
    EXPECT_GT((*l)["flops_per_iter"].get<double>(), 0.0) << p;
    EXPECT_GT((*l)["tflops"].get<double>(), 0.0) << p;
    // Whole blocks move far more than the 50 MB L2 holds, so they cannot beat the DRAM roof
    // (small sub-ranges can: their data may stay in L2).
    if (std::string(p).find('/') == std::string::npos) {
      EXPECT_LT((*l)["peak_pct"].get<double>(), 100.0) << p << ": faster than the GPU's peak?";
    }
  }
  const double fwd = (*find_layer(j, "resblock fwd"))["ms_per_iter"].get<double>();
  const double bwd = (*find_layer(j, "resblock bwd"))["ms_per_iter"].get<double>();
  // The layer table is the eager pass's (graph replays carry no ranges).
  ASSERT_EQ(j["mode"], "graph");
  ASSERT_TRUE(j["timing"]["eager"].is_object());
  EXPECT_NEAR((fwd + bwd) / j["timing"]["eager"]["kernel_sum_ms_per_iter"].get<double>(), 1.0, 0.02)
      << "nearly all GPU time lies inside the two ranges";
  // The same kernels either way: replays record as many activities as the eager pass.
  uint64_t graph_acts = 0;
  for (auto& k : j["kernels"]) graph_acts += k["instances"].get<uint64_t>();
  for (auto& k : j["memops"]) graph_acts += k["instances"].get<uint64_t>();
  EXPECT_EQ(graph_acts, j["timing"]["eager"]["activities"].get<uint64_t>());
  EXPECT_NEAR(j["timing"]["kernel_sum_ms_per_iter"].get<double>() /
                  j["timing"]["eager"]["kernel_sum_ms_per_iter"].get<double>(),
              1.0, 0.05);

  json t = json::parse(read_file(trace));
  size_t kernels = 0, layers = 0, replay_kernels = 0, memsets = 0;
  validate_trace(t, &kernels, &layers, &replay_kernels, &memsets);
  // Both passes are in the trace: the replays' kernels are the kernel table's, and the eager pass
  // ran them too, cuDNN's workspace memsets as memsets (the graph runs them as fill kernels).
  uint64_t instances = 0;
  for (auto& k : j["kernels"]) instances += k["instances"].get<uint64_t>();
  EXPECT_EQ(replay_kernels, instances);
  EXPECT_EQ(kernels + memsets, instances);
  EXPECT_GE(layers, 20u * 2);
}

TEST(ProfileGpu, ResblockTableAndCsv) {
  NEED_GPU();
  const std::string args =
      "profile --layer resblock --batch-size 32 --resolution 64 --in-channels 192 "
      "--out-channels 64 --iters 5 --warmup 2";
  auto t = test::run_unet(args);
  ASSERT_EQ(t.code, 0) << t.err;
  std::printf("%s\n", t.out.c_str());
  for (const char* s :
       {"Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
        "StdDev (ns)", "Name", "resblock fwd", "  in_layers", "TFLOP/s", "kernel sum", "CUDA events"})
    EXPECT_NE(t.out.find(s), std::string::npos) << s;
  auto c = test::run_unet(args + " --format csv");
  ASSERT_EQ(c.code, 0) << c.err;
  // Rectangular: every row has as many fields as the header (fields with commas are quoted).
  std::istringstream in(c.out);
  std::string line;
  size_t ncols = 0, rows = 0, kernel_rows = 0;
  while (std::getline(in, line)) {
    size_t fields = 1;
    bool q = false;
    for (char ch : line) {
      if (ch == '"')
        q = !q;
      else if (ch == ',' && !q)
        ++fields;
    }
    EXPECT_FALSE(q) << line;
    if (!rows++) ncols = fields;
    EXPECT_EQ(fields, ncols) << line;
    if (line.rfind("kernel,", 0) == 0) ++kernel_rows;
  }
  EXPECT_GT(kernel_rows, 0u);
}

TEST(ProfileGpu, ModelTrainingStep) {
  NEED_GPU();
  auto r = test::run_unet("profile --layer model --batch-size 32 --iters 10 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  check_report(j, 10);
  const double diff = j["timing"]["difference_pct"].get<double>();
  std::printf(
      "model step (graph): kernel sum %.3f ms/iter, CUDA events %.3f ms/iter (%.1f%%), %.1f GFLOP/iter\n",
      j["timing"]["kernel_sum_ms_per_iter"].get<double>(),
      j["timing"]["cuda_events_ms_per_iter"].get<double>(), diff,
      j["totals"]["flops_per_iter"].get<double>() / 1e9);
  std::printf("model step (graph): GPU idle between kernels %.3f ms/iter\n",
              j["timing"]["idle_between_kernels_ms_per_iter"].get<double>());
  ASSERT_EQ(j["mode"], "graph");
  const json& e = j["timing"]["eager"];
  ASSERT_TRUE(e.is_object());
  std::printf("model step (eager): kernel sum %.3f ms/iter, CUDA events %.3f ms/iter (%.1f%%), idle %.3f\n",
              e["kernel_sum_ms_per_iter"].get<double>(), e["cuda_events_ms_per_iter"].get<double>(),
              e["difference_pct"].get<double>(), e["idle_between_kernels_ms_per_iter"].get<double>());
  // The done criterion, on what `unet train` runs (a replayed CUDA graph).
  EXPECT_LT(std::fabs(busy_diff_pct(j)), 10.0) << j["timing"].dump();
  // Nothing double-counted or lost: the replays record as many activities as the eager pass.
  uint64_t graph_acts = 0;
  for (auto& k : j["kernels"]) graph_acts += k["instances"].get<uint64_t>();
  for (auto& k : j["memops"]) graph_acts += k["instances"].get<uint64_t>();
  EXPECT_EQ(graph_acts, e["activities"].get<uint64_t>());
  for (const char* p : {"forward", "backward", "optimizer", "loss"}) EXPECT_TRUE(find_layer(j, p)) << p;
  int blocks = 0;
  for (const auto& l : j["layers"])
    if (l["name"].get<std::string>().find("input_blocks.") == 0) {
      ++blocks;
      EXPECT_GT(l["ms_per_iter"].get<double>(), 0.0) << l["path"];
    }
  EXPECT_GE(blocks, 24);
  // SPEC §5: 1.47 TFLOP of GEMM-shaped work per step, plus a little memory-bound work.
  EXPECT_NEAR(j["totals"]["flops_per_iter"].get<double>() / 1.47e12, 1.0, 0.1);
}

// --no-graph: the old eager-only report (no eager block; kernel table from eager launches).
TEST(ProfileGpu, NoGraphIsEager) {
  NEED_GPU();
  auto r = test::run_unet(
      "profile --layer resblock --batch-size 32 --resolution 64 --in-channels 192 --out-channels 64 "
      "--iters 5 --warmup 2 --format json --no-graph --no-plain-timing");
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  check_report(j, 5);
  EXPECT_EQ(j["mode"], "eager");
  EXPECT_TRUE(j["timing"]["eager"].is_null());
  // Eager launches leave host-paced gaps between kernels (~30 a 1 ms iteration here), so the bound is
  // looser than the graph's 10%: an H200 measured 10.1% once (2026-11-30, beside no other GPU work).
  EXPECT_LT(std::fabs(busy_diff_pct(j)), 20.0) << j["timing"].dump();
}

TEST(ProfileGpu, EveryLayerKindRuns) {
  NEED_GPU();
  for (const char* l : {"resblock", "attention", "conv3x3", "conv1x1", "groupnorm", "linear", "upsample",
                        "downsample", "adamw"}) {
    for (const char* pass : {"forward", "backward", "step"}) {
      auto r = test::run_unet(
          std::string("profile --layer ") + l + " --pass " + pass +
          " --batch-size 4 --resolution 16 --in-channels 64 --iters 2 --warmup 1 --format json "
          "--no-plain-timing");
      ASSERT_EQ(r.code, 0) << l << " " << pass << ": " << r.err;
      json j = json::parse(r.out);
      EXPECT_FALSE(j["kernels"].empty()) << l << " " << pass;
      EXPECT_FALSE(j["layers"].empty()) << l << " " << pass;
    }
  }
}

// --layer model --pass forward profiles what `unet sample` runs per step: eval mode (no dropout
// kernels although the model has dropout), memory planned for sampling (less than the training
// step holds), no backward.
TEST(ProfileGpu, ModelForwardIsSamplingsForward) {
  NEED_GPU();
  auto profile = [](const char* pass) {
    auto r = test::run_unet(std::string("profile --layer model --pass ") + pass +
                            " --batch-size 4 --image-size 32 --num-channels 32 --channel-mult 1,2 "
                            "--num-res-blocks 1 --attention-resolutions 16 --dropout 0.1 --iters 2 --warmup 1 "
                            "--format json --no-plain-timing");
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code ? json() : json::parse(r.out);
  };
  const json fwd = profile("forward"), step = profile("step");
  ASSERT_FALSE(fwd.is_null());
  ASSERT_FALSE(step.is_null());
  auto has_kernel = [](const json& j, const std::string& part) {
    for (const auto& k : j["kernels"])
      if (k["name"].get<std::string>().find(part) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has_kernel(step, "Dropout"));  // the training step's forward drops
  EXPECT_FALSE(has_kernel(fwd, "Dropout"));
  EXPECT_TRUE(find_layer(fwd, "forward"));
  EXPECT_FALSE(find_layer(fwd, "backward"));
  EXPECT_LT(fwd["memory_bytes"].get<double>(), step["memory_bytes"].get<double>());
}

// The switch: UNET_KERNELS / --kernels picks the conv variant, and the profile's layer
// table says which ran.
TEST(ProfileGpu, KernelOverrideShowsInTheLayerTable) {
  NEED_GPU();
  auto variants = [](const std::string& extra) {
    auto r = test::run_unet(
        "profile --layer conv3x3 --batch-size 8 --resolution 32 --in-channels 64 --iters 2 "
        "--warmup 1 --format json --no-plain-timing " +
        extra);
    EXPECT_EQ(r.code, 0) << r.err;
    std::set<std::string> v;
    if (r.code) return v;
    const json j = json::parse(r.out);
    for (const auto& l : j["layers"])
      for (const auto& x : l["variants"]) v.insert(x.get<std::string>());
    if (v.empty()) ADD_FAILURE() << "no variants in " << j["layers"].dump().substr(0, 2000);
    return v;
  };
  const auto forced = variants("--kernels conv=im2col");
  EXPECT_TRUE(forced.count("conv_fwd=im2col")) << "forced im2col";
  EXPECT_TRUE(forced.count("conv_bwd_filter=im2col"));
  const auto dflt = variants("");
  EXPECT_FALSE(dflt.empty());
  std::printf("default conv variants:");
  for (auto& x : dflt) std::printf(" %s", x.c_str());
  std::printf("\n");
  auto bad = test::run_unet("profile --layer conv3x3 --kernels conv=nosuch --iters 1");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("conv=nosuch does not exist"), std::string::npos) << bad.err;
}
