#include "guidance.h"

#include "util.h"

namespace unet {

ClassifierGuide::ClassifierGuide(Engine& eng, Classifier& classifier, float scale, int max_batch)
    : eng_(eng), cls_(classifier), scale_(scale) {
  cls_.plan(max_batch, Mode::InputGrad);
  const int64_t K = cls_.config().num_classes;
  logits_ = eng_.alloc(DType::F32, {max_batch, K});
  dlogits_ = eng_.alloc(DType::F32, {max_batch, K});
}

void ClassifierGuide::grad(const Tensor& x, const Tensor& t, const Tensor& y, const Tensor& g) {
  const int64_t B = x.dim[0];
  ScopedRange r(eng_.device(), "classifier guidance");
  const Tensor l = logits_.batch(B), dl = dlogits_.batch(B);
  cls_.forward(x, t, l);
  // d/dlogits of s * log softmax(l)[y] = -s (softmax(l) - onehot(y)), per sample (no 1/B).
  eng_.ops().run(CrossEntropy{l, y, {}, dl, -scale_});
  cls_.backward(dl);
  eng_.ops().run(Copy{cls_.input_grad(), g});
}

void ClassifierGuide::attach(SamplerNet& net) {
  net.guide_classes = cls_.config().num_classes;
  net.cond_fn = [this](const Tensor& x, const Tensor& t, const Tensor& y, const Tensor& g) {
    grad(x, t, y, g);
  };
}

}  // namespace unet
