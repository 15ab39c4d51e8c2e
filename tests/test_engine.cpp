// The engine seam itself: typed tensors, op validation and description, the variant chooser and
// its overrides (UNET_KERNELS / --kernels), the counting wrapper, the CPU device, and the memory
// planner (packing by lifetime, overlap checks, read-before-write detection).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>

#include "cpu_engine.h"
#include "engine.h"
#include "flops.h"
#include "graph_dag.h"
#include "ophelp.h"
#include "planner.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {

TEST(Tensor, ShapeViewsAndChecks) {
  float buf[24];
  Tensor t(buf, DType::F32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24u);
  EXPECT_EQ(t.bytes(), 96u);
  EXPECT_EQ(t.last(), 4);
  EXPECT_EQ(t.rows(), 6);
  EXPECT_EQ(t.per_sample(), 12u);
  EXPECT_EQ(t.batch(1).numel(), 12u);
  EXPECT_EQ(t.view({6, 4}).dim[0], 6);
  EXPECT_THROW(t.view({5, 4}), std::logic_error);
  EXPECT_EQ(t.flat(4, 8).f32(), buf + 4);
  EXPECT_THROW(t.bf16(), std::logic_error);
  EXPECT_EQ(t.str(), "f32[2,3,4]");
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(Tensor().str(), "-");
}

TEST(Ops, CheckRejectsInconsistentShapesNamingTheOp) {
  float a[64];
  Tensor x(a, DType::F32, {1, 4, 4, 2}), w(a, DType::F32, {3, 3, 3, 2}), y(a, DType::F32, {1, 4, 4, 3});
  EXPECT_NO_THROW((ConvFwd{x, w, {}, {}, {}, y, 1}.check()));
  Tensor bad(a, DType::F32, {1, 4, 4, 5});
  try {
    ConvFwd{x, w, {}, {}, {}, bad, 1}.check();
    FAIL() << "no throw";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("conv_fwd x=f32[1,4,4,2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW((ConvFwd{x, w, {}, {}, {}, Tensor(a, DType::F32, {1, 2, 2, 3}), 1}.check()), std::logic_error);
  // Keys: same shapes and integer parameters = same key; data pointers and floats do not matter.
  ConvFwd c1{x, w, {}, {}, {}, y, 1}, c2 = c1;
  c2.x.data = a + 8;
  EXPECT_EQ(op_key(c1), op_key(c2));
  c2.bias = Tensor(a, DType::F32, {3});
  EXPECT_NE(op_key(c1), op_key(c2));
  EXPECT_NE(op_key(Fill{y, 1.f}), op_key(Fill{x, 1.f}));
  EXPECT_EQ(op_key(Fill{y, 1.f}), op_key(Fill{y, 2.f}));
}

// Bytes are derived from the op's tensors: inputs read once, outputs written once.
TEST(Ops, CostFromTheFieldList) {
  float a[1];
  Tensor x(a, DType::BF16, {2, 8, 8, 16}), w(a, DType::BF16, {32, 3, 3, 16}), b(a, DType::F32, {32});
  Tensor y(a, DType::BF16, {2, 8, 8, 32});
  const ConvFwd op{x, w, b, {}, {}, y, 1};
  const flops::Cost c = flops::cost(op);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 2 * 64 * 32 * 9 * 16 + 2 * 64 * 32);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * (2 * 64 * 16 + 32 * 9 * 16 + 2 * 64 * 32) + 4 * 32);
  Tensor e(a, DType::F32, {100});
  // AdamW with its EMA: p, m, v, ema read and written, g read, 4 hyper + 1 scale read
  EXPECT_DOUBLE_EQ(flops::cost(AdamW{e, e, e, e, Tensor(a, DType::F32, {4}), Tensor(a, DType::F32, {1}), 0.9f,
                                     0.999f, 1e-8f, e, 0.5f})
                       .bytes,
                   4.0 * (9 * 100 + 5));
}

// A variant table of two Fill variants: "narrow" only for f32, "wide" for everything.
struct TwoVariants : VariantOps<CpuCtx> {
  CpuCtx ctx;
  std::vector<std::string> ran;
  TwoVariants() : VariantOps<CpuCtx>(ctx) {
    static TwoVariants* self;
    self = this;
    variants<Fill>().push_back({"narrow",
                                [](const Fill& f, const CpuCtx&) { return f.y.dtype == DType::F32; },
                                [](const Fill&, CpuCtx&) { self->ran.push_back("narrow"); }, nullptr});
    variants<Fill>().push_back(
        {"wide", nullptr, [](const Fill&, CpuCtx&) { self->ran.push_back("wide"); }, nullptr});
  }
};

TEST(Variants, PriorityOverridesAndFallback) {
  float a[4];
  uint16_t h[4];
  Tensor f(a, DType::F32, {4}), b(h, DType::BF16, {4});
  {
    TwoVariants v;
    v.run(Fill{f, 0});
    v.run(Fill{b, 0});
    EXPECT_EQ(v.ran, (std::vector<std::string>{"narrow", "wide"}));  // priority = list order
    EXPECT_EQ(v.variants_for(Fill{f, 0}), (std::vector<std::string>{"narrow", "wide"}));
    EXPECT_EQ(v.variants_for(Fill{b, 0}), (std::vector<std::string>{"wide"}));
    v.run_variant(Fill{f, 0}, "wide");
    EXPECT_EQ(v.ran.back(), "wide");
  }
  set_kernel_overrides("elementwise=wide");
  {
    TwoVariants v;
    v.run(Fill{f, 0});
    EXPECT_EQ(v.variant(Fill{f, 0}), "wide");
    EXPECT_EQ(v.ran, (std::vector<std::string>{"wide"}));
  }
  set_kernel_overrides("fill=narrow");  // an op name overrides its family's setting
  {
    TwoVariants v;
    v.run(Fill{b, 0});  // narrow cannot run bf16: falls back (with a notice) to the default
    EXPECT_EQ(v.ran, (std::vector<std::string>{"wide"}));
    v.run(Fill{f, 0});
    EXPECT_EQ(v.ran.back(), "narrow");
  }
  set_kernel_overrides("fill=nosuch");
  {
    TwoVariants v;
    try {
      v.run(Fill{f, 0});
      FAIL() << "no throw";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("fill=nosuch does not exist"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("narrow, wide"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(set_kernel_overrides("conv"), UserError);
  EXPECT_THROW(set_kernel_overrides("=x"), UserError);
  set_kernel_overrides("");
  EXPECT_TRUE(kernel_overrides().empty() || std::getenv("UNET_KERNELS"));
}

TEST(CpuEngine, MemoryAndNames) {
  auto e = make_cpu_engine();
  EXPECT_FALSE(e->is_cuda());
  EXPECT_EQ(e->device().name(), "cpu");
  EXPECT_EQ(e->act_dtype(), DType::F32);
  EXPECT_EQ(make_cpu_engine(Precision::BF16)->act_dtype(), DType::BF16);
  EXPECT_EQ(make_cpu_engine(Precision::TF32)->precision(), Precision::FP32);  // tf32 means fp32 here
  const size_t before = e->device().bytes_held();
  Tensor a = e->alloc(DType::F32, {1000}), b = e->alloc(DType::BF16, {3});
  for (const Tensor& t : {a, b}) EXPECT_EQ((uintptr_t)t.data % 256, 0u);
  EXPECT_GE(e->device().bytes_held() - before, 4006u);
  EXPECT_GT(e->device().bytes_free(), 0u);
  auto src = test::randn(1000, test::test_seed());
  e->upload(a, src.data());
  std::vector<float> back(1000);
  e->download(back.data(), a);
  EXPECT_EQ(back, src);
}

// Device::fence_ms, the GPU time per step of `unet train`'s log line: the CPU cannot say (-1); on
// the GPU the time between two passed fences, additive over a third between them, and -1 for a
// reversed or unknown pair and for a fence the ring no longer holds.
TEST(Fences, MillisecondsBetweenTwo) {
  auto cpu = make_cpu_engine();
  const uint64_t c0 = cpu->device().fence(), c1 = cpu->device().fence();
  EXPECT_EQ(cpu->device().fence_ms(c0, c1), -1.0);
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::string why;
  auto eng = make_cuda_engine(Precision::FP32, &why);
  ASSERT_NE(eng, nullptr) << why;
  Device& dev = eng->device();
  const Tensor big = eng->alloc(DType::F32, {int64_t(1) << 24});
  const float v = (float)(test::test_seed() % 1000);
  const uint64_t a = dev.fence();
  for (int k = 0; k < 8; ++k) eng->ops().run(Fill{big, v + (float)k});
  const uint64_t b = dev.fence();
  for (int k = 0; k < 8; ++k) eng->ops().run(Fill{big, v - (float)k});
  const uint64_t c = dev.fence();
  dev.fence_wait(c);
  const double ab = dev.fence_ms(a, b), bc = dev.fence_ms(b, c), ac = dev.fence_ms(a, c);
  EXPECT_GT(ab, 0.0);  // (8 fills of 64 MB: ~0.1 ms and more)
  EXPECT_GT(bc, 0.0);
  EXPECT_NEAR(ac, ab + bc, 1e-3);
  EXPECT_EQ(dev.fence_ms(b, a), -1.0);
  EXPECT_EQ(dev.fence_ms(0, b), -1.0);
  EXPECT_EQ(dev.fence_ms(a, c + 1), -1.0);  // (not yet made)
  uint64_t last = c;
  for (int k = 0; k < 100; ++k) last = dev.fence();
  dev.fence_wait(last);
  EXPECT_EQ(dev.fence_ms(a, last), -1.0);  // a's event has been recorded again since
  EXPECT_GE(dev.fence_ms(last - 1, last), 0.0);
}

// ---- planner ----

TEST(Planner, PacksByLifetimeWithoutOverlap) {
  auto e = make_cpu_engine();
  Planner p;
  // a chain: b0 -> b1 -> b2 -> b3, each used by two consecutive ops, plus one buffer live throughout.
  std::vector<Tensor> b;
  for (int i = 0; i < 4; ++i) b.push_back(p.declare("b" + std::to_string(i), DType::F32, {1000}));
  Tensor keep = p.declare("keep", DType::F32, {500});
  Tensor unused = p.declare("unused", DType::F32, {7});
  Ops& ops = p.tracer(e->ops());
  ops.run(Fill{keep, 0});
  ops.run(Fill{b[0], 0});
  for (int i = 0; i < 3; ++i) ops.run(Copy{b[i], b[i + 1]});
  ops.run(Add{b[3], b[3], b[3]});
  ops.run(Copy{keep, keep});
  p.pack();
  EXPECT_NO_THROW(p.verify());
  // Live at once: at most two chain buffers and `keep` (4000 + 4000 + 2000 bytes, aligned).
  EXPECT_LE(p.arena_bytes(), 4096u + 4096u + 2048u);
  EXPECT_LT(p.arena_bytes(), p.declared_bytes());
  for (const auto& buf : p.buffers())
    if (buf.name == "unused") {
      EXPECT_EQ(buf.first, -1);
    }
  (void)unused;
  // Bound: the same declarations now return arena addresses in the planned places.
  std::vector<char> arena(p.arena_bytes());
  p.bind(arena.data());
  for (int i = 0; i < 4; ++i) {
    Tensor t = p.declare("b" + std::to_string(i), DType::F32, {1000});
    EXPECT_GE((char*)t.data, arena.data());
    EXPECT_LE((char*)t.data + t.bytes(), arena.data() + arena.size());
  }
  EXPECT_THROW(p.declare("other", DType::F32, {500}), std::logic_error);  // not the planned sequence
}

// Lanes: a side-lane op runs after the main lane's earlier ops and before those after the join,
// in no fixed order against the main lane's ops in between. So the buffers a side op uses are live
// until the join: sequentially `x` (last read by the side lane's op) and `dx` (first written after
// it on the main lane) could share memory; inside a region they must not. Buffers only the main
// lane uses keep their own lifetimes there (t1 and t2 need not be live together), and buffers
// outside the region still reuse memory.
TEST(Planner, LaneRegionsKeepTheirBuffersLiveTogether) {
  auto e = make_cpu_engine();
  for (bool region : {false, true}) {
    SCOPED_TRACE(region ? "region" : "sequential");
    Planner p;
    Tensor x = p.declare("x", DType::F32, {1000}), dy = p.declare("dy", DType::F32, {1000});
    Tensor dw = p.declare("dw", DType::F32, {1000}), dx = p.declare("dx", DType::F32, {1000});
    Tensor t1 = p.declare("t1", DType::F32, {1000}), t2 = p.declare("t2", DType::F32, {1000});
    Tensor after = p.declare("after", DType::F32, {1000});
    Ops& ops = p.tracer(e->ops());
    ops.run(Fill{x, 1});                   // 0
    ops.run(Fill{dy, 2});                  // 1
    if (region) ops.lane(true);
    ops.run(Add{x, dy, dw});               // 2: the side lane's: reads x and dy, writes dw
    if (region) ops.lane(false);
    ops.run(Copy{dy, dx});                 // 3: the main lane's: x is dead sequentially
    ops.run(Fill{t1, 3});                  // 4: main-lane temporaries, one after the other
    ops.run(Add{t1, dx, dx});              // 5
    ops.run(Fill{t2, 4});                  // 6
    ops.run(Add{t2, dx, dx});              // 7
    if (region) ops.join();
    ops.run(Copy{dx, after});              // 8: after the join: free to reuse x's or dy's memory
    ops.run(Add{after, dw, after});        // 9
    p.pack();
    EXPECT_NO_THROW(p.verify());
    auto find = [&](const char* n) {
      for (const auto& b : p.buffers())
        if (b.name == n) return b;
      ADD_FAILURE() << n;
      return Planner::Buffer{};
    };
    const Planner::Buffer bx = find("x"), bdy = find("dy"), bdx = find("dx"), bdw = find("dw");
    const Planner::Buffer b1 = find("t1"), b2 = find("t2");
    const bool shared = bx.offset == bdx.offset || bx.offset == b1.offset || bx.offset == b2.offset;
    EXPECT_EQ(shared, !region) << "x at " << bx.offset << ", dx at " << bdx.offset;
    if (region) {
      EXPECT_EQ(bx.last, 7);   // the side op's inputs live until the join
      EXPECT_EQ(bdy.last, 7);
      EXPECT_EQ(bdx.first, 3);  // the main lane's keep their own lifetimes
      EXPECT_EQ(b1.first, 4);
      EXPECT_EQ(b1.last, 5);
      EXPECT_EQ(b2.first, 6);
      for (const auto* m : {&b1, &b2, &bdx})
        for (const auto* sd : {&bx, &bdy, &bdw}) EXPECT_NE(m->offset, sd->offset) << m->name << " " << sd->name;
    }
    EXPECT_LT(p.arena_bytes(), p.declared_bytes());  // memory is reused either way
  }
}

TEST(Planner, RefusesReadsBeforeWrites) {
  auto e = make_cpu_engine();
  Planner p;
  Tensor a = p.declare("a", DType::F32, {10}), b = p.declare("b", DType::F32, {10});
  Ops& ops = p.tracer(e->ops());
  try {
    ops.run(Copy{a, b});
    FAIL() << "no throw";
  } catch (const std::logic_error& err) {
    EXPECT_NE(std::string(err.what()).find("reads buffer a before anything writes it"), std::string::npos)
        << err.what();
  }
}

// Random interval sets: the packing never overlaps live buffers and never needs more than the
// sum of all sizes; it needs at least the largest set of simultaneously live buffers.
// alone_nodes (which kernels of the tf32 step's graph get programmatic launches): small graphs by
// hand, then random DAGs against reachability by Floyd-Warshall.
TEST(GraphDag, AloneNodes) {
  using E = std::vector<std::pair<size_t, size_t>>;
  const std::vector<char> all(6, 1);
  EXPECT_EQ(alone_nodes(3, E{{0, 1}, {1, 2}}, all), (std::vector<char>{1, 1, 1}));
  // a fork and join: the two branches run beside each other
  EXPECT_EQ(alone_nodes(4, E{{0, 1}, {0, 2}, {1, 3}, {2, 3}}, all), (std::vector<char>{1, 0, 0, 1}));
  // ... unless the other branch's node is not counted (not a kernel)
  EXPECT_EQ(alone_nodes(4, E{{0, 1}, {0, 2}, {1, 3}, {2, 3}}, {1, 1, 0, 1}), (std::vector<char>{1, 1, 0, 1}));
  // two lanes: the main lane 0-1-2-3-4, a side lane's 5 forked after 1 and joined at 4
  EXPECT_EQ(alone_nodes(6, E{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {1, 5}, {5, 4}}, all),
            (std::vector<char>{1, 1, 0, 0, 1, 0}));
  EXPECT_THROW(alone_nodes(2, E{{0, 1}, {1, 0}}, all), std::logic_error);
  const auto r = test::randu(20 * 4000, test::test_seed(), 0, 1);
  size_t k = 0, some_alone = 0, some_not = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const size_t n = 70;  // (more than one 64-bit word of ancestors)
    E edges;
    std::vector<char> counted(n);
    std::vector<std::vector<char>> reach(n, std::vector<char>(n, 0));
    for (size_t i = 0; i < n; ++i) {
      counted[i] = r[k++] < 0.8;
      // edges forward only (a DAG): one from a node of the last 3 (connected, with branches), and
      // each of the others of the last 5 at 0.3 (joins)
      const size_t one = i ? i - 1 - std::min<size_t>(i - 1, (size_t)(r[k++] * 3)) : 0;
      for (size_t j = i >= 5 ? i - 5 : 0; j < i; ++j)
        if (j == one || r[k++] < 0.3) edges.push_back({j, i}), reach[j][i] = 1;
    }
    for (size_t m = 0; m < n; ++m)
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < n; ++j)
          if (reach[i][m] && reach[m][j]) reach[i][j] = 1;
    std::shuffle(edges.begin(), edges.end(), std::mt19937(trial));
    const std::vector<char> got = alone_nodes(n, edges, counted);
    for (size_t v = 0; v < n; ++v) {
      bool want = counted[v];
      for (size_t u = 0; u < n && want; ++u)
        if (u != v && counted[u] && !reach[u][v] && !reach[v][u]) want = false;
      EXPECT_EQ(got[v] != 0, want) << "trial " << trial << " node " << v;
      (want ? some_alone : some_not) += 1;
    }
  }
  EXPECT_GT(some_alone, 20u);  // (both kinds occur)
  EXPECT_GT(some_not, 20u);
}

TEST(Planner, RandomLifetimesNeverOverlap) {
  auto e = make_cpu_engine();
  for (int trial = 0; trial < 20; ++trial) {
    Planner p;
    const auto r = test::randu(200, test::test_seed() + trial, 0, 1);
    const int n = 40;
    std::vector<Tensor> t;
    for (int i = 0; i < n; ++i)
      t.push_back(p.declare("t" + std::to_string(i), DType::F32, {1 + (int64_t)(r[i] * 5000)}));
    Ops& ops = p.tracer(e->ops());
    std::vector<int> first(n), last(n);
    for (int i = 0; i < n; ++i) {
      first[i] = (int)(r[n + i] * 60);
      last[i] = first[i] + (int)(r[2 * n + i] * 30);
    }
    for (int k = 0; k < 100; ++k)
      for (int i = 0; i < n; ++i) {
        if (k == first[i]) ops.run(Fill{t[i], 0});
        if (k > first[i] && k <= last[i]) ops.run(Copy{t[i], t[i]});
      }
    p.pack();
    p.verify();
    size_t peak_live = 0;
    for (int k = 0; k < p.ops_traced(); ++k) {
      size_t live = 0;
      for (const auto& b : p.buffers())
        if (b.first <= k && k <= b.last) live += b.bytes;
      peak_live = std::max(peak_live, live);
    }
    EXPECT_GE(p.arena_bytes(), peak_live);
    EXPECT_LE(p.arena_bytes(), p.declared_bytes());
  }
}

}  // namespace

namespace {

// With programmatic dependent launch (sampling's graphs; UNET_PDL) an edge into a unet kernel in a CUDA graph
// is programmatic (cuda_engine.cu): the kernel may be launched before its predecessor has finished, and only
// its first statement, pdl_entry(), makes it wait. So every kernel under kernels/ must begin with it: a
// kernel without it would race with its predecessor. Scans the sources (no GPU needed).
TEST(Kernels, EveryKernelBeginsWithPdlEntry) {
  namespace fs = std::filesystem;
  int kernels = 0;
  for (const auto& e : fs::recursive_directory_iterator(test::source_dir() + "/kernels")) {
    const std::string ext = e.path().extension().string();
    if (ext != ".cu" && ext != ".cuh") continue;
    std::ifstream f(e.path());
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (size_t at = s.find("__global__"); at != std::string::npos; at = s.find("__global__", at + 1)) {
      const size_t body = s.find_first_of("{;", at);
      ASSERT_NE(body, std::string::npos) << e.path();
      if (s[body] == ';') continue;  // a declaration
      ++kernels;
      const size_t first = s.find_first_not_of(" \t\r\n", body + 1);
      const size_t line = std::count(s.begin(), s.begin() + at, '\n') + 1;
      EXPECT_EQ(s.compare(first, 12, "pdl_entry();"), 0)
          << e.path().string() << ":" << line << ": a kernel whose first statement is not pdl_entry();";
    }
  }
  EXPECT_GT(kernels, 40);  // the scan found the kernels
}

}  // namespace

#if UNET_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdlib>

namespace unet {
void graph_memsets_as_kernels(cudaGraph_t g);         // kernels/device/cuda_engine.cu
void foreign_programmatic_edges_full(cudaGraph_t g);  // kernels/device/cuda_engine.cu
}

namespace {

// graph_memsets_as_kernels on g, then its kernel nodes (no memset node may be left).
std::vector<cudaGraphNode_t> fill_and_list_kernels(cudaGraph_t g) {
  graph_memsets_as_kernels(g);
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(g, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n), kernels;
  EXPECT_EQ(cudaGraphGetNodes(g, nodes.data(), &n), cudaSuccess);
  for (cudaGraphNode_t x : nodes) {
    cudaGraphNodeType t = cudaGraphNodeTypeEmpty;
    EXPECT_EQ(cudaGraphNodeGetType(x, &t), cudaSuccess);
    EXPECT_NE(t, cudaGraphNodeTypeMemset);
    if (t == cudaGraphNodeTypeKernel) kernels.push_back(x);
  }
  return kernels;
}

// The memset nodes of a graph (1-, 2- and 4-byte elements, 1D and pitched 2D, aligned for the fill
// kernel's 16-byte stores or not) replaced by fill kernels: no memset node is left, the bytes
// written are those of the memsets (checked against a host model, the rest keeps its poison), and
// the edges hold: a later memset over part of an earlier one wins, and a copy after the memsets
// sees their values.
TEST(CudaGraphs, MemsetNodesBecomeFillKernels) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  constexpr size_t kBytes = 1 << 16;
  char *buf = nullptr, *copy = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&copy, kBytes), cudaSuccess);
  std::vector<unsigned char> want(kBytes, 0xEE);
  ASSERT_EQ(cudaMemcpy(buf, want.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(copy, 0x11, kBytes), cudaSuccess);
  struct Set {
    size_t off, pitch;
    unsigned value, es;
    size_t width, height;
  };
  std::mt19937 rng((unsigned)test::test_seed());
  const std::vector<Set> sets = {
      {0, 0, 0x5a, 1, 4096, 1},                       // 16-byte aligned, wide stores
      {4096 + 3, 0, 0xc3, 1, 1001, 1},                // unaligned, odd length
      {8192, 48, 0x7f, 1, 32, 9},                     // 2D, 16-byte rows and pitch
      {12288 + 2, 50, 0xa5, 1, 21, 7},                // 2D, unaligned
      {16384, 0, 0xbeef, 2, 1001, 1},                 // 2-byte elements, 2002 bytes: element stores
      {20480, 0, 0x3f80a1b2u, 4, 1024, 1},            // 4-byte elements, wide
      {24576 + 4, 64, 0x12345678u, 4, 5, 6},          // 4-byte elements, 2D, narrow rows
      {100, 0, 0x01, 1, 200, 1},                      // over part of the first (must come after it)
      {30000, 0, (unsigned)(rng() & 0xff), 1, rng() % 3000 + 1, 1},
  };
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaGraphCreate(&g, 0), cudaSuccess);
  cudaGraphNode_t prev = nullptr;
  for (const Set& s : sets) {
    cudaMemsetParams p = {};
    p.dst = buf + s.off;
    p.pitch = s.height > 1 ? s.pitch : 0;
    p.value = s.value;
    p.elementSize = s.es;
    p.width = s.width;
    p.height = s.height;
    cudaGraphNode_t n = nullptr;
    ASSERT_EQ(cudaGraphAddMemsetNode(&n, g, prev ? &prev : nullptr, prev ? 1 : 0, &p), cudaSuccess);
    prev = n;
    for (size_t r = 0; r < s.height; ++r)
      for (size_t k = 0; k < s.width; ++k)
        for (unsigned b = 0; b < s.es; ++b)
          want[s.off + r * (s.height > 1 ? s.pitch : 0) + k * s.es + b] = (unsigned char)(s.value >> (8 * b));
  }
  cudaGraphNode_t cp = nullptr;
  ASSERT_EQ(cudaGraphAddMemcpyNode1D(&cp, g, &prev, 1, copy, buf, kBytes, cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(fill_and_list_kernels(g).size(), sets.size());
  cudaGraphExec_t ge = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) ASSERT_EQ(cudaGraphLaunch(ge, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> got(kBytes), got_copy(kBytes);
  ASSERT_EQ(cudaMemcpy(got.data(), buf, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_copy.data(), copy, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  size_t bad = 0, first = kBytes;
  for (size_t i = 0; i < kBytes; ++i)
    if (got[i] != want[i] || got_copy[i] != want[i]) ++bad, first = std::min(first, i);
  EXPECT_EQ(bad, 0u) << "first differing byte " << first;
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaFree(buf);
  cudaFree(copy);
}

// Two kernels that are not unet's, as PTX (loaded at run time: this file has no device code).
// pdl_producer lets its dependents launch at once, spins `cycles`, then stores `value`;
// pdl_reader copies *in to *out without waiting on any programmatic predecessor (griddepcontrol.wait):
// launched with programmatic stream serialization, it runs as soon as its predecessor lets it.
constexpr const char* kPdlPtx = R"(.version 8.0
.target sm_90
.address_size 64
.visible .entry pdl_producer(.param .u64 out, .param .u32 value, .param .u64 cycles)
{
  .reg .pred %p<2>;
  .reg .b32 %r<2>;
  .reg .b64 %rd<6>;
  griddepcontrol.launch_dependents;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [value];
  ld.param.u64 %rd2, [cycles];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u64 %rd3, %clock64;
  add.s64 %rd4, %rd3, %rd2;
$L_spin:
  mov.u64 %rd5, %clock64;
  setp.lt.u64 %p1, %rd5, %rd4;
  @%p1 bra $L_spin;
  st.global.u32 [%rd1], %r1;
  ret;
}
.visible .entry pdl_reader(.param .u64 in, .param .u64 out)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [in];
  ld.param.u64 %rd2, [out];
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  ld.volatile.global.u32 %r1, [%rd1];
  st.global.u32 [%rd2], %r1;
  ret;
}
)";

// Programmatic edges of g (between any two nodes).
size_t programmatic_edge_count(cudaGraph_t g) {
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  EXPECT_EQ(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n), cudaSuccess);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) k += data[i].type == cudaGraphDependencyTypeProgrammatic;
  return k;
}

// The lanes' join in a captured graph: a kernel launched with programmatic stream serialization
// (as cuDNN launches its kernels) right after the main lane waits for the side lane. Eagerly the
// wait is a full dependency on the side lane's kernel; the capture makes that edge programmatic
// (H200, CUDA 13.0: one such edge), which broke the seed64 step's graph with one of cuDNN's engines
// (cuda_engine.cu). After foreign_programmatic_edges_full (graph_end applies it to every capture)
// no programmatic edge is left between these two kernels that are not unet's, and every replay
// reads the value the side lane's kernel wrote. Hopper and later (programmatic launch). The
// unconverted graph's edges and result are printed, not checked: whether a reader that does not
// wait reads early depends on the edge's port and on timing (on the H200 it read the value).
TEST(CudaGraphs, ForeignProgrammaticEdgesAfterAJoinBecomeFull) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "programmatic dependent launch needs sm_90";
  cudaLibrary_t lib = nullptr;
  ASSERT_EQ(cudaLibraryLoadData(&lib, kPdlPtx, nullptr, nullptr, 0, nullptr, nullptr, 0), cudaSuccess);
  cudaKernel_t producer = nullptr, reader = nullptr;
  ASSERT_EQ(cudaLibraryGetKernel(&producer, lib, "pdl_producer"), cudaSuccess);
  ASSERT_EQ(cudaLibraryGetKernel(&reader, lib, "pdl_reader"), cudaSuccess);
  unsigned *flag = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&flag, 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 4), cudaSuccess);
  cudaStream_t main = nullptr, side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t fork = nullptr, join = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  std::mt19937 rng((unsigned)test::test_seed());
  unsigned value = 1 + rng() % 1000000;
  unsigned long long cycles = 4000000;  // ~2 ms: the reader, if let go early, reads long before
  auto capture = [&]() {
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(main, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(flag, 0, 4, main), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(fork, main), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
    void* pargs[] = {&flag, &value, &cycles};
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(1), c.blockDim = dim3(32), c.stream = side;
    EXPECT_EQ(cudaLaunchKernelExC(&c, reinterpret_cast<const void*>(producer), pargs), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(join, side), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(main, join, 0), cudaSuccess);
    cudaLaunchAttribute a = {};
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
    c.stream = main, c.attrs = &a, c.numAttrs = 1;
    void* rargs[] = {&flag, &out};
    EXPECT_EQ(cudaLaunchKernelExC(&c, reinterpret_cast<const void*>(reader), rargs), cudaSuccess);
    EXPECT_EQ(cudaStreamEndCapture(main, &g), cudaSuccess);
    return g;
  };
  auto replay = [&](cudaGraph_t g) {
    cudaGraphExec_t ge = nullptr;
    EXPECT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    unsigned got = 0;
    EXPECT_EQ(cudaMemset(out, 0xff, 4), cudaSuccess);  // poison
    EXPECT_EQ(cudaGraphLaunch(ge, main), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(main), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&got, out, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaGraphExecDestroy(ge);
    return got;
  };
  cudaGraph_t raw = capture();
  ASSERT_NE(raw, nullptr);
  const size_t before = programmatic_edge_count(raw);
  const unsigned raw_got = replay(raw);
  std::printf("[pdl] as captured: %zu programmatic edge(s), the reader read %u (written: %u)\n", before,
              raw_got, value);
  cudaGraphDestroy(raw);
  for (int rep = 0; rep < 3; ++rep) {
    value = 1 + rng() % 1000000;
    cudaGraph_t g = capture();
    ASSERT_NE(g, nullptr);
    foreign_programmatic_edges_full(g);
    EXPECT_EQ(programmatic_edge_count(g), 0u);
    EXPECT_EQ(replay(g), value) << "replay " << rep;
    cudaGraphDestroy(g);
  }
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(main);
  cudaStreamDestroy(side);
  cudaFree(flag);
  cudaFree(out);
  cudaLibraryUnload(lib);
}

// Stream priorities: the engine's main lane is the most urgent stream (UNET_STREAM_PRIORITY=0: the
// default priority); a captured graph's kernel nodes keep their stream's priority, and a memset
// node replaced by a fill kernel takes the priority of the kernel it was for, so the lane keeps
// its place with the block scheduler. The replaced graph, instantiated with node priorities,
// still orders the fill before the kernel (cuBLAS scales what the fill wrote).
TEST(CudaGraphs, KernelNodesKeepLanePriority) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  for (const char* v : {"1", "0"}) {
    setenv("UNET_STREAM_PRIORITY", v, 1);
    std::string why;
    auto eng = make_cuda_engine(Precision::FP32, &why);
    ASSERT_NE(eng, nullptr) << why;
    int prio = 1;
    ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(eng->device().native_stream()), &prio), cudaSuccess);
    EXPECT_EQ(prio, std::string(v) == "1" ? greatest : 0) << "UNET_STREAM_PRIORITY=" << v;
  }
  unsetenv("UNET_STREAM_PRIORITY");

  constexpr int kN = 4096;
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(buf, 0xff, kN * sizeof(float)), cudaSuccess);  // NaN until the fill
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest), cudaSuccess);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
  std::mt19937 rng((unsigned)test::test_seed());
  const float alpha = 1.5f + (float)(rng() % 100);
  const unsigned char byte = (unsigned char)(0x30 + rng() % 16);  // a finite, normal float pattern
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buf, byte, kN * sizeof(float), s), cudaSuccess);
  ASSERT_EQ(cublasSscal(h, kN, &alpha, buf, 1), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  const std::vector<cudaGraphNode_t> kernels = fill_and_list_kernels(g);
  for (cudaGraphNode_t x : kernels) {
    cudaKernelNodeAttrValue a = {};
    ASSERT_EQ(cudaGraphKernelNodeGetAttribute(x, cudaLaunchAttributePriority, &a), cudaSuccess);
    EXPECT_EQ(a.priority, greatest);
  }
  EXPECT_GE(kernels.size(), 2u);  // the fill and cuBLAS's scale
  cudaGraphExec_t ge = nullptr;
  ASSERT_EQ(cudaGraphInstantiateWithFlags(&ge, g, cudaGraphInstantiateFlagUseNodePriority), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<float> got(kN);
  ASSERT_EQ(cudaMemcpy(got.data(), buf, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  float filled;
  std::memset(&filled, byte, sizeof filled);
  size_t bad = 0;
  for (float x : got) bad += x != filled * alpha;
  EXPECT_EQ(bad, 0u);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cublasDestroy(h);
  cudaStreamDestroy(s);
  cudaFree(buf);
}

// Ops::aside(true) forks the optimizer's stream after both lanes: a copy issued there between
// joins sees what the side lane wrote before it (the early optimizer updates read the filter
// gradients that way). Each round the side lane overwrites 64 MB four times, then the aside stream
// copies its tail: every slot must hold its round's last value.
TEST(CudaGraphs, AsideStartsAfterBothLanes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::string why;
  auto eng = make_cuda_engine(Precision::FP32, &why);
  ASSERT_NE(eng, nullptr) << why;
  Ops& ops = eng->ops();
  constexpr int kRounds = 8;
  constexpr int64_t kN = 1 << 24, kTail = 4096;
  const Tensor big = eng->alloc(DType::F32, {kN}), out = eng->alloc(DType::F32, {kRounds, kTail});
  test::poison(*eng, out);
  const float base = (float)(test::test_seed() % 1000);
  for (int r = 0; r < kRounds; ++r) {
    ops.lane(true);
    for (int k = 0; k < 4; ++k) ops.run(Fill{big, base + (float)(r * 10 + k)});
    ops.lane(false);
    ops.aside(true);
    ops.run(Copy{big.flat(kN - kTail, kTail), out.flat((size_t)r * kTail, kTail)});
    ops.aside(false);
    ops.join();
    ops.join_aside();  // (before the next round's fills)
  }
  std::vector<float> got((size_t)kRounds * kTail);
  eng->download(got.data(), out);
  size_t bad = 0;
  for (int r = 0; r < kRounds; ++r)
    for (int64_t i = 0; i < kTail; ++i) bad += got[(size_t)r * kTail + i] != base + (float)(r * 10 + 3);
  EXPECT_EQ(bad, 0u);
}

// Ops::branch(true) forks a third stream after the main lane: a copy issued there sees what the
// main lane wrote before it, and join_branch() makes the main lane's later ops see what the branch
// wrote, while the main lane's own work in between (and the side lane's) runs beside it. Each
// round: the main lane fills `a`, the branch copies a's tail to `b`, the main lane meanwhile fills
// `c` 64 MB at a time, then after join_branch copies b (and c's tail) to the round's output.
// Eagerly and replayed from a captured graph (the model's backward runs that way).
TEST(CudaGraphs, BranchForksFromAndJoinsTheMainLane) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::string why;
  auto eng = make_cuda_engine(Precision::FP32, &why);
  ASSERT_NE(eng, nullptr) << why;
  Ops& ops = eng->ops();
  Device& dev = eng->device();
  constexpr int kRounds = 8;
  constexpr int64_t kN = 1 << 24, kTail = 4096;
  const Tensor a = eng->alloc(DType::F32, {kN}), b = eng->alloc(DType::F32, {kTail}),
               c = eng->alloc(DType::F32, {kN}), side = eng->alloc(DType::F32, {kN}),
               out = eng->alloc(DType::F32, {2, kRounds, kTail});
  const float base = (float)(test::test_seed() % 1000);
  auto rounds = [&](float shift) {
    for (int r = 0; r < kRounds; ++r) {
      ops.lane(true);  // the side lane busy throughout, as in the backward
      for (int k = 0; k < 2; ++k) ops.run(Fill{side, shift + (float)k});
      ops.lane(false);
      for (int k = 0; k < 3; ++k) ops.run(Fill{a, shift + base + (float)(r * 10 + k)});
      ops.branch(true);
      ops.run(Copy{a.flat(kN - kTail, kTail), b});
      ops.branch(false);
      for (int k = 0; k < 4; ++k) ops.run(Fill{c, shift + base + (float)(r * 10 + 5 + k)});
      ops.join_branch();
      ops.run(Copy{b, out.flat((size_t)r * kTail, kTail)});
      ops.run(Copy{c.flat(kN - kTail, kTail), out.flat((size_t)(kRounds + r) * kTail, kTail)});
    }
    ops.join();
  };
  auto check = [&](float shift, const char* how) {
    std::vector<float> got((size_t)2 * kRounds * kTail);
    eng->download(got.data(), out);
    size_t bad = 0;
    for (int r = 0; r < kRounds; ++r)
      for (int64_t i = 0; i < kTail; ++i) {
        bad += got[(size_t)r * kTail + i] != shift + base + (float)(r * 10 + 2);
        bad += got[(size_t)(kRounds + r) * kTail + i] != shift + base + (float)(r * 10 + 8);
      }
    EXPECT_EQ(bad, 0u) << how;
  };
  test::poison(*eng, out);
  rounds(0.0f);
  check(0.0f, "eager");
  test::poison(*eng, out);
  dev.graph_begin();
  rounds(1000.0f);
  dev.graph_end();
  dev.graph_launch();
  check(1000.0f, "graph replay");
}

}  // namespace
#endif
