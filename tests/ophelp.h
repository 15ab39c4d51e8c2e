// The generic op test: every kernel variant of an op against the CPU reference.
//
// check_variants(name, build, ...) builds the op twice from one description (shapes, dtypes) —
// on the CPU engine and on a CUDA engine of each precision — fills its inputs on the CPU with
// fresh random values (one draw for fp32 and tf32, one for bf16; a hook can make them consistent,
// e.g. statistics from a forward pass), copies the same bytes to the GPU, poisons every output
// with NaN, runs the CPU reference and then EVERY CUDA variant that supports the op, and compares
// each output (relative L2) within the precision's tolerance. Each variant also runs twice on the
// same inputs and must be bitwise reproducible (exact resume relies on it). Without a GPU the GPU
// half skips.
//
// check_cpu_variants(name, build, ...) is the same check on the CPU engine: every CPU variant
// (the fast "avx512" / "avx2" ones this CPU runs) against its "ref" variant on the same inputs,
// fp32 within the summation-order tolerance (1e-5) and in the bf16 emulation (2e-3: the same f32
// sums rounded to bf16, where a last-bit difference may flip a rounding), bitwise reproducible run
// to run and bitwise independent of the OpenMP thread count (1, 2, 3 threads: bit-exact resume on
// the CPU relies on it). The GPU checks compare with "ref" too, not with the CPU's default variant.
//
// Tolerances (relative L2 error, ||gpu - cpu|| / ||cpu||):
//  * fp32: 1e-5 — IEEE fp32 on both sides, only summation order differs;
//  * tf32: 1e-3 for one tensor-core GEMM (10-bit mantissa inputs, ~5e-4 each), 3e-3 where two
//    are chained (attention);
//  * bf16: 1e-2 — both sides store bf16 (the CPU emulates the rounding points), so the error is a
//    bf16 ulp (2^-8) on the elements whose pre-rounding values straddle a rounding boundary plus
//    the f32 accumulation order inside the op; 2e-2 where GEMMs are chained (attention).
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine.h"
#include "testutil.h"

namespace unet::test {

using Alloc = std::function<Tensor(DType, std::initializer_list<int64_t>)>;

Engine& cpu_engine(Precision p = Precision::FP32);  // FP32 or the BF16 emulation
Engine* gpu_engine(Precision p);                    // nullptr without a GPU
bool have_gpu();
std::string no_gpu_reason();

struct Tol {
  double fp32 = 1e-5, tf32 = 1e-3, bf16 = 1e-2;
  double for_precision(Precision p) const {
    return p == Precision::FP32 ? fp32 : p == Precision::TF32 ? tf32 : bf16;
  }
};

// Host copies of a tensor as floats (bf16 widened, i32 converted).
std::vector<float> to_host(Engine& e, const Tensor& t);
void from_host(Engine& e, const Tensor& t, const std::vector<float>& v);  // rounds to t's dtype
std::vector<uint8_t> raw(Engine& e, const Tensor& t);
void set_raw(Engine& e, const Tensor& t, const std::vector<uint8_t>& b);
void poison(Engine& e, const Tensor& t);  // NaN in every element (i32: 0x7fffffff)

// Random inputs: f32/bf16 ~ N(0, scale^2) (bf16 rounded), i32 left for the hook.
template <class Op>
void randomize(Engine& e, Op& op, uint64_t seed, float scale = 1.0f) {
  int k = 0;
  for_each_tensor(op, [&](const char*, Tensor& t, Role r) {
    ++k;
    if (r == Role::Out || t.dtype == DType::I32) return;
    from_host(e, t, randn(t.numel(), seed * 131 + k, scale));
  });
}

// bytes of each input tensor in visit order (Out tensors: empty).
template <class Op>
std::vector<std::vector<uint8_t>> inputs_of(Engine& e, const Op& op) {
  std::vector<std::vector<uint8_t>> v;
  for_each_tensor(op, [&](const char*, const Tensor& t, Role r) {
    v.push_back(r == Role::Out ? std::vector<uint8_t>{} : raw(e, t));
  });
  return v;
}
template <class Op>
void load_inputs(Engine& e, const Op& op, const std::vector<std::vector<uint8_t>>& in) {
  size_t i = 0;
  for_each_tensor(op, [&](const char*, const Tensor& t, Role r) {
    if (r == Role::Out)
      poison(e, t);
    else
      set_raw(e, t, in[i]);
    ++i;
  });
}
template <class Op>
std::vector<std::pair<std::string, std::vector<float>>> outputs_of(Engine& e, const Op& op) {
  std::vector<std::pair<std::string, std::vector<float>>> v;
  for_each_tensor(op, [&](const char* n, const Tensor& t, Role r) {
    if (r != Role::In) v.push_back({n, to_host(e, t)});
  });
  return v;
}

// Checks every CUDA variant of the op against the CPU reference in each precision.
//  build(alloc, act): the op with tensors from alloc; act is the activation dtype of the engine.
//  prep(engine, op): optional, runs on the CPU engine after randomize(), to make inputs valid.
// Returns the number of (precision, variant) pairs checked (0 without a GPU).
template <class Op>
int check_variants(const std::string& what, const std::function<Op(const Alloc&, DType)>& build, Tol tol,
                   const std::function<void(Engine&, Op&)>& prep = nullptr,
                   std::vector<Precision> precisions = {Precision::FP32, Precision::TF32, Precision::BF16}) {
  if (!have_gpu()) return 0;
  int checked = 0;
  // fp32 and tf32 share the CPU engine and the activation dtype, so they share one draw of the
  // inputs and one reference run (at seed64's shapes drawing the inputs takes longer than the
  // reference: batch 4, 64 -> 64 at 64x64, 0.16 s against 0.01)
  std::vector<std::vector<uint8_t>> in;
  std::vector<std::pair<std::string, std::vector<float>>> want;
  std::optional<Precision> ref_for;  // the CPU engine's precision of in / want (it fixes act)
  for (Precision p : precisions) {
    SCOPED_TRACE(what + " " + precision_name(p));
    const Precision cp = p == Precision::BF16 ? Precision::BF16 : Precision::FP32;
    Engine& cpu = cpu_engine(cp);
    Engine* gpu = gpu_engine(p);
    if (!gpu) {
      ADD_FAILURE() << "no CUDA engine for " << precision_name(p);
      continue;
    }
    const DType act = gpu->act_dtype();
    Alloc ga = [&](DType t, std::initializer_list<int64_t> d) { return gpu->alloc(t, d); };
    Op g = build(ga, act);
    if (ref_for != cp) {
      Alloc ca = [&](DType t, std::initializer_list<int64_t> d) { return cpu.alloc(t, d); };
      Op c = build(ca, act);
      randomize(cpu, c, test_seed() + 7 * checked + 1);
      if (prep) prep(cpu, c);
      in = inputs_of(cpu, c);
      load_inputs(cpu, c, in);
      cpu.base_ops().run_variant(c, "ref");  // the reference loops, whatever the CPU's default
      want = outputs_of(cpu, c);
      ref_for = cp;
    }
    const double t = tol.for_precision(p);
    for (const std::string& v : gpu->base_ops().variants_for(g)) {
      SCOPED_TRACE("variant " + v);
      load_inputs(*gpu, g, in);
      gpu->base_ops().run_variant(g, v);
      gpu->device().sync();
      const auto got = outputs_of(*gpu, g);
      for (size_t i = 0; i < got.size(); ++i) {
        const double e = rel_l2(got[i].second, want[i].second);
        if (std::getenv("UNET_TEST_VERBOSE"))
          std::printf("  %-40s %-5s %-10s %-6s rel err %.2e (tol %.0e)\n", what.c_str(), precision_name(p),
                      v.c_str(), got[i].first.c_str(), e, t);
        EXPECT_LE(e, t) << got[i].first << " of " << describe(g);
      }
      // Bitwise reproducible run to run.
      load_inputs(*gpu, g, in);
      gpu->base_ops().run_variant(g, v);
      gpu->device().sync();
      const auto again = outputs_of(*gpu, g);
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(std::memcmp(got[i].second.data(), again[i].second.data(), got[i].second.size() * 4) == 0)
            << got[i].first << " differs between two runs of " << v;
      ++checked;
    }
  }
  return checked;
}

// The CPU variants' tolerances: fp32 (tf32 is fp32 on the CPU) and the bf16 emulation.
inline const Tol kCpuTol{1e-5, 1e-5, 2e-3};

// Every CPU variant of the op but "ref" against "ref" (see the top of this file), in fp32 and in
// the bf16 emulation. build(alloc, act) as for check_variants; prep(engine, op) makes the random
// inputs valid. Returns the number of (precision, variant) pairs checked (0 when this CPU runs
// none but ref).
template <class Op>
int check_cpu_variants(const std::string& what, const std::function<Op(const Alloc&, DType)>& build,
                       Tol tol = kCpuTol, const std::function<void(Engine&, Op&)>& prep = nullptr,
                       std::vector<Precision> precisions = {Precision::FP32, Precision::BF16}) {
  static int calls = 0;
  const int saved = omp_get_max_threads();
  int checked = 0;
  for (Precision p : precisions) {
    SCOPED_TRACE(what + " (cpu variants, " + precision_name(p) + ")");
    Engine& cpu = cpu_engine(p);
    Alloc ca = [&](DType t, std::initializer_list<int64_t> d) { return cpu.alloc(t, d); };
    Op c = build(ca, cpu.act_dtype());
    randomize(cpu, c, test_seed() + 7 * (++calls) + 3);
    if (prep) prep(cpu, c);
    const auto in = inputs_of(cpu, c);
    load_inputs(cpu, c, in);
    cpu.base_ops().run_variant(c, "ref");
    const auto want = outputs_of(cpu, c);
    const double t = tol.for_precision(p);
    for (const std::string& v : cpu.base_ops().variants_for(c)) {
      if (v == "ref") continue;
      SCOPED_TRACE("variant " + v);
      std::vector<std::pair<std::string, std::vector<float>>> first;
      for (int threads : {2, 1, 3, 2}) {
        omp_set_num_threads(threads);
        load_inputs(cpu, c, in);
        cpu.base_ops().run_variant(c, v);
        const auto got = outputs_of(cpu, c);
        if (first.empty()) {
          first = got;
          for (size_t i = 0; i < got.size(); ++i) {
            const double e = rel_l2(got[i].second, want[i].second);
            if (std::getenv("UNET_TEST_VERBOSE"))
              std::printf("  %-40s cpu %-5s %-8s %-6s rel err %.2e (tol %.0e)\n", what.c_str(),
                          precision_name(p), v.c_str(), got[i].first.c_str(), e, t);
            EXPECT_LE(e, t) << got[i].first << " of " << describe(c);
          }
          continue;
        }
        for (size_t i = 0; i < got.size(); ++i)
          EXPECT_TRUE(std::memcmp(got[i].second.data(), first[i].second.data(), got[i].second.size() * 4) ==
                      0)
              << got[i].first << " of " << v << " differs at " << threads << " threads from 2 threads";
      }
      ++checked;
    }
  }
  omp_set_num_threads(saved);
  return checked;
}

#define SKIP_WITHOUT_GPU() \
  if (!::unet::test::have_gpu()) GTEST_SKIP() << ::unet::test::no_gpu_reason()

}  // namespace unet::test
