// `unet profile`, device-independent half: kernel aggregation, layer ranges, roofline math,
// FLOP counts, the three output formats and the Chrome trace, on synthetic CUPTI-like records.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "config.h"
#include "engine.h"
#include "flops.h"
#include "model.h"
#include "params.h"
#include "profile_report.h"
#include "testutil.h"

using namespace unet;
using namespace unet::prof;
using json = nlohmann::json;

namespace {

// Random durations per name; returns the activities and remembers every duration.
std::vector<Activity> random_acts(std::mt19937_64& g, std::map<std::string, std::vector<uint64_t>>& truth,
                                  int names, ActivityKind kind, const std::string& prefix) {
  std::vector<Activity> acts;
  std::uniform_int_distribution<int> count(1, 40);
  std::uniform_int_distribution<uint64_t> dur(500, 2000000);
  uint64_t t = 1000000;
  for (int k = 0; k < names; ++k) {
    const std::string name = prefix + std::to_string(k) + "<float, 128>(int, float const*)";
    const int n = count(g);
    for (int i = 0; i < n; ++i) {
      Activity a;
      a.kind = kind;
      a.name = name;
      a.start = t;
      a.end = t + dur(g);
      a.bytes = kind == ActivityKind::Kernel ? 0 : 4096 * (i + 1);
      t = a.end + 100;
      truth[name].push_back(a.duration());
      acts.push_back(a);
    }
  }
  std::shuffle(acts.begin(), acts.end(), g);
  return acts;
}

// A CSV reader that honours quoted fields (commas, doubled quotes) — enough for RFC 4180.
std::vector<std::vector<std::string>> parse_csv(const std::string& s) {
  std::vector<std::vector<std::string>> rows(1);
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (quoted) {
      if (c == '"' && i + 1 < s.size() && s[i + 1] == '"')
        field += '"', ++i;
      else if (c == '"')
        quoted = false;
      else
        field += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().push_back(field), field.clear();
    } else if (c == '\n') {
      rows.back().push_back(field), field.clear();
      rows.emplace_back();
    } else {
      field += c;
    }
    any = true;
  }
  if (!field.empty()) rows.back().push_back(field);
  if (rows.back().empty()) rows.pop_back();
  EXPECT_FALSE(quoted) << "unterminated quote";
  (void)any;
  return rows;
}

// Checks the Chrome trace-event format (JSON object form): what Perfetto and chrome://tracing need.
void validate_trace(const json& t, size_t* n_kernels, size_t* n_layers) {
  ASSERT_TRUE(t.is_object());
  ASSERT_TRUE(t.contains("traceEvents"));
  ASSERT_TRUE(t["traceEvents"].is_array());
  *n_kernels = *n_layers = 0;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
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
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    if (e.contains("args")) {
      ASSERT_TRUE(e["args"].is_object());
    }
    const std::string cat = e.value("cat", "");
    if (cat == "kernel") ++*n_kernels;
    if (cat == "layer") ++*n_layers;
    tracks[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back(
        {e["ts"].get<double>(), e["dur"].get<double>()});
  }
  // Complete events on one track must nest or be disjoint (else viewers draw them wrongly).
  for (auto& kv : tracks) {
    auto& ev = kv.second;
    std::sort(ev.begin(), ev.end(),
              [](auto& a, auto& b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<double> ends;
    for (auto& e : ev) {
      while (!ends.empty() && ends.back() <= e.first + 1e-9) ends.pop_back();
      if (!ends.empty()) {
        EXPECT_LE(e.first + e.second, ends.back() + 1e-6) << "overlapping events on a track";
      }
      ends.push_back(e.first + e.second);
    }
  }
}

// An engine that does nothing: FLOP counting of whole models without memory or a device.
class NullDevice final : public Device {
 public:
  bool is_cuda() const override { return false; }
  std::string name() const override { return "null"; }
  // Fake, never dereferenced addresses, distinct per allocation.
  void* alloc(size_t b) override {
    uintptr_t p = next_;
    next_ += (b + 255) / 256 * 256 + 256;
    return reinterpret_cast<void*>(p);
  }
  void upload(void*, const void*, size_t) override {}
  void download(void*, const void*, size_t) override {}
  void sync() override {}
  size_t bytes_held() const override { return next_ - 0x100000; }
  size_t bytes_free() const override { return size_t(1) << 50; }

 private:
  uintptr_t next_ = 0x100000;
};
class NullOps final : public OpsAdapter<NullOps> {
 public:
  int calls = 0;
  template <class Op>
  void handle(const Op& op) {
    op.check();
    ++calls;
  }
  template <class Op>
  size_t handle_prepare(const Op&) {
    return 0;
  }
  template <class Op>
  std::string handle_variant(const Op&) {
    return "null";
  }
};
std::unique_ptr<Engine> null_engine() {
  return std::make_unique<Engine>(std::make_unique<NullDevice>(), std::make_unique<NullOps>(),
                                  Precision::FP32);
}

}  // namespace

// ---- nsys-style summary ----

TEST(ProfileReport, SummaryMatchesIndependentStatistics) {
  std::mt19937_64 g(test::test_seed());
  std::map<std::string, std::vector<uint64_t>> truth;
  auto acts = random_acts(g, truth, 7, ActivityKind::Kernel, "void kern");
  std::map<std::string, std::vector<uint64_t>> mtruth;
  auto mem = random_acts(g, mtruth, 2, ActivityKind::Memcpy, "[CUDA memcpy ");
  acts.insert(acts.end(), mem.begin(), mem.end());

  auto rows = summarize(acts, true);
  ASSERT_EQ(rows.size(), truth.size());
  uint64_t all = 0;
  for (auto& kv : truth)
    for (auto d : kv.second) all += d;
  double pct = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    ASSERT_TRUE(truth.count(r.name)) << r.name;
    auto d = truth[r.name];
    // Independent reference: Welford for mean/variance, nth_element for the median.
    double mean = 0, m2 = 0;
    for (size_t k = 0; k < d.size(); ++k) {
      double delta = d[k] - mean;
      mean += delta / (k + 1);
      m2 += delta * (d[k] - mean);
    }
    uint64_t total = 0;
    for (auto x : d) total += x;
    std::vector<uint64_t> s = d;
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    double med = (double)s[s.size() / 2];
    if (s.size() % 2 == 0) {
      uint64_t lower = *std::max_element(s.begin(), s.begin() + s.size() / 2);
      med = 0.5 * (med + (double)lower);
    }
    EXPECT_EQ(r.instances, d.size());
    EXPECT_EQ(r.total_ns, total);
    EXPECT_NEAR(r.avg_ns, mean, 1e-6 * mean);
    EXPECT_DOUBLE_EQ(r.med_ns, med);
    EXPECT_EQ(r.min_ns, *std::min_element(d.begin(), d.end()));
    EXPECT_EQ(r.max_ns, *std::max_element(d.begin(), d.end()));
    const double sd = d.size() > 1 ? std::sqrt(m2 / (d.size() - 1)) : 0.0;
    EXPECT_NEAR(r.stddev_ns, sd, 1e-6 * (sd + 1));
    EXPECT_NEAR(r.time_pct, 100.0 * total / all, 1e-9);
    pct += r.time_pct;
    if (i) {
      EXPECT_GE(rows[i - 1].total_ns, r.total_ns) << "sorted by total time";
    }
  }
  EXPECT_NEAR(pct, 100.0, 1e-9);

  auto mrows = summarize(acts, false);
  ASSERT_EQ(mrows.size(), mtruth.size());
  for (const auto& r : mrows) {
    uint64_t bytes = 0;
    for (size_t k = 0; k < mtruth[r.name].size(); ++k) bytes += 4096 * (k + 1);
    EXPECT_EQ(r.bytes, bytes) << r.name;
  }
}

TEST(ProfileReport, SingleInstanceHasZeroStddev) {
  Activity a;
  a.name = "k";
  a.start = 10;
  a.end = 1010;
  auto rows = summarize({a}, true);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].stddev_ns, 0.0);
  EXPECT_EQ(rows[0].med_ns, 1000.0);
  EXPECT_EQ(rows[0].time_pct, 100.0);
}

TEST(ProfileReport, Demangle) {
  EXPECT_EQ(demangle("_Z3fooi"), "foo(int)");
  EXPECT_EQ(demangle("plain_name"), "plain_name");
  EXPECT_EQ(demangle("_Znot a symbol"), "_Znot a symbol");
}

// ---- layer ranges ----

namespace {
struct Synthetic {
  RangeTracker tracker;
  std::vector<Activity> acts;
  uint64_t clock = 1000;
  Synthetic() : tracker([this] { return clock; }) {}
  void kernel(uint64_t dur) {
    Activity a;
    a.name = "k";
    a.start = clock * 10;
    a.end = a.start + dur;
    a.range = tracker.current();
    a.launch = clock;
    acts.push_back(a);
    clock += 1;
  }
};
}  // namespace

TEST(ProfileReport, LayerAggregationInclusiveInTreeOrder) {
  std::mt19937_64 g(test::test_seed() + 1);
  std::uniform_int_distribution<uint64_t> dur(1, 100000);
  std::uniform_real_distribution<double> fl(0, 1e9);
  Synthetic s;
  const int iters = 3;
  // Expected totals per path, computed as the run goes (independent of the tree folding).
  std::map<std::string, uint64_t> time;
  std::map<std::string, double> flops;
  std::map<std::string, int> calls;
  std::vector<std::string> stack;
  auto push = [&](const std::string& n) {
    s.tracker.push(n.c_str());
    stack.push_back(stack.empty() ? n : stack.back() + "/" + n);
    calls[stack.back()]++;
    s.clock++;
  };
  auto pop = [&] {
    s.tracker.pop();
    stack.pop_back();
    s.clock++;
  };
  auto work = [&](int kernels) {
    const double f = fl(g);
    s.tracker.add_cost(f, 2 * f);
    for (auto& p : stack) flops[p] += f;
    for (int i = 0; i < kernels; ++i) {
      s.kernel(dur(g));
      for (auto& p : stack) time[p] += s.acts.back().duration();
    }
  };
  for (int it = 0; it < iters; ++it) {
    push("forward");
    for (int b = 0; b < 2; ++b) {
      push("input_blocks." + std::to_string(b) + " fwd");
      work(2);
      if (b == 1) {
        push("attn");
        work(3);
        pop();
      }
      pop();
    }
    pop();
    push("backward");
    work(1);
    pop();
  }
  s.kernel(777);  // outside every range
  s.tracker.add_cost(5, 10);

  auto rows =
      aggregate_layers(s.tracker.instances(), s.acts, s.tracker.outside_flops(), s.tracker.outside_bytes());
  std::vector<std::string> order;
  for (auto& r : rows) order.push_back(r.path);
  const std::vector<std::string> want = {"forward",
                                         "forward/input_blocks.0 fwd",
                                         "forward/input_blocks.1 fwd",
                                         "forward/input_blocks.1 fwd/attn",
                                         "backward",
                                         "(outside layer ranges)"};
  ASSERT_EQ(order, want);
  for (auto& r : rows) {
    if (r.path == "(outside layer ranges)") {
      EXPECT_EQ(r.time_ns, 777u);
      EXPECT_EQ(r.kernels, 1u);
      EXPECT_EQ(r.flops, 5);
      continue;
    }
    EXPECT_EQ(r.time_ns, time[r.path]) << r.path;
    EXPECT_NEAR(r.flops, flops[r.path], 1e-6 * flops[r.path]) << r.path;
    EXPECT_NEAR(r.bytes, 2 * flops[r.path], 2e-6 * flops[r.path]) << r.path;
    EXPECT_EQ((int)r.calls, calls[r.path]) << r.path;
    EXPECT_EQ(r.depth, (int)std::count(r.path.begin(), r.path.end(), '/'));
  }

  // The launch-time fallback finds the same innermost ranges the correlation ids gave.
  auto blind = s.acts;
  for (auto& a : blind) a.range = 0;
  assign_ranges_by_launch_time(blind, s.tracker.instances());
  for (size_t i = 0; i < blind.size(); ++i) EXPECT_EQ(blind[i].range, s.acts[i].range) << i;

  EXPECT_EQ(range_path(s.tracker, s.acts[4].range), "forward/input_blocks.1 fwd/attn");
  s.tracker.clear();
  EXPECT_TRUE(s.tracker.instances().empty());
  s.tracker.push("again");
  EXPECT_GT(s.tracker.current(), s.acts[4].range) << "ids are never reused after clear()";
  s.tracker.pop();
  s.tracker.pop();  // unbalanced pop is ignored
  EXPECT_EQ(s.tracker.current(), 0u);
}

TEST(ProfileReport, TrackerHooksPairUp) {
  RangeTracker t;
  std::vector<uint64_t> pushed;
  int pops = 0;
  t.on_push = [&](uint64_t id) { pushed.push_back(id); };
  t.on_pop = [&] { ++pops; };
  t.push("a");
  t.push("b");
  EXPECT_EQ(t.depth(), 2);
  EXPECT_EQ(t.current(), pushed.back());
  t.pop();
  t.pop();
  EXPECT_EQ(pushed.size(), 2u);
  EXPECT_EQ(pops, 2);
  EXPECT_NE(pushed[0], pushed[1]);
  EXPECT_EQ(t.find(pushed[1])->parent, pushed[0]);
}

// ---- roofline and peaks ----

TEST(ProfileReport, RooflineMath) {
  Peaks p;
  p.tflops = 500;
  p.gbps = 2000;
  // 1 TFLOP and 1 GB in 10 ms: 100 TFLOP/s (20% of peak), 100 GB/s (5%): compute-bound work.
  Roofline r = roofline(1e12, 1e9, 1e7, p);
  EXPECT_NEAR(r.tflops, 100, 1e-9);
  EXPECT_NEAR(r.gbps, 100, 1e-9);
  EXPECT_NEAR(r.flop_pct, 20, 1e-9);
  EXPECT_NEAR(r.bw_pct, 5, 1e-9);
  EXPECT_NEAR(r.peak_pct, 20, 1e-9);
  EXPECT_NEAR(r.intensity, 1000, 1e-9);
  EXPECT_STREQ(r.bound, "compute");
  // A memory-bound op: 1 GFLOP, 4 GB in 4 ms = 1000 GB/s (50%), 0.25 TFLOP/s.
  r = roofline(1e9, 4e9, 4e6, p);
  EXPECT_NEAR(r.gbps, 1000, 1e-9);
  EXPECT_NEAR(r.bw_pct, 50, 1e-9);
  EXPECT_NEAR(r.tflops, 0.25, 1e-12);
  EXPECT_STREQ(r.bound, "memory");
  // The roofline floor time: max(flops/peak, bytes/bw); peak_pct = floor / actual.
  std::mt19937_64 g(test::test_seed() + 2);
  std::uniform_real_distribution<double> u(1, 1e12);
  for (int i = 0; i < 100; ++i) {
    double f = u(g), b = u(g), ns = u(g);
    Roofline q = roofline(f, b, ns, p);
    const double floor_ns = std::max(f / (p.tflops * 1e3), b / p.gbps);
    EXPECT_NEAR(q.peak_pct, 100.0 * floor_ns / ns, 1e-9 * q.peak_pct + 1e-12);
  }
  EXPECT_EQ(roofline(1, 1, 0, p).peak_pct, 0.0);  // no time: no rate, no division by zero
}

TEST(ProfileReport, DevicePeaks) {
  DeviceInfo h100;
  h100.name = "NVIDIA H100 80GB HBM3";
  h100.cc_major = 9;
  h100.sms = 132;
  EXPECT_NEAR(device_peaks(h100, Precision::TF32).tflops, 494.7, 1e-9);
  EXPECT_NEAR(device_peaks(h100, Precision::BF16).tflops, 989.4, 1e-9);
  EXPECT_NEAR(device_peaks(h100, Precision::FP32).tflops, 66.9, 1e-9);
  EXPECT_NEAR(device_peaks(h100, Precision::TF32).gbps, 3352, 1e-9);
  EXPECT_NE(device_peaks(h100, Precision::TF32).source.find("datasheet"), std::string::npos);
  h100.name = "NVIDIA H100 PCIe";
  EXPECT_NEAR(device_peaks(h100, Precision::BF16).tflops, 756, 1e-9);
  h100.name = "NVIDIA H200";
  EXPECT_NEAR(device_peaks(h100, Precision::TF32).gbps, 4800, 1e-9);

  // Unknown name: computed from the properties.
  DeviceInfo d;
  d.name = "Some Hopper";
  d.cc_major = 9;
  d.sms = 132;
  d.sm_clock_mhz = 1980;
  d.mem_clock_mhz = 2619;
  d.bus_bits = 5120;
  Peaks p = device_peaks(d, Precision::TF32);
  EXPECT_NEAR(p.tflops, 132 * 1980e6 * 2048 / 1e12, 1e-9);
  EXPECT_NEAR(p.gbps, 2 * 2619e6 * 5120 / 8 / 1e9, 1e-9);
  EXPECT_NE(p.source.find("device properties"), std::string::npos);
  EXPECT_NEAR(device_peaks(d, Precision::FP32).tflops, 132 * 1980e6 * 256 / 1e12, 1e-9);
}

// ---- FLOP and byte counts ----

Tensor T4(DType t, int64_t a, int64_t b, int64_t c, int64_t d) { return Tensor(nullptr, t, {a, b, c, d}); }

TEST(Flops, ConvMatchesNaiveLoopCount) {
  // Count the multiply-adds a direct convolution loop performs (padding taps included) and the
  // distinct elements it touches.
  for (int k : {1, 3})
    for (int stride : {1, 2}) {
      const int B = 2, H = 6, W = 6, Ci = 5, Co = 7, p = k / 2;
      const int Ho = (H + 2 * p - k) / stride + 1, Wo = (W + 2 * p - k) / stride + 1;
      double macs = 0;
      for (int b = 0; b < B; ++b)
        for (int oy = 0; oy < Ho; ++oy)
          for (int ox = 0; ox < Wo; ++ox)
            for (int co = 0; co < Co; ++co)
              for (int ky = 0; ky < k; ++ky)
                for (int kx = 0; kx < k; ++kx)
                  for (int ci = 0; ci < Ci; ++ci) macs += 1;
      const double outs = (double)B * Ho * Wo * Co;
      const Tensor x = T4(DType::F32, B, H, W, Ci), w = T4(DType::F32, Co, k, k, Ci),
                   y = T4(DType::F32, B, Ho, Wo, Co);
      const Tensor bias(nullptr, DType::F32, {Co});
      const ConvFwd f{x, w, bias, {}, {}, y, stride};
      f.check();
      EXPECT_EQ(f.flops(), 2 * macs + outs) << k << " " << stride;
      EXPECT_EQ(flops::cost(f).bytes, 4.0 * (B * H * W * Ci + Co * k * k * Ci + Co + outs));
      const ConvBwdData bd{y, w, x, stride};
      const ConvBwdFilter bf{x, y, w, bias, {}, stride};
      EXPECT_EQ(bd.flops() + bf.flops(), 4 * macs + outs);
      // reads dy, w / x, dy; writes dx / dw, db
      EXPECT_EQ(flops::cost(bd).bytes + flops::cost(bf).bytes,
                4.0 * (2.0 * B * H * W * Ci + 2.0 * Co * k * k * Ci + Co + 2 * outs));
      EXPECT_EQ(bd.flops(), 2 * macs);
      // bf16 storage halves the bytes of the bf16 tensors, not the arithmetic.
      const ConvFwd h{T4(DType::BF16, B, H, W, Ci),
                      T4(DType::BF16, Co, k, k, Ci),
                      bias,
                      {},
                      {},
                      T4(DType::BF16, B, Ho, Wo, Co),
                      stride};
      EXPECT_EQ(h.flops(), f.flops());
      EXPECT_EQ(flops::cost(h).bytes, 2.0 * (B * H * W * Ci + Co * k * k * Ci + outs) + 4.0 * Co);
    }
}

TEST(Flops, LinearAttentionAdamw) {
  const Tensor x(nullptr, DType::F32, {32, 64}), w(nullptr, DType::F32, {256, 64}),
      b(nullptr, DType::F32, {256});
  const Tensor y(nullptr, DType::F32, {32, 256});
  const LinearFwd l{x, w, b, y};
  EXPECT_EQ(l.flops(), 2.0 * 32 * 64 * 256 + 32 * 256);
  EXPECT_EQ(flops::cost(l).bytes, 4.0 * (32 * 64 + 256 * 64 + 256 + 32 * 256));
  EXPECT_EQ((LinearBwd{x, w, y, x, w, {}}.flops()), 4.0 * 32 * 64 * 256);
  // Attention, B=2, T=16, C=64, 2 heads of 32: per head QK^T and AV are 2*T*T*d each; backward
  // recomputes QK^T, then dV, dP, dQ, dK.
  const double T = 16, d = 32, heads = 2, B = 2;
  const double matmul = B * heads * (2 * T * T * d + 2 * T * T * d);
  const Tensor qkv = T4(DType::F32, 2, 4, 4, 192), out = T4(DType::F32, 2, 4, 4, 64),
               lse(nullptr, DType::F32, {2, 2, 16});
  const AttentionFwd a{qkv, out, lse, false};
  a.check();
  EXPECT_EQ(a.flops(), matmul + B * heads * 5 * T * T);
  EXPECT_EQ(flops::cost(a).bytes, 4.0 * (B * T * 192 + B * T * 64 + B * heads * T));
  EXPECT_EQ((AttentionBwd{qkv, out, lse, out, qkv, false}.flops()), 2.5 * matmul + B * heads * 5 * T * T);
  const Tensor p(nullptr, DType::F32, {1000}), h(nullptr, DType::F32, {4}), sc(nullptr, DType::F32, {1});
  // reads p, g, m, v (and 4 + 1 scalars); writes p, m, v
  EXPECT_EQ(flops::cost(AdamW{p, p, p, p, h, sc, 0.9f, 0.999f, 1e-8f, {}, 0.f}).bytes, 4.0 * (1000 * 7 + 5));
  EXPECT_EQ(flops::cost(AdamW{p, p, p, p, h, sc, 0.9f, 0.999f, 1e-8f, p, 0.99f}).bytes, 4.0 * (1000 * 9 + 5));
}

TEST(Flops, CountingOpsForwardsAndAttributes) {
  NullOps null;
  RangeTracker t;
  struct Ranges : Device {  // a device whose ranges go to the tracker
    RangeTracker& t;
    explicit Ranges(RangeTracker& tt) : t(tt) {}
    bool is_cuda() const override { return false; }
    std::string name() const override { return "ranges"; }
    void* alloc(size_t) override { return nullptr; }
    void upload(void*, const void*, size_t) override {}
    void download(void*, const void*, size_t) override {}
    void sync() override {}
    size_t bytes_held() const override { return 0; }
    size_t bytes_free() const override { return 0; }
    void range_push(const char* n) override { t.push(n); }
    void range_pop() override { t.pop(); }
  } ranges(t);
  std::vector<std::string> ops;
  flops::CountingOps cb(
      null, ranges,
      [&](const char* op, const std::string& v, const flops::Cost& c) {
        ops.push_back(std::string(op) + "=" + v);
        t.add_cost(c.flops, c.bytes);
        t.add_variant(op + std::string("=") + v);
      },
      /*op_ranges=*/true);
  const Tensor x = T4(DType::F32, 1, 8, 8, 32), w = T4(DType::F32, 32, 3, 3, 32);
  const ConvFwd conv{x, w, {}, {}, {}, x, 1};
  const Tensor lx(nullptr, DType::F32, {4, 8}), lw(nullptr, DType::F32, {8, 8}), lb(nullptr, DType::F32, {8});
  const LinearFwd lin{lx, lw, lb, lx};
  ranges.range_push("layer");
  cb.run(conv);
  cb.run(lin);
  ranges.range_pop();
  cb.set_counting(false);
  cb.run(Add{x, x, x});
  EXPECT_EQ(null.calls, 3) << "every op reaches the inner table";
  ASSERT_EQ(ops.size(), 2u) << "nothing is counted while counting is off";
  EXPECT_EQ(ops[0], "conv_fwd=null");
  auto rows = aggregate_layers(t.instances(), {});
  ASSERT_EQ(rows.size(), 4u);  // layer, layer/conv_fwd[null], layer/linear_fwd[null], add[null] (outside)
  EXPECT_EQ(rows[0].path, "layer");
  EXPECT_EQ(rows[1].path, "layer/conv_fwd[null]");
  EXPECT_EQ(rows[1].variants, std::vector<std::string>{"conv_fwd=null"});
  EXPECT_EQ(rows[0].flops, conv.flops() + lin.flops());
  EXPECT_EQ(rows[1].flops, conv.flops());
}

// SPEC §5: one seed64 training step at batch 32 is 1.47 TFLOP. Count it through the real model
// code on an engine that does nothing.
TEST(Flops, Seed64TrainingStepIs147Tflop) {
  auto eng = null_engine();
  RangeTracker t;
  set_range_listener(&t);
  double matmul = 0;
  flops::CountingOps cb(eng->base_ops(), eng->device(),
                        [&](const char* op, const std::string&, const flops::Cost& c) {
                          t.add_cost(c.flops, c.bytes);
                          const std::string o = op;
                          if (o.find("conv") == 0 || o.find("linear") == 0 || o.find("attention") == 0)
                            matmul += c.flops;
                        });
  const ModelConfig cfg = preset("seed64");
  Model m(cfg, *eng);
  const int B = 32;
  m.plan(B, Mode::Train);
  eng->set_ops(&cb);
  const Tensor x = eng->alloc(DType::F32, {B, 64, 64, 3}), out = eng->alloc(DType::F32, {B, 64, 64, 3});
  const Tensor tt = eng->alloc(DType::F32, {B});
  t.clear();
  matmul = 0;
  m.forward(x, tt, {}, out, true);
  const double fwd = matmul;
  m.backward(out);
  const double step = matmul;
  eng->set_ops(nullptr);
  set_range_listener(nullptr);
  std::printf("seed64 B=32: forward %.1f GFLOP, forward+backward %.1f GFLOP (GEMM-shaped ops)\n", fwd / 1e9,
              step / 1e9);
  // 1.47 TFLOP of GEMM work plus the attention backward's recomputed QK^T (a few GFLOP).
  EXPECT_NEAR(step / 1.47e12, 1.0, 0.05);
  EXPECT_NEAR(step / fwd, 3.0, 0.1) << "backward is about twice the forward";
  // Every layer range of the model carries FLOPs.
  auto rows = aggregate_layers(t.instances(), {});
  int blocks = 0;
  for (auto& r : rows)
    if (r.name.find("input_blocks.") == 0) {
      ++blocks;
      EXPECT_GT(r.flops, 0) << r.path;
      EXPECT_GT(r.bytes, 0) << r.path;
    }
  EXPECT_GE(blocks, 2 * 12) << "12 input blocks, forward and backward";
}

// ---- formats ----

namespace {
Report sample_report(std::vector<Activity>* acts_out, RangeTracker& tracker) {
  std::mt19937_64 g(test::test_seed() + 3);
  std::uniform_int_distribution<uint64_t> dur(1000, 90000);
  std::vector<Activity> acts;
  uint64_t clock = 0;
  const char* names[] = {"void gemm<float, 128, 64>(Params, int, float const*)", "groupnorm_kernel",
                         "silu \"quoted\", with comma"};
  for (int it = 0; it < 4; ++it) {
    tracker.push("resblock fwd");
    for (int sub = 0; sub < 2; ++sub) {
      tracker.push(sub ? "out_layers" : "in_layers");
      tracker.add_cost(2e9, 3e7);
      for (int k = 0; k < 3; ++k) {
        Activity a;
        a.name = names[k];
        a.start = clock;
        a.end = clock + dur(g);
        a.stream = 7;
        a.range = tracker.current();
        a.grid[0] = 128;
        a.block[0] = 256;
        clock = a.end + 500;
        acts.push_back(a);
      }
      tracker.pop();
    }
    tracker.pop();
    Activity m;
    m.kind = ActivityKind::Memset;
    m.name = "[CUDA memset]";
    m.start = clock;
    m.end = clock + 800;
    m.bytes = 1 << 20;
    m.stream = 7;
    clock = m.end + 100;
    acts.push_back(m);
  }
  Report r;
  r.gpu = "NVIDIA H100 80GB HBM3";
  r.target = "resblock B=32 64x64 192->64 channels";
  r.precision = "tf32";
  r.pass = "step";
  r.iters = 4;
  r.warmup = 2;
  r.peaks.tflops = 494.7;
  r.peaks.gbps = 3352;
  r.peaks.what = "TF32 tensor cores, dense";
  r.peaks.source = "NVIDIA H100 SXM5 datasheet";
  r.events_ms = (double)clock / 1e6 * 1.03;
  r.plain_events_ms = r.events_ms * 0.98;
  build_report(r, acts, tracker);
  *acts_out = acts;
  return r;
}
}  // namespace

TEST(ProfileReport, TableCsvJsonAgree) {
  RangeTracker tracker;
  std::vector<Activity> acts;
  Report r = sample_report(&acts, tracker);
  uint64_t kern = 0;
  for (auto& a : acts)
    if (a.kind == ActivityKind::Kernel) kern += a.duration();
  EXPECT_EQ(r.kernel_ns, kern);
  EXPECT_EQ(r.memop_ns, 4u * 800);
  EXPECT_NEAR(r.flops, 4 * 2 * 2e9, 1);
  // Activities run back to back: busy time is their sum, the span runs first start to last end.
  EXPECT_EQ(r.busy_ns, kern + 3200);
  EXPECT_EQ(r.span_ns, acts.back().end - acts.front().start);
  EXPECT_NEAR(r.idle_ms_per_iter(), (double)(r.span_ns - r.busy_ns) / 1e6 / 4, 1e-12);

  const std::string table = format_table(r);
  for (const char* col : {"Time (%)",     "Total Time (ns)", "Instances",   "Avg (ns)",    "Med (ns)",
                          "Min (ns)",     "Max (ns)",        "StdDev (ns)", "Name",        "[CUDA memset]",
                          "resblock fwd", "  in_layers",     "TFLOP/s",     "GB/s",        "Peak (%)",
                          "NVIDIA H100",  "494.7",           "kernel sum",  "CUDA events", "% difference"})
    EXPECT_NE(table.find(col), std::string::npos) << col << "\n" << table;
  EXPECT_NE(table.find(timing_line(r)), std::string::npos);
  // back to back, no overlap: no note; kernels on two streams (their sum above the busy time): the note
  EXPECT_EQ(timing_line(r).find("overlap"), std::string::npos) << timing_line(r);
  Report lanes = r;
  lanes.busy_ns = r.kernel_ns * 3 / 4;
  EXPECT_NE(timing_line(lanes).find("kernels overlap (several streams)"), std::string::npos) << timing_line(lanes);
  char want[128];
  std::snprintf(want, sizeof want, "kernel sum %.3f ms/iter", (double)(kern + 3200) / 1e6 / 4);
  EXPECT_NE(table.find(want), std::string::npos) << want << "\n" << table;

  // CSV: a rectangular table that round-trips names with commas and quotes.
  auto rows = parse_csv(format_csv(r));
  ASSERT_GT(rows.size(), 5u);
  const auto& head = rows[0];
  for (auto& row : rows) ASSERT_EQ(row.size(), head.size());
  auto col = [&](const char* n) { return (size_t)(std::find(head.begin(), head.end(), n) - head.begin()); };
  ASSERT_LT(col("section"), head.size());
  std::set<std::string> kernel_names;
  double layer_ms = -1;
  for (auto& row : rows) {
    if (row[col("section")] == "kernel") kernel_names.insert(row[col("name")]);
    if (row[col("section")] == "layer" && row[col("path")] == "resblock fwd")
      layer_ms = std::stod(row[col("ms_per_iter")]);
  }
  EXPECT_EQ(kernel_names.size(), 3u);
  EXPECT_TRUE(kernel_names.count("silu \"quoted\", with comma"));
  EXPECT_NEAR(layer_ms, (double)kern / 1e6 / 4, 1e-6 * layer_ms);

  // JSON: parses, and its numbers are the report's.
  json j = json::parse(format_json(r));
  EXPECT_EQ(j["kernels"].size(), 3u);
  EXPECT_EQ(j["memops"].size(), 1u);
  EXPECT_EQ(j["memops"][0]["bytes"].get<uint64_t>(), 4u << 20);
  uint64_t total = 0;
  for (auto& k : j["kernels"]) total += k["total_ns"].get<uint64_t>();
  EXPECT_EQ(total, kern);
  EXPECT_NEAR(j["timing"]["kernel_sum_ms_per_iter"].get<double>(), (double)(kern + 3200) / 1e6 / 4, 1e-9);
  EXPECT_NEAR(j["timing"]["difference_pct"].get<double>(), r.difference_pct(), 1e-9);
  ASSERT_EQ(j["layers"].size(), 4u);  // resblock fwd, its two children, the memsets outside
  EXPECT_EQ(j["layers"][3]["path"], "(outside layer ranges)");
  EXPECT_NEAR(j["layers"][3]["ms_per_iter"].get<double>(), 800e-6, 1e-12);
  EXPECT_EQ(j["layers"][1]["path"], "resblock fwd/in_layers");
  EXPECT_EQ(j["layers"][1]["depth"], 1);
  EXPECT_NEAR(j["layers"][0]["calls_per_iter"].get<double>(), 1.0, 1e-12);
  EXPECT_NEAR(j["layers"][0]["flops_per_iter"].get<double>(), 4e9, 1);
  const double ms = j["layers"][0]["ms_per_iter"].get<double>();
  EXPECT_NEAR(j["layers"][0]["tflops"].get<double>(), 4e9 / (ms * 1e-3) / 1e12, 1e-9);
  EXPECT_NEAR(j["layers"][0]["step_pct"].get<double>(),
              100.0 * ms / j["timing"]["kernel_sum_ms_per_iter"].get<double>(), 1e-9);
}

// The cuDNN a run loaded (unet profile sets it from cudnn_library()): a line of the table, an info
// row of the CSV and a JSON key when known; nothing where it is not (a build without CUDA).
TEST(ProfileReport, NamesTheConvolutionLibrary) {
  RangeTracker tracker;
  std::vector<Activity> acts;
  Report r = sample_report(&acts, tracker);
  const std::string lib = "cuDNN 9.14.0 (/usr/lib/x86_64-linux-gnu/libcudnn.so.9, \"quoted\")";
  r.cudnn = lib;
  EXPECT_NE(format_table(r).find("Convolution library: " + lib + "\n"), std::string::npos) << format_table(r);
  EXPECT_EQ(json::parse(format_json(r))["cudnn"], lib);
  auto rows = parse_csv(format_csv(r));
  ASSERT_GT(rows.size(), 1u);
  const auto& head = rows[0];
  auto col = [&](const char* n) { return (size_t)(std::find(head.begin(), head.end(), n) - head.begin()); };
  int found = 0;
  for (auto& row : rows)
    if (row[col("section")] == "info" && row[col("name")] == "cudnn")
      found += row[col("value")] == lib ? 1 : 100;
  EXPECT_EQ(found, 1);
  r.cudnn.clear();
  EXPECT_EQ(format_table(r).find("Convolution library"), std::string::npos);
  EXPECT_FALSE(json::parse(format_json(r)).contains("cudnn"));
  for (auto& row : parse_csv(format_csv(r))) EXPECT_NE(row[col("name")], "cudnn");
}

// Graph mode: the kernel table, kernel sum and events are the replays'; the layer table, FLOPs
// and Step (%) stay the eager pass's, whose timing is kept as `eager`.
TEST(ProfileReport, GraphReplaysReplaceKernelTablesKeepLayers) {
  RangeTracker tracker;
  std::vector<Activity> eager;
  Report r = sample_report(&eager, tracker);
  const uint64_t eager_sum = r.kernel_ns + r.memop_ns, eager_busy = r.busy_ns, eager_span = r.span_ns;
  const double eager_events = r.events_ms, flops = r.flops;
  const std::vector<LayerRow> layers = r.layers;
  // Replays: the same activities packed tighter (no gaps), each a random amount shorter; graph
  // records carry no layer range.
  std::mt19937_64 g(test::test_seed() + 5);
  std::uniform_int_distribution<uint64_t> shave(0, 500);
  std::vector<Activity> graph = eager;
  uint64_t clock = 1000000, sum = 0;
  for (auto& a : graph) {
    const uint64_t d = a.duration() - shave(g);
    a.range = 0;
    a.start = clock;
    a.end = clock + d;
    clock = a.end + 10;
    sum += d;
  }
  const double graph_events = (double)(clock - 1000000) / 1e6 * 1.01;
  use_graph_replays(r, graph, graph_events);
  EXPECT_EQ(r.mode, "graph");
  EXPECT_EQ(r.kernel_ns + r.memop_ns, sum);
  EXPECT_EQ(r.span_ns, graph.back().end - graph.front().start);
  EXPECT_DOUBLE_EQ(r.events_ms, graph_events);
  EXPECT_EQ(r.eager.kernel_ns + r.eager.memop_ns, eager_sum);
  EXPECT_EQ(r.eager.busy_ns, eager_busy);
  EXPECT_EQ(r.eager.span_ns, eager_span);
  EXPECT_DOUBLE_EQ(r.eager.events_ms, eager_events);
  EXPECT_EQ(r.eager.activities, eager.size());
  EXPECT_DOUBLE_EQ(r.flops, flops);
  ASSERT_EQ(r.layers.size(), layers.size());
  for (size_t i = 0; i < layers.size(); ++i) EXPECT_EQ(r.layers[i].time_ns, layers[i].time_ns);

  const std::string table = format_table(r);
  EXPECT_NE(table.find("CUDA-graph replays: " + timing_line(r)), std::string::npos) << table;
  EXPECT_NE(table.find(eager_line(r)), std::string::npos) << table;
  char want[160];
  std::snprintf(want, sizeof want, "kernel sum %.3f ms/iter, CUDA events %.3f ms/iter",
                (double)eager_sum / 1e6 / 4, eager_events / 4);
  EXPECT_NE(eager_line(r).find(want), std::string::npos) << eager_line(r);

  json j = json::parse(format_json(r));
  EXPECT_EQ(j["mode"], "graph");
  EXPECT_EQ(j["layers_mode"], "eager");
  EXPECT_NEAR(j["timing"]["kernel_sum_ms_per_iter"].get<double>(), (double)sum / 1e6 / 4, 1e-9);
  EXPECT_NEAR(j["timing"]["cuda_events_ms_per_iter"].get<double>(), graph_events / 4, 1e-9);
  const json& e = j["timing"]["eager"];
  ASSERT_TRUE(e.is_object());
  EXPECT_NEAR(e["kernel_sum_ms_per_iter"].get<double>(), (double)eager_sum / 1e6 / 4, 1e-9);
  EXPECT_NEAR(e["cuda_events_ms_per_iter"].get<double>(), eager_events / 4, 1e-9);
  EXPECT_EQ(e["activities"].get<uint64_t>(), eager.size());
  // Step (%) divides by the kernel sum of the pass the layer times come from.
  const double ms = j["layers"][0]["ms_per_iter"].get<double>();
  EXPECT_NEAR(j["layers"][0]["step_pct"].get<double>(), 100.0 * ms / ((double)eager_sum / 1e6 / 4), 1e-9);

  auto rows = parse_csv(format_csv(r));
  const auto& head = rows[0];
  auto col = [&](const char* n) { return (size_t)(std::find(head.begin(), head.end(), n) - head.begin()); };
  std::map<std::string, std::string> vals;
  for (auto& row : rows) {
    ASSERT_EQ(row.size(), head.size());
    if (row[col("section")] == "info" || row[col("section")] == "timing")
      vals[row[col("name")]] = row[col("value")];
  }
  EXPECT_EQ(vals["mode"], "graph");
  EXPECT_NEAR(std::stod(vals["eager_cuda_events_ms_per_iter"]), eager_events / 4, 1e-6);
  EXPECT_NEAR(std::stod(vals["kernel_sum_ms_per_iter"]), (double)sum / 1e6 / 4, 1e-6);

  // Eager mode (no use_graph_replays) says so and has no eager block.
  std::vector<Activity> acts2;
  RangeTracker t2;
  Report plain = sample_report(&acts2, t2);
  json p = json::parse(format_json(plain));
  EXPECT_EQ(p["mode"], "eager");
  EXPECT_TRUE(p["timing"]["eager"].is_null());
  EXPECT_EQ(eager_line(plain), "");
}

// Overlap and "running alone" against a 1-ns reference grid: random activities on three streams
// (back-to-back and empty ones included), each ns counted by how many run in it, and the ns where
// exactly one runs credited to its name. Then the table, JSON and CSV carry the numbers.
TEST(ProfileReport, OverlapAndAloneMatchAGrid) {
  std::mt19937_64 g(test::test_seed() + 11);
  std::uniform_int_distribution<uint64_t> st(0, 4000), du(0, 300);
  const char* names[] = {"kernel_a", "kernel_b", "kernel_c", "kernel_d"};
  std::vector<Activity> acts(90);
  for (size_t i = 0; i < acts.size(); ++i) {
    Activity& a = acts[i];
    a.kind = i % 9 == 8 ? ActivityKind::Memset : ActivityKind::Kernel;
    a.name = a.kind == ActivityKind::Memset ? "[CUDA memset]" : names[g() % 4];
    a.start = i > 0 && i % 10 == 0 ? acts[i - 1].end : st(g);  // some back-to-back
    a.end = a.start + du(g);
    a.stream = (uint32_t)(i % 3);
  }
  std::vector<int> count(5000, 0);
  for (const auto& a : acts)
    for (uint64_t t = a.start; t < a.end; ++t) ++count[t];
  std::vector<uint64_t> want_overlap(1, 0);
  std::map<std::string, uint64_t> want_alone;
  for (uint64_t t = 0; t < count.size(); ++t) {
    if (!count[t]) continue;
    if ((size_t)count[t] >= want_overlap.size()) want_overlap.resize(count[t] + 1, 0);
    ++want_overlap[count[t]];
    if (count[t] == 1)
      for (const auto& a : acts)
        if (a.start <= t && t < a.end) ++want_alone[a.name];
  }
  Report r;
  r.iters = 2;
  r.events_ms = 0.01;
  build_kernel_tables(r, acts);
  ASSERT_EQ(r.overlap_ns.size(), want_overlap.size());
  for (size_t k = 1; k < want_overlap.size(); ++k) EXPECT_EQ(r.overlap_ns[k], want_overlap[k]) << k;
  EXPECT_EQ(r.busy_ns, (uint64_t)std::count_if(count.begin(), count.end(), [](int c) { return c > 0; }));
  ASSERT_EQ(r.alone_ns.size(), want_alone.size());
  for (size_t i = 0; i < r.alone_ns.size(); ++i) {
    EXPECT_EQ(r.alone_ns[i].second, want_alone[r.alone_ns[i].first]) << r.alone_ns[i].first;
    if (i) {
      EXPECT_GE(r.alone_ns[i - 1].second, r.alone_ns[i].second);
    }
  }
  ASSERT_GE(want_overlap.size(), 3u) << "the draw should overlap";

  const std::string table = format_table(r);
  EXPECT_NE(table.find("Running alone"), std::string::npos) << table;
  EXPECT_NE(table.find(r.alone_ns[0].first), std::string::npos);
  EXPECT_NE(overlap_line(r).find("1 activity running"), std::string::npos);
  EXPECT_NE(table.find(overlap_line(r)), std::string::npos);
  json j = json::parse(format_json(r));
  EXPECT_NEAR(j["timing"]["overlap_ms_per_iter"]["1"].get<double>(), (double)want_overlap[1] / 1e6 / 2, 1e-12);
  ASSERT_EQ(j["timing"]["alone"].size(), r.alone_ns.size());
  EXPECT_EQ(j["timing"]["alone"][0]["name"], r.alone_ns[0].first);
  auto rows = parse_csv(format_csv(r));
  const auto& head = rows[0];
  auto col = [&](const char* n) { return (size_t)(std::find(head.begin(), head.end(), n) - head.begin()); };
  size_t alone_rows = 0;
  for (auto& row : rows)
    if (row[col("section")] == "alone") {
      ++alone_rows;
      EXPECT_EQ(std::stoull(row[col("total_ns")]), want_alone[row[col("name")]]);
    }
  EXPECT_EQ(alone_rows, want_alone.size());

  Report none;  // no activities: no overlap line, no section
  build_kernel_tables(none, {});
  EXPECT_EQ(overlap_line(none), "");
  EXPECT_EQ(format_table(none).find("Running alone"), std::string::npos);
}

TEST(ProfileReport, BusyTimeIsTheUnionOfIntervals) {
  // Random overlapping intervals (two streams); reference: a 1-ns bitmap.
  std::mt19937_64 g(test::test_seed() + 4);
  std::uniform_int_distribution<uint64_t> st(0, 5000), du(0, 400);
  std::vector<Activity> acts(60);
  std::vector<char> busy(6000, 0);
  uint64_t lo = UINT64_MAX, hi = 0;
  for (auto& a : acts) {
    a.start = st(g);
    a.end = a.start + du(g);
    a.stream = a.start % 2;
    for (uint64_t t = a.start; t < a.end; ++t) busy[t] = 1;
    lo = std::min(lo, a.start), hi = std::max(hi, a.end);
  }
  RangeTracker none;
  Report r;
  r.iters = 1;
  build_report(r, acts, none);
  EXPECT_EQ(r.busy_ns, (uint64_t)std::count(busy.begin(), busy.end(), 1));
  EXPECT_EQ(r.span_ns, hi - lo);
}

TEST(ProfileReport, ChromeTraceIsValid) {
  RangeTracker tracker;
  std::vector<Activity> acts;
  Report r = sample_report(&acts, tracker);
  std::ostringstream os;
  write_chrome_trace(os, acts, tracker, r.gpu);
  json t = json::parse(os.str());
  size_t kernels = 0, layers = 0;
  validate_trace(t, &kernels, &layers);
  EXPECT_EQ(kernels, 4u * 6);
  EXPECT_EQ(layers, 4u * 3);  // resblock fwd + two children, each iteration
  bool named_stream = false;
  for (auto& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "stream 7") named_stream = true;
  EXPECT_TRUE(named_stream);
}

// The graph replays go to their own process, on their own clock from 0, stream by stream.
TEST(ProfileReport, ChromeTraceHasGraphReplays) {
  RangeTracker tracker;
  std::vector<Activity> acts;
  Report r = sample_report(&acts, tracker);
  std::vector<Activity> replays;
  std::mt19937 rng(std::random_device{}());
  const uint64_t base = 5'000'000'000ull + rng() % 1000;
  for (int i = 0; i < 5; ++i) {
    Activity a;
    a.kind = ActivityKind::Kernel;
    a.name = "replayed_" + std::to_string(i);
    a.start = base + 1000 * i + rng() % 100;
    a.end = a.start + 200 + rng() % 500;
    a.stream = 20 + i % 2;
    replays.push_back(a);
  }
  std::ostringstream os;
  write_chrome_trace(os, acts, tracker, r.gpu, &replays);
  json t = json::parse(os.str());
  size_t kernels = 0, layers = 0;
  validate_trace(t, &kernels, &layers);
  EXPECT_EQ(kernels, 4u * 6 + replays.size());
  EXPECT_EQ(layers, 4u * 3);
  int pid = -1, found = 0;
  for (auto& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == "GPU: CUDA-graph replays")
      pid = e["pid"];
  ASSERT_GE(pid, 0);
  uint64_t r0 = replays[0].start;
  for (const auto& a : replays) r0 = std::min(r0, a.start);
  for (auto& e : t["traceEvents"]) {
    if (e["ph"] != "X" || e["pid"] != pid) continue;
    const std::string name = e["name"];
    auto it = std::find_if(replays.begin(), replays.end(), [&](const Activity& a) { return a.name == name; });
    ASSERT_NE(it, replays.end()) << name;
    EXPECT_NEAR(e["ts"].get<double>(), (double)(it->start - r0) / 1000.0, 1e-6);
    EXPECT_NEAR(e["dur"].get<double>(), (double)it->duration() / 1000.0, 1e-6);
    EXPECT_EQ(e["tid"].get<int>(), (int)it->stream + 1);
    ++found;
  }
  EXPECT_EQ(found, (int)replays.size());
}

// ---- the command without a GPU ----

TEST(ProfileCli, WithoutGpuOneLineAndExit1) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present (tests/test_profile_gpu.cpp covers it)";
  auto r = test::run_unet("profile --layer resblock --batch-size 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("GPU"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(ProfileCli, BadFlagsAreUserErrors) {
  EXPECT_EQ(test::run_unet("profile --format xml").code, 1);
  EXPECT_EQ(test::run_unet("profile --layer nothing").code, 1);
  EXPECT_EQ(test::run_unet("profile --pass sideways").code, 1);
  auto h = test::run_unet("profile --help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("--layer"), std::string::npos);
}
