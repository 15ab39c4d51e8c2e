// Counter-based random numbers: every draw is a pure function of (seed, stream, index), so any
// value can be recomputed without replaying a sequence. Training draws depend only on
// (seed, step, sample), which makes resume "restart at step k" and bit-exact, and makes the
// data order independent of threads and prefetch depth.
//
// No std:: distributions (their algorithms differ between standard libraries): the integer
// hash is splitmix64's finaliser, the transforms are written out here. Floating-point
// transforms use double arithmetic and round once to float, so results agree across machines
// running the same binary (and, up to libm last-bit differences in log/cos, across libms).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define UNET_RNG_HD __host__ __device__
#else
#define UNET_RNG_HD
#endif

namespace unet {

// Independent streams. The values are part of the on-disk reproducibility contract (a
// checkpoint resumed by a later build must draw the same numbers): never renumber.
enum class Stream : uint64_t {
  TrainNoise = 1,       // q_sample noise: key (step), index b*numel + j
  TrainTimestep = 2,    // t ~ U{0..T-1}: key (step), index b
  TrainFlip = 3,        // horizontal flip: key (step), index b
  Shuffle = 4,          // Fisher-Yates permutation of the dataset: key (epoch), index j
  Dropout = 5,          // per-step dropout seeds
  SampleInit = 6,       // sampler x_T: index i*numel + j (global sample i, NHWC element j)
  SampleStep = 7,       // sampler step noise: key (original timestep t), index i*numel + j
  SampleLabel = 8,      // sampler class labels when none are given: index i
  TrainTimestepIS = 9,  // importance-sampled t (loss-second-moment): key (step), index b
  EvalNoise = 10,       // unet eval's q_sample noise: key (timestep t), index i*numel + j
  ClassDropout = 11,    // classifier-free guidance: label -> null class, key (step), index b
};

// splitmix64's output function: a bijection of 64-bit words with good avalanche.
UNET_RNG_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Hash of (seed, a, b). For a fixed seed and a, b -> hash is a bijection, and so is a -> hash
// for a fixed seed and b: distinct counters of one key never collide; across keys, collisions
// are those of a random 64-bit function.
UNET_RNG_HD inline uint64_t hash64(uint64_t seed, uint64_t a, uint64_t b = 0) {
  uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull);
  h = mix64(h ^ (a * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
  h = mix64(h ^ (b * 0xAEF17502108EF2D9ull + 0x632BE59BD9B4E019ull));
  return h;
}

// A sub-seed for a 2-D counter: draws (stream, key, index) use rng_key(seed, stream, key) as
// their seed, e.g. normal(rng_key(seed, Stream::TrainNoise, step), Stream::TrainNoise, i).
UNET_RNG_HD inline uint64_t rng_key(uint64_t seed, Stream s, uint64_t key) {
  return hash64(seed ^ 0x5851F42D4C957F2Dull, static_cast<uint64_t>(s), key);
}

UNET_RNG_HD inline uint64_t rng_bits(uint64_t seed, Stream s, uint64_t index) {
  return hash64(seed, static_cast<uint64_t>(s), index);
}

// Uniform in [0, 1): the top 24 bits, so every value is exactly representable as a float.
UNET_RNG_HD inline float uniform01(uint64_t seed, Stream s, uint64_t index) {
  return static_cast<float>(rng_bits(seed, s, index) >> 40) * (1.0f / 16777216.0f);
}

// Uniform in [0, 1) with 53 bits (a double).
UNET_RNG_HD inline double uniform01_f64(uint64_t seed, Stream s, uint64_t index) {
  return static_cast<double>(rng_bits(seed, s, index) >> 11) * (1.0 / 9007199254740992.0);
}

// Box-Muller on the two 32-bit halves of one hash of index/2: the even index takes the cosine
// branch, the odd index the sine branch, so normal_fill() can produce both from one hash.
// u1 is in (0, 1] (never log(0)); |z| <= sqrt(2 ln 2^32) ~ 6.66.
UNET_RNG_HD inline void box_muller_pair(uint64_t bits, double* z0, double* z1) {
  const double u1 = (static_cast<double>(bits >> 32) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = static_cast<double>(bits & 0xFFFFFFFFull) * (1.0 / 4294967296.0);
  const double r = sqrt(-2.0 * log(u1));
  const double th = 6.283185307179586476925286766559 * u2;
  *z0 = r * cos(th);
  *z1 = r * sin(th);
}

UNET_RNG_HD inline float normal(uint64_t seed, Stream s, uint64_t index) {
  double z0, z1;
  box_muller_pair(rng_bits(seed, s, index >> 1), &z0, &z1);
  return static_cast<float>((index & 1) ? z1 : z0);
}

// out[j] = normal(seed, s, index0 + j) for j < n, two values per hash.
UNET_RNG_HD inline void normal_fill(uint64_t seed, Stream s, uint64_t index0, size_t n, float* out) {
  size_t j = 0;
  if (n > 0 && (index0 & 1)) out[j++] = normal(seed, s, index0);
  for (; j + 1 < n; j += 2) {
    double z0, z1;
    box_muller_pair(rng_bits(seed, s, (index0 + j) >> 1), &z0, &z1);
    out[j] = static_cast<float>(z0);
    out[j + 1] = static_cast<float>(z1);
  }
  if (j < n) out[j] = normal(seed, s, index0 + j);
}

// Uniform integer in [0, n) by multiply-shift of a 64-bit hash: bias <= n / 2^64, i.e. none
// that matters for any n we use (dataset sizes, T). n must be >= 1.
UNET_RNG_HD inline int64_t randint(uint64_t seed, Stream s, uint64_t index, int64_t n) {
  const uint64_t h = rng_bits(seed, s, index);
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(__umul64hi(h, static_cast<uint64_t>(n)));
#else
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(n)) >> 64);
#endif
}

}  // namespace unet
