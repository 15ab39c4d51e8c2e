#include "sampler.h"

#include <algorithm>
#include <vector>

#include "rng.h"
#include "util.h"

namespace unet {

namespace {

// z[b*numel + j] = normal(key(t), SampleStep, (first+b)*numel + j): independent of batching.
void step_noise(uint64_t seed, int t_orig, int64_t first, int B, size_t numel, float* z) {
  const uint64_t key = rng_key(seed, Stream::SampleStep, static_cast<uint64_t>(t_orig));
  const bool big = static_cast<size_t>(B) * numel > 32768;  // threads cost more than tiny draws
#pragma omp parallel for schedule(static) if (big)
  for (int b = 0; b < B; ++b)
    normal_fill(key, Stream::SampleStep, static_cast<uint64_t>(first + b) * numel, numel, z + b * numel);
}

}  // namespace

Sampler::Sampler(Backend& be, SamplerNet net, int max_batch)
    : be_(be), net_(std::move(net)), bmax_(max_batch) {
  if (bmax_ < 1) throw UserError("sample: batch size must be >= 1, got " + std::to_string(bmax_));
  if (net_.image_size < 1 || net_.channels < 1 || !net_.denoise)
    throw UserError("sample: invalid network description");
  const int H = net_.image_size, C = net_.channels;
  const size_t cap = static_cast<size_t>(bmax_) * H * H * C;
  x_ = be_.alloc(cap);
  out_ = be_.alloc(net_.learn_sigma ? 2 * cap : cap);
  eps_ = net_.learn_sigma ? be_.alloc(cap) : out_;
  var_ = net_.learn_sigma ? be_.alloc(cap) : nullptr;
  x0_ = be_.alloc(cap);
  noise_ = be_.alloc(cap);
  t_ = be_.alloc(bmax_);
  y_ = net_.class_cond ? static_cast<int32_t*>(be_.alloc_bytes(sizeof(int32_t) * bmax_)) : nullptr;
  hz_.resize(cap);
  if (net_.learn_sigma) {
    hnoise_.resize(cap);
    hvar_.resize(cap);
  }
  ht_.resize(bmax_);
  hy_.resize(bmax_);
}

void Sampler::run(const SampleOptions& opt, int n, const float* noise_nhwc, const int32_t* labels,
                  float* out_nhwc, const std::function<void(int, int)>& progress) {
  if (n < 1) throw UserError("sample: -n must be >= 1, got " + std::to_string(n));
  if (opt.batch_size < 0)
    throw UserError("sample: --batch-size must be >= 0, got " + std::to_string(opt.batch_size));
  if (!(opt.eta >= 0.0f && opt.eta <= 1.0f))
    throw UserError("sample: --eta must be in [0, 1], got " + std::to_string(opt.eta));
  const bool ddim = opt.sampler == "ddim";
  const int T = net_.diffusion_steps;
  const Diffusion base(T, net_.noise_schedule, net_.learn_sigma);
  // Always respaced, as guided-diffusion's SpacedDiffusion does even for all T steps.
  const Diffusion d = base.respaced(sampler_timesteps(opt.sampler, T, opt.steps));
  const int S = d.num_timesteps();

  const int H = net_.image_size, C = net_.channels;
  const size_t numel = static_cast<size_t>(H) * H * C;
  const int Bmax = std::min(opt.batch_size > 0 ? std::min(opt.batch_size, n) : n, bmax_);

  if (net_.class_cond && labels)
    for (int i = 0; i < n; ++i)
      if (labels[i] < 0 || labels[i] >= net_.num_classes)
        throw UserError("sample: class " + std::to_string(labels[i]) + " is out of range [0, " +
                        std::to_string(net_.num_classes) + ")");

  const int batches = (n + Bmax - 1) / Bmax;
  const int total = batches * S;
  int done = 0;
  for (int first = 0; first < n; first += Bmax) {
    const int B = std::min(Bmax, n - first);
    const size_t m = static_cast<size_t>(B) * numel;
    if (noise_nhwc) {
      be_.upload(x_, noise_nhwc + static_cast<size_t>(first) * numel, m);
    } else {
      float* hz = hz_.data();
      const bool big = m > 32768;
#pragma omp parallel for schedule(static) if (big)
      for (int b = 0; b < B; ++b)
        normal_fill(opt.seed, Stream::SampleInit, static_cast<uint64_t>(first + b) * numel, numel,
                    hz + b * numel);
      be_.upload(x_, hz, m);
    }
    if (net_.class_cond) {
      for (int b = 0; b < B; ++b)
        hy_[b] = labels ? labels[first + b]
                        : static_cast<int32_t>(randint(opt.seed, Stream::SampleLabel,
                                                       static_cast<uint64_t>(first + b), net_.num_classes));
      be_.upload_bytes(y_, hy_.data(), sizeof(int32_t) * B);
    }

    for (int k = S - 1; k >= 0; --k) {
      const int t_orig = d.timestep_map[k];
      std::fill(ht_.begin(), ht_.begin() + B, static_cast<float>(t_orig));
      be_.upload(t_, ht_.data(), B);
      net_.denoise(x_, t_, y_, out_, B);
      // Model output is NHWC with [eps | variance value] along channels when sigma is learned.
      if (net_.learn_sigma) be_.concat_bwd(out_, eps_, var_, B, H * H, C, C);

      if (ddim) {
        const Diffusion::DdimCoeffs c = d.ddim_coeffs(k, opt.eta);
        if (c.noise) {
          step_noise(opt.seed, t_orig, first, B, numel, hz_.data());
          be_.upload(noise_, hz_.data(), m);
        }
        d.ddim_step(be_, k, opt.eta, x_, eps_, x0_, c.noise ? noise_ : nullptr, m, opt.clip);
      } else {
        const bool add_noise = d.ddpm_coeffs(k).noise;
        float scale = 0.0f;
        if (add_noise) {
          step_noise(opt.seed, t_orig, first, B, numel, hz_.data());
          if (net_.learn_sigma) {
            // exp() of a per-element log variance has no Backend op: done on the host, which
            // costs one download and one upload of the batch per step (small next to the model).
            be_.download(hvar_.data(), var_, m);
            d.learned_range_noise(k, hvar_.data(), hz_.data(), hnoise_.data(), m);
            be_.upload(noise_, hnoise_.data(), m);
            scale = 1.0f;
          } else {
            be_.upload(noise_, hz_.data(), m);
            scale = static_cast<float>(d.fixed_large_std(k));
          }
        }
        d.ddpm_step(be_, k, x_, eps_, x0_, add_noise ? noise_ : nullptr, scale, m, opt.clip);
      }
      if (progress) progress(++done, total);
    }
    be_.download(out_nhwc + static_cast<size_t>(first) * numel, x_, m);
  }
}

void sample(Backend& be, const SamplerNet& net, const SampleOptions& opt, int n, const float* noise_nhwc,
            const int32_t* labels, float* out_nhwc, const std::function<void(int, int)>& progress) {
  if (n < 1) throw UserError("sample: -n must be >= 1, got " + std::to_string(n));
  Sampler s(be, net, opt.batch_size > 0 ? std::min(opt.batch_size, n) : n);
  s.run(opt, n, noise_nhwc, labels, out_nhwc, progress);
}

}  // namespace unet
