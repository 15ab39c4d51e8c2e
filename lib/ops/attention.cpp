// CpuBackend attention: the float instantiations of lib/ops/attention.h.
#include "attention.h"

#include "cpu_backend.h"

namespace unet {

void CpuBackend::attention_fwd(const float* qkv, float* out, float* attn, int B, int T, int C, int heads,
                               bool legacy) {
  ref::attention_fwd<float>(qkv, out, attn, B, T, C, heads, legacy);
}
void CpuBackend::attention_bwd(const float* qkv, const float* attn, const float* dout, float* dqkv, int B,
                               int T, int C, int heads, bool legacy) {
  ref::attention_bwd<float>(qkv, attn, dout, dqkv, B, T, C, heads, legacy);
}

}  // namespace unet
