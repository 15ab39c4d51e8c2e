// Loss variant "cuda" of the classifier's ops: CrossEntropy (one block per sample: the max, the
// sum of exponentials in double by a fixed tree, the label's rank) and ClassifierStats (one
// thread, samples in order, like the CPU reference). Deterministic, no atomics.
#include <cfloat>

#include "cuda_engine.cuh"

namespace unet {

namespace {

constexpr int kXentThreads = 256;

__global__ void xent_kernel(const float* logits, const int32_t* labels, float* terms, float* dlogits,
                            float scale, int B, int K) {
  pdl_entry();
  __shared__ float smax[kXentThreads];
  __shared__ double ssum[kXentThreads];
  __shared__ int scnt[kXentThreads];
  const int tid = threadIdx.x;
  for (int b = blockIdx.x; b < B; b += gridDim.x) {
    const float* l = logits + (size_t)b * K;
    const int y = labels[b];
    const float ly = l[y];
    float mx = -FLT_MAX;
    int cnt = 0;
    for (int k = tid; k < K; k += kXentThreads) {
      mx = fmaxf(mx, l[k]);
      cnt += l[k] > ly;
    }
    smax[tid] = mx;
    scnt[tid] = cnt;
    __syncthreads();
    for (int s = kXentThreads / 2; s > 0; s >>= 1) {
      if (tid < s) {
        smax[tid] = fmaxf(smax[tid], smax[tid + s]);
        scnt[tid] += scnt[tid + s];
      }
      __syncthreads();
    }
    mx = smax[0];
    const int above = scnt[0];
    double z = 0;
    for (int k = tid; k < K; k += kXentThreads) z += exp((double)(l[k] - mx));
    ssum[tid] = z;
    __syncthreads();
    for (int s = kXentThreads / 2; s > 0; s >>= 1) {
      if (tid < s) ssum[tid] += ssum[tid + s];
      __syncthreads();
    }
    z = ssum[0];
    if (terms && tid == 0) {
      float* t = terms + (size_t)b * kClassTerms;
      t[kClassLoss] = (float)((double)mx + log(z) - (double)ly);
      t[kClassTop1] = above < 1 ? 1.f : 0.f;
      t[kClassTop5] = above < 5 ? 1.f : 0.f;
    }
    if (dlogits) {
      float* d = dlogits + (size_t)b * K;
      for (int k = tid; k < K; k += kXentThreads)
        d[k] = scale * ((float)(exp((double)(l[k] - mx)) / z) - (k == y ? 1.f : 0.f));
    }
    __syncthreads();  // the shared arrays are reused by the next row
  }
}

__global__ void cstats_kernel(const float* terms, const int32_t* quartile, float* stats, int B) {
  pdl_entry();
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s[kClassStats];
  for (int k = 0; k < kClassStats; ++k) s[k] = 0;
  for (int b = 0; b < B; ++b) {
    const int q = quartile[b];
    for (int j = 0; j < kClassTerms; ++j) {
      const double v = terms[(size_t)b * kClassTerms + j];
      s[j] += v;
      if (q >= 0 && q < 4) s[kClassTerms + kClassTerms * q + j] += v;
    }
  }
  for (int k = 0; k < kClassStats; ++k) stats[k] = (float)((double)stats[k] + s[k]);
}

void xent(const CrossEntropy& o, CudaCtx& ctx) {
  const int B = (int)o.logits.dim[0], K = (int)o.logits.dim[1];
  if (!B) return;
  const unsigned grid = (unsigned)(B < 65535 ? B : 65535);  // one block per sample (grid-stride beyond)
  xent_kernel<<<grid, kXentThreads, 0, ctx.stream>>>(dptr<float>(o.logits), dptr<int32_t>(o.labels),
                                                     dptr<float>(o.terms), dptr<float>(o.dlogits), o.scale, B,
                                                     K);
  KERNEL_CHECK();
}

void cstats(const ClassifierStats& o, CudaCtx& ctx) {
  cstats_kernel<<<1, 1, 0, ctx.stream>>>(dptr<float>(o.terms), dptr<int32_t>(o.quartile),
                                         dptr<float>(o.stats), (int)o.terms.dim[0]);
  KERNEL_CHECK();
}

}  // namespace

void register_cross_entropy_cuda(CudaOps& ops) {
  ops.variants<CrossEntropy>().push_back({"cuda", nullptr, xent, nullptr});
  ops.variants<ClassifierStats>().push_back({"cuda", nullptr, cstats, nullptr});
}

}  // namespace unet
