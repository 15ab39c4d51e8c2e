#include "sampler.h"

#include <algorithm>
#include <vector>

#include "env_vars.h"
#include "rng.h"
#include "util.h"

namespace unet {

Sampler::Sampler(Engine& eng, SamplerNet net, int max_batch)
    : eng_(eng), net_(std::move(net)), bmax_(max_batch) {
  if (bmax_ < 1) throw UserError("sample: batch size must be >= 1, got " + std::to_string(bmax_));
  if (net_.image_size < 1 || net_.channels < 1 || !net_.denoise)
    throw UserError("sample: invalid network description");
  const int64_t H = net_.image_size, C = net_.channels, Bm = bmax_;
  auto img = [&](int64_t c) { return eng_.alloc(DType::F32, {Bm, H, H, c}); };
  x_ = img(C);
  out_ = img(net_.learn_sigma ? 2 * C : C);
  eps_ = net_.learn_sigma ? img(C) : out_;
  if (net_.learn_sigma) var_ = img(C), noise_ = img(C);
  x0_ = img(C);
  z_ = img(C);
  // the timesteps, then SampleStep's numbers: one upload a step
  step_ = eng_.alloc(DType::F32, {Bm + kSampleStepCoefs});
  t_ = step_.flat(0, (size_t)Bm);
  if (net_.class_cond || net_.cond_fn) y_ = eng_.alloc(DType::I32, {Bm});
  if (net_.cond_fn) {
    grad_ = img(C);
    if (net_.learn_sigma) vgrad_ = img(C);
  }
  ht_ = static_cast<float*>(eng_.device().alloc_host((size_t)(Bm + kSampleStepCoefs) * sizeof(float)));
  hy_.resize(bmax_);
}

// Noise drawn on the device where it is used (the step noise was drawn on the host and uploaded:
// 786k normals a step for 64 images at 64x64, 12.7 ms on one core, which limited the bf16 sampling
// loop below ~16 threads): z[b*numel + j] = normal(key, stream, (first+b)*numel + j), independent
// of batching. x_T: key = the seed, stream SampleInit; step t: key(t), SampleStep.
void Sampler::draw_noise(uint64_t key, Stream s, int64_t first, const Tensor& z) {
  eng_.ops().run(NormalFill{z, key, static_cast<uint64_t>(s), static_cast<uint64_t>(first) * z.per_sample()});
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
  Diffusion d = base.respaced(opt.respacing.empty() ? sampler_timesteps(opt.sampler, T, opt.steps)
                                                     : space_timesteps(T, opt.respacing));
  d.predict_xstart = net_.predict_xstart;
  const int S = d.num_timesteps();

  const int H = net_.image_size, C = net_.channels;
  const size_t numel = static_cast<size_t>(H) * H * C;
  const int Bmax = std::min(opt.batch_size > 0 ? std::min(opt.batch_size, n) : n, bmax_);

  // The labels' range: the model's classes, and the classifier's when guided.
  const bool labelled = net_.class_cond || net_.cond_fn;
  const int n_classes = net_.class_cond ? net_.num_classes : net_.guide_classes;
  if (net_.cond_fn && net_.class_cond && net_.guide_classes > 0 && net_.guide_classes < n_classes)
    throw UserError("sample: the model has " + std::to_string(n_classes) + " classes but the classifier " +
                    std::to_string(net_.guide_classes));
  if (labelled && n_classes < 1) throw UserError("sample: no classes to draw labels from");
  if (labelled && labels)
    for (int i = 0; i < n; ++i)
      if (labels[i] < 0 || labels[i] >= n_classes)
        throw UserError("sample: class " + std::to_string(labels[i]) + " is out of range [0, " +
                        std::to_string(n_classes) + ")");

  const int batches = (n + Bmax - 1) / Bmax;
  const int total = batches * S;
  int done = 0;
  Ops& ops = eng_.ops();
  // The forward as a CUDA graph: every step reads the same buffers (t is uploaded into t_ before
  // each replay), so one capture per batch size serves all its steps. The first step at a batch
  // size runs eagerly (cuDNN plans, lazy kernel loading, workspace growth happen outside the
  // capture), the second is captured and replayed from then on.
  Device& dev = eng_.device();
  const bool graph = opt.cuda_graph && dev.supports_graphs() && !net_.cond_fn;
  // Unguided steps run as one op after the forward (SampleStep), in its graph, unless
  // UNET_SAMPLE_STEP=0 (H200, 2026-11-30: level at batch 64, up to 0.03 ms a step faster at 1-16).
  const bool one_op = !net_.cond_fn && env_sample_step();
  int eager_batch = 0, graph_batch = 0;
  struct DropGraph {  // also on an exception: the device's one graph slot is left empty
    Device& d;
    bool on;
    ~DropGraph() {
      if (on) d.graph_drop();
    }
  } drop{dev, graph};
  struct Hold {  // the weights stay as they are until the last step (also on an exception)
    const std::function<void(bool)>& f;
    explicit Hold(const std::function<void(bool)>& h) : f(h) {
      if (f) f(true);
    }
    ~Hold() {
      if (f) f(false);
    }
  } hold{net_.hold_weights};
  // body: the forward (and with one_op the step after it), run as a graph from the second step
  // at a batch size on
  auto graphed = [&](const std::function<void()>& body, int B) {
    if (!graph || (eager_batch != B && graph_batch != B)) {
      body();
      eager_batch = B;
      return;
    }
    if (graph_batch != B) {
      dev.graph_begin();
      body();
      dev.graph_end(Device::GraphPdl::All);
      graph_batch = B;
    }
    dev.graph_launch();
  };
  for (int first = 0; first < n; first += Bmax) {
    const int B = std::min(Bmax, n - first);
    const Tensor x = x_.batch(B), out = out_.batch(B), eps = eps_.batch(B), x0 = x0_.batch(B),
                 z = z_.batch(B), t = t_.batch(B);
    if (noise_nhwc) {
      eng_.upload(x, noise_nhwc + static_cast<size_t>(first) * numel);
    } else {
      draw_noise(opt.seed, Stream::SampleInit, first, x);
    }
    Tensor y;
    if (labelled) {
      for (int b = 0; b < B; ++b)
        hy_[b] = labels ? labels[first + b]
                        : static_cast<int32_t>(randint(opt.seed, Stream::SampleLabel,
                                                       static_cast<uint64_t>(first + b), n_classes));
      y = y_.batch(B);
      eng_.upload(y, hy_.data());
    }
    const Tensor y_model = net_.class_cond ? y : Tensor{};

    for (int k = S - 1; k >= 0; --k) {
      const int t_orig = d.timestep_map[k];
      // guided-diffusion's _scale_timesteps: t.float() * (1000.0 / T), in float32.
      const float t_model = net_.rescale_timesteps
                                ? static_cast<float>(t_orig) * static_cast<float>(1000.0 / T)
                                : static_cast<float>(t_orig);
      const uint64_t step_key = rng_key(opt.seed, Stream::SampleStep, static_cast<uint64_t>(t_orig));
      eng_.device().fence_wait(tfence_);
      std::fill(ht_, ht_ + B, t_model);
      // the step's numbers: SampleStep reads them on the device, the op sequence below its noise's
      float* c = ht_ + bmax_;
      d.sample_step_coefs(k, ddim, opt.eta, c);
      if (one_op) {
        sample_step_put_u64(c, 7, step_key);
        sample_step_put_u64(c, 9, static_cast<uint64_t>(first) * numel);
        eng_.upload(step_, ht_);
      } else {
        eng_.upload(t, ht_);
      }
      tfence_ = eng_.device().fence();
      // Model output is NHWC with [eps | variance value] along channels when sigma is learned.
      auto split = [&] {
        if (net_.learn_sigma) ops.run(ConcatBwd{out, eps, var_.batch(B)});
      };
      if (one_op) {
        graphed(
            [&] {
              net_.denoise(x, t, y_model, out);
              split();
              ops.run(SampleStep{x, eps, net_.learn_sigma && !ddim ? var_.batch(B) : Tensor{}, x0, z,
                                 step_.flat((size_t)bmax_, kSampleStepCoefs),
                                 static_cast<uint64_t>(Stream::SampleStep), d.predict_xstart, opt.clip});
            },
            B);
        if (progress) progress(++done, total);
        continue;
      }
      graphed([&] { net_.denoise(x, t, y_model, out); }, B);
      split();
      // Classifier guidance: s * d log p(y | x_t) / d x_t, at x_t (before the step).
      const Tensor grad = net_.cond_fn ? grad_.batch(B) : Tensor{};
      if (net_.cond_fn) net_.cond_fn(x, t, y, grad);

      if (ddim) {
        const bool add_noise = d.ddim_coeffs(k, opt.eta).noise;
        if (add_noise) draw_noise(step_key, Stream::SampleStep, first, z);
        d.ddim_step(ops, k, opt.eta, x, eps, x0, add_noise ? z : Tensor{}, opt.clip, grad);
      } else {
        // the noise and its scale: with learned sigma the range's std applied per element (scale
        // c[4] = 1), else the fixed-large std c[4]
        Tensor noise;
        if (d.ddpm_coeffs(k).noise) {
          draw_noise(step_key, Stream::SampleStep, first, z);
          noise = z;
          if (net_.learn_sigma) {
            noise = noise_.batch(B);
            ops.run(LearnedRangeNoise{var_.batch(B), z, noise, c[5], c[6]});
          }
        }
        // Guidance: the mean gains variance * grad (condition_mean).
        Tensor guide = grad;
        float guide_scale = 0.0f;
        if (grad.defined()) {
          if (net_.learn_sigma) {
            const Diffusion::LogRange r = d.learned_range_bounds(k);
            guide = vgrad_.batch(B);
            ops.run(LearnedRangeNoise{var_.batch(B), grad, guide, 2.0f * r.min_log, 2.0f * r.max_log});
            guide_scale = 1.0f;
          } else {
            guide_scale = static_cast<float>(d.fixed_large_variance(k));
          }
        }
        d.ddpm_step(ops, k, x, eps, x0, noise, c[4], opt.clip, guide, guide_scale);
      }
      if (progress) progress(++done, total);
    }
    eng_.download(out_nhwc + static_cast<size_t>(first) * numel, x);
  }
}

void sample(Engine& eng, const SamplerNet& net, const SampleOptions& opt, int n, const float* noise_nhwc,
            const int32_t* labels, float* out_nhwc, const std::function<void(int, int)>& progress) {
  if (n < 1) throw UserError("sample: -n must be >= 1, got " + std::to_string(n));
  Sampler s(eng, net, opt.batch_size > 0 ? std::min(opt.batch_size, n) : n);
  s.run(opt, n, noise_nhwc, labels, out_nhwc, progress);
}

}  // namespace unet
