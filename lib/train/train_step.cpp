#include "train_step.h"

#include <cmath>

#include "env_vars.h"
#include "rng.h"
#include "util.h"

namespace unet {

Tensor StepBase::rows(const Tensor& t, int64_t off, int64_t n) {
  if (!t.defined()) return t;
  Tensor r = t;
  r.data = static_cast<char*>(t.data) + (size_t)off * t.per_sample() * dtype_size(t.dtype);
  r.dim[0] = n;
  return r;
}

StepBase::StepBase(Engine& eng, Network& net, Optimizer& opt, int B, int microbatch)
    : eng_(eng), net_(net), opt_(opt), B_(B) {
  m_ = microbatch <= 0 || microbatch > B ? B : microbatch;
  if (B % m_ != 0)
    throw UserError("--microbatch " + std::to_string(m_) + " does not divide --batch-size " +
                    std::to_string(B));
  if (m_ < B_) acc_ = eng.alloc(DType::F32, {(int64_t)net.arena_floats()});
  set_hooks();
}

StepBase::~StepBase() { net_.set_grad_ready_hook(nullptr); }

void StepBase::set_communicator(Communicator* comm) {
  comm_ = comm && comm->size() > 1 ? comm : nullptr;
  set_hooks();
}

void StepBase::set_hooks() {
  // Early optimizer updates: one micro-batch, no clipping, a CUDA engine with lanes; with several
  // ranks, on the ranges whose mean gradient the communicator has enqueued during the backward.
  early_ = allow_early_ && !acc_.defined() && opt_.can_update_early() && eng_.is_cuda() && env_lanes();
  const bool buckets = comm_ && !acc_.defined();
  if (!buckets && !early_) {
    net_.set_grad_ready_hook(nullptr);
    return;
  }
  // Issued from the optimizer's stream (Ops::aside), which follows both lanes, so the backward
  // calls it every few layers without joining its lanes there (a data-parallel backward waited for
  // the filter gradients at every call before; 2 H200s, tf32 seed64: docs/speed-log.md).
  net_.set_grad_ready_hook(
      [this, buckets](size_t first_final) {
        if (!armed_ && !buckets) return;  // a backward outside a training step
        Ops& ops = eng_.ops();
        ops.aside(true);
        if (buckets) {
          comm_->grads_ready(first_final);
          first_final = comm_->reduced_from();
        }
        // (the optimizer's stream waits for the reductions only where it has a range to update)
        if (armed_ && first_final != SIZE_MAX && opt_.update_due(first_final)) {
          if (buckets) comm_->wait_reduced();
          opt_.update_from(net_.params(), net_.grads(), first_final);
        }
        ops.aside(false);
      },
      true);
}

void StepBase::grads_begin() {
  if (comm_ && !acc_.defined()) comm_->begin_grads(net_.grads());
  if (early_) {
    opt_.begin_early();
    armed_ = true;
  }
}

void StepBase::grads_end(int micro) {
  if (!acc_.defined()) return;
  // weight gradients overwrite grads(): sum them in acc_
  if (micro == 0)
    eng_.ops().run(Copy{net_.grads(), acc_});
  else
    eng_.ops().run(Add{acc_, net_.grads(), acc_});
}

void StepBase::update() {
  if (comm_) {
    // Every rank continues with the mean gradient of the global batch: norm, clipping and the
    // NaN checks decide the same on all ranks.
    ScopedRange r(eng_.device(), "all-reduce");
    if (acc_.defined()) comm_->begin_grads(acc_);
    comm_->end_grads();
    eng_.ops().join_aside();  // (the stream the buckets forked from)
  }
  ScopedRange r(eng_.device(), "optimizer");
  opt_.step(net_.params(), acc_.defined() ? acc_ : net_.grads());
  if (armed_) eng_.ops().join_aside();  // the next forward reads the weights
  armed_ = false;
}

void StepBase::enqueue(uint64_t dropout_seed) {
  for (int k = 0; k < micro_batches(); ++k) {
    forward(dropout_seed, k);
    backward(k);
  }
  update();
}

TrainStep::TrainStep(Engine& eng, Model& model, Optimizer& opt, int B, int microbatch)
    : StepBase(eng, model, opt, B, microbatch), model_(model), cfg_(model.config()), obj_(model.config()) {
  model.plan(m_, Mode::Train);
  // bf16: AdamW writes the weights' bf16 copy as it updates them, so a forward casts them only
  // when they changed otherwise (Model::refresh_weights; H100 seed64: a 47 us pass at the start of
  // every step)
  if (model.shadow().defined()) {
    opt.keep_shadow(model.shadow());
    model.weights_kept_by_optimizer(true);
  }
  const int64_t b = B, m = m_, R = cfg_.image_size, C = cfg_.in_channels, Co = cfg_.out_channels();
  auto img = [&](int64_t n, int64_t c) { return eng.alloc(DType::F32, {n, R, R, c}); };
  x0 = img(b, C), noise = img(b, C), xt_ = img(b, C);
  t = eng.alloc(DType::F32, {b});
  coef = eng.alloc(DType::F32, {2 * b});
  loss_coef = eng.alloc(DType::F32, {b, kLossCoefRows});
  terms = eng.alloc(DType::F32, {b, kLossTerms});
  stats = eng.alloc(DType::F32, {7});
  if (cfg_.class_cond) labels = eng.alloc(DType::I32, {b});
  out_ = img(m, Co), dout_ = img(m, Co);
  Device& dev = eng.device();
  h_t_ = static_cast<float*>(dev.alloc_host(sizeof(float) * B));
  h_coef_ = static_cast<float*>(dev.alloc_host(sizeof(float) * 2 * B));
  h_loss_coef_ = static_cast<float*>(dev.alloc_host(sizeof(float) * B * kLossCoefRows));
  reset_stats();
  // Well-defined inputs for callers that upload only t and coef (unet profile).
  const Diffusion d(cfg_.diffusion_steps, cfg_.noise_schedule, cfg_.learn_sigma);
  std::vector<int> ti(B);
  for (int i = 0; i < B; ++i) ti[i] = (int)(((int64_t)i * 7919) % cfg_.diffusion_steps);
  set_timesteps(d, ti.data(), nullptr);
  dev.sync();
}

void TrainStep::set_timesteps(const Diffusion& d, const int* ti, const float* w) {
  const size_t D = (size_t)cfg_.image_size * cfg_.image_size * cfg_.in_channels;
  for (int i = 0; i < B_; ++i) {
    const int k = ti[i];
    h_t_[i] = obj_.model_time(d.timestep_map.at(k));
    h_coef_[i] = (float)d.sqrt_alphas_cumprod[k];
    h_coef_[B_ + i] = (float)d.sqrt_one_minus_alphas_cumprod[k];
    loss_coef_row(d, obj_, k, w ? (double)w[i] : 1.0, B_, D, h_loss_coef_ + (size_t)i * kLossCoefRows);
  }
  eng_.upload(t, h_t_);
  eng_.upload(coef, h_coef_);
  eng_.upload(loss_coef, h_loss_coef_);
}

void TrainStep::reset_stats() { eng_.ops().run(Fill{stats, 0.f}); }

void TrainStep::forward(uint64_t dropout_seed, int micro) {
  if (micro == 0) {
    ScopedRange r(eng_.device(), "q_sample");
    eng_.ops().run(QSample{x0, noise, coef, xt_});
  }
  ScopedRange r(eng_.device(), "forward");
  const int64_t off = (int64_t)micro * m_;
  // Micro-batches after the first draw their dropout masks from their own seeds.
  const uint64_t seed = micro == 0 ? dropout_seed : hash64(dropout_seed, 0x6d6963726f62ull, (uint64_t)micro);
  model_.forward(rows(xt_, off, m_), rows(t, off, m_), rows(labels, off, m_), out_, true, seed);
}

void TrainStep::backward(int micro) {
  Ops& ops = eng_.ops();
  const int64_t off = (int64_t)micro * m_;
  {
    ScopedRange r(eng_.device(), "loss");
    const Tensor lc = rows(loss_coef, off, m_), tm = rows(terms, off, m_);
    ops.run(DiffusionLoss{out_, rows(x0, off, m_), rows(xt_, off, m_), rows(noise, off, m_), lc, tm, dout_,
                          obj_.predict_xstart, obj_.use_kl, false});
    // (for the logs: with early updates on the optimizer's stream, off the backward's start)
    if (updates_early()) ops.aside(true);
    ops.run(LossStats{tm, lc, stats});
    if (updates_early()) ops.aside(false);
  }
  ScopedRange r(eng_.device(), "backward");
  grads_begin();
  model_.backward(dout_);
  grads_end(micro);
}

}  // namespace unet
