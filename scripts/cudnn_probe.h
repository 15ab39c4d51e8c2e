// What the cuDNN probes (scripts/cudnn_*_probe.cu, not part of the build) share: a checked call,
// an owned backend descriptor, NHWC tensors and the 3x3 convolution descriptor.
#pragma once
#include <cudnn.h>

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

// A failing cuDNN call prints itself and throws 1.
#define CK(x)                                                                                     \
  do {                                                                                            \
    auto s_ = (x);                                                                                \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudnnGetErrorString(s_)); \
      throw 1;                                                                                    \
    }                                                                                             \
  } while (0)

struct D {
  cudnnBackendDescriptor_t d = nullptr;
  D() = default;
  explicit D(cudnnBackendDescriptorType_t t) { CK(cudnnBackendCreateDescriptor(t, &d)); }
  D(D&& o) noexcept : d(o.d) { o.d = nullptr; }
  D& operator=(D&& o) noexcept {
    std::swap(d, o.d);
    return *this;
  }
  ~D() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
  template <class T>
  void set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const T* v) {
    CK(cudnnBackendSetAttribute(d, a, t, n, v));
  }
  void setd(cudnnBackendAttributeName_t a, const D& o) { set(a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o.d); }
};

// Descriptors a graph references, alive until cleared; tensors get uids 1, 2, ... in order.
inline std::vector<D> keep;
inline int64_t next_uid = 1;

// logical NCHW dims with NHWC strides
inline cudnnBackendDescriptor_t tensor(cudnnDataType_t ty, int64_t n, int64_t c, int64_t h, int64_t w,
                                       bool virt = false, int64_t* uid_out = nullptr) {
  D d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t dims[4] = {n, c, h, w}, strides[4] = {h * w * c, 1, w * c, c}, align = 16;
  int64_t uid = next_uid++;
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ty);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  bool v = virt;
  d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
  CK(cudnnBackendFinalize(d.d));
  if (uid_out) *uid_out = uid;
  keep.push_back(std::move(d));
  return keep.back().d;
}

// Finalizes op (which references sub) and keeps both alive; returns op.
inline cudnnBackendDescriptor_t keep_op(D sub, D op) {
  CK(cudnnBackendFinalize(op.d));
  keep.push_back(std::move(sub));
  keep.push_back(std::move(op));
  return keep.back().d;
}

// A 3x3, stride 1, padding 1 cross-correlation computed in f32.
inline D conv3x3() {
  D conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t nd = 2, pad[2] = {1, 1}, dil[2] = {1, 1}, str[2] = {1, 1};
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nd);
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str);
  CK(cudnnBackendFinalize(conv.d));
  return conv;
}

// The engine configs cuDNN's heuristics list for a finalized graph, best first (none when the
// heuristics refuse the graph).
inline std::vector<D> heuristic_configs(const D& graph, cudnnBackendHeurMode_t mode) {
  D heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.setd(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (cudnnBackendFinalize(heur.d) != CUDNN_STATUS_SUCCESS) return {};
  int64_t n = 0;
  cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr);
  std::vector<D> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < n; ++i) cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR), raw.push_back(cfgs.back().d);
  int64_t got = 0;
  cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, raw.data());
  cfgs.resize((size_t)(got < 0 ? 0 : got < n ? got : n));
  return cfgs;
}
