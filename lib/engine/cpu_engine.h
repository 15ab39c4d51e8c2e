// The CPU engine: host memory, synchronous ops, and one "ref" variant per op — the reference
// loops of lib/ops/<family>.h in float (the tests also instantiate them in double).
//
// bf16 is emulated at the op seam: a bf16 tensor is widened to float before the op and its
// outputs are rounded back (to nearest even, as CUDA does), so the CPU engine stores exactly
// what the CUDA engine stores; only the order of float sums inside an op differs.
#pragma once
#include <deque>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine.h"

namespace unet {

struct CpuCtx {
  Precision prec = Precision::FP32;
  void need_workspace(size_t) {}
};
using CpuOps = VariantOps<CpuCtx>;

// GroupNormApply's reference (emulated as cpu_ref's): what the conv ops' norm of their input is.
void gn_apply_ref(const GroupNormApply& o);
template <class Op, class = void>
struct has_norm : std::false_type {};
template <class Op>
struct has_norm<Op, std::void_t<decltype(std::declval<const Op&>().norm.on())>> : std::true_type {};

// Runs f32impl on op with every bf16 tensor replaced by a float copy; outputs rounded back. A conv
// op's norm of its input (NormIn) runs first into a buffer of x's dtype (what the model stores
// without it), then the op on that: so every CPU variant takes it.
template <class Op>
void cpu_run_emulated(const Op& op, void (*f32impl)(const Op&)) {
  if constexpr (has_norm<Op>::value) {
    if (op.norm.on()) {
      std::vector<float> buf((op.x.numel() * dtype_size(op.x.dtype) + 3) / 4);
      Op c = op;
      c.x = Tensor(buf.data(), op.x.dtype, {op.x.dim[0], op.x.dim[1], op.x.dim[2], op.x.dim[3]});
      c.norm = NormIn{};
      gn_apply_ref(norm_apply(op.norm, op.x, c.x));
      return cpu_run_emulated(c, f32impl);
    }
  }
  bool any = false;
  for_each_tensor(op, [&](const char*, const Tensor& t, Role) { any |= t.dtype == DType::BF16; });
  if (!any) return f32impl(op);
  Op c = op;
  std::deque<std::vector<float>> tmp;
  struct Back {
    uint16_t* dst;
    const float* src;
    size_t n;
  };
  std::vector<Back> back;
  for_each_tensor(c, [&](const char*, Tensor& t, Role r) {
    if (t.dtype != DType::BF16) return;
    const size_t n = t.numel();
    tmp.emplace_back(n);
    float* f = tmp.back().data();
    const uint16_t* src = static_cast<const uint16_t*>(t.data);
    if (r != Role::Out)
      for (size_t i = 0; i < n; ++i) f[i] = bf16_bits_to_float(src[i]);
    if (r != Role::In) back.push_back({static_cast<uint16_t*>(t.data), f, n});
    t.data = f;
    t.dtype = DType::F32;
  });
  f32impl(c);
  for (auto& b : back)
    for (size_t i = 0; i < b.n; ++i) b.dst[i] = float_to_bf16_bits(b.src[i]);
}

// The reference variant of an op from its float implementation.
template <class Op, void (*F)(const Op&)>
Variant<Op, CpuCtx> cpu_ref() {
  return {"ref", nullptr, [](const Op& o, CpuCtx&) { cpu_run_emulated(o, F); }, nullptr};
}

// One registration per op family (lib/ops/<family>.cpp), called by the CPU engine.
void register_conv_cpu(CpuOps& ops);
void register_linear_cpu(CpuOps& ops);
void register_groupnorm_cpu(CpuOps& ops);
void register_elementwise_cpu(CpuOps& ops);
void register_resample_cpu(CpuOps& ops);
void register_concat_cpu(CpuOps& ops);
void register_embedding_cpu(CpuOps& ops);
void register_attention_cpu(CpuOps& ops);
void register_pool_cpu(CpuOps& ops);
void register_dropout_cpu(CpuOps& ops);
void register_loss_cpu(CpuOps& ops);
void register_diffusion_cpu(CpuOps& ops);
void register_optimizer_cpu(CpuOps& ops);
// The fast variants ("avx512", "avx2", "avx512_wino", ...; lib/ops/<family>_fast.cpp), put ahead
// of "ref" by their family's registration.
void register_conv_fast_cpu(CpuOps& ops);
void register_attention_fast_cpu(CpuOps& ops);
void register_groupnorm_fast_cpu(CpuOps& ops);
// GroupNormBwd's optional column sums (dx_sums, dx_total, add_total) from the written dx and add;
// every CPU variant calls it after dx is complete.
void gn_bwd_column_sums(const GroupNormBwd& o);
// A GroupNormBwd with dx2 (the input gradient split in two tensors) as `full` into one f32 buffer
// of x's shape, then split; `full(o)` itself without dx2.
void gn_bwd_split(const GroupNormBwd& o, void (*full)(const GroupNormBwd&));
// A GroupNormFwd with its input in two parts (x2) as one on their concatenation: written to xcat
// when given, else to buf (f32, as the emulated ops run).
GroupNormFwd gn_fwd_joined(const GroupNormFwd& o, std::vector<float>& buf);
// GroupNorm's input as it reads it, sample b: x + xbias[c] + xemb[b, c] (the ops' optional input
// offset) written to out (HW*C floats) and returned; x's own rows when neither is given.
const float* gn_read_x(const Tensor& x, const Tensor& xbias, const Tensor& xemb, int b, float* out);
// ConvFwd's optional GroupNorm statistics (mean, rstd) of the written y as stored: every CPU
// variant calls it after y is complete, outside the bf16 emulation (the reference's statistics,
// as GroupNormFwd's reference computes them).
void conv_gn_stats(const ConvFwd& o);
// The same for any NHWC y (f32 or bf16) into mean, rstd [B, G] (nothing when mean is undefined).
void gn_stats_of(const Tensor& y, const Tensor& mean, const Tensor& rstd);

}  // namespace unet
