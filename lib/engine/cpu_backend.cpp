// CpuBackend: construction and memory. Host memory, 256-byte aligned and zeroed, owned by the
// backend until it is destroyed; copies are memcpy and nothing is asynchronous.
#include "cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace unet {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

bool CpuBackend::is_cuda() const { return false; }
std::string CpuBackend::name() const { return "cpu"; }
// The CPU engine computes in fp32 whatever is asked; the setting is only remembered.
void CpuBackend::set_precision(Precision p) { prec_ = p; }
Precision CpuBackend::precision() const { return prec_; }

void* CpuBackend::alloc_bytes(size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256 + (bytes == 0 ? 256 : 0);
  void* p = std::aligned_alloc(256, rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  blocks_.emplace_back(p);
  bytes_ += rounded;
  return p;
}

float* CpuBackend::alloc(size_t n) { return static_cast<float*>(alloc_bytes(n * sizeof(float))); }

void CpuBackend::upload(float* dst, const float* host_src, size_t n) {
  if (n) std::memcpy(dst, host_src, n * sizeof(float));
}
void CpuBackend::download(float* host_dst, const float* src, size_t n) {
  if (n) std::memcpy(host_dst, src, n * sizeof(float));
}
void CpuBackend::upload_bytes(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}
void CpuBackend::copy(float* dst, const float* src, size_t n) {
  if (n && dst != src) std::memmove(dst, src, n * sizeof(float));
}
void CpuBackend::fill(float* x, float v, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) x[i] = v;
}
void CpuBackend::sync() {}
size_t CpuBackend::peak_bytes() const { return bytes_; }

}  // namespace unet
