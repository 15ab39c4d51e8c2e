// Host-side pieces the implicit-GEMM convolution variants share (simt.cu, mma.cu): a conv's
// geometry in the forward's terms, the shape checks, and the alignment their 16-byte accesses need.
#pragma once
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "cuda_engine.cuh"

namespace unet {
namespace igemm {

// x [B, H, W, Ci] -> y [B, H, W, Co] with a KS x KS filter (stride 1, padding KS / 2).
struct Geo {
  int B, H, W, Ci, Co, KS;
  long long M() const { return (long long)B * H * W; }  // the GEMM's rows: output pixels
};
inline Geo fwd_geo(const ConvFwd& o) {
  return {(int)o.x.dim[0], (int)o.x.dim[1], (int)o.x.dim[2], (int)o.x.dim[3], (int)o.w.dim[0], (int)o.w.dim[1]};
}
inline Geo data_geo(const ConvBwdData& o) {  // in the forward's terms
  return {(int)o.dx.dim[0], (int)o.dx.dim[1], (int)o.dx.dim[2], (int)o.dx.dim[3], (int)o.w.dim[0], (int)o.w.dim[1]};
}
inline Geo filter_geo(const ConvBwdFilter& o) {
  return {(int)o.x.dim[0], (int)o.x.dim[1], (int)o.x.dim[2], (int)o.x.dim[3], (int)o.dw.dim[0], (int)o.dw.dim[1]};
}
// The data gradient as a forward: input dy (Co channels), output dx (Ci).
inline Geo as_forward(const Geo& g) { return {g.B, g.H, g.W, g.Co, g.Ci, g.KS}; }

inline bool same_size(const Tensor& a, const Tensor& b) { return a.dim[1] == b.dim[1] && a.dim[2] == b.dim[2]; }

// Every planned buffer and parameter is 256-byte aligned (planner, parameter arena); the 16-byte
// accesses rely on it.
inline void need_aligned(const char* variant, std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (p && !aligned16(p)) throw std::logic_error(std::string("conv ") + variant + ": a tensor is not 16-byte aligned");
}

}  // namespace igemm
}  // namespace unet
