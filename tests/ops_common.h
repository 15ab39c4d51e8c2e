// Shared helpers of the per-family op tests (tests/test_<family>.cpp): random vectors in double,
// central finite differences, a float CPU engine to run ops through, layout conversion.
//
// Each family's test checks its CPU reference (lib/ops/<family>.h) against independent naive
// formulas and finite differences in double, the float engine against the double template, and
// every CUDA variant against the CPU engine (ophelp.h, on the GPU machine).
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "arch.h"
#include "config.h"
#include "engine.h"
#include "ophelp.h"
#include "ref.h"
#include "testutil.h"

// The float engine vs the float64 reference: rounding of long fp32 dot products (K up to a few
// hundred, random signs) reaches ~1e-5 relative on unlucky draws; bugs show up orders above it.
constexpr double kF32Tol = 3e-5;

namespace opt {

using namespace unet::test;  // check_variants, Tol, Alloc
using V = std::vector<double>;
using F = std::vector<float>;
namespace ref = unet::ref;
using unet::DType;
using unet::Tensor;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

inline uint64_t next_seed() {
  static uint64_t k = 0;
  return unet::test::test_seed() * 1000003ull + 7919ull * (++k);
}
inline V rnd(size_t n, double lo = -1, double hi = 1) {
  F f = unet::test::randu(n, next_seed(), (float)lo, (float)hi);
  return V(f.begin(), f.end());
}
inline V nans(size_t n) { return V(n, kNaN); }
inline F tof(const V& v) { return F(v.begin(), v.end()); }
inline double dot(const V& a, const V& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
inline double rel(const V& a, const V& b) {  // ||a-b|| / ||b||, inf on NaN
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    n += (a[i] - b[i]) * (a[i] - b[i]);
    d += b[i] * b[i];
  }
  return d == 0 ? (n == 0 ? 0 : INFINITY) : std::sqrt(n / d);
}
inline double rel(const F& a, const V& b) { return rel(V(a.begin(), a.end()), b); }

// Central differences of loss() w.r.t. x (all elements, or max_n random ones) against ana.
inline void gradcheck(const std::string& what, V& x, const V& ana, const std::function<double()>& loss,
                      size_t max_n = 250) {
  ASSERT_EQ(x.size(), ana.size()) << what;
  std::vector<size_t> idx;
  if (x.size() <= max_n) {
    for (size_t i = 0; i < x.size(); ++i) idx.push_back(i);
  } else {
    std::mt19937_64 g(next_seed());
    for (size_t i = 0; i < max_n; ++i) idx.push_back(g() % x.size());
  }
  // Thousands of tiny forward calls: one thread (thread teams cost more than they save here;
  // multi-threaded results are covered by the determinism test).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double eps = 1e-6;
  double err = 0, nrm = 0, worst = 0;
  size_t worst_i = 0;
  for (size_t i : idx) {
    const double save = x[i];
    x[i] = save + eps;
    const double lp = loss();
    x[i] = save - eps;
    const double lm = loss();
    x[i] = save;
    const double num = (lp - lm) / (2 * eps), e = std::fabs(num - ana[i]);
    if (!(e <= worst)) worst = e, worst_i = i;
    err += e * e;
    nrm += ana[i] * ana[i];
  }
  omp_set_num_threads(threads);
  EXPECT_GT(nrm, 0) << what << ": gradient is all zero (vacuous check)";
  EXPECT_LT(std::sqrt(err / nrm), 1e-6)
      << what << ": worst element " << worst_i << " off by " << worst << " (analytic " << ana[worst_i] << ")";
}

// The float CPU engine as the model sees it, with helpers to move vectors in and out.
struct Dev {
  std::unique_ptr<unet::Engine> eng = unet::make_cpu_engine();
  Tensor put(const V& v, std::initializer_list<int64_t> d) {
    Tensor t = eng->alloc(DType::F32, d);
    EXPECT_EQ(t.numel(), v.size());
    F f = tof(v);
    eng->upload(t, f.data());
    return t;
  }
  Tensor put(const V& v) { return put(v, {(int64_t)v.size()}); }
  Tensor poisoned(std::initializer_list<int64_t> d) {
    Tensor t = eng->alloc(DType::F32, d);
    eng->ops().run(unet::Fill{t, NAN});
    return t;
  }
  Tensor labels(const std::vector<int32_t>& l) {
    Tensor t = eng->alloc(DType::I32, {(int64_t)l.size()});
    eng->upload(t, l.data());
    return t;
  }
  F get(const Tensor& t) {
    F f(t.numel());
    eng->download(f.data(), t);
    return f;
  }
  template <class Op>
  void run(const Op& o) {
    eng->ops().run(o);
  }
};

// ---- layout helpers (PyTorch NCHW <-> engine NHWC) ----
inline V nchw_to_nhwc(const V& t, int B, int C, int H, int W) {
  V e(t.size());
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x)
          e[(((size_t)b * H + y) * W + x) * C + c] = t[(((size_t)b * C + c) * H + y) * W + x];
  return e;
}

// A model's layers (input blocks, middle, output blocks), for the variant checks at real shapes:
// seed64 at batch 32 for the GPU variants, tiny32 at batch 16 for the CPU ones.
template <class F2>
void each_layer(const unet::Arch& a, F2 f) {
  for (auto& b : a.input_blocks)
    for (auto& l : b) f(l);
  for (auto& l : a.middle) f(l);
  for (auto& b : a.output_blocks)
    for (auto& l : b) f(l);
}
inline unet::Arch seed64_arch() { return unet::build_arch(unet::preset("seed64")); }
template <class F2>
void each_seed64_layer(F2 f) {
  each_layer(seed64_arch(), f);
}

}  // namespace opt
