#include "classifier_free.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

#include "init.h"
#include "params.h"
#include "rng.h"
#include "util.h"

namespace unet {

namespace {
// Rows [off, off + n) of a batch-major tensor.
Tensor rows(const Tensor& t, int64_t off, int64_t n) {
  Tensor r = t;
  r.data = static_cast<char*>(t.data) + (size_t)off * t.per_sample() * dtype_size(t.dtype);
  r.dim[0] = n;
  return r;
}
}  // namespace

bool class_dropped(uint64_t seed, int64_t step, int64_t b, double p) {
  if (!(p > 0)) return false;
  const uint64_t key = rng_key(seed, Stream::ClassDropout, static_cast<uint64_t>(step));
  return uniform01_f64(key, Stream::ClassDropout, static_cast<uint64_t>(b)) < p;
}

int apply_class_dropout(uint64_t seed, int64_t step, int64_t first, int n, double p, int32_t null_label,
                        int32_t* labels) {
  int dropped = 0;
  for (int i = 0; i < n; ++i)
    if (class_dropped(seed, step, first + i, p)) labels[i] = null_label, ++dropped;
  return dropped;
}

void add_null_class(Checkpoint& ck, uint64_t seed) {
  if (!ck.cfg.class_cond) throw UserError("a null class needs a class-conditional model");
  if (ck.cfg.null_class) return;
  ModelConfig nc = ck.cfg;
  nc.null_class = true;
  const ParamTable from = build_param_table(ck.cfg), to = build_param_table(nc);
  if (ck.model.size() != from.total) throw std::logic_error("add_null_class: model arena of the wrong size");
  std::vector<float> grown(to.total, 0.0f), fresh;
  for (const ParamInfo& p : to.params) {
    const ParamInfo& q = from.at(p.name);
    std::vector<float> v(p.numel);
    engine_to_torch(q, ck.model.data() + q.offset, v.data());  // q.numel <= p.numel values
    if (p.name == "label_emb.weight") {                        // [K + 1, D]: rows 0..K-1 kept, row K fresh
      fresh.resize(p.numel);
      init_tensor(p, seed, fresh.data());
      std::copy(fresh.begin() + (ptrdiff_t)q.numel, fresh.end(), v.begin() + (ptrdiff_t)q.numel);
    }
    torch_to_engine(p, v.data(), grown.data() + p.offset);
  }
  ck.cfg = nc;
  ck.model = std::move(grown);
  ck.ema.clear();
  ck.has_optimizer = false;
  ck.opt = OptimizerState();
}

SamplerNet classifier_free_guidance(Engine& eng, SamplerNet cond, int max_batch, float w,
                                    int32_t null_label) {
  if (!cond.class_cond || !cond.denoise)
    throw UserError("classifier-free guidance needs a class-conditional model");
  if (max_batch < 1) throw UserError("sample: batch size must be >= 1, got " + std::to_string(max_batch));
  struct State {
    Tensor x, t, y, out, eps, var;  // 2 * max_batch samples each
  };
  auto s = std::make_shared<State>();
  const int64_t H = cond.image_size, C = cond.channels, B2 = 2 * (int64_t)max_batch;
  const int64_t Co = cond.learn_sigma ? 2 * C : C;
  s->x = eng.alloc(DType::F32, {B2, H, H, C});
  s->t = eng.alloc(DType::F32, {B2});
  s->y = eng.alloc(DType::I32, {B2});
  s->out = eng.alloc(DType::F32, {B2, H, H, Co});
  if (cond.learn_sigma) {
    s->eps = eng.alloc(DType::F32, {B2, H, H, C});
    s->var = eng.alloc(DType::F32, {B2, H, H, C});
  }
  SamplerNet g = cond;
  auto inner = std::move(cond.denoise);
  const bool learn_sigma = cond.learn_sigma;
  Engine* e = &eng;
  g.denoise = [s, inner, learn_sigma, w, null_label, max_batch, e](const Tensor& x, const Tensor& t,
                                                                   const Tensor& y, const Tensor& out) {
    const int64_t B = x.dim[0];
    if (B > max_batch || !y.defined())
      throw std::logic_error("classifier_free_guidance: batch over the planned size, or no labels");
    Ops& ops = e->ops();
    // One forward pass over [x; x] at [t; t] with labels [y; null].
    ops.run(Copy{x, rows(s->x, 0, B)});
    ops.run(Copy{x, rows(s->x, B, B)});
    ops.run(Copy{t, rows(s->t, 0, B)});
    ops.run(Copy{t, rows(s->t, B, B)});
    ops.run(Copy{y, rows(s->y, 0, B)});
    ops.run(Fill{rows(s->y, B, B), static_cast<float>(null_label)});
    const Tensor out2 = s->out.batch(2 * B);
    inner(s->x.batch(2 * B), s->t.batch(2 * B), s->y.batch(2 * B), out2);
    // guided = w * cond + (1 - w) * uncond, written over the unconditional half.
    const Tensor mean2 = learn_sigma ? s->eps.batch(2 * B) : out2;
    if (learn_sigma) ops.run(ConcatBwd{out2, mean2, s->var.batch(2 * B)});
    const Tensor cond_mean = rows(mean2, 0, B), guided = rows(mean2, B, B);
    ops.run(Axpbypcz{cond_mean, guided, {}, w, 1.0f - w, 0.0f});
    if (learn_sigma)
      ops.run(ConcatFwd{guided, rows(s->var, 0, B), out});  // the variance of the conditional half
    else
      ops.run(Copy{guided, out});
  };
  return g;
}

}  // namespace unet
