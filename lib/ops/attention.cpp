// CPU engine, attention family: reference variants (lib/ops/attention.h in float).
#include "attention.h"

#include "cpu_engine.h"

namespace unet {
namespace {

void attn_fwd(const AttentionFwd& o) {
  const Tensor& q = o.qkv;
  ref::attention_fwd<float>(q.f32(), o.out.f32(), o.lse.f32(), (int)q.dim[0], (int)(q.dim[1] * q.dim[2]),
                            (int)o.out.dim[3], (int)o.lse.dim[1], o.legacy);
}
void attn_bwd(const AttentionBwd& o) {
  const Tensor& q = o.qkv;
  ref::attention_bwd<float>(q.f32(), o.lse.f32(), o.dout.f32(), o.dqkv.f32(), (int)q.dim[0],
                            (int)(q.dim[1] * q.dim[2]), (int)o.out.dim[3], (int)o.lse.dim[1], o.legacy);
}

}  // namespace

void register_attention_cpu(CpuOps& ops) {
  ops.variants<AttentionFwd>().push_back(cpu_ref<AttentionFwd, attn_fwd>());
  ops.variants<AttentionBwd>().push_back(cpu_ref<AttentionBwd, attn_bwd>());
  register_attention_fast_cpu(ops);  // avx512, avx2 ahead of ref: the default where they run
}

}  // namespace unet
