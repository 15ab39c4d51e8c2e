#include "grid.h"

#include <cmath>
#include <cstdio>

#include "image.h"

namespace unet {

namespace {
uint8_t pixel(float v) {
  float s = (v + 1.0f) * 127.5f;
  s = std::isnan(s) ? 0.0f : std::fmin(std::fmax(s, 0.0f), 255.0f);
  return (uint8_t)s;  // truncation, like torch's .to(uint8)
}
}  // namespace

std::vector<uint8_t> to_uint8(const float* x, size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = pixel(x[i]);
  return out;
}

std::vector<uint8_t> to_uint8_rgb(const float* x, int n, int H, int W, int C) {
  std::vector<uint8_t> out((size_t)n * H * W * 3);
  for (size_t p = 0; p < (size_t)n * H * W; ++p)
    for (int c = 0; c < 3; ++c) out[p * 3 + c] = pixel(x[p * C + (C == 1 ? 0 : std::min(c, C - 1))]);
  return out;
}

void save_grid_png(const std::string& path, const float* x, int n, int H, int W, int C) {
  auto rgb = to_uint8_rgb(x, n, H, W, C);
  int gw = 0, gh = 0;
  auto grid = make_grid(rgb.data(), n, H, W, &gw, &gh);
  write_png(path, grid.data(), gw, gh);
}

void save_pngs(const std::string& dir, const float* x, int n, int H, int W, int C) {
  auto rgb = to_uint8_rgb(x, n, H, W, C);
  for (int i = 0; i < n; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/%06d.png", i);
    write_png(dir + name, rgb.data() + (size_t)i * H * W * 3, W, H);
  }
}

}  // namespace unet
