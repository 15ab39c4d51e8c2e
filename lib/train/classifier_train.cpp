#include "classifier_train.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "objective.h"
#include "optim.h"
#include "preflight.h"
#include "rng.h"
#include "util.h"

namespace unet {

namespace {
std::string fmt_g(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*g", digits, v);
  return b;
}
constexpr const char* kTermName[kClassTerms] = {"loss", "acc1", "acc5"};
}  // namespace

// ---- the step -------------------------------------------------------------------------------------

ClassifierStep::ClassifierStep(Engine& eng, Classifier& cls, Optimizer& opt, int B, int microbatch)
    : StepBase(eng, cls, opt, B, microbatch), cls_(cls), T_(cls.config().diffusion_steps) {
  cls.plan(m_, Mode::Train);
  const ClassifierConfig& c = cls.config();
  const int64_t b = B, m = m_, R = c.image_size, C = c.in_channels, K = c.num_classes;
  auto img = [&](int64_t n) { return eng.alloc(DType::F32, {n, R, R, C}); };
  for (bool val : {false, true}) {
    (val ? val_x0 : x0) = img(b);
    (val ? val_noise : noise) = img(b);
    (val ? val_t : t) = eng.alloc(DType::F32, {b});
    (val ? val_coef : coef) = eng.alloc(DType::F32, {2 * b});
    (val ? val_labels : labels) = eng.alloc(DType::I32, {b});
    (val ? val_quartile : quartile) = eng.alloc(DType::I32, {b});
    (val ? val_stats : stats) = eng.alloc(DType::F32, {kClassStats});
    (val ? val_terms_ : terms) = eng.alloc(DType::F32, {b, kClassTerms});
    Device& dev = eng.device();
    float** h = h_[val ? 1 : 0];
    h[0] = static_cast<float*>(dev.alloc_host(sizeof(float) * B));
    h[1] = static_cast<float*>(dev.alloc_host(sizeof(float) * 2 * B));
    h[2] = static_cast<float*>(dev.alloc_host(sizeof(int32_t) * B));
  }
  xt_ = img(b);
  logits_ = eng.alloc(DType::F32, {m, K});
  dlogits_ = eng.alloc(DType::F32, {m, K});
  reset_stats();
  eng.ops().run(Fill{val_stats, 0.f});
  eng.device().sync();
}

void ClassifierStep::set_timesteps(const Diffusion& d, const int* ti, bool noised, bool val) {
  float** h = h_[val ? 1 : 0];
  int32_t* q = reinterpret_cast<int32_t*>(h[2]);
  for (int i = 0; i < B_; ++i) {
    const int k = noised ? ti[i] : 0;
    h[0][i] = (float)d.timestep_map.at(k);  // the classifier is trained on the original timestep
    h[1][i] = noised ? (float)d.sqrt_alphas_cumprod[k] : 1.0f;  // clean: x_t = 1 x0 + 0 noise = x0
    h[1][B_ + i] = noised ? (float)d.sqrt_one_minus_alphas_cumprod[k] : 0.0f;
    q[i] = unet::quartile(k, T_);
  }
  eng_.upload(val ? val_t : t, h[0]);
  eng_.upload(val ? val_coef : coef, h[1]);
  eng_.upload(val ? val_quartile : quartile, q);
}

void ClassifierStep::reset_stats() {
  eng_.ops().run(Fill{stats, 0.f});
  eng_.ops().run(Fill{val_stats, 0.f});
}

void ClassifierStep::forward(uint64_t, int micro) {
  if (micro == 0) {
    ScopedRange r(eng_.device(), "q_sample");
    eng_.ops().run(QSample{x0, noise, coef, xt_});
  }
  ScopedRange r(eng_.device(), "forward");
  const int64_t off = (int64_t)micro * m_;
  cls_.forward(rows(xt_, off, m_), rows(t, off, m_), logits_);
}

void ClassifierStep::backward(int micro) {
  Ops& ops = eng_.ops();
  const int64_t off = (int64_t)micro * m_;
  {
    ScopedRange r(eng_.device(), "loss");
    // F.cross_entropy averaged over the whole batch: every micro-batch's share is 1/B.
    const Tensor tm = rows(terms, off, m_);
    ops.run(CrossEntropy{logits_, rows(labels, off, m_), tm, dlogits_, 1.0f / (float)B_});
    ops.run(ClassifierStats{tm, rows(quartile, off, m_), stats});
  }
  ScopedRange r(eng_.device(), "backward");
  grads_begin();
  cls_.backward(dlogits_);
  grads_end(micro);
}

void ClassifierStep::evaluate() {
  ScopedRange r(eng_.device(), "validation");
  Ops& ops = eng_.ops();
  ops.run(QSample{val_x0, val_noise, val_coef, xt_});
  for (int k = 0; k < micro_batches(); ++k) {
    const int64_t off = (int64_t)k * m_;
    cls_.forward(rows(xt_, off, m_), rows(val_t, off, m_), logits_);
    const Tensor tm = rows(val_terms_, off, m_);
    ops.run(CrossEntropy{logits_, rows(val_labels, off, m_), tm, {}, 1.0f});
    ops.run(ClassifierStats{tm, rows(val_quartile, off, m_), val_stats});
  }
}

// ---- the task -------------------------------------------------------------------------------------

ClassifierTask::ClassifierTask(const ClassifierConfig& cfg, const TrainOptions& o) : cfg_(cfg), o_(o) {}

void ClassifierTask::check_data(const DatasetInfo& info, const std::string& path) const {
  if (!info.has_labels)
    throw UserError(path +
                    ": the dataset has no labels; a classifier trains on labelled images "
                    "(unet prepare --labels subdirs)");
  if (info.image_size != cfg_.image_size)
    throw UserError(path + ": images are " + std::to_string(info.image_size) + "x" +
                    std::to_string(info.image_size) + " but the classifier's image size is " +
                    std::to_string(cfg_.image_size));
  if ((int64_t)info.class_names.size() > cfg_.num_classes)
    throw UserError(path + ": " + std::to_string(info.class_names.size()) +
                    " classes but the classifier has " + std::to_string(cfg_.num_classes) +
                    " (--num-classes)");
}

Network& ClassifierTask::build(Engine& eng) {
  cls_ = std::make_unique<Classifier>(cfg_, eng);
  return *cls_;
}

void ClassifierTask::make_step(Engine& eng, Optimizer& opt, int Bl, int microbatch, Communicator* comm) {
  eng_ = &eng;
  comm_ = comm && comm->size() > 1 ? comm : nullptr;
  step_ = std::make_unique<ClassifierStep>(eng, *cls_, opt, Bl, microbatch);
  step_->set_communicator(comm_);
  Bl_ = Bl;
  host_labels_ = (int32_t*)eng.device().alloc_host(sizeof(int32_t) * Bl);
  host_t_.resize(Bl);
}

void ClassifierTask::start(Engine& eng, const Checkpoint&, bool, int64_t step, int rank, int world) {
  diff_ = std::make_unique<Diffusion>(cfg_.diffusion_steps, cfg_.noise_schedule, false);
  if (o_.val_data.empty() || o_.eval_every <= 0) return;
  Device& dev = eng.device();
  val_ = std::make_unique<DataLoader>(
      o_.val_data, o_.batch_size, cfg_.diffusion_steps, val_seed(), o_.flip,
      evaluations_before(step, o_.eval_every), 2, [&dev](size_t bytes) { return dev.alloc_host(bytes); },
      rank, world);
  check_data(val_->info(), o_.val_data);
}

std::vector<std::string> ClassifierTask::columns() const {
  std::vector<std::string> c;
  const bool val = !o_.val_data.empty() && o_.eval_every > 0;
  for (const char* pre : {"", "val_"}) {
    if (*pre && !val) break;
    for (const char* n : kTermName)
      if (*pre || std::string(n) != "loss") c.push_back(std::string(pre) + n);  // "loss" is the loop's
    for (const char* n : kTermName)
      for (int q = 0; q < 4; ++q) c.push_back(std::string(pre) + n + "_q" + std::to_string(q));
  }
  return c;
}

void ClassifierTask::set_batch(const Batch& b, int64_t step, int first) {
  for (int i = 0; i < Bl_; ++i) host_labels_[i] = b.labels[i];
  for (int i = 0; i < Bl_; ++i) host_t_[i] = o_.noised ? (int)b.t[i] : 0;
  for (int i = 0; i < Bl_; ++i) ++quartile_n_[quartile(host_t_[i], cfg_.diffusion_steps)];
  step_->set_timesteps(*diff_, host_t_.data(), o_.noised);
  eng_->upload(step_->x0, b.x0.data());
  draw_train_noise(eng_->ops(), step_->noise, o_.seed, step, first);
  eng_->upload(step_->labels, host_labels_);
}

void ClassifierTask::after_step(int64_t step) {
  // classifier_train.py evaluates after the update of steps 0, E, 2E, ... (0-based)
  if (!val_ || (step - 1) % o_.eval_every != 0) return;
  Batch* b = val_->next();
  std::vector<int> t(Bl_);
  for (int i = 0; i < Bl_; ++i) t[i] = o_.noised ? (int)b->t[i] : 0;
  for (int i = 0; i < Bl_; ++i) ++val_quartile_n_[quartile(t[i], cfg_.diffusion_steps)];
  step_->set_timesteps(*diff_, t.data(), o_.noised, /*val=*/true);
  std::vector<int32_t> lab(b->labels.begin(), b->labels.end());
  eng_->upload(step_->val_x0, b->x0.data());
  draw_train_noise(eng_->ops(), step_->val_noise, val_seed(), b->step, val_->first());
  eng_->upload(step_->val_labels, lab.data());
  step_->evaluate();
  eng_->device().sync();  // the host buffers above are reused at the next evaluation
  ++val_batches_;
}

double ClassifierTask::window(Communicator* comm, double n_samples, std::map<std::string, double>& row,
                              std::string& terms, std::string& tail) {
  float st[kClassStats], vs[kClassStats];
  if (comm_) {
    comm->all_reduce(step_->stats, ReduceOp::Sum);
    comm->all_reduce(step_->val_stats, ReduceOp::Sum);
  }
  {
    ControlPlane::Wait w(comm_ ? comm_->control() : nullptr);
    eng_->download(st, step_->stats);
    eng_->download(vs, step_->val_stats);
  }
  int64_t qn[4], vqn[4];
  std::memcpy(qn, quartile_n_, sizeof qn);
  std::memcpy(vqn, val_quartile_n_, sizeof vqn);
  auto sum_ranks = [&](int64_t* q) {
    if (!comm_) return;
    std::string mine(4 * sizeof(int64_t), '\0');
    std::memcpy(&mine[0], q, 4 * sizeof(int64_t));
    int64_t total[4] = {0, 0, 0, 0};
    for (const std::string& r : comm->all_gather(mine)) {
      int64_t x[4];
      std::memcpy(x, r.data(), sizeof x);
      for (int k = 0; k < 4; ++k) total[k] += x[k];
    }
    std::memcpy(q, total, sizeof total);
  };
  sum_ranks(qn);
  sum_ranks(vqn);
  auto fill = [&](const float* s, const int64_t* q, double n, const std::string& pre) {
    for (int j = 0; j < kClassTerms; ++j) row[pre + kTermName[j]] = s[j] / n;
    for (int k = 0; k < 4; ++k) {
      if (q[k] == 0) continue;  // no sample in this quartile: an empty cell
      for (int j = 0; j < kClassTerms; ++j)
        row[pre + kTermName[j] + "_q" + std::to_string(k)] = s[kClassTerms + kClassTerms * k + j] / q[k];
    }
  };
  fill(st, qn, n_samples, "");
  terms = " (acc@1 " + fmt_g(row["acc1"], 4) + ", acc@5 " + fmt_g(row["acc5"], 4) + ")";
  for (int k = 0; k < 4; ++k)
    if (qn[k]) tail += " q" + std::to_string(k) + " " + fmt_g(row["loss_q" + std::to_string(k)], 4);
  const int64_t vn = vqn[0] + vqn[1] + vqn[2] + vqn[3];
  if (vn > 0) {
    fill(vs, vqn, (double)vn, "val_");
    tail += " | val loss " + fmt_g(row["val_loss"], 5) + " acc@1 " + fmt_g(row["val_acc1"], 4) + " acc@5 " +
            fmt_g(row["val_acc5"], 4);
  }
  return row["loss"];
}

void ClassifierTask::reset_window() {
  step_->reset_stats();
  for (int64_t& n : quartile_n_) n = 0;
  for (int64_t& n : val_quartile_n_) n = 0;
  val_batches_ = 0;
}

bool ClassifierTask::window_finite(Communicator* comm) {
  float h[kClassStats];
  if (comm_) comm->all_reduce(step_->stats, ReduceOp::Sum);
  {
    ControlPlane::Wait w(comm_ ? comm_->control() : nullptr);
    eng_->download(h, step_->stats);
  }
  return std::isfinite(h[0]);
}

void ClassifierTask::fill_checkpoint(Checkpoint& c) const {
  c.is_classifier = true;
  c.ccfg = cfg_;
}

}  // namespace unet
