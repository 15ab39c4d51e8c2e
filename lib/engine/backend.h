// The op interface: every layer op, forward and backward, implemented twice —
// the CPU reference (lib/ops/*.cpp, class CpuBackend) and CUDA (kernels/*.cu, class CudaBackend).
// The model code (lib/model.cpp) is written once against this interface.
//
// Conventions (all ops):
//  * Pointers are in the backend's memory (host for CPU, device for CUDA), float32 unless noted.
//  * Activations are NHWC: [B, H, W, C], channels contiguous. "HW" = H*W.
//  * Conv weights are in the ENGINE layout [Co, kh, kw, Ci] (K = kh*kw*Ci contiguous); the
//    checkpoint module converts from/to PyTorch's [Co, Ci, kh, kw]. Linear weights are [O, I]
//    (PyTorch's layout). Biases may be nullptr where noted.
//  * Backward ops OVERWRITE their outputs (dx, dw, db), never accumulate; any output pointer
//    may be nullptr to skip that gradient. The model adds fan-out gradients with add().
//  * Ops are asynchronous on CUDA (one stream); nothing synchronises the host except the
//    explicit copy_to_host / sync calls.
//  * Reductions are deterministic (fixed order), so identical inputs give bitwise identical
//    outputs run to run — the basis of bit-exact resume.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "rng.h"

#ifdef __CUDACC__
#define UNET_HD __host__ __device__
#else
#define UNET_HD
#endif

namespace unet {

enum class Precision { FP32, TF32, BF16 };
Precision parse_precision(const std::string& s);  // throws UserError
const char* precision_name(Precision p);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual bool is_cuda() const = 0;
  virtual std::string name() const = 0;  // "cpu" or "cuda (NVIDIA H100 ...)"
  virtual void set_precision(Precision p) = 0;
  virtual Precision precision() const = 0;

  // ---- memory: planned up front; never called inside a training step ----
  virtual float* alloc(size_t n) = 0;  // n floats, 256-byte aligned, owned by the backend
  virtual void* alloc_bytes(size_t bytes) = 0;
  virtual void upload(float* dst, const float* host_src, size_t n) = 0;
  virtual void download(float* host_dst, const float* src, size_t n) = 0;  // synchronises
  virtual void upload_bytes(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy(float* dst, const float* src, size_t n) = 0;  // device to device
  virtual void fill(float* x, float v, size_t n) = 0;
  virtual void sync() = 0;
  virtual size_t peak_bytes() const = 0;  // device bytes held: planned allocations + fixed workspaces
  // Host memory for staging uploads (pinned on CUDA so copies are truly asynchronous); owned
  // by the backend; the default is alloc_bytes(), right where backend memory is host memory
  // (CPU). fence() marks the point after all work enqueued so far; fence_wait(id)
  // blocks until the device has reached it (the trainer uses it to know when a pinned batch
  // buffer has been consumed and may be refilled). CPU: plain memory, no-ops.
  virtual void* alloc_host(size_t bytes) { return alloc_bytes(bytes); }
  virtual uint64_t fence() { return 0; }
  virtual void fence_wait(uint64_t id) { (void)id; }

  // CUDA graphs: the ops issued between graph_begin() and graph_end() are recorded (not run)
  // once and replayed by graph_launch() with far less launch overhead. Inside a capture no op
  // may synchronise the host or allocate. Only where supports_graphs() (CUDA).
  virtual bool supports_graphs() const { return false; }
  virtual void graph_begin() {}
  virtual void graph_end() {}
  virtual void graph_launch() {}

  // Marks a named region (layer) for the profiler / NVTX; no-op unless a profiler is attached.
  virtual void range_push(const char* name) { (void)name; }
  virtual void range_pop() {}

  // ---- convolution: kernel k in {1,3}, stride in {1,2}, padding k/2 ----
  // x [B,H,W,Ci], w [Co,k,k,Ci], bias [Co] (nullable), y [B,Ho,Wo,Co], Ho = (H+2p-k)/stride+1.
  virtual void conv2d_fwd(const float* x, const float* w, const float* bias, float* y, int B, int H, int W,
                          int Ci, int Co, int k, int stride) = 0;
  // dy [B,Ho,Wo,Co] -> dx [B,H,W,Ci], dw [Co,k,k,Ci], db [Co] (each nullable).
  virtual void conv2d_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                          int B, int H, int W, int Ci, int Co, int k, int stride) = 0;

  // ---- linear: x [N,I], w [O,I], b [O] (nullable), y [N,O] ----
  virtual void linear_fwd(const float* x, const float* w, const float* b, float* y, int N, int I, int O) = 0;
  virtual void linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                          int N, int I, int O) = 0;

  // ---- GroupNorm (eps 1e-5), x [B,HW,C], G groups; saves mean/rstd [B,G] for backward.
  // If silu is true, y = SiLU(GN(x)) (fused); backward then takes the same flag.
  virtual void groupnorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                             float* rstd, int B, int HW, int C, int G, bool silu) = 0;
  virtual void groupnorm_bwd(const float* x, const float* gamma, const float* beta, const float* mean,
                             const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta,
                             int B, int HW, int C, int G, bool silu) = 0;

  // ---- elementwise ----
  virtual void silu_fwd(const float* x, float* y, size_t n) = 0;
  virtual void silu_bwd(const float* x, const float* dy, float* dx, size_t n) = 0;
  virtual void add(const float* a, const float* b, float* y, size_t n) = 0;  // y = a + b (y may alias)
  virtual void scale(float* x, float s, size_t n) = 0;                       // x *= s
  // h [B,HW,C] += e[b, c] (emb broadcast add); backward: de[b,c] = sum_hw dh (overwrite).
  virtual void add_bcast_fwd(float* h, const float* e, int B, int HW, int C) = 0;
  virtual void add_bcast_bwd(const float* dh, float* de, int B, int HW, int C) = 0;
  // Scale-shift: ss [B,2C] = (scale | shift); y = x*(1+scale)+shift. x and y may alias
  // only in fwd. Backward: dx = dy*(1+scale), dss[b,:C] = sum_hw dy*x, dss[b,C:] = sum_hw dy.
  virtual void scale_shift_fwd(const float* x, const float* ss, float* y, int B, int HW, int C) = 0;
  virtual void scale_shift_bwd(const float* x, const float* ss, const float* dy, float* dx, float* dss, int B,
                               int HW, int C) = 0;

  // ---- resampling: x [B,H,W,C] -> y [B,2H,2W,C] (nearest) / [B,H/2,W/2,C] (2x2 mean) ----
  virtual void upsample2x_fwd(const float* x, float* y, int B, int H, int W, int C) = 0;
  virtual void upsample2x_bwd(const float* dy, float* dx, int B, int H, int W, int C) = 0;
  virtual void avgpool2x2_fwd(const float* x, float* y, int B, int H, int W, int C) = 0;
  virtual void avgpool2x2_bwd(const float* dy, float* dx, int B, int H, int W, int C) = 0;

  // ---- channel concat: a [B,HW,Ca], b [B,HW,Cb] -> y [B,HW,Ca+Cb] (a first) ----
  virtual void concat_fwd(const float* a, const float* b, float* y, int B, int HW, int Ca, int Cb) = 0;
  virtual void concat_bwd(const float* dy, float* da, float* db, int B, int HW, int Ca, int Cb) = 0;

  // ---- embeddings ----
  // t [B] (timesteps as float) -> y [B,dim]: [cos(t*f_i), sin(t*f_i)], f_i = exp(-ln(1e4) i/half)
  virtual void timestep_embedding(const float* t, float* y, int B, int dim) = 0;
  // y [B,D] += table[labels[b]]; labels int32 [B]. Backward: dtable [K,D] = scatter-sum (overwrite).
  virtual void embedding_add_fwd(const int32_t* labels, const float* table, float* y, int B, int D) = 0;
  virtual void embedding_bwd(const int32_t* labels, const float* dy, float* dtable, int B, int K, int D) = 0;

  // ---- attention (QKVAttention / QKVAttentionLegacy of guided-diffusion) ----
  // qkv [B,T,3C] (output of the qkv 1x1 conv in NHWC), out [B,T,C] heads-concatenated with
  // head h owning channels [h*d, (h+1)*d). new order: q = qkv[..., 0:C], k = [C:2C], v = [2C:3C],
  // head h of q is q[..., h*d:(h+1)*d]. legacy: head h owns qkv channels [h*3d, (h+1)*3d) as
  // q|k|v. attn [B*heads, T, T] saves softmax weights for backward (softmax over the key axis).
  virtual void attention_fwd(const float* qkv, float* out, float* attn, int B, int T, int C, int heads,
                             bool legacy) = 0;
  virtual void attention_bwd(const float* qkv, const float* attn, const float* dout, float* dqkv, int B,
                             int T, int C, int heads, bool legacy) = 0;

  // ---- dropout: mask from a counter-based hash of (seed, index), identical on CPU and GPU:
  // keep iff dropout_uniform(seed, i) >= p, kept values scaled by 1/(1-p). ----
  virtual void dropout_fwd(const float* x, float* y, size_t n, float p, uint64_t seed) = 0;
  virtual void dropout_bwd(const float* dy, float* dx, size_t n, float p, uint64_t seed) = 0;

  // ---- loss: mean((pred-target)^2) over n; writes loss to *loss (device scalar) and
  // dpred = 2 (pred - target) / n. ----
  virtual void mse_fwd_bwd(const float* pred, const float* target, float* loss, float* dpred, size_t n) = 0;

  // ---- diffusion helpers ----
  // x_t = sqrt_ab[b]*x0 + sqrt_1mab[b]*noise, per-sample coefficients [B], each sample n_per elements.
  virtual void q_sample(const float* x0, const float* noise, const float* sqrt_ab, const float* sqrt_1mab,
                        float* xt, int B, size_t n_per) = 0;
  // y = a*x + b*y + c*z (per-sample scalars are applied by the caller one sample at a time or
  // with all-equal coefficients); used by samplers.
  virtual void axpbypcz(float a, const float* x, float b, float* y, float c, const float* z, size_t n) = 0;
  virtual void clamp(float* x, float lo, float hi, size_t n) = 0;

  // ---- optimizer (flat parameter arena) ----
  // sumsq[0] = sum x^2 over n (deterministic).
  virtual void sum_squares(const float* x, float* out, size_t n) = 0;
  // AdamW with bias correction; grad is multiplied by *grad_scale (device scalar, for clipping)
  // before use. lr/bias corrections are host scalars computed by the caller.
  virtual void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                     float beta2, float eps, float wd, float bc1, float bc2, const float* grad_scale) = 0;
  // grad_scale = min(1, clip / (sqrt(sumsq)+1e-6)) if clip > 0 else 1; also writes norm.
  virtual void clip_scale(const float* sumsq, float clip, float* norm, float* grad_scale) = 0;
  virtual void ema(float* ema, const float* p, float rate, size_t n) = 0;  // ema = rate*ema+(1-rate)*p
  // AdamW whose per-step scalars live in backend memory so a captured graph can replay it:
  // hyper = {1 - lr*wd, lr/bc1, sqrt(bc2)} as floats, computed by the caller exactly as adamw()
  // computes them. Only the CUDA engine (which captures graphs) implements it.
  virtual void adamw_dev(float* p, const float* g, float* m, float* v, size_t n, const float* hyper,
                         float beta1, float beta2, float eps, const float* grad_scale);
};

// Uniform in [0,1) for dropout, shared by the CPU and CUDA kernels: the project's counter-based
// RNG (lib/rng.h) on its Dropout stream, so the mask of element i is a pure function of (seed, i).
UNET_HD inline float dropout_uniform(uint64_t seed, uint64_t i) {
  return uniform01(seed, Stream::Dropout, i);
}

std::unique_ptr<Backend> make_cpu_backend();
// nullptr when no CUDA device is present or the build has no CUDA.
std::unique_ptr<Backend> make_cuda_backend(std::string* why_not = nullptr);
bool cuda_available();

}  // namespace unet
