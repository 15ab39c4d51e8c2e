// Pool variant "cuda": the tokens of guided-diffusion's AttentionPool2d and its pooled token,
// forward and backward, f32 or bf16 activations (f32 math). One thread per (sample, channel) walks
// the positions in order, so the mean (and its sum order) is the CPU reference's; reads and writes
// are contiguous along channels.
#include "cuda_engine.cuh"

namespace unet {

namespace {

// y[b,0,c] = mean_p x[b,p,c] + pos[c,0]; y[b,1+p,c] = x[b,p,c] + pos[c,1+p].
template <class T>
__global__ void tokens_fwd_kernel(const T* x, const float* pos, T* y, int B, int P, int C) {
  pdl_entry();
  const int Tn = P + 1;
  const size_t n = (size_t)B * C, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
    const int c = (int)(i % C);
    const size_t b = i / C;
    const T* xb = x + b * P * C;
    T* yb = y + b * Tn * C;
    float s = 0.f;
    for (int p = 0; p < P; ++p) {
      const float v = ldf(xb, (size_t)p * C + c);
      s += v;
      stf(yb, (size_t)(1 + p) * C + c, v + pos[(size_t)c * Tn + 1 + p]);
    }
    stf(yb, c, s / (float)P + pos[(size_t)c * Tn]);
  }
}

// dx[b,p,c] = dy[b,1+p,c] + dy[b,0,c] / P.
template <class T>
__global__ void tokens_bwd_kernel(const T* dy, T* dx, int B, int P, int C) {
  pdl_entry();
  const int Tn = P + 1;
  const size_t n = (size_t)B * P * C, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
    const int c = (int)(i % C);
    const size_t bp = i / C, b = bp / P, p = bp % P;
    const T* gb = dy + b * Tn * C;
    stf(dx, i, ldf(gb, (1 + p) * C + c) + ldf(gb, c) / (float)P);
  }
}

// dpos[c,t] = sum_b dy[b,t,c], b in order.
template <class T>
__global__ void tokens_dpos_kernel(const T* dy, float* dpos, int B, int Tn, int C) {
  pdl_entry();
  const size_t n = (size_t)Tn * C, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
    const int c = (int)(i % C);
    const size_t t = i / C;
    float s = 0.f;
    for (int b = 0; b < B; ++b) s += ldf(dy, ((size_t)b * Tn + t) * C + c);
    dpos[(size_t)c * Tn + t] = s;
  }
}

template <class T>
__global__ void select_fwd_kernel(const T* x, float* y, int B, int Tn, int C) {
  pdl_entry();
  const size_t n = (size_t)B * C, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = ldf(x, (i / C) * Tn * C + i % C);
}

template <class T>
__global__ void select_bwd_kernel(const float* dy, T* dx, int B, int Tn, int C) {
  pdl_entry();
  const size_t per = (size_t)Tn * C, n = (size_t)B * per, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t b = i / per, j = i % per;
    stf(dx, i, j < (size_t)C ? dy[b * C + j] : 0.f);
  }
}

void tokens_fwd(const PoolTokensFwd& o, CudaCtx& ctx) {
  const int B = (int)o.x.dim[0], P = (int)(o.x.dim[1] * o.x.dim[2]), C = (int)o.x.dim[3];
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    tokens_fwd_kernel<T><<<grid_for((size_t)B * C), kThreads, 0, ctx.stream>>>(
        dptr<T>(o.x), dptr<float>(o.pos), dptr<T>(o.y), B, P, C);
    KERNEL_CHECK();
  });
}

void tokens_bwd(const PoolTokensBwd& o, CudaCtx& ctx) {
  const int B = (int)o.dx.dim[0], P = (int)(o.dx.dim[1] * o.dx.dim[2]), C = (int)o.dx.dim[3];
  with_act(o.dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    tokens_bwd_kernel<T>
        <<<grid_for((size_t)B * P * C), kThreads, 0, ctx.stream>>>(dptr<T>(o.dy), dptr<T>(o.dx), B, P, C);
    KERNEL_CHECK();
    if (o.dpos.defined()) {
      tokens_dpos_kernel<T><<<grid_for((size_t)(P + 1) * C), kThreads, 0, ctx.stream>>>(
          dptr<T>(o.dy), dptr<float>(o.dpos), B, P + 1, C);
      KERNEL_CHECK();
    }
  });
}

void select_fwd(const PoolSelectFwd& o, CudaCtx& ctx) {
  const int B = (int)o.x.dim[0], Tn = (int)o.x.dim[2], C = (int)o.x.dim[3];
  with_act(o.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    select_fwd_kernel<T>
        <<<grid_for((size_t)B * C), kThreads, 0, ctx.stream>>>(dptr<T>(o.x), dptr<float>(o.y), B, Tn, C);
    KERNEL_CHECK();
  });
}

void select_bwd(const PoolSelectBwd& o, CudaCtx& ctx) {
  const int B = (int)o.dx.dim[0], Tn = (int)o.dx.dim[2], C = (int)o.dx.dim[3];
  with_act(o.dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    select_bwd_kernel<T><<<grid_for((size_t)B * Tn * C), kThreads, 0, ctx.stream>>>(dptr<float>(o.dy),
                                                                                    dptr<T>(o.dx), B, Tn, C);
    KERNEL_CHECK();
  });
}

}  // namespace

void register_pool_cuda(CudaOps& ops) {
  ops.variants<PoolTokensFwd>().push_back({"cuda", nullptr, tokens_fwd, nullptr});
  ops.variants<PoolTokensBwd>().push_back({"cuda", nullptr, tokens_bwd, nullptr});
  ops.variants<PoolSelectFwd>().push_back({"cuda", nullptr, select_fwd, nullptr});
  ops.variants<PoolSelectBwd>().push_back({"cuda", nullptr, select_bwd, nullptr});
}

}  // namespace unet
