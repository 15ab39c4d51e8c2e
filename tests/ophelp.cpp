#include "ophelp.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>

namespace unet::test {

Engine& cpu_engine(Precision p) {
  static std::map<Precision, std::unique_ptr<Engine>> engines;
  auto& e = engines[p];
  if (!e) e = make_cpu_engine(p);
  return *e;
}

namespace {
std::string& reason() {
  static std::string r;
  return r;
}
}  // namespace

bool have_gpu() {
  static const bool ok = [] {
    if (!cuda_available()) {
      reason() = "no CUDA device found";
      return false;
    }
    return true;
  }();
  return ok;
}
std::string no_gpu_reason() { return have_gpu() ? "" : reason(); }

Engine* gpu_engine(Precision p) {
  if (!have_gpu()) return nullptr;
  static std::map<Precision, std::unique_ptr<Engine>> engines;
  auto& e = engines[p];
  if (!e) e = make_cuda_engine(p, &reason());
  return e.get();
}

std::vector<uint8_t> raw(Engine& e, const Tensor& t) {
  std::vector<uint8_t> b(t.bytes());
  e.download(b.data(), t);
  return b;
}
void set_raw(Engine& e, const Tensor& t, const std::vector<uint8_t>& b) { e.upload(t, b.data()); }

std::vector<float> to_host(Engine& e, const Tensor& t) {
  const std::vector<uint8_t> b = raw(e, t);
  std::vector<float> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::BF16) {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      v[i] = bf16_bits_to_float(h);
    } else if (t.dtype == DType::I32) {
      int32_t h;
      std::memcpy(&h, b.data() + 4 * i, 4);
      v[i] = (float)h;
    } else {
      std::memcpy(&v[i], b.data() + 4 * i, 4);
    }
  }
  return v;
}

void from_host(Engine& e, const Tensor& t, const std::vector<float>& v) {
  std::vector<uint8_t> b(t.bytes());
  for (size_t i = 0; i < t.numel(); ++i) {
    if (t.dtype == DType::BF16) {
      const uint16_t h = float_to_bf16_bits(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    } else if (t.dtype == DType::I32) {
      const int32_t h = (int32_t)v[i];
      std::memcpy(b.data() + 4 * i, &h, 4);
    } else {
      std::memcpy(b.data() + 4 * i, &v[i], 4);
    }
  }
  set_raw(e, t, b);
}

void poison(Engine& e, const Tensor& t) {
  if (t.dtype == DType::I32) {
    std::vector<int32_t> v(t.numel(), std::numeric_limits<int32_t>::max());
    e.upload(t, v.data());
    return;
  }
  from_host(e, t, std::vector<float>(t.numel(), std::numeric_limits<float>::quiet_NaN()));
}

}  // namespace unet::test
