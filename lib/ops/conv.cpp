// CPU engine, conv family: the reference variant (lib/ops/conv.h in float).
#include "conv.h"

#include "cpu_engine.h"
#include "elementwise.h"

namespace unet {
namespace {

const float* opt(const Tensor& t) { return t.defined() ? t.f32() : nullptr; }

void conv_fwd(const ConvFwd& o) {
  const Tensor &x = o.x, &y = o.y;
  const int B = (int)x.dim[0], Co = (int)o.w.dim[0], k = (int)o.w.dim[1];
  ref::conv2d_fwd<float>(x.f32(), o.w.f32(), opt(o.bias), y.f32(), B, (int)x.dim[1], (int)x.dim[2],
                         (int)x.dim[3], Co, k, o.stride);
  ref::conv_epilogue<float>(y.f32(), opt(o.emb), opt(o.res), B, (size_t)y.dim[1] * y.dim[2], Co);
}

void conv_bwd_data(const ConvBwdData& o) {
  const Tensor& dx = o.dx;
  ref::conv2d_bwd<float>(nullptr, o.w.f32(), o.dy.f32(), dx.f32(), nullptr, nullptr, (int)dx.dim[0],
                         (int)dx.dim[1], (int)dx.dim[2], (int)dx.dim[3], (int)o.w.dim[0], (int)o.w.dim[1],
                         o.stride);
}

void conv_bwd_filter(const ConvBwdFilter& o) {
  const Tensor &x = o.x, &dy = o.dy;
  const int B = (int)dy.dim[0], Co = (int)dy.dim[3];
  if (o.dw.defined() || o.db.defined()) {
    const int k = o.dw.defined() ? (int)o.dw.dim[1] : 1;
    ref::conv2d_bwd<float>(x.f32(), nullptr, dy.f32(), nullptr, o.dw.defined() ? o.dw.f32() : nullptr,
                           o.db.defined() ? o.db.f32() : nullptr, B, (int)x.dim[1], (int)x.dim[2],
                           (int)x.dim[3], Co, k, o.stride);
  }
  if (o.demb.defined())
    ref::add_bcast_bwd<float>(dy.f32(), o.demb.f32(), B, (int)(dy.dim[1] * dy.dim[2]), Co);
}

}  // namespace

void register_conv_cpu(CpuOps& ops) {
  // The statistics after the emulation has rounded y as stored (bf16: what the GPU's are of).
  ops.variants<ConvFwd>().push_back({"ref", nullptr,
                                     [](const ConvFwd& o, CpuCtx&) {
                                       cpu_run_emulated(o, conv_fwd);
                                       conv_gn_stats(o);
                                     },
                                     nullptr});
  ops.variants<ConvBwdData>().push_back(cpu_ref<ConvBwdData, conv_bwd_data>());
  ops.variants<ConvBwdFilter>().push_back(cpu_ref<ConvBwdFilter, conv_bwd_filter>());
  register_conv_fast_cpu(ops);  // avx512, avx2 ahead of ref: the default where they run
}

}  // namespace unet
