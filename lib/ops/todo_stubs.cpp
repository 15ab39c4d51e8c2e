// Placeholder definitions; each moves to its lib/ops/<family>.cpp when implemented.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "cpu_backend.h"
#include <stdexcept>

namespace unet {

bool CpuBackend::is_cuda() const { throw std::logic_error("CpuBackend::is_cuda not implemented"); }
std::string CpuBackend::name() const { throw std::logic_error("CpuBackend::name not implemented"); }
void CpuBackend::set_precision(Precision p) { throw std::logic_error("CpuBackend::set_precision not implemented"); }
Precision CpuBackend::precision() const { throw std::logic_error("CpuBackend::precision not implemented"); }
float* CpuBackend::alloc(size_t n) { throw std::logic_error("CpuBackend::alloc not implemented"); }
void* CpuBackend::alloc_bytes(size_t bytes) { throw std::logic_error("CpuBackend::alloc_bytes not implemented"); }
void CpuBackend::upload(float* dst, const float* host_src, size_t n) { throw std::logic_error("CpuBackend::upload not implemented"); }
void CpuBackend::download(float* host_dst, const float* src, size_t n) { throw std::logic_error("CpuBackend::download not implemented"); }
void CpuBackend::upload_bytes(void* dst, const void* host_src, size_t bytes) { throw std::logic_error("CpuBackend::upload_bytes not implemented"); }
void CpuBackend::copy(float* dst, const float* src, size_t n) { throw std::logic_error("CpuBackend::copy not implemented"); }
void CpuBackend::fill(float* x, float v, size_t n) { throw std::logic_error("CpuBackend::fill not implemented"); }
void CpuBackend::sync() { throw std::logic_error("CpuBackend::sync not implemented"); }
size_t CpuBackend::peak_bytes() const { throw std::logic_error("CpuBackend::peak_bytes not implemented"); }
void CpuBackend::conv2d_fwd(const float* x, const float* w, const float* bias, float* y, int B, int H, int W, int Ci, int Co, int k, int stride) { throw std::logic_error("CpuBackend::conv2d_fwd not implemented"); }
void CpuBackend::conv2d_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int B, int H, int W, int Ci, int Co, int k, int stride) { throw std::logic_error("CpuBackend::conv2d_bwd not implemented"); }
void CpuBackend::linear_fwd(const float* x, const float* w, const float* b, float* y, int N, int I, int O) { throw std::logic_error("CpuBackend::linear_fwd not implemented"); }
void CpuBackend::linear_bwd(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int N, int I, int O) { throw std::logic_error("CpuBackend::linear_bwd not implemented"); }
void CpuBackend::groupnorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd, int B, int HW, int C, int G, bool silu) { throw std::logic_error("CpuBackend::groupnorm_fwd not implemented"); }
void CpuBackend::groupnorm_bwd(const float* x, const float* gamma, const float* beta, const float* mean, const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta, int B, int HW, int C, int G, bool silu) { throw std::logic_error("CpuBackend::groupnorm_bwd not implemented"); }
void CpuBackend::silu_fwd(const float* x, float* y, size_t n) { throw std::logic_error("CpuBackend::silu_fwd not implemented"); }
void CpuBackend::silu_bwd(const float* x, const float* dy, float* dx, size_t n) { throw std::logic_error("CpuBackend::silu_bwd not implemented"); }
void CpuBackend::add(const float* a, const float* b, float* y, size_t n) { throw std::logic_error("CpuBackend::add not implemented"); }
void CpuBackend::scale(float* x, float s, size_t n) { throw std::logic_error("CpuBackend::scale not implemented"); }
void CpuBackend::add_bcast_fwd(float* h, const float* e, int B, int HW, int C) { throw std::logic_error("CpuBackend::add_bcast_fwd not implemented"); }
void CpuBackend::add_bcast_bwd(const float* dh, float* de, int B, int HW, int C) { throw std::logic_error("CpuBackend::add_bcast_bwd not implemented"); }
void CpuBackend::scale_shift_fwd(const float* x, const float* ss, float* y, int B, int HW, int C) { throw std::logic_error("CpuBackend::scale_shift_fwd not implemented"); }
void CpuBackend::scale_shift_bwd(const float* x, const float* ss, const float* dy, float* dx, float* dss, int B, int HW, int C) { throw std::logic_error("CpuBackend::scale_shift_bwd not implemented"); }
void CpuBackend::upsample2x_fwd(const float* x, float* y, int B, int H, int W, int C) { throw std::logic_error("CpuBackend::upsample2x_fwd not implemented"); }
void CpuBackend::upsample2x_bwd(const float* dy, float* dx, int B, int H, int W, int C) { throw std::logic_error("CpuBackend::upsample2x_bwd not implemented"); }
void CpuBackend::avgpool2x2_fwd(const float* x, float* y, int B, int H, int W, int C) { throw std::logic_error("CpuBackend::avgpool2x2_fwd not implemented"); }
void CpuBackend::avgpool2x2_bwd(const float* dy, float* dx, int B, int H, int W, int C) { throw std::logic_error("CpuBackend::avgpool2x2_bwd not implemented"); }
void CpuBackend::concat_fwd(const float* a, const float* b, float* y, int B, int HW, int Ca, int Cb) { throw std::logic_error("CpuBackend::concat_fwd not implemented"); }
void CpuBackend::concat_bwd(const float* dy, float* da, float* db, int B, int HW, int Ca, int Cb) { throw std::logic_error("CpuBackend::concat_bwd not implemented"); }
void CpuBackend::timestep_embedding(const float* t, float* y, int B, int dim) { throw std::logic_error("CpuBackend::timestep_embedding not implemented"); }
void CpuBackend::embedding_add_fwd(const int32_t* labels, const float* table, float* y, int B, int D) { throw std::logic_error("CpuBackend::embedding_add_fwd not implemented"); }
void CpuBackend::embedding_bwd(const int32_t* labels, const float* dy, float* dtable, int B, int K, int D) { throw std::logic_error("CpuBackend::embedding_bwd not implemented"); }
void CpuBackend::attention_fwd(const float* qkv, float* out, float* attn, int B, int T, int C, int heads, bool legacy) { throw std::logic_error("CpuBackend::attention_fwd not implemented"); }
void CpuBackend::attention_bwd(const float* qkv, const float* attn, const float* dout, float* dqkv, int B, int T, int C, int heads, bool legacy) { throw std::logic_error("CpuBackend::attention_bwd not implemented"); }
void CpuBackend::dropout_fwd(const float* x, float* y, size_t n, float p, uint64_t seed) { throw std::logic_error("CpuBackend::dropout_fwd not implemented"); }
void CpuBackend::dropout_bwd(const float* dy, float* dx, size_t n, float p, uint64_t seed) { throw std::logic_error("CpuBackend::dropout_bwd not implemented"); }
void CpuBackend::mse_fwd_bwd(const float* pred, const float* target, float* loss, float* dpred, size_t n) { throw std::logic_error("CpuBackend::mse_fwd_bwd not implemented"); }
void CpuBackend::q_sample(const float* x0, const float* noise, const float* sqrt_ab, const float* sqrt_1mab, float* xt, int B, size_t n_per) { throw std::logic_error("CpuBackend::q_sample not implemented"); }
void CpuBackend::axpbypcz(float a, const float* x, float b, float* y, float c, const float* z, size_t n) { throw std::logic_error("CpuBackend::axpbypcz not implemented"); }
void CpuBackend::clamp(float* x, float lo, float hi, size_t n) { throw std::logic_error("CpuBackend::clamp not implemented"); }
void CpuBackend::sum_squares(const float* x, float* out, size_t n) { throw std::logic_error("CpuBackend::sum_squares not implemented"); }
void CpuBackend::adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps, float wd, float bc1, float bc2, const float* grad_scale) { throw std::logic_error("CpuBackend::adamw not implemented"); }
void CpuBackend::clip_scale(const float* sumsq, float clip, float* norm, float* grad_scale) { throw std::logic_error("CpuBackend::clip_scale not implemented"); }
void CpuBackend::ema(float* ema, const float* p, float rate, size_t n) { throw std::logic_error("CpuBackend::ema not implemented"); }

}  // namespace unet
