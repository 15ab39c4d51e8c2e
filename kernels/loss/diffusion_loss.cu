// Loss variant "cuda" of DiffusionLoss and LossStats (op_defs.h): guided-diffusion's training
// objective and variational-bound terms per sample, the gradient in the same pass.
//
// Stage 1: a grid of (chunks of kPerBlock elements, samples); each thread computes its elements
// (loss_math.h, the CPU reference's arithmetic), writes dout, and the block reduces its four sums
// (mse, vb, x0 mse, eps mse) in double with a fixed tree. Stage 2: one thread per sample adds its
// chunks in order and writes the terms. No atomics: bitwise reproducible.
#include "cuda_engine.cuh"
#include "loss_math.h"

namespace unet {

namespace {

constexpr int kPerBlock = 2048;  // elements of one sample per block (8 per thread)

struct LossArgs {
  const float *out, *x0, *xt, *noise, *coef;
  float* dout;
  size_t P, D;
  int C, Co, chunks;
  lossmath::Flags f;
};

__global__ void dloss_partial_kernel(LossArgs a, double* partial) {
  pdl_entry();
  __shared__ float c[kLossCoefRows];
  __shared__ double sm[4][kThreads];
  const int b = blockIdx.y, chunk = blockIdx.x, tid = threadIdx.x;
  if (tid < kLossCoefRows) c[tid] = a.coef[(size_t)b * kLossCoefRows + tid];
  __syncthreads();
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const size_t i0 = (size_t)chunk * kPerBlock;
  const size_t i1 = i0 + kPerBlock < a.D ? i0 + kPerBlock : a.D;
  for (size_t i = i0 + tid; i < i1; i += kThreads) {
    const size_t p = i / a.C;
    const int ch = (int)(i - p * a.C);
    const size_t gi = (size_t)b * a.D + i, go = ((size_t)b * a.P + p) * a.Co + ch;
    const lossmath::Elem<float> e = lossmath::element<float>(a.out[go], a.f.learned ? a.out[go + a.C] : 0.0f,
                                                             a.x0[gi], a.xt[gi], a.noise[gi], c, a.f);
    s0 += (double)e.mse, s1 += (double)e.vb, s2 += (double)e.x0_mse, s3 += (double)e.eps_mse;
    if (a.dout) {
      a.dout[go] = e.dmean;
      if (a.f.learned) a.dout[go + a.C] = e.dvar;
    }
  }
  sm[0][tid] = s0, sm[1][tid] = s1, sm[2][tid] = s2, sm[3][tid] = s3;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h >>= 1) {
    if (tid < h)
      for (int k = 0; k < 4; ++k) sm[k][tid] += sm[k][tid + h];
    __syncthreads();
  }
  if (tid < 4) partial[((size_t)b * a.chunks + chunk) * 4 + tid] = sm[tid][0];
}

__global__ void dloss_final_kernel(const double* partial, int B, int chunks, const float* coef, double D,
                                   lossmath::Flags f, float* terms) {
  pdl_entry();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  double s[4] = {0, 0, 0, 0};
  for (int ch = 0; ch < chunks; ++ch)
    for (int k = 0; k < 4; ++k) s[k] += partial[((size_t)b * chunks + ch) * 4 + k];
  lossmath::finish<float>(s[0], s[1], s[2], s[3], D, coef + (size_t)b * kLossCoefRows, f,
                          terms + (size_t)b * kLossTerms);
}

void dloss(const DiffusionLoss& o, CudaCtx& ctx) {
  LossArgs a;
  const int B = (int)o.x0.dim[0];
  a.C = (int)o.x0.dim[3], a.Co = (int)o.out.dim[3];
  a.P = (size_t)o.x0.dim[1] * o.x0.dim[2];
  a.D = a.P * a.C;
  if (B == 0 || a.D == 0) return;
  a.out = dptr<float>(o.out), a.x0 = dptr<float>(o.x0), a.xt = dptr<float>(o.xt),
  a.noise = dptr<float>(o.noise);
  a.coef = dptr<float>(o.coef), a.dout = dptr<float>(o.dout);
  a.f.learned = a.Co == 2 * a.C;
  a.f.predict_xstart = o.predict_xstart, a.f.use_kl = o.use_kl, a.f.clip = o.clip;
  a.f.vb = a.f.learned || o.use_kl;
  a.f.grad = a.dout != nullptr;
  a.chunks = (int)((a.D + kPerBlock - 1) / kPerBlock);
  if ((size_t)B * a.chunks * 4 * sizeof(double) > CudaCtx::kPartialFloats * sizeof(float))
    throw std::runtime_error("diffusion_loss: batch too large for the reduction scratch");
  double* partial = reinterpret_cast<double*>(ctx.partial());
  dloss_partial_kernel<<<dim3(a.chunks, B), kThreads, 0, ctx.stream>>>(a, partial);
  KERNEL_CHECK();
  dloss_final_kernel<<<(B + 127) / 128, 128, 0, ctx.stream>>>(partial, B, a.chunks, a.coef, (double)a.D, a.f,
                                                              dptr<float>(o.terms));
  KERNEL_CHECK();
}

// One thread per statistic, samples in order (B is a batch: a few hundred at most).
__global__ void loss_stats_kernel(const float* terms, const float* coef, float* stats, int B) {
  pdl_entry();
  const int k = threadIdx.x;
  if (k >= 7) return;
  double s = 0;
  for (int b = 0; b < B; ++b) {
    const float* c = coef + (size_t)b * kLossCoefRows;
    const float* t = terms + (size_t)b * kLossTerms;
    const double w = (double)c[kWeight];
    if (k == 0) s += w * (double)t[kTermLoss];
    if (k == 1) s += w * (double)t[kTermMse];
    if (k == 2) s += w * (double)t[kTermVb];
    if (k >= 3 && (int)c[kQuartile] == k - 3) s += w * (double)t[kTermLoss];
  }
  stats[k] = (float)((double)stats[k] + s);
}

void stats(const LossStats& o, CudaCtx& ctx) {
  loss_stats_kernel<<<1, 32, 0, ctx.stream>>>(dptr<float>(o.terms), dptr<float>(o.coef), dptr<float>(o.stats),
                                              (int)o.terms.dim[0]);
  KERNEL_CHECK();
}

}  // namespace

void register_diffusion_loss_cuda(CudaOps& ops) {
  ops.variants<DiffusionLoss>().push_back({"cuda", nullptr, dloss, nullptr});
  ops.variants<LossStats>().push_back({"cuda", nullptr, stats, nullptr});
}

}  // namespace unet
