// The CPU engine's fast variants ("avx512", "avx2", ...): shared plumbing of
// lib/ops/<family>_fast.cpp. Each family registers one variant per instruction set (widest first),
// ahead of "ref"; a variant supports an op when this CPU runs its kernels (f32, or bf16 through the
// CPU engine's emulation). UNET_KERNELS=conv=ref (or --kernels) forces the reference.
#pragma once
#include <vector>

#include "cpu_engine.h"
#include "cpu_fast.h"

namespace unet::cpufast {

// I = 0: AVX-512, 1: AVX2.
template <int I>
const Kernels* kernels() {
  return I == 0 ? avx512_kernels() : avx2_kernels();
}

// Every tensor of the op f32 or bf16 (bf16 through the engine's emulation, as "ref" does).
template <class Op>
bool float_tensors(const Op& op) {
  bool ok = true;
  for_each_tensor(op, [&](const char*, const Tensor& t, Role) { ok &= t.dtype != DType::I32; });
  return ok;
}

// A float buffer of at least n elements, kept per thread between calls (no allocation, no page
// faults in steady state). slot: which of the thread's buffers.
float* thread_buffer(int slot, size_t n);

// Registers the variants {avx512, avx2} of Op at the front of its list. Variant I supports an op
// when this CPU runs kernels<I>(), every tensor is f32 or bf16 and shape_ok(op); it runs F<I> on
// the op, bf16 tensors widened to float and the outputs rounded back (cpu_run_emulated, the same
// emulation "ref" runs in).
// names: the two variants' names (string literals), "avx512" and "avx2" unless told.
// After: run on the op as given once the emulation has stored the outputs (what needs them as
// stored, e.g. ConvFwd's statistics of a bf16 y).
template <class Op, bool (*shape_ok)(const Op&), void (*F0)(const Op&), void (*F1)(const Op&),
          void (*After)(const Op&) = nullptr>
void add_fast_variants(CpuOps& ops, const char* name0 = "avx512", const char* name1 = "avx2") {
  using Var = Variant<Op, CpuCtx>;
  auto& l = ops.variants<Op>();
  l.insert(l.begin(),
           {Var{name0, [](const Op& o, const CpuCtx&) { return kernels<0>() && float_tensors(o) && shape_ok(o); },
                [](const Op& o, CpuCtx&) {
                  cpu_run_emulated(o, F0);
                  if constexpr (After != nullptr) After(o);
                },
                nullptr},
            Var{name1, [](const Op& o, const CpuCtx&) { return kernels<1>() && float_tensors(o) && shape_ok(o); },
                [](const Op& o, CpuCtx&) {
                  cpu_run_emulated(o, F1);
                  if constexpr (After != nullptr) After(o);
                },
                nullptr}});
}

}  // namespace unet::cpufast
