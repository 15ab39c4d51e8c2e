// Converting model outputs to pictures: guided-diffusion's ((x+1)*127.5).clamp(0,255) -> uint8
// (truncation, as its image_sample.py does), PNG grids and per-image PNGs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace unet {

// x -> uint8 elementwise (any layout, channels kept).
std::vector<uint8_t> to_uint8(const float* x, size_t n);
// x NHWC float [n,H,W,C] -> uint8 [n,H,W,3] (C=1 replicated to gray RGB; C>3 keeps the first 3).
std::vector<uint8_t> to_uint8_rgb(const float* x, int n, int H, int W, int C);
void save_grid_png(const std::string& path, const float* x, int n, int H, int W, int C);
void save_pngs(const std::string& dir, const float* x, int n, int H, int W, int C);

}  // namespace unet
