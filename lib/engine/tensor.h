// Typed tensor views: the currency of the op seam.
//
// A Tensor is a non-owning view: a pointer into an engine's memory (host for the CPU engine,
// device for CUDA), an element type and a shape of up to four dimensions. Activations are NHWC
// [B, H, W, C] (channels contiguous); weights keep the engine layout (conv [Co, k, k, Ci], linear
// [O, I]); vectors are [N]. Dimension 0 of every per-sample buffer is the batch, so a batch
// smaller than the planned one is the prefix view `batch(b)`.
//
// bf16 is stored as the upper 16 bits of an IEEE float and rounded to nearest even, exactly as
// CUDA's __float2bfloat16_rn, so the CPU engine can emulate the GPU's rounding points bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef __CUDACC__
#define UNET_HD __host__ __device__
#else
#define UNET_HD
#endif

namespace unet {

enum class DType : uint8_t { F32, BF16, I32 };

inline size_t dtype_size(DType t) { return t == DType::BF16 ? 2 : 4; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
  }
  return "?";
}

// Host-side bf16 <-> float (device code uses cuda_bf16.h; same bits).
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Rounds a float to the nearest bf16 value (kept as a float).
inline float round_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int rank = 0;  // 0 = absent (an optional argument left out)
  int64_t dim[4] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* p, DType t, std::initializer_list<int64_t> dims) : data(p), dtype(t) {
    if (dims.size() < 1 || dims.size() > 4) throw std::logic_error("Tensor: rank must be 1..4");
    for (int64_t d : dims) dim[rank++] = d;
  }

  bool defined() const { return rank > 0; }
  size_t numel() const {
    if (!rank) return 0;
    size_t n = 1;
    for (int i = 0; i < rank; ++i) n *= (size_t)dim[i];
    return n;
  }
  size_t bytes() const { return numel() * dtype_size(dtype); }
  int64_t last() const { return rank ? dim[rank - 1] : 0; }  // channels of an NHWC tensor
  int64_t rows() const { return rank ? (int64_t)(numel() / (size_t)last()) : 0; }
  // Elements per batch entry (all but dimension 0).
  size_t per_sample() const { return rank ? numel() / (size_t)dim[0] : 0; }

  // The first b entries of dimension 0 (a contiguous prefix).
  Tensor batch(int64_t b) const {
    Tensor t = *this;
    if (rank) t.dim[0] = b;
    return t;
  }
  // The same memory with another shape of equal element count.
  Tensor view(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, dims);
    if (t.numel() != numel()) throw std::logic_error("Tensor::view: element count differs");
    return t;
  }
  // Elements [off, off + n) of the flat tensor as a 1-D view.
  Tensor flat(size_t off, size_t n) const {
    return Tensor((char*)data + off * dtype_size(dtype), dtype, {(int64_t)n});
  }

  float* f32() const { return check(DType::F32), static_cast<float*>(data); }
  uint16_t* bf16() const { return check(DType::BF16), static_cast<uint16_t*>(data); }
  int32_t* i32() const { return check(DType::I32), static_cast<int32_t*>(data); }

  std::string str() const;  // "bf16[32,64,64,128]" or "-" when absent

 private:
  void check(DType t) const {
    if (dtype != t)
      throw std::logic_error(std::string("tensor is ") + dtype_name(dtype) + ", not " + dtype_name(t));
  }
};

inline std::string Tensor::str() const {
  if (!rank) return "-";
  std::string s = std::string(dtype_name(dtype)) + "[";
  for (int i = 0; i < rank; ++i) s += (i ? "," : "") + std::to_string(dim[i]);
  return s + "]";
}

inline Tensor f32_tensor(float* p, std::initializer_list<int64_t> dims) {
  return Tensor(p, DType::F32, dims);
}

}  // namespace unet
