#include "train_step.h"

namespace unet {

TrainStep::TrainStep(Engine& eng, Model& model, Optimizer& opt, int B)
    : eng_(eng), model_(model), opt_(opt), cfg_(model.config()) {
  model.plan(B, Mode::Train);
  const int64_t b = B, R = cfg_.image_size, C = cfg_.in_channels, Co = cfg_.out_channels();
  auto img = [&](int64_t c) { return eng.alloc(DType::F32, {b, R, R, c}); };
  x0 = img(C), noise = img(C), xt_ = img(C);
  t = eng.alloc(DType::F32, {b});
  coef = eng.alloc(DType::F32, {2 * b});
  if (cfg_.class_cond) labels = eng.alloc(DType::I32, {b});
  out_ = img(Co), dout_ = img(Co);
  if (cfg_.learn_sigma) {
    eps_ = img(C), var_ = img(C), deps_ = img(C), zeros_ = img(C);
    eng.ops().run(Fill{zeros_, 0.f});
  }
  loss_ = eng.alloc(DType::F32, {1});
  loss_sum = eng.alloc(DType::F32, {1});
  eng.ops().run(Fill{loss_sum, 0.f});
}

void TrainStep::set_communicator(Communicator* comm) {
  comm_ = comm && comm->size() > 1 ? comm : nullptr;
  if (comm_)
    model_.set_grad_ready_hook([c = comm_](size_t first_final) { c->grads_ready(first_final); });
  else
    model_.set_grad_ready_hook(nullptr);
}

void TrainStep::forward(uint64_t dropout_seed) {
  {
    ScopedRange r(eng_.device(), "q_sample");
    eng_.ops().run(QSample{x0, noise, coef, xt_});
  }
  ScopedRange r(eng_.device(), "forward");
  model_.forward(xt_, t, labels, out_, true, dropout_seed);
}

void TrainStep::backward() {
  Ops& ops = eng_.ops();
  {
    ScopedRange r(eng_.device(), "loss");
    if (cfg_.learn_sigma) {
      // SPEC §1: the loss is the eps-MSE; the variance channels get no gradient.
      ops.run(ConcatBwd{out_, eps_, var_});
      ops.run(MseLoss{eps_, noise, loss_, deps_});
      ops.run(ConcatFwd{deps_, zeros_, dout_});
    } else {
      ops.run(MseLoss{out_, noise, loss_, dout_});
    }
  }
  ScopedRange r(eng_.device(), "backward");
  if (comm_) comm_->begin_grads(model_.grads());
  model_.backward(dout_);
}

void TrainStep::update() {
  if (comm_) {
    // Every rank continues with the mean gradient of the global batch: norm, clipping and the
    // NaN checks below decide the same on all ranks.
    ScopedRange r(eng_.device(), "all-reduce");
    comm_->end_grads();
  }
  ScopedRange r(eng_.device(), "optimizer");
  opt_.step(model_.params(), model_.grads());
  eng_.ops().run(Add{loss_sum, loss_, loss_sum});
}

}  // namespace unet
