// unet sample CKPT.h5 — thin: load weights, read --noise, call lib/sampler, write PNG/HDF5.
#include <filesystem>

#include "checkpoint.h"
#include "commands.h"
#include "grid.h"
#include "h5.h"
#include "layout.h"
#include "model.h"
#include "rng.h"
#include "sampler.h"
#include "util.h"

namespace unet {
namespace {
struct SampleArgs {
  std::string ckpt, noise, out = "samples.png", h5, png_dir;
  int n = 16;
  int batch_size = 0;
  std::string sampler = "ddpm";
  int steps = 0;
  float eta = 0;
  int cls = -1;
  bool no_ema = false, no_clip = false;
  uint64_t seed = 0;
  DeviceFlags dev;
  CLI::Option* n_opt = nullptr;
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
  *n = (int)s[0];
  return nchw_to_nhwc(h5::read_f32(f, "noise").data(), *n, C, R, R);
}

void run(SampleArgs& a) {
  namespace fs = std::filesystem;
  if (a.sampler != "ddpm" && a.sampler != "ddim") throw UserError("--sampler must be ddpm or ddim");
  if (a.n < 1) throw UserError("-n must be positive");
  if (a.batch_size < 0 || a.steps < 0) throw UserError("--batch-size and --steps must be positive");
  if (!(a.eta >= 0)) throw UserError("--eta must be >= 0");
  // Check outputs before the (long) sampling run, so a typo fails fast.
  if (!a.out.empty()) check_writable_dir_for(a.out);
  if (!a.h5.empty()) check_writable_dir_for(a.h5);
  if (!a.png_dir.empty()) {
    std::error_code ec;
    fs::create_directories(a.png_dir, ec);
    if (!fs::is_directory(a.png_dir)) throw UserError(a.png_dir + ": cannot create directory");
  }
  Checkpoint ck = load_checkpoint(a.ckpt);
  const ModelConfig& cfg = ck.cfg;
  if (a.steps > cfg.diffusion_steps)
    throw UserError("--steps " + std::to_string(a.steps) + " exceeds the model's " +
                    std::to_string(cfg.diffusion_steps) + " diffusion steps");
  if (a.cls >= 0 && !cfg.class_cond) throw UserError("--class: " + a.ckpt + " is not class-conditional");
  if (a.cls >= cfg.num_classes && cfg.class_cond)
    throw UserError("--class " + std::to_string(a.cls) + " is out of range (the model has " +
                    std::to_string(cfg.num_classes) + " classes)");
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
  std::vector<int32_t> labels;
  if (cfg.class_cond) {
    labels.resize(n);
    for (int i = 0; i < n; ++i)
      labels[i] = a.cls >= 0
                      ? a.cls
                      : (int32_t)(rng_bits(a.seed, Stream::SampleLabel, i) % (uint64_t)cfg.num_classes);
  }
  auto eng = a.dev.make();
  Model model(cfg, *eng);
  const bool use_ema = !a.no_ema && !ck.ema.empty();
  eng->upload(model.params(), use_ema ? ck.ema.data() : ck.model.data());
  SampleOptions so;
  so.sampler = a.sampler;
  so.steps = a.steps;
  so.eta = a.eta;
  so.clip = !a.no_clip;
  so.seed = a.seed;
  so.batch_size = a.batch_size ? std::min(a.batch_size, n) : std::min(n, 64);
  const int R = cfg.image_size, C = cfg.in_channels;
  std::fprintf(stderr, "unet sample: %d images, %s %d steps, %s weights\n", n, a.sampler.c_str(),
               a.steps ? a.steps : cfg.diffusion_steps, use_ema ? "EMA" : "model");
  std::vector<float> out((size_t)n * R * R * C);
  Progress prog("sample", n, "img");
  sample(model, so, n, noise.empty() ? nullptr : noise.data(), labels.empty() ? nullptr : labels.data(),
         out.data(), [&](int done, int) { prog.update(done); });
  prog.finish();
  std::fprintf(stderr, "unet sample: peak %s memory %.2f GB (activations %.2f GB planned for batch %d)\n",
               eng->is_cuda() ? "GPU" : "host", eng->device().bytes_held() / 1e9,
               model.activation_bytes() / 1e9, so.batch_size);
  if (!a.h5.empty()) {
    AtomicFile af(a.h5);
    {
      h5::File f = h5::File::create(af.tmp_path());
      h5::write_f32(f, "samples", nhwc_to_nchw(out.data(), n, C, R, R).data(),
                    {(hsize_t)n, (hsize_t)C, (hsize_t)R, (hsize_t)R});
      std::vector<uint8_t> u8 = to_uint8(out.data(), out.size());  // the model's channels, NHWC
      h5::write_u8(f, "images", u8.data(), {(hsize_t)n, (hsize_t)R, (hsize_t)R, (hsize_t)C});
      if (!labels.empty()) {
        std::vector<int64_t> l(labels.begin(), labels.end());
        h5::write_i64(f, "labels", l.data(), {(hsize_t)n});
      }
      h5::set_attr(f, "/", "sampler", a.sampler);
      h5::set_attr(f, "/", "steps", (int64_t)(a.steps ? a.steps : cfg.diffusion_steps));
      h5::set_attr(f, "/", "eta", (double)a.eta);
      h5::set_attr(f, "/", "seed", (int64_t)a.seed);
      h5::set_attr(f, "/", "checkpoint", a.ckpt);
      h5::set_attr(f, "/", "weights", std::string(use_ema ? "ema" : "model"));
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
  sub->add_option("checkpoint", a->ckpt, "checkpoint (HDF5)")->required();
  a->n_opt = sub->add_option("-n,--num-samples", a->n, "number of images (default 16, or N of --noise)");
  sub->add_option("--batch-size", a->batch_size, "images per model call (default min(n, 64))");
  sub->add_option("--sampler", a->sampler, "ddpm (ancestral, default) or ddim")
      ->check(CLI::IsMember({"ddpm", "ddim"}));
  sub->add_option("--steps", a->steps, "sampling steps: respaced DDPM or DDIM step count (default: all)");
  sub->add_option("--eta", a->eta, "DDIM eta (default 0: deterministic)");
  sub->add_option("--noise", a->noise, "x_T from dataset 'noise' float32 [N,C,H,W] of this HDF5 file");
  sub->add_option("--class", a->cls,
                  "class label for every image (class-conditional models; default random)");
  sub->add_flag("--no-ema", a->no_ema, "use the raw weights instead of the EMA weights");
  sub->add_flag("--no-clip", a->no_clip, "do not clip the predicted x_0 to [-1, 1]");
  sub->add_option("--seed", a->seed, "seed for x_T, step noise and labels (default 0)");
  sub->add_option("-o,--output", a->out, "PNG grid (default samples.png; empty to skip)");
  sub->add_option("--h5", a->h5, "also write samples float32 [N,C,H,W] and images uint8 [N,H,W,C] here");
  sub->add_option("--png-dir", a->png_dir, "also write one PNG per image into this directory");
  a->dev.add(sub);
  sub->callback([a] { run(*a); });
}

}  // namespace unet
