// Host-side extras of the CUDA engine that plain C++ code (tests, the profiler, the trainer) may
// call. No CUDA headers here, so any .cpp can include it; the class itself is in
// cuda_backend.cuh (CUDA translation units only). Only meaningful when UNET_HAVE_CUDA is defined.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "backend.h"

namespace unet {

// Default size of the op workspace (im2col / col2im buffer, attention score gradients). The
// convolution chunks its batch so that one chunk's patch matrix fits.
constexpr size_t kCudaDefaultWorkspaceBytes = size_t(128) << 20;

// Like make_cuda_backend, with an explicit workspace size (tests use a tiny one to force the
// multi-chunk convolution path).
std::unique_ptr<Backend> make_cuda_backend_with_workspace(size_t workspace_bytes,
                                                          std::string* why_not = nullptr);

// The backend's one stream as an opaque handle (cudaStream_t), for graph capture / profiling.
// Returns nullptr when b is not a CUDA backend.
void* cuda_backend_stream(Backend* b);

// Bytes the backend holds beyond alloc*: the op workspace, reduction scratch and cuBLAS's
// workspace (all allocated once, at construction).
size_t cuda_backend_fixed_bytes(const Backend* b);

}  // namespace unet
