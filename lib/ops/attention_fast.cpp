// CPU engine, attention family: the fast variants "avx512" and "avx2" (registered ahead of "ref" by
// register_attention_cpu). The reference's algorithm per (batch, head) — gather q, k, v, small
// GEMMs, softmax — on the register-tiled GEMM and a vectorised exp (cpu_fast_impl.h), over blocks
// of 64 query rows so the softmax weights stay in cache; f32 (bf16 through the emulation). Each
// (batch, head) is one task: results do not depend on the thread count.
#include <cmath>

#include "attention.h"
#include "cpu_fast_variants.h"

namespace unet {
namespace {

using cpufast::AttnArgs;
using cpufast::Kernels;

template <class Op>
bool heads_ok(const Op& o) {
  return o.out.dim[3] % o.lse.dim[1] == 0;
}

// Runs f(args of (b, h), scratch) for every (batch, head) of the op.
template <class Op, class F>
void each_head(const Op& o, F f) {
  const int B = (int)o.qkv.dim[0], T = (int)(o.qkv.dim[1] * o.qkv.dim[2]), C = (int)o.out.dim[3];
  const int heads = (int)o.lse.dim[1], d = C / heads;
  const float scale = (float)(1.0 / std::sqrt(std::sqrt((double)d)));
  const size_t nscratch = cpufast::attn_scratch_floats(T, d);
#pragma omp parallel for schedule(static) if ((double)B * T * T * C > 1e5)
  for (int bh = 0; bh < B * heads; ++bh) {
    const int b = bh / heads, h = bh % heads;
    const ref::AttnLayout L = ref::attn_layout(h, C, d, o.legacy);
    AttnArgs a{};
    a.T = T, a.C = C, a.d = d, a.q_off = L.q, a.k_off = L.k, a.v_off = L.v, a.o_off = h * d, a.scale = scale;
    a.qkv = o.qkv.f32() + (size_t)b * T * 3 * C;
    a.lse = o.lse.f32() + (size_t)bh * T;
    f(a, (size_t)b * T * C, cpufast::thread_buffer(2, nscratch));
  }
}

template <int I>
void attn_run(const AttentionFwd& o) {
  const Kernels& K = *cpufast::kernels<I>();
  each_head(o, [&](AttnArgs& a, size_t bo, float* scratch) {
    a.out = o.out.f32() + bo;
    K.attn_fwd(a, scratch);
  });
}
template <int I>
void attn_bwd_run(const AttentionBwd& o) {
  const Kernels& K = *cpufast::kernels<I>();
  each_head(o, [&](AttnArgs& a, size_t bo, float* scratch) {
    a.dout = o.dout.f32() + bo;
    a.dqkv = o.dqkv.f32() + 3 * bo;
    K.attn_bwd(a, scratch);
  });
}

}  // namespace

void register_attention_fast_cpu(CpuOps& ops) {
  cpufast::add_fast_variants<AttentionFwd, heads_ok<AttentionFwd>, attn_run<0>, attn_run<1>>(ops);
  cpufast::add_fast_variants<AttentionBwd, heads_ok<AttentionBwd>, attn_bwd_run<0>, attn_bwd_run<1>>(ops);
}

}  // namespace unet
