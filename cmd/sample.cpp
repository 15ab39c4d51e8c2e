// unet sample CKPT.h5 — thin: load weights, read --noise, call lib/sampler, write PNG/HDF5.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "checkpoint.h"
#include "classifier.h"
#include "classifier_free.h"
#include "commands.h"
#include "diffusion.h"
#include "env_vars.h"
#include "grid.h"
#include "guidance.h"
#include "h5.h"
#include "layout.h"
#include "model.h"
#include "params.h"
#include "preflight.h"
#include "rng.h"
#include "sampler.h"
#include "util.h"

namespace unet {
namespace {
struct SampleArgs {
  std::string ckpt, noise, out = "samples.png", h5, png_dir, classifier;
  int n = 16;
  int batch_size = 0;
  std::string sampler = "ddpm";
  int steps = 0;
  std::string respacing;  // --timestep-respacing
  float eta = 0;
  float guidance_scale = 1;
  float classifier_scale = 1;
  int cls = 0;
  bool no_ema = false, no_clip = false;
  uint64_t seed = 0;
  DeviceFlags dev;
  CLI::Option *n_opt = nullptr, *steps_opt = nullptr, *cls_opt = nullptr, *gs_opt = nullptr,
              *cs_opt = nullptr;
};

// Reads NOISE.h5 dataset `noise` float32 [N,C,H,W] (PyTorch layout) and returns NHWC.
std::vector<float> read_noise(const std::string& path, const ModelConfig& cfg, int* n) {
  h5::File f = h5::File::open(path);
  if (!h5::is_dataset(f, "noise")) throw UserError(path + ": no dataset 'noise' (float32 [N,C,H,W])");
  auto s = h5::shape(f, "noise");
  const int C = cfg.in_channels, R = cfg.image_size;
  if (s.size() != 4 || (int)s[1] != C || (int)s[2] != R || (int)s[3] != R)
    throw UserError(path + ": noise must be [N," + std::to_string(C) + "," + std::to_string(R) + "," +
                    std::to_string(R) + "] for this model");
  if (s[0] < 1 || s[0] > (hsize_t)kMaxSamples)
    throw UserError(path + ": noise holds " + std::to_string((unsigned long long)s[0]) + " images (1 to " +
                    std::to_string(kMaxSamples) + " can be sampled)");
  *n = (int)s[0];
  std::vector<float> x = h5::read_f32(f, "noise");
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i]))
      throw UserError(path + ": noise holds non-finite values (" + (std::isnan(x[i]) ? "NaN" : "Inf") +
                      " at element " + std::to_string(i) + ")");
  return nchw_to_nhwc(x.data(), *n, C, R, R);
}

void run(SampleArgs& a) {
  namespace fs = std::filesystem;
  a.ckpt = checkpoint_arg(a.ckpt, "sample");
  a.classifier = checkpoint_arg(a.classifier, "--classifier");
  // Outputs first: never an input (also through links), never a special file, in a writable
  // directory — so a typo fails now, not after the sampling.
  auto check_out = [&](const std::string& p) {
    check_writable_dir_for(p);
    check_not_input(p, a.ckpt, "checkpoint");
    check_not_input(p, a.noise, "--noise file");
    check_not_input(p, a.classifier, "--classifier checkpoint");
  };
  if (!a.out.empty()) check_out(a.out);
  if (!a.h5.empty()) check_out(a.h5);
  if (!a.out.empty() && !a.h5.empty() && (a.out == a.h5 || same_file(a.out, a.h5)))
    throw UserError(a.h5 + ": -o and --h5 name the same file");
  std::error_code ec;
  if (!a.png_dir.empty() && fs::exists(a.png_dir, ec) && !fs::is_directory(a.png_dir, ec))
    throw UserError(a.png_dir + ": --png-dir exists and is not a directory");
  check_environment(
      {{"checkpoint", a.ckpt}, {"--noise file", a.noise}, {"--classifier checkpoint", a.classifier}});

  Checkpoint ck = load_checkpoint(a.ckpt);
  const ModelConfig& cfg = ck.cfg;
  if (a.steps_opt->count() && a.steps > cfg.diffusion_steps)
    throw UserError("--steps " + std::to_string(a.steps) + " exceeds the model's " +
                    std::to_string(cfg.diffusion_steps) + " diffusion steps");
  if (a.steps_opt->count() && !a.respacing.empty())
    throw UserError("--steps and --timestep-respacing both choose the timesteps: give one");
  // The steps each image takes (a bad --timestep-respacing fails here, before any work).
  const int steps = !a.respacing.empty() ? (int)space_timesteps(cfg.diffusion_steps, a.respacing).size()
                    : a.steps             ? a.steps
                                          : cfg.diffusion_steps;
  // Classifier guidance: a classifier of the model's images and (for a class-conditional model)
  // classes; the labels it is guided towards are the model's.
  const bool guided = !a.classifier.empty();
  if (a.cs_opt->count() && !guided) throw UserError("--classifier-scale needs --classifier CLS.h5");
  Checkpoint cck;
  std::string noise_warning;
  if (guided) {
    cck = load_classifier_checkpoint(a.classifier);
    const ClassifierConfig& cc = cck.ccfg;
    if (cc.image_size != cfg.image_size || cc.in_channels != cfg.in_channels)
      throw UserError(a.classifier + ": the classifier takes " + std::to_string(cc.image_size) + "x" +
                      std::to_string(cc.image_size) + "x" + std::to_string(cc.in_channels) + " images but " +
                      a.ckpt + " makes " + std::to_string(cfg.image_size) + "x" +
                      std::to_string(cfg.image_size) + "x" + std::to_string(cfg.in_channels));
    if (cfg.class_cond && cc.num_classes != cfg.num_classes)
      throw UserError(a.classifier + ": the classifier has " + std::to_string(cc.num_classes) +
                      " classes but " + a.ckpt + " has " + std::to_string(cfg.num_classes));
    // The classifier reads t as the noise level of the process it was trained under.
    if (cc.diffusion_steps != cfg.diffusion_steps || cc.noise_schedule != cfg.noise_schedule)
      noise_warning = a.classifier + ": the classifier was trained on the noise of " +
                      std::to_string(cc.diffusion_steps) + " " + cc.noise_schedule + " steps, " + a.ckpt +
                      " samples with " + std::to_string(cfg.diffusion_steps) + " " + cfg.noise_schedule +
                      " steps: the timesteps it is given stand for other noise levels";
  }
  const bool labelled = cfg.class_cond || guided;
  const int n_classes = cfg.class_cond ? cfg.num_classes : guided ? cck.ccfg.num_classes : 0;
  const bool cls_given = a.cls_opt->count() > 0;
  if (cls_given && !labelled)
    throw UserError("--class: " + a.ckpt + " is not class-conditional (and no --classifier guides it)");
  // A model with a null class (classifier-free guidance) takes it as --class num_classes, unless a
  // classifier guides towards the class.
  const bool null_ok = cfg.class_cond && cfg.null_class && !guided;
  if (cls_given && guided && cfg.null_class && a.cls == cfg.num_classes)
    throw UserError("--class " + std::to_string(a.cls) + " is the null class of " + a.ckpt +
                    ": a --classifier guides towards one of its " + std::to_string(n_classes) +
                    " classes (0 to " + std::to_string(n_classes - 1) + ")");
  if (cls_given && a.cls >= (null_ok ? cfg.label_rows() : n_classes))
    throw UserError("--class " + std::to_string(a.cls) + " is out of range (the " +
                    (cfg.class_cond ? "model" : "classifier") + " has " + std::to_string(n_classes) +
                    " classes: 0 to " + std::to_string(n_classes - 1) +
                    (null_ok ? ", and " + std::to_string(cfg.num_classes) + " for the null class" : "") +
                    ")");
  const bool cf_guided = a.gs_opt->count() > 0;
  if (cf_guided && !cfg.null_class)
    throw UserError("--guidance-scale: " + a.ckpt +
                    (cfg.class_cond ? " has no null class" : " is not class-conditional") +
                    " (classifier-free guidance needs a model trained with unet train --class-dropout P)");
  std::vector<float> noise;
  int n = a.n;
  if (!a.noise.empty()) {
    int nn = 0;
    noise = read_noise(a.noise, cfg, &nn);
    if (a.n_opt->count() && a.n != nn)
      throw UserError(a.noise + ": holds " + std::to_string(nn) + " noise images but -n is " +
                      std::to_string(a.n));
    n = nn;
  }
  const int R = cfg.image_size, C = cfg.in_channels;
  check_memory(sample_host_bytes(cfg, build_param_table(cfg), n, !noise.empty(), !a.h5.empty()),
               "sampling " + std::to_string(n) + " images of " + std::to_string(R) + "x" + std::to_string(R) +
                   "x" + std::to_string(C) + (a.n_opt->count() ? " (-n)" : ""));
  // The engine before anything is written (it refuses a forced kernel variant it lacks).
  std::string device;
  auto eng = a.dev.make(&device);
  if (!a.png_dir.empty()) {
    fs::create_directories(a.png_dir, ec);
    std::error_code ec2;
    if (!fs::is_directory(a.png_dir, ec2))
      throw UserError(a.png_dir + ": cannot create directory" + (ec ? " (" + ec.message() + ")" : ""));
    for (int i = 0; i < n; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "/%06d.png", i);
      check_out(a.png_dir + name);
    }
  }
  std::vector<int32_t> labels;
  if (labelled) {
    labels.resize(n);
    for (int i = 0; i < n; ++i)
      labels[i] =
          cls_given ? a.cls : (int32_t)(rng_bits(a.seed, Stream::SampleLabel, i) % (uint64_t)n_classes);
  }
  // Everything checked: the only informational line, on stdout.
  Model model(cfg, *eng);
  const bool use_ema = !a.no_ema && !ck.ema.empty();
  eng->upload(model.params(), use_ema ? ck.ema.data() : ck.model.data());
  SampleOptions so;
  so.sampler = a.sampler;
  so.steps = a.steps;
  so.respacing = a.respacing;
  so.eta = a.eta;
  so.clip = !a.no_clip;
  so.seed = a.seed;
  // The classifier first: its planned memory per image counts when the batch is chosen.
  std::unique_ptr<Classifier> classifier;
  if (guided) {
    classifier = std::make_unique<Classifier>(cck.ccfg, *eng);
    eng->upload(classifier->params(), !a.no_ema && !cck.ema.empty() ? cck.ema.data() : cck.model.data());
  }
  // Without --batch-size: on a GPU the largest batch (up to n) whose planned memory fits, from the
  // plan's bytes per image (every planned buffer scales with the batch) and the sampler's own
  // buffers, keeping a tenth of the free memory and 512 MB for workspaces; on the CPU 64.
  bool auto_batch = false;
  if (a.batch_size) {
    so.batch_size = std::min(a.batch_size, n);
  } else if (!eng->is_cuda()) {
    so.batch_size = std::min(n, 64);
  } else {
    const double img = (double)R * R * C * sizeof(float);
    const double per_image = (double)model.plan_bytes(1, Mode::Sample) * (cf_guided ? 2 : 1) +
                             (classifier ? (double)classifier->plan_bytes(1, Mode::InputGrad) : 0.0) +
                             16 * img * (cf_guided ? 2 : 1);
    const double free = (double)eng->device().bytes_free();
    const double usable = free - free / 10 - 512.0 * (1 << 20);
    so.batch_size = (int)std::max(1.0, std::min((double)n, std::floor(usable / per_image)));
    auto_batch = true;
  }
  so.cuda_graph = !std::getenv("UNET_NO_CUDA_GRAPH");  // as unet train: the forward replayed as one graph
  // Classifier-free guidance runs the conditional and the unconditional half in one forward pass:
  // the model is planned for twice the batch; a --classifier is planned for the batch (backward to
  // the image only). Both before anything is printed: a batch beyond memory is refused first.
  const int planned = cf_guided ? 2 * so.batch_size : so.batch_size;
  model.plan(planned, Mode::Sample);
  SamplerNet net = sampler_net(model);
  // --class num_classes: the null class (not with a classifier, which guides towards a class: the
  // sampler then checks the labels against the classifier's classes, the model's without the null).
  if (null_ok) net.num_classes = cfg.label_rows();
  if (cf_guided)
    net = classifier_free_guidance(*eng, std::move(net), so.batch_size, a.guidance_scale, cfg.num_classes);
  // Classifier guidance on top (guidance.h): the classifier's EMA weights when it has them (as the
  // model's), unless --no-ema.
  std::unique_ptr<ClassifierGuide> guide;
  if (guided) {
    guide = std::make_unique<ClassifierGuide>(*eng, *classifier, a.classifier_scale, so.batch_size);
    guide->attach(net);
  }
  char gs[160] = "";
  if (cf_guided) std::snprintf(gs, sizeof gs, ", guidance scale %g", (double)a.guidance_scale);
  if (guided)
    std::snprintf(gs + std::strlen(gs), sizeof gs - std::strlen(gs),
                  ", classifier guidance scale %g (%s weights)", (double)a.classifier_scale,
                  !a.no_ema && !cck.ema.empty() ? "EMA" : "model");
  if (!noise_warning.empty()) std::fprintf(stderr, "unet: warning: %s\n", one_line(noise_warning).c_str());
  std::printf("unet sample: %d images, %s %d steps%s, %s weights%s, batch %d%s, %s\n", n, a.sampler.c_str(),
              steps, a.respacing.empty() ? "" : (" (--timestep-respacing " + a.respacing + ")").c_str(),
              use_ema ? "EMA" : "model", gs, so.batch_size,
              auto_batch && so.batch_size < n ? " (the largest that fits)" : "", device.c_str());
  std::fflush(stdout);
  std::vector<float> out((size_t)n * R * R * C);
  Progress prog("sample", n, "img");
  const auto t0 = std::chrono::steady_clock::now();
  // After the second step: the first runs eagerly (lazy kernel loading), the second is captured.
  // The steps are enqueued ahead of the GPU, so t2 waits for the second to finish: else the
  // window held the second step's GPU work too, one step more than it divides by (seed64, 60
  // steps, H200: 6.57 ms a step against the forward's 6.47 of CUDA events; now 6.49).
  auto t2 = t0;
  int total_steps = 0;
  sample(*eng, net, so, n, noise.empty() ? nullptr : noise.data(), labels.empty() ? nullptr : labels.data(),
         out.data(), [&](int done, int total) {
           if (done == 2 && total > 4) {
             eng->device().sync();
             t2 = std::chrono::steady_clock::now();
           }
           total_steps = total;
           prog.update(done);
         });
  prog.finish();
  // The sampling loop alone (no loading, planning or writing): what benchmarks compare.
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int batches = (n + so.batch_size - 1) / so.batch_size;
  const auto t_end = std::chrono::steady_clock::now();
  char steady[96] = "";
  if (total_steps > 4)
    std::snprintf(steady, sizeof steady, "; %.2f ms per step from the third on",
                  std::chrono::duration<double, std::milli>(t_end - t2).count() / (total_steps - 2));
  std::printf("unet sample: %d images in %.2f s, %.2f ms per step of a batch of %d (%.2f images/s)%s\n", n, secs,
              1e3 * secs / ((double)steps * batches), so.batch_size, n / secs, steady);
  // stdout, like every informational line: stderr carries only warnings and errors.
  std::printf("unet sample: peak %s memory %.2f GB (activations %.2f GB planned for batch %d%s)\n",
              eng->is_cuda() ? "GPU" : "host", eng->device().bytes_held() / 1e9,
              model.activation_bytes() / 1e9, planned,
              cf_guided ? ": conditional and unconditional halves" : "");
  if (!a.h5.empty()) {
    AtomicFile af(a.h5);
    {
      h5::File f = h5::File::create(af.tmp_path(), a.h5);
      h5::write_f32(f, "samples", nhwc_to_nchw(out.data(), n, C, R, R).data(),
                    {(hsize_t)n, (hsize_t)C, (hsize_t)R, (hsize_t)R});
      std::vector<uint8_t> u8 = to_uint8(out.data(), out.size());  // the model's channels, NHWC
      h5::write_u8(f, "images", u8.data(), {(hsize_t)n, (hsize_t)R, (hsize_t)R, (hsize_t)C});
      if (!labels.empty()) {
        std::vector<int64_t> l(labels.begin(), labels.end());
        h5::write_i64(f, "labels", l.data(), {(hsize_t)n});
      }
      h5::set_attr(f, "/", "sampler", a.sampler);
      h5::set_attr(f, "/", "steps", (int64_t)steps);
      if (!a.respacing.empty()) h5::set_attr(f, "/", "timestep_respacing", a.respacing);
      h5::set_attr(f, "/", "eta", (double)a.eta);
      if (cf_guided) h5::set_attr(f, "/", "guidance_scale", (double)a.guidance_scale);
      if (guided) {
        h5::set_attr(f, "/", "classifier", a.classifier);
        h5::set_attr(f, "/", "classifier_scale", (double)a.classifier_scale);
      }
      h5::set_attr(f, "/", "seed", (int64_t)a.seed);
      h5::set_attr(f, "/", "checkpoint", a.ckpt);
      h5::set_attr(f, "/", "weights", std::string(use_ema ? "ema" : "model"));
      f.close();  // surfaces a failed flush (disk full) before the rename
    }
    af.commit();
    std::printf("wrote %s\n", a.h5.c_str());
  }
  if (!a.png_dir.empty()) {
    save_pngs(a.png_dir, out.data(), n, R, R, C);
    std::printf("wrote %d PNGs to %s\n", n, a.png_dir.c_str());
  }
  if (!a.out.empty()) {
    save_grid_png(a.out, out.data(), n, R, R, C);
    std::printf("wrote %s\n", a.out.c_str());
  }
}
}  // namespace

void register_sample(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  auto* sub = app.add_subcommand("sample", "generate images from a checkpoint");
  sub->add_option("checkpoint", a->ckpt, "checkpoint (HDF5), or a run directory: its latest.h5")->required();
  a->n_opt = sub->add_option("-n,--num-samples", a->n, "number of images (default 16, or N of --noise)")
                 ->check(int_range(1, kMaxSamples));
  sub->add_option("--batch-size", a->batch_size, "images per model call (default: on a GPU the largest batch that fits, up to n; on the CPU min(n, 64))")
      ->check(int_range(1, kMaxBatch));
  sub->add_option("--sampler", a->sampler, "ddpm (ancestral, default) or ddim")
      ->check(CLI::IsMember({"ddpm", "ddim"}));
  a->steps_opt =
      sub->add_option("--steps", a->steps,
                      "sampling steps, 1 to the model's diffusion steps: respaced DDPM or DDIM step count "
                      "(default: all)")
          ->check(int_range(1, kModelLimits.diffusion_steps));
  sub->add_option("--timestep-respacing", a->respacing,
                  "guided-diffusion's timestep_respacing, for either sampler: N (N steps spread over all "
                  "of them, as --steps N with ddpm), N1,N2,... (the diffusion steps cut into equal "
                  "sections, N_i steps taken in section i) or ddimN (every k-th step, N of them, as "
                  "--steps N with ddim); instead of --steps");
  sub->add_option("--eta", a->eta, "DDIM eta (default 0: deterministic)")->check(real_range(0, INFINITY));
  sub->add_option("--noise", a->noise, "x_T from dataset 'noise' float32 [N,C,H,W] of this HDF5 file");
  a->cls_opt =
      sub->add_option("--class", a->cls,
                      "class label 0..num_classes-1 for every image (class-conditional models, and the "
                      "class a --classifier guides towards; default random, written to --h5 as labels); "
                      "num_classes = the null class of a --class-dropout model")
          ->check(int_range(0, kModelLimits.num_classes - 1));
  sub->add_option("--classifier", a->classifier,
                  "classifier guidance with this noisy-image classifier (unet train-classifier / unet init "
                  "--classifier): DDPM shifts each step's mean by variance * grad, DDIM its eps by "
                  "-sqrt(1 - abar) * grad, grad = scale * d log p(class | x_t) / d x_t");
  a->cs_opt = sub->add_option("--classifier-scale", a->classifier_scale,
                              "classifier guidance scale s (default 1.0, guided-diffusion's; 0 = unguided)")
                  ->check(real_range(0, INFINITY));
  a->gs_opt =
      sub->add_option("--guidance-scale", a->guidance_scale,
                      "classifier-free guidance: eps = eps_uncond + W (eps_cond - eps_uncond), both from one "
                      "forward pass of twice the batch (models trained with --class-dropout; W = 1: "
                      "conditional, 0: unconditional, > 1: stronger guidance)")
          ->check(real_range(0, INFINITY));
  sub->add_flag("--no-ema", a->no_ema, "use the raw weights instead of the EMA weights");
  sub->add_flag("--no-clip", a->no_clip, "do not clip the predicted x_0 to [-1, 1]");
  sub->add_option("--seed", a->seed, "seed for x_T, step noise and labels, 0 to 2^63-1 (default 0)")
      ->check(seed_range());
  sub->add_option("-o,--output", a->out, "PNG grid (default samples.png; empty to skip)");
  sub->add_option("--h5", a->h5, "also write samples float32 [N,C,H,W] and images uint8 [N,H,W,C] here");
  sub->add_option("--png-dir", a->png_dir, "also write one PNG per image into this directory");
  a->dev.add(sub);
  sub->callback([a] { run(*a); });
}

}  // namespace unet
