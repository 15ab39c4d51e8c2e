// The counter-based RNG and the training data loader: order is a permutation per epoch, a pure
// function of (seed, step) — so resume at step k gives exactly the batches of a fresh run —,
// flips really mirror, values and labels follow the images.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>

#include "dataloader.h"
#include "dataset.h"
#include "engine.h"
#include "ophelp.h"
#include "rng.h"
#include "testutil.h"
#include "trainer.h"
#include "util.h"

using namespace unet;

// ---- rng ----

TEST(Rng, KnownAnswers) {
  // Pinned values: checkpoints resume by recomputing draws, so the hash must never change.
  EXPECT_EQ(mix64(0), 0ull);
  EXPECT_EQ(hash64(0, 0, 0), 0xe58a717ad54683a5ull);
  EXPECT_EQ(hash64(1, 2, 3), 0x6b1a1bb8e571a4b1ull);
  EXPECT_EQ(rng_key(7, Stream::TrainNoise, 11), 0x930b60031210a2e1ull);
  EXPECT_EQ(uniform01(1, Stream::TrainFlip, 5), 0.0437250137f);
  EXPECT_FLOAT_EQ(normal(1, Stream::TrainNoise, 0), -0.512241006f);  // libm may differ in the last bit
}

TEST(Rng, DeterministicAndStreamsDiffer) {
  const uint64_t seed = test::test_seed();
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(uniform01(seed, Stream::TrainFlip, i), uniform01(seed, Stream::TrainFlip, i));
    same += uniform01(seed, Stream::TrainFlip, i) == uniform01(seed, Stream::Shuffle, i);
    same += normal(seed, Stream::TrainNoise, i) == normal(seed + 1, Stream::TrainNoise, i);
    same += rng_key(seed, Stream::SampleStep, i) == rng_key(seed, Stream::SampleStep, i + 1);
  }
  EXPECT_LE(same, 2);
}

TEST(Rng, UniformMoments) {
  const uint64_t seed = test::test_seed();
  const int n = 200000;
  double s = 0, s2 = 0;
  float lo = 1, hi = 0;
  for (int i = 0; i < n; ++i) {
    const float u = uniform01(seed, Stream::TrainFlip, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    lo = std::min(lo, u), hi = std::max(hi, u);
    s += u, s2 += double(u) * u;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);  // sd of the mean ~ 0.00065
  EXPECT_NEAR(var, 1.0 / 12, 0.002);
  EXPECT_LT(lo, 1e-3);
  EXPECT_GT(hi, 1 - 1e-3);
}

TEST(Rng, NormalMomentsAndFill) {
  const uint64_t seed = test::test_seed();
  const int n = 200001;  // odd, to exercise the unpaired tail of normal_fill
  std::vector<float> z(n);
  normal_fill(seed, Stream::TrainNoise, 0, n, z.data());
  double s = 0, s2 = 0, s4 = 0;
  int tail = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(z[i]));
    ASSERT_EQ(z[i], normal(seed, Stream::TrainNoise, i)) << i;
    s += z[i], s2 += double(z[i]) * z[i], s4 += std::pow(double(z[i]), 4);
    tail += std::fabs(z[i]) > 1.959964;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);  // sd ~ 0.0022
  EXPECT_NEAR(var, 1.0, 0.015);
  EXPECT_NEAR(s4 / n, 3.0, 0.1);               // kurtosis of a Gaussian
  EXPECT_NEAR(double(tail) / n, 0.05, 0.003);  // two-sided 5% tail
  // Odd start and odd length: same values as the scalar draws.
  std::vector<float> w(7);
  normal_fill(seed, Stream::TrainNoise, 13, 7, w.data());
  for (int j = 0; j < 7; ++j) EXPECT_EQ(w[j], z[13 + j]);
  // Adjacent pairs (cos/sin branch of one hash) are uncorrelated.
  double c = 0;
  for (int i = 0; i + 1 < n; i += 2) c += double(z[i]) * z[i + 1];
  EXPECT_NEAR(c / (n / 2), 0.0, 0.015);
}

TEST(Rng, RandintUniform) {
  const uint64_t seed = test::test_seed();
  for (int64_t m : {1, 2, 7, 1000}) {
    std::vector<int> count(m, 0);
    const int n = 100000;
    for (int i = 0; i < n; ++i) {
      const int64_t r = randint(seed, Stream::TrainTimestep, i, m);
      ASSERT_GE(r, 0);
      ASSERT_LT(r, m);
      count[r]++;
    }
    double chi2 = 0;
    const double e = double(n) / m;
    for (int c : count) chi2 += (c - e) * (c - e) / e;
    // chi2 with k = m-1 dof against its upper quantile at z = 6 (tail ~1e-9; Wilson-Hilferty:
    // k (1 - 2/(9k) + z sqrt(2/(9k)))^3). "mean + 6 sd" was no such bound at small k: with 1 dof
    // chi2 passes 10.5 once in 800 draws (seed 2012740584 drew 13.1 at m = 2).
    const double k = double(std::max<int64_t>(m - 1, 1)), h = 2.0 / (9.0 * k);
    EXPECT_LT(chi2, k * std::pow(1.0 - h + 6.0 * std::sqrt(h), 3)) << m;
  }
}

// ---- data loader ----

namespace {

struct Toy {
  DatasetInfo info;
  std::vector<uint8_t> images;
  std::vector<int64_t> labels;
};

// N distinct random images of S x S x 3 (distinct with overwhelming probability) and labels.
Toy toy(int N, int S, bool labels, uint64_t seed) {
  Toy t;
  t.info.count = N;
  t.info.image_size = S;
  t.info.has_labels = labels;
  if (labels) t.info.class_names = {"a", "b", "c"};
  auto u = test::randu(size_t(N) * S * S * 3, seed, 0.0f, 256.0f);
  t.images.resize(u.size());
  for (size_t i = 0; i < u.size(); ++i) t.images[i] = uint8_t(std::min(255.0f, u[i]));
  if (labels)
    for (int i = 0; i < N; ++i) t.labels.push_back((i * 7 + 1) % 3);
  return t;
}

// x0 of image `idx`, mirrored or not, as the loader must produce it.
std::vector<float> expect_x0(const Toy& t, int64_t idx, bool flip) {
  const int S = t.info.image_size;
  std::vector<float> v(size_t(S) * S * 3);
  for (int y = 0; y < S; ++y)
    for (int x = 0; x < S; ++x)
      for (int c = 0; c < 3; ++c)
        v[(size_t(y) * S + x) * 3 + c] =
            float(t.images[((size_t(idx) * S + y) * S + (flip ? S - 1 - x : x)) * 3 + c]) / 127.5f - 1.0f;
  return v;
}

bool batches_equal(const Batch& a, const Batch& b) {
  return a.step == b.step && a.x0 == b.x0 && a.t == b.t && a.labels == b.labels;
}

}  // namespace

TEST(DataLoader, EpochIsAPermutation) {
  const uint64_t seed = test::test_seed();
  for (int64_t N : {1, 2, 10, 1001}) {
    auto p0 = DataLoader::epoch_permutation(seed, 0, N);
    auto p1 = DataLoader::epoch_permutation(seed, 1, N);
    EXPECT_EQ(p0, DataLoader::epoch_permutation(seed, 0, N));
    std::set<int64_t> s0(p0.begin(), p0.end()), s1(p1.begin(), p1.end());
    EXPECT_EQ(s0.size(), size_t(N));
    EXPECT_EQ(s1.size(), size_t(N));
    EXPECT_EQ(*s0.begin(), 0);
    EXPECT_EQ(*s0.rbegin(), N - 1);
    if (N >= 10) {
      EXPECT_NE(p0, p1);  // reshuffled every epoch
      EXPECT_NE(p0, DataLoader::epoch_permutation(seed + 1, 0, N));
    }
  }
}

TEST(DataLoader, OrderCoversEveryImageOncePerEpoch) {
  const uint64_t seed = test::test_seed();
  const int N = 13, B = 5;  // batches straddle epochs
  Toy t = toy(N, 2, false, seed);
  DataLoader dl(t.info, t.images, t.labels, B, 100, seed, false, 0);
  std::vector<int64_t> seen;
  for (int s = 0; s < 8; ++s) {
    Batch* b = dl.next();
    ASSERT_EQ(b->step, s);
    for (int j = 0; j < B; ++j) {
      const int64_t idx = dl.dataset_index(int64_t(s) * B + j);
      // The delivered image is the one the order says.
      auto want = expect_x0(t, idx, false);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), b->x0.begin() + j * want.size()));
      seen.push_back(idx);
    }
  }
  for (int e = 0; e < 3; ++e) {  // 40 samples: epochs 0, 1, 2 complete
    std::set<int64_t> s(seen.begin() + e * N, seen.begin() + (e + 1) * N);
    EXPECT_EQ(s.size(), size_t(N)) << "epoch " << e;
  }
}

TEST(DataLoader, DeterministicAndResumeExact) {
  const uint64_t seed = test::test_seed();
  Toy t = toy(11, 4, true, seed);
  const int B = 4, T = 1000;
  std::vector<Batch> fresh;
  {
    DataLoader a(t.info, t.images, t.labels, B, T, seed, true, 0, 2);
    for (int s = 0; s < 12; ++s) fresh.push_back(*a.next());
  }
  // Same seed, different prefetch depth: the same batches.
  DataLoader b(t.info, t.images, t.labels, B, T, seed, true, 0, 1);
  for (int s = 0; s < 12; ++s) EXPECT_TRUE(batches_equal(*b.next(), fresh[s])) << s;
  // Resume at step 7: batches 7, 8, ... exactly.
  DataLoader r(t.info, t.images, t.labels, B, T, seed, true, 7, 3);
  for (int s = 7; s < 12; ++s) {
    Batch* x = r.next();
    EXPECT_EQ(x->step, s);
    EXPECT_TRUE(batches_equal(*x, fresh[s])) << s;
    EXPECT_TRUE(batches_equal(*x, r.compute(s))) << s;
  }
  // Another seed: different batches.
  DataLoader o(t.info, t.images, t.labels, B, T, seed + 1, true, 0);
  Batch* x = o.next();
  EXPECT_NE(x->t, fresh[0].t);
}

TEST(DataLoader, FlipValuesTimestepsLabels) {
  const uint64_t seed = test::test_seed();
  Toy t = toy(9, 6, true, seed);
  const int B = 8, T = 50;
  const size_t numel = 6 * 6 * 3;
  for (bool flip : {true, false}) {
    DataLoader dl(t.info, t.images, t.labels, B, T, seed, flip, 3);
    int flipped = 0, plain = 0;
    std::set<int> ts;
    for (int s = 3; s < 23; ++s) {
      Batch* b = dl.next();
      ASSERT_EQ(b->x0.size(), B * numel);
      for (int j = 0; j < B; ++j) {
        const int64_t idx = dl.dataset_index(int64_t(s) * B + j);
        auto p = expect_x0(t, idx, false), m = expect_x0(t, idx, true);
        const bool is_p = std::equal(p.begin(), p.end(), b->x0.begin() + j * numel);
        const bool is_m = std::equal(m.begin(), m.end(), b->x0.begin() + j * numel);
        ASSERT_TRUE(is_p || is_m) << "sample " << j << " of step " << s << " is not image " << idx;
        if (is_m && !is_p) ++flipped;
        if (is_p && !is_m) ++plain;
        EXPECT_EQ(b->labels[j], t.labels[idx]);
        const float tj = b->t[j];
        ASSERT_EQ(tj, std::floor(tj));
        ASSERT_GE(tj, 0);
        ASSERT_LT(tj, T);
        ts.insert(int(tj));
      }
      for (float v : b->x0) {
        ASSERT_GE(v, -1.0f);
        ASSERT_LE(v, 1.0f);
      }
    }
    if (flip) {
      EXPECT_GT(flipped, 40);  // 160 samples, p = 1/2
      EXPECT_GT(plain, 40);
    } else {
      EXPECT_EQ(flipped, 0);
    }
    EXPECT_GT(ts.size(), 40u);  // 160 draws over 50 values
  }
  // Endpoints of the pixel mapping: 0 -> -1, 255 -> 1.
  Toy e = toy(1, 1, false, seed);
  e.images = {0, 255, 128};
  DataLoader dl(e.info, e.images, e.labels, 1, 10, seed, false, 0);
  Batch* b = dl.next();
  EXPECT_EQ(b->x0[0], -1.0f);
  EXPECT_EQ(b->x0[1], 1.0f);
  EXPECT_EQ(b->x0[2], 128.0f / 127.5f - 1.0f);
  EXPECT_EQ(b->labels[0], 0);  // no labels: zeros
}

// A training batch's noise (draw_train_noise, on the engine): standard normal, fresh every step.
TEST(DataLoader, NoiseIsStandardNormal) {
  const uint64_t seed = test::test_seed();
  Engine& cpu = test::cpu_engine();
  const Tensor z = cpu.alloc(DType::F32, {16, 16, 16, 3});
  double s = 0, s2 = 0;
  size_t n = 0;
  std::vector<float> first;
  for (int64_t step = 0; step < 5; ++step) {
    test::poison(cpu, z);
    draw_train_noise(cpu.ops(), z, seed, step, 0);
    const std::vector<float> v = test::to_host(cpu, z);
    if (step == 0)
      first = v;
    else
      EXPECT_NE(v, first);  // fresh every step
    for (float x : v) s += x, s2 += double(x) * x, ++n;
  }
  EXPECT_NEAR(s / n, 0.0, 0.02);
  EXPECT_NEAR(s2 / n, 1.0, 0.03);
}

// The noise of rank r's slice of a global batch: sample g's values are normal(noise_key(seed,
// step), TrainNoise, g x H x W x C + j) (the host's normal_fill, lib/rng.h), so every rank's
// slice (its loader's first()) is that slice of one process's batch. Bitwise on the CPU engine;
// on a GPU within the NormalFill tolerance (libm's last bit; skipped without one).
TEST(DataLoader, NoiseDrawnByTheEngineIsTheLoaders) {
  const uint64_t seed = test::test_seed();
  const int S = 8, B = 6, world = 3;
  const size_t numel = size_t(S) * S * 3;
  Toy t = toy(5, S, true, seed);
  for (int64_t step : {4, 5, 11}) {
    std::vector<float> whole(B * numel);  // one process's batch, on the host
    normal_fill(DataLoader::noise_key(seed, step), Stream::TrainNoise, 0, whole.size(), whole.data());
    for (int rank = 0; rank < world; ++rank) {
      DataLoader dl(t.info, t.images, t.labels, B, 1000, seed, true, 4, 2, nullptr, rank, world);
      const int b = dl.local_batch();
      ASSERT_EQ(dl.first(), rank * b);
      const std::vector<float> w(whole.begin() + dl.first() * numel,
                                 whole.begin() + (dl.first() + b) * numel);
      Engine& cpu = test::cpu_engine();
      const Tensor z = cpu.alloc(DType::F32, {b, S, S, 3});
      test::poison(cpu, z);
      draw_train_noise(cpu.ops(), z, seed, step, dl.first());
      EXPECT_EQ(test::to_host(cpu, z), w) << "rank " << rank << " step " << step;
      if (Engine* gpu = test::gpu_engine(Precision::TF32)) {
        const Tensor g = gpu->alloc(DType::F32, {b, S, S, 3});
        test::poison(*gpu, g);
        draw_train_noise(gpu->ops(), g, seed, step, dl.first());
        const std::vector<float> v = test::to_host(*gpu, g);
        size_t differ = 0;
        for (size_t i = 0; i < w.size(); ++i) {
          if (v[i] == w[i]) continue;
          ++differ;
          EXPECT_LE(std::fabs(v[i] - w[i]), std::fabs(w[i]) * 1.2e-7f) << i;  // (NaN fails)
        }
        EXPECT_LE(differ, 2u);
      }
    }
  }
}

// The background thread's OpenMP loops take the count of the thread that made the loader
// (omp_set_num_threads is per thread: a new thread would start from every core), at most
// DataLoader::kMaxThreads.
TEST(DataLoader, ThreadsAreTheCreators) {
  const uint64_t seed = test::test_seed();
  Toy t = toy(3, 8, false, seed);
  const int saved = omp_get_max_threads();
  for (int n : {1, 3, DataLoader::kMaxThreads + 5}) {
    omp_set_num_threads(n);
    DataLoader dl(t.info, t.images, t.labels, 4, 1000, seed, true, 0);
    dl.next();  // the background thread has filled a batch
    EXPECT_EQ(dl.threads(), std::min(n, DataLoader::kMaxThreads));  // (at most kMaxThreads)
  }
  omp_set_num_threads(saved);
}

TEST(DataLoader, HostAllocHook) {
  const uint64_t seed = test::test_seed();
  Toy t = toy(5, 4, false, seed);
  auto bytes = std::make_shared<std::atomic<size_t>>(0);
  auto arena = std::make_shared<std::vector<std::unique_ptr<char[]>>>();
  {
    DataLoader dl(t.info, t.images, t.labels, 2, 10, seed, true, 0, 2, [bytes, arena](size_t n) {
      *bytes += n;
      arena->emplace_back(new char[n]);
      return static_cast<void*>(arena->back().get());
    });
    Batch* b = dl.next();
    bool inside = false;
    for (auto& blk : *arena) inside |= static_cast<void*>(b->x0.data()) == static_cast<void*>(blk.get());
    EXPECT_TRUE(inside);
    EXPECT_TRUE(batches_equal(*b, dl.compute(0)));
  }
  // 3 slots x (2 images of x0 + t + labels).
  EXPECT_EQ(bytes->load(), 3 * (2 * 4 * 4 * 3 * sizeof(float) + 2 * sizeof(float) + 2 * sizeof(int32_t)));
}

TEST(DataLoader, RejectsBadInput) {
  Toy t = toy(4, 2, true, 1);
  EXPECT_THROW(DataLoader(t.info, t.images, {}, 2, 10, 0, true, 0), UserError);  // labels missing
  auto short_images = t.images;
  short_images.pop_back();
  EXPECT_THROW(DataLoader(t.info, short_images, t.labels, 2, 10, 0, true, 0), UserError);
  EXPECT_THROW(DataLoader(t.info, t.images, t.labels, 0, 10, 0, true, 0), UserError);
  EXPECT_THROW(DataLoader(test::temp_dir("dl") + "/missing.h5", 2, 10, 0, true, 0), UserError);
}

// From an HDF5 file written by `prepare`'s writer: the same batches as from memory.
TEST(DataLoader, FromFileMatchesMemory) {
  const uint64_t seed = test::test_seed();
  Toy t = toy(7, 4, true, seed);
  const std::string path = test::temp_dir("dataloader") + "/d.h5";
  {
    DatasetWriter w(path, 4, true, t.info.class_names);
    for (int i = 0; i < 7; ++i) w.append(t.images.data() + size_t(i) * 4 * 4 * 3, t.labels[i]);
    w.commit();
  }
  DataLoader f(path, 3, 100, seed, true, 5);
  EXPECT_EQ(f.info().count, 7);
  EXPECT_EQ(f.info().image_size, 4);
  EXPECT_TRUE(f.info().has_labels);
  DataLoader m(t.info, t.images, t.labels, 3, 100, seed, true, 5);
  for (int s = 5; s < 10; ++s) EXPECT_TRUE(batches_equal(*f.next(), *m.next())) << s;
}
