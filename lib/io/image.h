// Image decoding (PNG via libpng, JPEG via libjpeg-turbo), guided-diffusion's resize+center-crop,
// PNG writing and image grids.
//
// Decoding conventions (documented in `unet prepare --help` too):
// - The format is detected from the file's content (magic bytes), never from its extension.
// - Output is always 8-bit RGB. Gray is replicated to R=G=B.
// - 16-bit samples become 8-bit by keeping the high byte (v >> 8), as PIL does when it opens
//   16-bit RGB/RGBA PNGs. (PIL clips 16-bit *grayscale* to 255 instead; we do not copy that.)
// - Alpha (RGBA, gray+alpha, palette/gray/RGB with tRNS) is composited over black:
//   c' = round(c * a / 255). PIL's convert("RGB"), used by guided-diffusion, discards alpha
//   instead; the two agree for opaque images.
// - JPEG: gray, YCbCr/RGB and CMYK/YCCK (converted like PIL: (255-c)(255-k)/255, Adobe-inverted
//   when the Adobe marker says so). libjpeg's default IDCT and fancy upsampling, as PIL uses.
//   EXIF orientation is not applied (neither PIL's Image.open nor guided-diffusion applies it).
// - Corrupt or truncated files throw UserError("<path>: <reason>"); the libraries never print.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace unet {

struct Image {
  int w = 0, h = 0;
  std::vector<uint8_t> rgb;  // h * w * 3, row-major HWC
};

// Images above this many pixels are refused before their pixels are allocated: PIL's bound
// (2 * Image.MAX_IMAGE_PIXELS, where it raises DecompressionBombError). prepare --max-pixels.
constexpr uint64_t kDefaultMaxPixels = 2ull * 89478485ull;

// Decodes a PNG or JPEG file (see the conventions above). Throws UserError naming the file;
// an image of more than max_pixels pixels (or a file too large to be one) is refused.
Image decode_image_file(const std::string& path, uint64_t max_pixels = kDefaultMaxPixels);
// The same from memory; `name` is used in error messages.
Image decode_image(const uint8_t* data, size_t size, const std::string& name,
                   uint64_t max_pixels = kDefaultMaxPixels);
// "png", "jpeg" or "" from the first bytes of a file (at least 8 bytes are looked at).
std::string sniff_image_format(const uint8_t* data, size_t size);

// guided-diffusion's center_crop_arr, reproducing PIL (Pillow >= 7) bit for bit:
//   while min(w,h) >= 2*size: resize to (w//2, h//2) with PIL's BOX filter;
//   scale = size / min(w,h); resize to (round(w*scale), round(h*scale)) with PIL's BICUBIC
//   (a = -0.5, support widened by the downscale factor, 22-bit fixed-point coefficients,
//   horizontal pass then vertical, each rounded to 8 bits); round() is Python's (half to even);
//   then crop size x size at ((h-size)//2, (w-size)//2).
Image resize_center_crop(const Image& img, int size);

enum class Filter { Box, Bilinear, Bicubic };
// PIL's Image.resize(new size, filter) for RGB images (exposed for tests).
Image resize_pil(const Image& img, int new_w, int new_h, Filter filter);

// Writes an 8-bit RGB PNG through AtomicFile (temporary name, renamed into place).
void write_png(const std::string& path, const uint8_t* rgb, int w, int h);

// torchvision.utils.make_grid(nrow=ceil(sqrt(n)), padding=2, pad_value=0) for N HWC RGB images:
// ceil(sqrt(n)) images per row, 2-pixel black borders around and between them. As in
// torchvision, a single image is returned as is (no border).
std::vector<uint8_t> make_grid(const uint8_t* imgs, int n, int h, int w, int* out_w, int* out_h);

}  // namespace unet
