// Image decoding (every PNG color type / bit depth, JPEG), PIL-exact resize + center crop,
// PNG writing, grids, and corrupt-file errors.
#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>

#include "image.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {

std::string tmp(const std::string& name) { return test::temp_dir("img") + "/" + name; }

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}
void write_all(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string capture_stderr_of(const std::function<void()>& fn) {
  fflush(stderr);
  std::string path = tmp("stderr.txt");
  int saved = dup(2);
  FILE* f = fopen(path.c_str(), "w");
  dup2(fileno(f), 2);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(f);
  return read_all(path);
}

// Writes a PNG with an arbitrary color type / bit depth from unpacked samples (one uint16 per
// sample, row-major), packing sub-byte depths and big-endian 16-bit as the format requires.
struct PngSpec {
  int w, h, color_type, depth;
  std::vector<uint16_t> samples;
  std::vector<png_color> palette;
  std::vector<uint8_t> trns_alpha;  // palette tRNS
  bool has_trns_color = false;
  png_color_16 trns_color{};
  bool interlace = false;
};

int channels_of(int ct) {
  switch (ct) {
    case PNG_COLOR_TYPE_GRAY:
      return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return 2;
    case PNG_COLOR_TYPE_PALETTE:
      return 1;
    case PNG_COLOR_TYPE_RGB:
      return 3;
    default:
      return 4;
  }
}

void write_png_spec(const std::string& path, const PngSpec& s) {
  FILE* fp = fopen(path.c_str(), "wb");
  ASSERT_TRUE(fp);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, fp);
  png_set_IHDR(png, info, s.w, s.h, s.depth, s.color_type,
               s.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!s.palette.empty()) png_set_PLTE(png, info, s.palette.data(), (int)s.palette.size());
  if (!s.trns_alpha.empty()) png_set_tRNS(png, info, s.trns_alpha.data(), (int)s.trns_alpha.size(), nullptr);
  if (s.has_trns_color) png_set_tRNS(png, info, nullptr, 0, const_cast<png_color_16*>(&s.trns_color));
  png_write_info(png, info);
  int ch = channels_of(s.color_type);
  size_t rowbytes = ((size_t)s.w * ch * s.depth + 7) / 8;
  std::vector<std::vector<uint8_t>> rows(s.h, std::vector<uint8_t>(rowbytes, 0));
  for (int y = 0; y < s.h; ++y)
    for (int i = 0; i < s.w * ch; ++i) {
      uint16_t v = s.samples[(size_t)y * s.w * ch + i];
      auto& r = rows[y];
      if (s.depth == 16) {
        r[i * 2] = v >> 8;
        r[i * 2 + 1] = v & 255;
      } else if (s.depth == 8) {
        r[i] = (uint8_t)v;
      } else {
        int bit = i * s.depth;
        r[bit / 8] |= (uint8_t)(v << (8 - s.depth - bit % 8));
      }
    }
  std::vector<png_bytep> ptrs;
  for (auto& r : rows) ptrs.push_back(r.data());
  png_write_image(png, ptrs.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  fclose(fp);
}

uint8_t over_black_ref(double c, double a) { return (uint8_t)std::lround(c * a / 255.0); }

void write_jpeg(const std::string& path, const uint8_t* data, int w, int h, int comps, J_COLOR_SPACE cs,
                int quality) {
  jpeg_compress_struct ci;
  jpeg_error_mgr err;
  ci.err = jpeg_std_error(&err);
  jpeg_create_compress(&ci);
  FILE* fp = fopen(path.c_str(), "wb");
  jpeg_stdio_dest(&ci, fp);
  ci.image_width = w;
  ci.image_height = h;
  ci.input_components = comps;
  ci.in_color_space = cs;
  jpeg_set_defaults(&ci);
  jpeg_set_quality(&ci, quality, TRUE);
  for (int i = 0; i < ci.num_components; ++i)
    ci.comp_info[i].h_samp_factor = ci.comp_info[i].v_samp_factor = 1;
  jpeg_start_compress(&ci, TRUE);
  while (ci.next_scanline < ci.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(data + (size_t)ci.next_scanline * w * comps);
    jpeg_write_scanlines(&ci, &row, 1);
  }
  jpeg_finish_compress(&ci);
  jpeg_destroy_compress(&ci);
  fclose(fp);
}

// A smooth random-ish RGB image (JPEG-friendly) with a per-run seed.
std::vector<uint8_t> smooth_image(int w, int h, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(0, 1);
  double a[3], b[3], c[3];
  for (int k = 0; k < 3; ++k) a[k] = u(g) * 6, b[k] = u(g) * 6, c[k] = u(g) * 6;
  std::vector<uint8_t> v((size_t)w * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < 3; ++k)
        v[((size_t)y * w + x) * 3 + k] =
            (uint8_t)std::lround(127.5 + 100 * std::sin(a[k] * x / w + b[k] * y / h + c[k]));
  return v;
}

std::vector<uint8_t> noise_image(int w, int h, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint8_t> v((size_t)w * h * 3);
  for (auto& x : v) x = (uint8_t)g();
  return v;
}

bool has_pil() { return std::system("/usr/bin/python3 -c 'import PIL.Image, numpy' >/dev/null 2>&1") == 0; }

}  // namespace

// ---- PNG decoding: every color type and bit depth --------------------------------------------
TEST(Image, PngGray) {
  std::mt19937 g(test::test_seed());
  for (int depth : {1, 2, 4, 8, 16}) {
    PngSpec s{7, 5, PNG_COLOR_TYPE_GRAY, depth, {}, {}, {}, false, {}, false};
    int maxv = (1 << depth) - 1;
    for (int i = 0; i < 35; ++i) s.samples.push_back((uint16_t)(g() % (maxv + 1)));
    std::string p = tmp("gray" + std::to_string(depth) + ".png");
    write_png_spec(p, s);
    Image im = decode_image_file(p);
    ASSERT_EQ(im.w, 7);
    ASSERT_EQ(im.h, 5);
    for (int i = 0; i < 35; ++i) {
      // sub-byte depths scale to the full range (bit replication), 16-bit keeps the high byte
      uint8_t want = depth == 16 ? s.samples[i] >> 8 : (uint8_t)(s.samples[i] * 255 / maxv);
      for (int k = 0; k < 3; ++k) ASSERT_EQ(im.rgb[i * 3 + k], want) << "depth " << depth << " px " << i;
    }
  }
}

TEST(Image, PngGrayAlphaRgbRgba) {
  std::mt19937 g(test::test_seed() + 1);
  for (int ct : {PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB, PNG_COLOR_TYPE_RGBA})
    for (int depth : {8, 16})
      for (bool interlace : {false, true}) {
        int w = 11, h = 9, ch = channels_of(ct);
        PngSpec s{w, h, ct, depth, {}, {}, {}, false, {}, interlace};
        for (int i = 0; i < w * h * ch; ++i)
          s.samples.push_back((uint16_t)(depth == 16 ? g() & 0xffff : g() & 0xff));
        std::string p = tmp("ct" + std::to_string(ct) + "_" + std::to_string(depth) + ".png");
        write_png_spec(p, s);
        Image im = decode_image_file(p);
        ASSERT_EQ(im.w, w);
        ASSERT_EQ(im.h, h);
        for (int i = 0; i < w * h; ++i) {
          auto smp = [&](int k) {
            return (double)(depth == 16 ? s.samples[i * ch + k] >> 8 : s.samples[i * ch + k]);
          };
          for (int k = 0; k < 3; ++k) {
            uint8_t want;
            if (ct == PNG_COLOR_TYPE_GRAY_ALPHA)
              want = over_black_ref(smp(0), smp(1));
            else if (ct == PNG_COLOR_TYPE_RGB)
              want = (uint8_t)smp(k);
            else
              want = over_black_ref(smp(k), smp(3));
            ASSERT_EQ(im.rgb[i * 3 + k], want)
                << "ct " << ct << " depth " << depth << " px " << i << " ch " << k;
          }
        }
      }
}

TEST(Image, PngPalette) {
  std::mt19937 g(test::test_seed() + 2);
  for (int depth : {1, 2, 4, 8})
    for (bool trns : {false, true}) {
      int n = 1 << depth, w = 13, h = 6;
      PngSpec s{w, h, PNG_COLOR_TYPE_PALETTE, depth, {}, {}, {}, false, {}, false};
      for (int i = 0; i < n; ++i) s.palette.push_back(png_color{(uint8_t)g(), (uint8_t)g(), (uint8_t)g()});
      if (trns)
        for (int i = 0; i < std::max(1, n / 2); ++i) s.trns_alpha.push_back((uint8_t)(i == 0 ? 0 : g()));
      for (int i = 0; i < w * h; ++i) s.samples.push_back((uint16_t)(g() % n));
      std::string p = tmp("pal" + std::to_string(depth) + (trns ? "t" : "") + ".png");
      write_png_spec(p, s);
      Image im = decode_image_file(p);
      for (int i = 0; i < w * h; ++i) {
        int idx = s.samples[i];
        png_color c = s.palette[idx];
        double a = idx < (int)s.trns_alpha.size() ? s.trns_alpha[idx] : 255;
        uint8_t want[3] = {over_black_ref(c.red, a), over_black_ref(c.green, a), over_black_ref(c.blue, a)};
        for (int k = 0; k < 3; ++k)
          ASSERT_EQ(im.rgb[i * 3 + k], want[k]) << depth << " " << trns << " px " << i;
      }
    }
}

TEST(Image, PngColorKeyTransparency) {
  // tRNS on gray / RGB images marks one exact color as fully transparent -> black.
  PngSpec s{4,  1,    PNG_COLOR_TYPE_RGB, 8, {10, 20, 30, 200, 100, 50, 10, 20, 31, 10, 20, 30}, {}, {}, true,
            {}, false};
  s.trns_color.red = 10;
  s.trns_color.green = 20;
  s.trns_color.blue = 30;
  std::string p = tmp("rgbkey.png");
  write_png_spec(p, s);
  Image im = decode_image_file(p);
  EXPECT_EQ(im.rgb, (std::vector<uint8_t>{0, 0, 0, 200, 100, 50, 10, 20, 31, 0, 0, 0}));
  PngSpec gs{3, 1, PNG_COLOR_TYPE_GRAY, 8, {7, 8, 7}, {}, {}, true, {}, false};
  gs.trns_color.gray = 7;
  std::string gp = tmp("graykey.png");
  write_png_spec(gp, gs);
  Image gi = decode_image_file(gp);
  EXPECT_EQ(gi.rgb, (std::vector<uint8_t>{0, 0, 0, 8, 8, 8, 0, 0, 0}));
}

TEST(Image, ContentNotExtension) {
  auto rgb = noise_image(5, 4, test::test_seed() + 3);
  std::string p = tmp("actually_png.jpg");
  write_png(p, rgb.data(), 5, 4);
  Image im = decode_image_file(p);
  EXPECT_EQ(im.rgb, rgb);
  std::string j = tmp("actually_jpeg.png");
  auto sm = smooth_image(16, 16, test::test_seed());
  write_jpeg(j, sm.data(), 16, 16, 3, JCS_RGB, 95);
  EXPECT_EQ(decode_image_file(j).w, 16);
}

// ---- JPEG ------------------------------------------------------------------------------------
TEST(Image, JpegRgbGrayCmyk) {
  uint64_t seed = test::test_seed() + 4;
  int w = 37, h = 23;
  auto src = smooth_image(w, h, seed);
  std::string p = tmp("rgb.jpg");
  write_jpeg(p, src.data(), w, h, 3, JCS_RGB, 98);
  Image im = decode_image_file(p);
  ASSERT_EQ(im.w, w);
  ASSERT_EQ(im.h, h);
  double sum = 0;
  int mx = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    int d = std::abs((int)im.rgb[i] - src[i]);
    sum += d;
    mx = std::max(mx, d);
  }
  EXPECT_LE(mx, 12);
  EXPECT_LE(sum / src.size(), 2.0);

  std::vector<uint8_t> gray((size_t)w * h);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = src[i * 3];
  std::string gp = tmp("gray.jpg");
  write_jpeg(gp, gray.data(), w, h, 1, JCS_GRAYSCALE, 98);
  Image gi = decode_image_file(gp);
  for (size_t i = 0; i < gray.size(); ++i) {
    ASSERT_EQ(gi.rgb[i * 3], gi.rgb[i * 3 + 1]);
    ASSERT_EQ(gi.rgb[i * 3], gi.rgb[i * 3 + 2]);
    ASSERT_LE(std::abs((int)gi.rgb[i * 3] - gray[i]), 8);
  }

  // CMYK with libjpeg's Adobe marker: stored inverted (Adobe convention), so raw 255 = no ink.
  // Blocks of solid colors: white, magenta (M ink), 50% black.
  int cw = 24, chh = 8;
  std::vector<uint8_t> cmyk((size_t)cw * chh * 4);
  for (int y = 0; y < chh; ++y)
    for (int x = 0; x < cw; ++x) {
      uint8_t* q = &cmyk[((size_t)y * cw + x) * 4];
      uint8_t ink[3][4] = {{0, 0, 0, 0}, {0, 255, 0, 0}, {0, 0, 0, 128}};
      for (int k = 0; k < 4; ++k) q[k] = 255 - ink[x / 8][k];
    }
  std::string cp = tmp("cmyk.jpg");
  write_jpeg(cp, cmyk.data(), cw, chh, 4, JCS_CMYK, 100);
  Image ci = decode_image_file(cp);
  auto px = [&](int x) { return &ci.rgb[(size_t)(4 * cw + x) * 3]; };
  uint8_t want[3][3] = {{255, 255, 255}, {255, 0, 255}, {127, 127, 127}};
  for (int b = 0; b < 3; ++b)
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(px(b * 8 + 4)[k], want[b][k], 3) << "block " << b << " ch " << k;
}

// ---- errors ----------------------------------------------------------------------------------
TEST(Image, CorruptFilesAreUserErrorsAndSilent) {
  auto rgb = noise_image(40, 30, test::test_seed() + 5);
  std::string good_png = tmp("good.png");
  write_png(good_png, rgb.data(), 40, 30);
  std::string good_jpg = tmp("good.jpg");
  auto sm = smooth_image(64, 48, test::test_seed());
  write_jpeg(good_jpg, sm.data(), 64, 48, 3, JCS_RGB, 90);
  std::string png = read_all(good_png), jpg = read_all(good_jpg);
  struct Case {
    std::string name, bytes, want;
  };
  std::string flipped = png;
  flipped[flipped.size() / 2] ^= 0x5a;  // inside IDAT: CRC or zlib error
  std::string badhdr = png;
  badhdr[16] = 0x7f;  // absurd width in IHDR (CRC mismatch too)
  std::vector<Case> cases = {
      {"trunc.png", png.substr(0, png.size() / 2), "PNG"},
      {"flip.png", flipped, "PNG"},
      {"hdr.png", badhdr, "PNG"},
      {"sig_only.png", png.substr(0, 8), "PNG"},
      {"trunc.jpg", jpg.substr(0, jpg.size() / 2), "JPEG"},
      {"soi_only.jpg", jpg.substr(0, 3), "JPEG"},
      {"garbage.png", std::string(1000, 'x'), "not a PNG or JPEG"},
      {"empty.jpg", "", "empty"},
      {"text.txt", "hello world\n", "not a PNG or JPEG"},
  };
  for (auto& c : cases) {
    std::string p = tmp(c.name);
    write_all(p, c.bytes);
    std::string msg = "(no error)";
    std::string err = capture_stderr_of([&] {
      try {
        decode_image_file(p);
      } catch (const UserError& e) {
        msg = e.what();
      }
    });
    EXPECT_EQ(err, "") << c.name << ": a library printed to stderr";
    EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << c.name << ": " << msg;
  }
  EXPECT_THROW(decode_image_file(tmp("does_not_exist.png")), UserError);
}

// An intact image above the pixel limit is refused for its size, not called corrupt.
TEST(Image, AboveThePixelLimitIsNotCorrupt) {
  const int w = 37 + (int)(test::test_seed() % 20), h = 23;
  auto rgb = noise_image(w, h, test::test_seed() + 9);
  const std::string png = tmp("limit.png"), jpg = tmp("limit.jpg");
  write_png(png, rgb.data(), w, h);
  write_jpeg(jpg, rgb.data(), w, h, 3, JCS_RGB, 90);
  for (const std::string& p : {png, jpg}) {
    EXPECT_EQ(decode_image_file(p, (uint64_t)w * h).w, w) << p << ": at the limit";
    std::string msg = "(no error)";
    try {
      decode_image_file(p, (uint64_t)w * h - 1);
    } catch (const UserError& e) {
      msg = e.what();
    }
    EXPECT_EQ(msg.find("corrupt"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(w) + "x" + std::to_string(h) + " = " + std::to_string(w * h) +
                       " pixels, above the limit of " + std::to_string(w * h - 1)),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
  }
}

// ---- resize + center crop --------------------------------------------------------------------
TEST(Image, ResizeGeometryAndConstant) {
  std::mt19937 g(test::test_seed() + 6);
  struct G {
    int w, h, size;
  };
  for (G c : std::vector<G>{{100, 60, 32},
                            {60, 100, 32},
                            {64, 64, 64},
                            {31, 17, 64},
                            {1000, 130, 32},
                            {513, 257, 64},
                            {1, 1, 8}}) {
    Image im;
    im.w = c.w;
    im.h = c.h;
    uint8_t col[3] = {(uint8_t)g(), (uint8_t)g(), (uint8_t)g()};
    for (int i = 0; i < c.w * c.h; ++i) im.rgb.insert(im.rgb.end(), col, col + 3);
    Image out = resize_center_crop(im, c.size);
    ASSERT_EQ(out.w, c.size);
    ASSERT_EQ(out.h, c.size);
    ASSERT_EQ(out.rgb.size(), (size_t)c.size * c.size * 3);
    for (size_t i = 0; i < out.rgb.size(); ++i)
      ASSERT_EQ(out.rgb[i], col[i % 3]) << c.w << "x" << c.h << " i=" << i;
  }
}

TEST(Image, ResizeHalvingAndCropOffsets) {
  // 200x100 ramp R = x, G = y; size 50: one BOX halving to 100x50 (each output = mean of a 2x2
  // block, (2x + 2x+1)/2 rounded half up = 2x+1), no bicubic (short side already 50), then crop
  // x offset (100-50)/2 = 25.
  Image im;
  im.w = 200;
  im.h = 100;
  for (int y = 0; y < 100; ++y)
    for (int x = 0; x < 200; ++x) im.rgb.insert(im.rgb.end(), {(uint8_t)x, (uint8_t)y, 77});
  Image out = resize_center_crop(im, 50);
  for (int y = 0; y < 50; ++y)
    for (int x = 0; x < 50; ++x) {
      const uint8_t* p = &out.rgb[((size_t)y * 50 + x) * 3];
      ASSERT_EQ(p[0], 2 * (x + 25) + 1);
      ASSERT_EQ(p[1], 2 * y + 1);
      ASSERT_EQ(p[2], 77);
    }
}

TEST(Image, ResizeBicubicLinearRamp) {
  // Bicubic nearly reproduces linear functions away from the borders (exactly only at integer
  // scale factors; the antialiased, stretched kernel is off by a fraction of a level). 120x90 -> 64: no
  // halving, scale 64/90, resized to round(120*64/90)=85 x 64, crop x offset (85-64)/2 = 10.
  Image im;
  im.w = 120;
  im.h = 90;
  for (int y = 0; y < 90; ++y)
    for (int x = 0; x < 120; ++x) im.rgb.insert(im.rgb.end(), {(uint8_t)(2 * x), (uint8_t)(2 * y), 5});
  Image out = resize_center_crop(im, 64);
  double s = 90.0 / 64.0;
  for (int y = 3; y < 61; ++y)
    for (int x = 0; x < 64; ++x) {
      const uint8_t* p = &out.rgb[((size_t)y * 64 + x) * 3];
      double rx = 2 * ((x + 10 + 0.5) * s - 0.5), ry = 2 * ((y + 0.5) * s - 0.5);
      ASSERT_NEAR(p[0], rx, 1.5) << x << "," << y;
      ASSERT_NEAR(p[1], ry, 1.5) << x << "," << y;
      ASSERT_EQ(p[2], 5);
    }
}

TEST(Image, MatchesPilCenterCropArr) {
  if (!has_pil()) GTEST_SKIP() << "/usr/bin/python3 lacks PIL";
  uint64_t seed = test::test_seed() + 8;
  struct C {
    int w, h, size;
  };
  std::vector<C> cases = {{317, 211, 64},  {64, 64, 64},   {40, 90, 64},
                          {1000, 130, 32}, {129, 255, 64}, {97, 400, 16}};
  std::string dir = test::temp_dir("pil");
  std::string script = dir + "/ref.py";
  std::ofstream(script)
      << "import sys, numpy as np\n"
         "from PIL import Image\n"
         "def center_crop_arr(pil_image, image_size):\n"
         "    while min(*pil_image.size) >= 2 * image_size:\n"
         "        pil_image = pil_image.resize(tuple(x // 2 for x in pil_image.size), resample=Image.BOX)\n"
         "    scale = image_size / min(*pil_image.size)\n"
         "    pil_image = pil_image.resize(tuple(round(x * scale) for x in pil_image.size), "
         "resample=Image.BICUBIC)\n"
         "    arr = np.array(pil_image)\n"
         "    crop_y = (arr.shape[0] - image_size) // 2\n"
         "    crop_x = (arr.shape[1] - image_size) // 2\n"
         "    return arr[crop_y : crop_y + image_size, crop_x : crop_x + image_size]\n"
         "for i in range(1, len(sys.argv), 3):\n"
         "    img = Image.open(sys.argv[i]); img.load(); img = img.convert('RGB')\n"
         "    a = center_crop_arr(img, int(sys.argv[i + 1]))\n"
         "    open(sys.argv[i + 2], 'wb').write(np.ascontiguousarray(a).tobytes())\n"
         "    open(sys.argv[i + 2] + '.dec', 'wb').write(np.asarray(img).tobytes())\n";
  std::string args;
  std::vector<std::string> srcs, outs;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto& c = cases[i];
    std::vector<uint8_t> px = i % 2 ? noise_image(c.w, c.h, seed + i) : smooth_image(c.w, c.h, seed + i);
    std::string src = dir + "/src" + std::to_string(i) + (i % 3 == 2 ? ".jpg" : ".png");
    if (i % 3 == 2)
      write_jpeg(src, px.data(), c.w, c.h, 3, JCS_RGB, 85);
    else
      write_png(src, px.data(), c.w, c.h);
    srcs.push_back(src);
    outs.push_back(dir + "/out" + std::to_string(i) + ".raw");
    args += " " + src + " " + std::to_string(c.size) + " " + outs.back();
  }
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + args).c_str()), 0);
  for (size_t i = 0; i < cases.size(); ++i) {
    Image dec = decode_image_file(srcs[i]);
    std::string pil_dec = read_all(outs[i] + ".dec");
    ASSERT_EQ(pil_dec.size(), dec.rgb.size());
    EXPECT_TRUE(std::equal(dec.rgb.begin(), dec.rgb.end(), (const uint8_t*)pil_dec.data()))
        << "decode differs from PIL for " << srcs[i];
    Image out = resize_center_crop(dec, cases[i].size);
    std::string ref = read_all(outs[i]);
    ASSERT_EQ(ref.size(), out.rgb.size()) << srcs[i];
    int ndiff = 0, maxd = 0;
    for (size_t k = 0; k < ref.size(); ++k) {
      int d = std::abs((int)(uint8_t)ref[k] - out.rgb[k]);
      ndiff += d != 0;
      maxd = std::max(maxd, d);
    }
    EXPECT_EQ(ndiff, 0) << srcs[i] << " -> " << cases[i].size << ": " << ndiff << " bytes differ, max "
                        << maxd;
  }
}

// ---- PNG writing and grids -------------------------------------------------------------------
TEST(Image, WritePngRoundTripAndAtomic) {
  auto rgb = noise_image(33, 21, test::test_seed() + 9);
  std::string dir = test::temp_dir("wpng");
  std::string p = dir + "/a.png";
  write_png(p, rgb.data(), 33, 21);
  Image im = decode_image_file(p);
  EXPECT_EQ(im.w, 33);
  EXPECT_EQ(im.h, 21);
  EXPECT_EQ(im.rgb, rgb);
  EXPECT_EQ(test::list_dir(dir).size(), 1u);  // no temporary left behind
  EXPECT_THROW(write_png(dir + "/missing/a.png", rgb.data(), 33, 21), UserError);
}

TEST(Image, MakeGrid) {
  int n = 5, h = 3, w = 4;
  std::vector<uint8_t> imgs((size_t)n * h * w * 3);
  for (size_t i = 0; i < imgs.size(); ++i) imgs[i] = (uint8_t)(1 + i % 250);  // never 0
  int gw = 0, gh = 0;
  auto g = make_grid(imgs.data(), n, h, w, &gw, &gh);
  // ceil(sqrt(5)) = 3 per row, 2 rows: width (4+2)*3+2, height (3+2)*2+2.
  ASSERT_EQ(gw, 20);
  ASSERT_EQ(gh, 12);
  ASSERT_EQ(g.size(), (size_t)gw * gh * 3);
  std::vector<int> owner((size_t)gw * gh, -1);
  for (int i = 0; i < n; ++i) {
    int r = i / 3, c = i % 3;
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        int gy = 2 + r * 5 + y, gx = 2 + c * 6 + x;
        owner[(size_t)gy * gw + gx] = i;
        for (int k = 0; k < 3; ++k)
          ASSERT_EQ(g[((size_t)gy * gw + gx) * 3 + k], imgs[(((size_t)i * h + y) * w + x) * 3 + k]);
      }
  }
  for (size_t p = 0; p < owner.size(); ++p) {
    if (owner[p] >= 0) continue;
    for (int k = 0; k < 3; ++k) ASSERT_EQ(g[p * 3 + k], 0) << "padding at " << p;
  }
  // Square counts and a single image.
  make_grid(imgs.data(), 4, h, w, &gw, &gh);
  EXPECT_EQ(gw, 14);
  EXPECT_EQ(gh, 12);
  auto one = make_grid(imgs.data(), 1, h, w, &gw, &gh);
  EXPECT_EQ(gw, w);
  EXPECT_EQ(gh, h);
  EXPECT_EQ(one, std::vector<uint8_t>(imgs.begin(), imgs.begin() + h * w * 3));
}
