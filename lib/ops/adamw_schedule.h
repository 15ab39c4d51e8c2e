// AdamW's per-step scalars, shared by the CPU reference and the CUDA kernel (host and device).
#pragma once
#include <cmath>
#include <cstdint>

#include "tensor.h"  // UNET_HD

namespace unet::ref {

// The per-step scalars of AdamW (op AdamWSchedule), the same arithmetic in every engine:
// t = step + 1, lr_t = lr * min(1, t / warmup) * max(0, 1 - (t - 1) / anneal) (the second factor
// guided-diffusion's lr_anneal_steps: lr (1 - step / anneal) at 0-based step t - 1), bc1 = 1 -
// beta1^t, bc2 = 1 - beta2^t (double), then hyper = {1 - lr_t wd, lr_t / bc1, sqrt(bc2), lr_t} in
// float.
UNET_HD inline double adamw_lr(double lr, int64_t warmup, int64_t anneal, int64_t t) {
  double f = warmup > 0 && t < warmup ? (double)t / (double)warmup : 1.0;
  if (anneal > 0) f *= t - 1 < anneal ? 1.0 - (double)(t - 1) / (double)anneal : 0.0;
  return lr * f;
}
UNET_HD inline void adamw_hyper(int64_t t, double lr, double wd, double beta1, double beta2, int64_t warmup,
                                int64_t anneal, float* hyper) {
  const float lr_f = (float)adamw_lr(lr, warmup, anneal, t), wd_f = (float)wd;
  const float bc1 = (float)(1.0 - pow(beta1, (double)t)), bc2 = (float)(1.0 - pow(beta2, (double)t));
  hyper[0] = 1.f - lr_f * wd_f;
  hyper[1] = lr_f / bc1;
  hyper[2] = sqrtf(bc2);
  hyper[3] = lr_f;
}

}  // namespace unet::ref
