#include "eval.h"

#include <algorithm>
#include <cmath>

#include "dataset.h"
#include "diffusion.h"
#include "objective.h"
#include "rng.h"
#include "util.h"

namespace unet {

EvalResult evaluate(Engine& eng, Model& model, const std::string& dataset_path, const EvalOptions& opt,
                    const std::function<void(int64_t, int64_t)>& progress) {
  const ModelConfig& cfg = model.config();
  DatasetReader reader(dataset_path);
  const DatasetInfo& info = reader.info();
  if (info.image_size != cfg.image_size)
    throw UserError(dataset_path + ": images are " + std::to_string(info.image_size) + "x" +
                    std::to_string(info.image_size) + " but the model's image size is " +
                    std::to_string(cfg.image_size));
  if (cfg.in_channels != 3)
    throw UserError(dataset_path + ": datasets are RGB but the model has " + std::to_string(cfg.in_channels) +
                    " input channels");
  if (cfg.class_cond && !info.has_labels)
    throw UserError(dataset_path + ": the model is class-conditional but the dataset has no labels");
  const int64_t n = opt.n > 0 ? opt.n : info.count;
  if (n < 1 || n > info.count)
    throw UserError(dataset_path + ": -n " + std::to_string(n) + " but the dataset has " +
                    std::to_string(info.count) + " images");
  std::vector<int64_t> all_labels;
  if (cfg.class_cond) {
    all_labels = reader.read_labels();
    for (int64_t i = 0; i < n; ++i)
      if (all_labels[i] < 0 || all_labels[i] >= cfg.num_classes)
        throw UserError(dataset_path + ": label " + std::to_string(all_labels[i]) + " of image " +
                        std::to_string(i) + " is outside the model's " + std::to_string(cfg.num_classes) +
                        " classes");
  }

  const int T = cfg.diffusion_steps, R = cfg.image_size, C = cfg.in_channels, Co = cfg.out_channels();
  const int Bmax = (int)std::min<int64_t>(n, opt.batch_size > 0 ? opt.batch_size : 32);
  const size_t numel = (size_t)R * R * C;
  const Diffusion diff(T, cfg.noise_schedule, cfg.learn_sigma);
  // The bound itself: no loss scaling (vb_scale 1), the model's variance (learned range or
  // fixed-large) and mean parameterisation. The op computes vb when use_kl is set, whatever the
  // variance; terms other than vb, x0_mse and eps_mse are not used here.
  Objective obj(cfg);
  obj.use_kl = false, obj.rescale_learned_sigmas = false;

  model.plan(Bmax, Mode::Sample);
  Ops& ops = eng.ops();
  const int64_t b = Bmax;
  auto img = [&](int64_t c) { return eng.alloc(DType::F32, {b, R, R, c}); };
  Tensor x0 = img(C), noise = img(C), xt = img(C), out = img(Co);
  Tensor tt = eng.alloc(DType::F32, {b}), coef = eng.alloc(DType::F32, {2 * b});
  Tensor lcoef = eng.alloc(DType::F32, {b, kLossCoefRows});
  Tensor terms = eng.alloc(DType::F32, {(int64_t)T * b * kLossTerms});
  Tensor labels;
  if (cfg.class_cond) labels = eng.alloc(DType::I32, {b});

  EvalResult res;
  res.n = n;
  res.vb.assign(T, 0.0), res.x0_mse.assign(T, 0.0), res.mse.assign(T, 0.0);
  res.total_per_image.reserve(n);
  std::vector<uint8_t> u8(Bmax * numel);
  std::vector<float> hx0(Bmax * numel), ht(Bmax), hcoef(2 * Bmax), hl((size_t)Bmax * kLossCoefRows),
      hterms((size_t)T * Bmax * kLossTerms);
  std::vector<int32_t> hy(Bmax);
  const double ab_last = diff.alphas_cumprod[T - 1];
  const double prior_mean = (double)(float)std::sqrt(ab_last);
  const double prior_lv = (double)(float)diff.log_one_minus_alphas_cumprod[T - 1];
  const double ln2 = 0.69314718055994530942;
  const int64_t total_calls = (n + Bmax - 1) / Bmax * T;
  int64_t calls = 0;

  for (int64_t first = 0; first < n; first += Bmax) {
    const int B = (int)std::min<int64_t>(Bmax, n - first);
    reader.read_images(first, B, u8.data());
    for (size_t i = 0; i < (size_t)B * numel; ++i) hx0[i] = (float)u8[i] / 127.5f - 1.0f;  // as the loader
    const Tensor X0 = x0.batch(B), Z = noise.batch(B), XT = xt.batch(B), OUT = out.batch(B), TT = tt.batch(B),
                 Y = cfg.class_cond ? labels.batch(B) : Tensor{};
    eng.upload(X0, hx0.data());
    if (cfg.class_cond) {
      for (int i = 0; i < B; ++i) hy[i] = (int32_t)all_labels[first + i];
      eng.upload(Y, hy.data());
    }
    for (int t = T - 1; t >= 0; --t) {
      // noise[i, j] = normal(key(t), EvalNoise, (first + i) * numel + j), drawn on the device
      ops.run(NormalFill{Z, rng_key(opt.seed, Stream::EvalNoise, (uint64_t)t), (uint64_t)Stream::EvalNoise,
                         (uint64_t)first * numel});
      for (int i = 0; i < B; ++i) {
        ht[i] = obj.model_time(t);
        hcoef[i] = (float)diff.sqrt_alphas_cumprod[t];
        hcoef[B + i] = (float)diff.sqrt_one_minus_alphas_cumprod[t];
        loss_coef_row(diff, obj, t, 1.0, B, numel, hl.data() + (size_t)i * kLossCoefRows);
      }
      eng.upload(TT, ht.data());
      eng.upload(coef.flat(0, 2 * B), hcoef.data());
      eng.upload(lcoef.batch(B), hl.data());
      ops.run(QSample{X0, Z, coef.flat(0, 2 * B), XT});
      model.forward(XT, TT, Y, OUT, /*train=*/false);
      const Tensor tm = terms.flat((size_t)t * B * kLossTerms, (size_t)B * kLossTerms).view({B, kLossTerms});
      ops.run(DiffusionLoss{
          OUT, X0, XT, Z, lcoef.batch(B), tm, {}, cfg.predict_xstart, /*use_kl=*/true, opt.clip});
      eng.device().sync();  // the host buffers are rewritten for the next timestep
      if (progress) progress(++calls, total_calls);
    }
    eng.download(hterms.data(), terms.flat(0, (size_t)T * B * kLossTerms));
    for (int i = 0; i < B; ++i) {
      double sum_vb = 0;
      for (int t = 0; t < T; ++t) {
        const float* r = hterms.data() + ((size_t)t * B + i) * kLossTerms;
        sum_vb += r[kTermVb];
        res.vb[t] += r[kTermVb];
        res.x0_mse[t] += r[kTermX0Mse];
        res.mse[t] += r[kTermEpsMse];
      }
      // _prior_bpd: KL(N(sqrt(abar_T-1) x0, 1 - abar_T-1) || N(0, 1)), mean over dims, in bits.
      double kl = 0;
      const float* x = hx0.data() + (size_t)i * numel;
      for (size_t j = 0; j < numel; ++j) {
        const double m = prior_mean * x[j];
        kl += 0.5 * (-1.0 - prior_lv + std::exp(prior_lv) + m * m);
      }
      const double prior = kl / (double)numel / ln2;
      res.prior_bpd += prior;
      res.total_per_image.push_back(sum_vb + prior);
      res.total_bpd += sum_vb + prior;
    }
  }
  for (int t = 0; t < T; ++t) res.vb[t] /= n, res.x0_mse[t] /= n, res.mse[t] /= n;
  res.prior_bpd /= n;
  res.total_bpd /= n;
  return res;
}

}  // namespace unet
