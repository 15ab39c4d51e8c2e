#include "image.h"

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "util.h"

namespace unet {

namespace {

[[noreturn]] void bad(const std::string& name, const std::string& why) { throw UserError(name + ": " + why); }

// Composites RGBA/gray-alpha over black: c' = round(c * a / 255).
inline uint8_t over_black(unsigned c, unsigned a) { return (uint8_t)((c * a + 127) / 255); }

// ---- PNG -------------------------------------------------------------------------------------
// libpng reports errors by longjmp; everything the decoder allocates lives in this context,
// owned by the caller's frame (not the frame that calls setjmp), so nothing is lost on the jump.
struct PngCtx {
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  char msg[256] = {0};
  bool intact = false;  // the failure is a limit or memory, not damage: msg says all
  std::vector<uint8_t> buf;
  std::vector<png_bytep> rows;
  int w = 0, h = 0, channels = 0;
  uint64_t max_pixels = kDefaultMaxPixels;
};

// The refusal of a file the decoder failed on: "<FMT> <msg>" when the file is intact (above the
// pixel limit, out of memory, a layout we do not read), else "corrupt <FMT> (<msg>)".
std::string decode_failure(const char* fmt, bool intact, const char* msg) {
  return intact ? std::string(fmt) + " " + msg : std::string("corrupt ") + fmt + " (" + msg + ")";
}

std::string too_large(uint64_t w, uint64_t h, uint64_t max) {
  return std::to_string(w) + "x" + std::to_string(h) + " = " + std::to_string(w * h) +
         " pixels, above the limit of " + std::to_string(max) + " (prepare --max-pixels)";
}

void png_error_fn(png_structp png, png_const_charp msg) {
  auto* c = static_cast<PngCtx*>(png_get_error_ptr(png));
  std::snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "PNG error");
  png_longjmp(png, 1);
}
void png_warning_fn(png_structp, png_const_charp) {}  // warnings are not the user's business

void png_read_mem(png_structp png, png_bytep out, png_size_t len) {
  auto* c = static_cast<PngCtx*>(png_get_io_ptr(png));
  if (c->size - c->pos < len) png_error(png, "truncated file");
  std::memcpy(out, c->data + c->pos, len);
  c->pos += len;
}

// Returns false with c->msg set on failure.
bool png_decode(PngCtx* c) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, c, png_error_fn, png_warning_fn);
  if (!png) {
    std::snprintf(c->msg, sizeof c->msg, "out of memory");
    c->intact = true;
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    if (!c->msg[0]) std::snprintf(c->msg, sizeof c->msg, "out of memory"), c->intact = true;
    return false;
  }
  png_set_read_fn(png, c, png_read_mem);
  png_set_benign_errors(png, 1);  // tolerate what PIL tolerates (bad ancillary chunks, ...)
  png_read_info(png, info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, ctype = 0;
  png_get_IHDR(png, info, &w, &h, &depth, &ctype, nullptr, nullptr, nullptr);
  if (w == 0 || h == 0) png_error(png, "empty image");
  if ((uint64_t)w * h > c->max_pixels) {
    c->intact = true;
    png_error(png, too_large(w, h, c->max_pixels).c_str());
  }
  if (depth == 16) png_set_strip_16(png);  // keep the high byte, as PIL's "RGB;16B" unpacker
  if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  int ch = png_get_channels(png, info);
  size_t rowbytes = png_get_rowbytes(png, info);
  if ((ch != 3 && ch != 4) || rowbytes != (size_t)w * ch) png_error(png, "unsupported PNG layout");
  c->buf.resize((size_t)h * rowbytes);
  c->rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) c->rows[y] = c->buf.data() + y * rowbytes;
  png_read_image(png, c->rows.data());
  // The trailing chunks (IEND, text after the image) are not read: a missing IEND after complete
  // image data is harmless, and PIL ignores it too.
  png_destroy_read_struct(&png, &info, nullptr);
  c->w = (int)w;
  c->h = (int)h;
  c->channels = ch;
  return true;
}

Image decode_png(const uint8_t* data, size_t size, const std::string& name, uint64_t max_pixels) {
  PngCtx c;
  c.max_pixels = max_pixels;
  c.data = data;
  c.size = size;
  if (!png_decode(&c)) bad(name, decode_failure("PNG", c.intact, c.msg));
  Image im;
  im.w = c.w;
  im.h = c.h;
  size_t n = (size_t)c.w * c.h;
  if (c.channels == 3) {
    im.rgb = std::move(c.buf);
  } else {
    im.rgb.resize(n * 3);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* p = &c.buf[i * 4];
      for (int k = 0; k < 3; ++k) im.rgb[i * 3 + k] = over_black(p[k], p[3]);
    }
  }
  return im;
}

// ---- JPEG ------------------------------------------------------------------------------------
struct JpegErr {
  jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX + 32];
};

void jpeg_error_exit_fn(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->msg);
  longjmp(e->jb, 1);
}

// Warnings are ignored except premature end of data, which means a truncated file: PIL refuses
// those too ("image file is truncated"), and a half-grey image must not enter a dataset.
void jpeg_emit_message_fn(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* e = reinterpret_cast<JpegErr*>(cinfo->err);
    std::snprintf(e->msg, sizeof e->msg, "truncated file");
    longjmp(e->jb, 1);
  }
}
void jpeg_output_message_fn(j_common_ptr) {}

struct JpegCtx {
  jpeg_decompress_struct cinfo;
  JpegErr err;
  std::vector<uint8_t> buf;
  int w = 0, h = 0, channels = 0;
  bool adobe = false;
  bool intact = false;  // the failure is a limit or an unsupported layout, not damage
  uint64_t max_pixels = kDefaultMaxPixels;
};

bool jpeg_decode(JpegCtx* c, const uint8_t* data, size_t size) {
  c->cinfo.err = jpeg_std_error(&c->err.pub);
  c->err.pub.error_exit = jpeg_error_exit_fn;
  c->err.pub.emit_message = jpeg_emit_message_fn;
  c->err.pub.output_message = jpeg_output_message_fn;
  c->err.msg[0] = 0;
  if (setjmp(c->err.jb)) {
    jpeg_destroy_decompress(&c->cinfo);
    return false;
  }
  jpeg_create_decompress(&c->cinfo);
  jpeg_mem_src(&c->cinfo, data, (unsigned long)size);
  jpeg_read_header(&c->cinfo, TRUE);
  j_decompress_ptr ci = &c->cinfo;
  if ((uint64_t)ci->image_width * ci->image_height > c->max_pixels || ci->image_width == 0 ||
      ci->image_height == 0) {
    std::snprintf(c->err.msg, sizeof c->err.msg, "%s",
                  ci->image_width == 0 || ci->image_height == 0
                      ? "empty image"
                      : too_large(ci->image_width, ci->image_height, c->max_pixels).c_str());
    c->intact = ci->image_width != 0 && ci->image_height != 0;
    jpeg_destroy_decompress(ci);
    return false;
  }
  switch (ci->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
      ci->out_color_space = JCS_RGB;
      break;
    case JCS_CMYK:
    case JCS_YCCK:
      ci->out_color_space = JCS_CMYK;
      break;
    default:
      std::snprintf(c->err.msg, sizeof c->err.msg, "unsupported color space");
      c->intact = true;
      jpeg_destroy_decompress(ci);
      return false;
  }
  jpeg_start_decompress(ci);
  int ch = ci->output_components;
  if (ch != 3 && ch != 4) {
    std::snprintf(c->err.msg, sizeof c->err.msg, "unsupported layout");
    c->intact = true;
    jpeg_destroy_decompress(ci);
    return false;
  }
  c->w = (int)ci->output_width;
  c->h = (int)ci->output_height;
  c->channels = ch;
  c->adobe = ci->saw_Adobe_marker;
  c->buf.resize((size_t)c->w * c->h * ch);
  while (ci->output_scanline < ci->output_height) {
    JSAMPROW row = c->buf.data() + (size_t)ci->output_scanline * c->w * ch;
    jpeg_read_scanlines(ci, &row, 1);
  }
  jpeg_finish_decompress(ci);
  jpeg_destroy_decompress(ci);
  return true;
}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name, uint64_t max_pixels) {
  auto c = std::make_unique<JpegCtx>();
  c->max_pixels = max_pixels;
  if (!jpeg_decode(c.get(), data, size)) bad(name, decode_failure("JPEG", c->intact, c->err.msg));
  Image im;
  im.w = c->w;
  im.h = c->h;
  if (c->channels == 3) {
    im.rgb = std::move(c->buf);
  } else {
    // PIL: Adobe CMYK JPEGs are stored inverted ("CMYK;I"); cmyk2rgb computes
    // nk - MULDIV255(c, nk) with nk = 255 - k.
    size_t n = (size_t)c->w * c->h;
    im.rgb.resize(n * 3);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* p = &c->buf[i * 4];
      int k = c->adobe ? 255 - p[3] : p[3];
      int nk = 255 - k;
      for (int j = 0; j < 3; ++j) {
        int v = c->adobe ? 255 - p[j] : p[j];
        int tmp = v * nk + 128;
        int r = nk - (((tmp >> 8) + tmp) >> 8);
        im.rgb[i * 3 + j] = (uint8_t)std::clamp(r, 0, 255);
      }
    }
  }
  return im;
}

}  // namespace

std::string sniff_image_format(const uint8_t* d, size_t n) {
  static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (n >= 8 && std::memcmp(d, png_sig, 8) == 0) return "png";
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return "jpeg";
  return "";
}

Image decode_image(const uint8_t* data, size_t size, const std::string& name, uint64_t max_pixels) {
  std::string fmt = sniff_image_format(data, size);
  if (fmt == "png") return decode_png(data, size, name, max_pixels);
  if (fmt == "jpeg") return decode_jpeg(data, size, name, max_pixels);
  if (size == 0) bad(name, "empty file");
  bad(name, "not a PNG or JPEG image");
}

Image decode_image_file(const std::string& path, uint64_t max_pixels) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) bad(path, "cannot read");
  // No image within the pixel limit is larger than 8 bytes a pixel (16-bit RGBA) plus headers:
  // refuse a bigger file before reading it into memory.
  const std::streamoff size = in.tellg();
  if (size < 0) bad(path, "cannot read");
  if ((uint64_t)size > max_pixels * 8 + (1u << 20))
    bad(path, std::to_string(size) + " bytes, too large for an image within the limit of " +
                  std::to_string(max_pixels) + " pixels (prepare --max-pixels)");
  in.seekg(0);
  std::vector<uint8_t> data((size_t)size);
  if (size > 0 && !in.read(reinterpret_cast<char*>(data.data()), size)) bad(path, "read error");
  return decode_image(data.data(), data.size(), path, max_pixels);
}

// ---- resampling, as Pillow's libImaging/Resample.c ---------------------------------------
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }
double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}
double bicubic_filter(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // [out][xmin, count]
  std::vector<int32_t> kk;  // [out][ksize], 22-bit fixed point
};

// precompute_coeffs + normalize_coeffs_8bpc with box = (0, in_size). The arithmetic is kept in
// the same types and order as Pillow's so the fixed-point coefficients come out identical.
Coeffs precompute(int in_size, int out_size, Filter f) {
  double (*filter)(double) = f == Filter::Box        ? box_filter
                             : f == Filter::Bilinear ? bilinear_filter
                                                     : bicubic_filter;
  double fsupport = f == Filter::Box ? 0.5 : f == Filter::Bilinear ? 1.0 : 2.0;
  float in0 = 0.0f, in1 = (float)in_size;
  double scale, filterscale;
  filterscale = scale = (double)(in1 - in0) / out_size;
  if (filterscale < 1.0) filterscale = 1.0;
  double support = fsupport * filterscale;
  Coeffs c;
  c.ksize = (int)std::ceil(support) * 2 + 1;
  c.bounds.resize((size_t)out_size * 2);
  c.kk.assign((size_t)out_size * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; xx++) {
    double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    double ss = 1.0 / filterscale;
    int xmin = (int)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = (int)(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    int x;
    for (x = 0; x < xmax; x++) {
      double w = filter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (x = 0; x < xmax; x++)
      if (ww != 0.0) k[x] /= ww;
    for (; x < c.ksize; x++) k[x] = 0;
    for (x = 0; x < c.ksize; x++) {
      double v = k[x];
      c.kk[(size_t)xx * c.ksize + x] =
          v < 0 ? (int32_t)(-0.5 + v * (1 << kPrecisionBits)) : (int32_t)(0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  return c;
}

inline uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;  // arithmetic shift, as Pillow's lookup index
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

Image resample_h(const Image& in, int out_w, Filter f) {
  Coeffs c = precompute(in.w, out_w, f);
  Image out;
  out.w = out_w;
  out.h = in.h;
  out.rgb.resize((size_t)out_w * in.h * 3);
  for (int y = 0; y < in.h; ++y) {
    const uint8_t* src = &in.rgb[(size_t)y * in.w * 3];
    uint8_t* dst = &out.rgb[(size_t)y * out_w * 3];
    for (int xx = 0; xx < out_w; ++xx) {
      int xmin = c.bounds[xx * 2], xmax = c.bounds[xx * 2 + 1];
      const int32_t* k = &c.kk[(size_t)xx * c.ksize];
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int x = 0; x < xmax; ++x) {
        const uint8_t* p = src + (size_t)(x + xmin) * 3;
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
      }
      dst[xx * 3] = clip8(s0);
      dst[xx * 3 + 1] = clip8(s1);
      dst[xx * 3 + 2] = clip8(s2);
    }
  }
  return out;
}

Image resample_v(const Image& in, int out_h, Filter f) {
  Coeffs c = precompute(in.h, out_h, f);
  Image out;
  out.w = in.w;
  out.h = out_h;
  out.rgb.resize((size_t)in.w * out_h * 3);
  size_t stride = (size_t)in.w * 3;
  for (int yy = 0; yy < out_h; ++yy) {
    int ymin = c.bounds[yy * 2], ymax = c.bounds[yy * 2 + 1];
    const int32_t* k = &c.kk[(size_t)yy * c.ksize];
    uint8_t* dst = &out.rgb[(size_t)yy * stride];
    for (size_t xc = 0; xc < stride; ++xc) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < ymax; ++y) s += in.rgb[(size_t)(y + ymin) * stride + xc] * k[y];
      dst[xc] = clip8(s);
    }
  }
  return out;
}

}  // namespace

Image resize_pil(const Image& img, int new_w, int new_h, Filter filter) {
  if (new_w <= 0 || new_h <= 0 || img.w <= 0 || img.h <= 0)
    throw std::invalid_argument("resize_pil: empty size");
  // Pillow: horizontal pass (8-bit intermediate) first, then vertical; a pass whose size does
  // not change is skipped.
  if (new_w == img.w && new_h == img.h) return img;
  if (new_w == img.w) return resample_v(img, new_h, filter);
  Image t = resample_h(img, new_w, filter);
  if (new_h == img.h) return t;
  return resample_v(t, new_h, filter);
}

Image resize_center_crop(const Image& img, int size) {
  if (size <= 0) throw std::invalid_argument("resize_center_crop: size must be positive");
  if (img.w <= 0 || img.h <= 0) throw std::invalid_argument("resize_center_crop: empty image");
  Image cur = img;
  while (std::min(cur.w, cur.h) >= 2 * size) cur = resize_pil(cur, cur.w / 2, cur.h / 2, Filter::Box);
  double scale = (double)size / std::min(cur.w, cur.h);
  // Python's round(): half to even, which std::rint does in the default rounding mode.
  int nw = std::max(size, (int)std::rint(cur.w * scale));
  int nh = std::max(size, (int)std::rint(cur.h * scale));
  cur = resize_pil(cur, nw, nh, Filter::Bicubic);
  int cy = (cur.h - size) / 2, cx = (cur.w - size) / 2;
  Image out;
  out.w = out.h = size;
  out.rgb.resize((size_t)size * size * 3);
  for (int y = 0; y < size; ++y)
    std::memcpy(&out.rgb[(size_t)y * size * 3], &cur.rgb[((size_t)(y + cy) * cur.w + cx) * 3],
                (size_t)size * 3);
  return out;
}

// ---- PNG writing -----------------------------------------------------------------------------
namespace {
struct PngWriteCtx {
  char msg[256] = {0};
  FILE* fp = nullptr;
  int err = 0;  // errno of a failed write (disk full, file too large)
};
// libpng's stdio writer reports a short write as "Write Error"; keep the reason instead.
void png_write_fn(png_structp png, png_bytep data, png_size_t len) {
  auto* c = static_cast<PngWriteCtx*>(png_get_io_ptr(png));
  if (std::fwrite(data, 1, len, c->fp) != len) {
    c->err = errno ? errno : EIO;
    png_error(png, std::strerror(c->err));
  }
}
void png_flush_fn(png_structp png) {
  auto* c = static_cast<PngWriteCtx*>(png_get_io_ptr(png));
  if (std::fflush(c->fp) != 0) {
    c->err = errno ? errno : EIO;
    png_error(png, std::strerror(c->err));
  }
}
void png_write_error_fn(png_structp png, png_const_charp msg) {
  auto* c = static_cast<PngWriteCtx*>(png_get_error_ptr(png));
  std::snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "PNG error");
  png_longjmp(png, 1);
}

bool png_write_file(FILE* fp, int w, int h, PngWriteCtx* c, std::vector<png_bytep>* rows) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, c, png_write_error_fn, png_warning_fn);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info ? &info : nullptr);
    return false;
  }
  c->fp = fp;
  png_set_write_fn(png, c, png_write_fn, png_flush_fn);
  png_set_IHDR(png, info, w, h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows->data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}
}  // namespace

void write_png(const std::string& path, const uint8_t* rgb, int w, int h) {
  if (w <= 0 || h <= 0) throw std::invalid_argument("write_png: empty image");
  AtomicFile af(path);
  FILE* fp = std::fopen(af.tmp_path().c_str(), "wb");
  if (!fp) throw UserError(path + ": cannot write (" + std::strerror(errno) + ")");
  PngWriteCtx c;
  std::vector<png_bytep> rows(h);
  for (int y = 0; y < h; ++y) rows[y] = const_cast<png_bytep>(rgb + (size_t)y * w * 3);
  bool ok = png_write_file(fp, w, h, &c, &rows);
  if (ok && std::fflush(fp) != 0) ok = false, c.err = errno;
  if (std::fclose(fp) != 0 && ok) ok = false, c.err = errno;
  if (!ok)
    throw UserError(path + ": cannot write (" +
                    (c.err      ? std::strerror(c.err)
                     : c.msg[0] ? c.msg
                                : "disk full or I/O error") +
                    ")");
  af.commit();
}

std::vector<uint8_t> make_grid(const uint8_t* imgs, int n, int h, int w, int* out_w, int* out_h) {
  if (n <= 0 || h <= 0 || w <= 0) throw std::invalid_argument("make_grid: empty input");
  if (n == 1) {  // torchvision returns a single image unpadded
    *out_w = w;
    *out_h = h;
    return std::vector<uint8_t>(imgs, imgs + (size_t)h * w * 3);
  }
  const int pad = 2;
  int ncol = (int)std::ceil(std::sqrt((double)n));
  while ((long)ncol * ncol < n) ++ncol;  // guard against sqrt rounding
  while (ncol > 1 && (long)(ncol - 1) * (ncol - 1) >= n) --ncol;
  ncol = std::min(ncol, n);
  int nrow = (n + ncol - 1) / ncol;
  int gw = (w + pad) * ncol + pad, gh = (h + pad) * nrow + pad;
  std::vector<uint8_t> g((size_t)gw * gh * 3, 0);
  for (int i = 0; i < n; ++i) {
    int r = i / ncol, c = i % ncol;
    int y0 = r * (h + pad) + pad, x0 = c * (w + pad) + pad;
    for (int y = 0; y < h; ++y)
      std::memcpy(&g[((size_t)(y0 + y) * gw + x0) * 3], imgs + ((size_t)i * h * w + (size_t)y * w) * 3,
                  (size_t)w * 3);
  }
  *out_w = gw;
  *out_h = gh;
  return g;
}

}  // namespace unet
