// The dataset file (DatasetWriter/DatasetReader) and `unet prepare` end to end.
#include <gtest/gtest.h>
#include <jpeglib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "dataset.h"
#include "h5.h"
#include "image.h"
#include "testutil.h"
#include "util.h"

using namespace unet;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> noise(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = (uint8_t)g();
  return v;
}

std::vector<uint8_t> smooth(int w, int h, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(0, 6);
  double a[3], b[3], c[3];
  for (int k = 0; k < 3; ++k) a[k] = u(g), b[k] = u(g), c[k] = u(g);
  std::vector<uint8_t> v((size_t)w * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < 3; ++k)
        v[((size_t)y * w + x) * 3 + k] =
            (uint8_t)std::lround(127.5 + 100 * std::sin(a[k] * x / w + b[k] * y / h + c[k]));
  return v;
}

void write_jpeg(const std::string& path, const std::vector<uint8_t>& rgb, int w, int h) {
  jpeg_compress_struct ci;
  jpeg_error_mgr err;
  ci.err = jpeg_std_error(&err);
  jpeg_create_compress(&ci);
  FILE* fp = fopen(path.c_str(), "wb");
  jpeg_stdio_dest(&ci, fp);
  ci.image_width = w;
  ci.image_height = h;
  ci.input_components = 3;
  ci.in_color_space = JCS_RGB;
  jpeg_set_defaults(&ci);
  jpeg_set_quality(&ci, 90, TRUE);
  jpeg_start_compress(&ci, TRUE);
  while (ci.next_scanline < ci.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb.data() + (size_t)ci.next_scanline * w * 3);
    jpeg_write_scanlines(&ci, &row, 1);
  }
  jpeg_finish_compress(&ci);
  jpeg_destroy_compress(&ci);
  fclose(fp);
}

void write_text(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string q(const std::string& s) { return "'" + s + "'"; }

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// A class-subfolder tree of PNG and JPEG files of assorted sizes, plus junk.
struct Tree {
  std::string root;
  std::vector<std::string> images;  // relative paths, in the order prepare must use
  std::vector<int> labels;          // class index of each image (classes sorted: birds, cats, dogs)
  std::vector<std::string> junk;    // relative paths of files prepare must skip
};

Tree make_tree(uint64_t seed) {
  Tree t;
  t.root = test::temp_dir("tree");
  for (auto d : {"birds", "cats/sub", "dogs", ".hidden", "empty_class"})
    fs::create_directories(t.root + "/" + d);
  auto png = [&](const std::string& rel, int w, int h, int label) {
    auto px = noise((size_t)w * h * 3, seed + t.images.size() * 7919);
    write_png(t.root + "/" + rel, px.data(), w, h);
    t.images.push_back(rel);
    t.labels.push_back(label);
  };
  auto jpg = [&](const std::string& rel, int w, int h, int label) {
    write_jpeg(t.root + "/" + rel, smooth(w, h, seed + t.images.size() * 104729), w, h);
    t.images.push_back(rel);
    t.labels.push_back(label);
  };
  // Sorted by bytes of the relative path: "cats/b-2.jpg" < "cats/b.jpg" < "cats/sub/..." .
  png("birds/x.png", 40, 40, 0);
  jpg("cats/B.jpg", 33, 70, 1);  // uppercase sorts before lowercase
  jpg("cats/b-2.jpg", 90, 50, 1);
  png("cats/b.jpg", 23, 31, 1);  // a PNG with a .jpg name: detected by content
  t.junk.push_back("cats/notes.txt");
  write_text(t.root + "/cats/notes.txt", "not an image\n");
  png("cats/sub/c.png", 130, 41, 1);
  t.junk.push_back("dogs/bad.png");
  {
    auto px = noise(30 * 30 * 3, seed);
    write_png(t.root + "/dogs/bad.png", px.data(), 30, 30);
    std::string bytes;
    {
      std::ifstream in(t.root + "/dogs/bad.png", std::ios::binary);
      bytes.assign((std::istreambuf_iterator<char>(in)), {});
    }
    write_text(t.root + "/dogs/bad.png", bytes.substr(0, bytes.size() / 2));  // truncated
  }
  jpg("dogs/d.jpg", 64, 64, 2);
  png("dogs/e.png", 17, 200, 2);
  write_text(t.root + "/.hidden/ignored.txt", "hidden files are not looked at\n");
  write_text(t.root + "/dogs/.DS_Store", "junk");
  return t;
}

std::vector<uint8_t> expected_pixels(const std::string& path, int size) {
  return resize_center_crop(decode_image_file(path), size).rgb;
}

}  // namespace

// ---- DatasetWriter / DatasetReader -----------------------------------------------------------
TEST(Dataset, RoundTripWithLabels) {
  std::string dir = test::temp_dir("ds");
  std::string p = dir + "/d.h5";
  const int S = 8, N = 70;  // N spans a partial second chunk
  auto imgs = noise((size_t)N * S * S * 3, test::test_seed());
  std::vector<int64_t> labels;
  {
    DatasetWriter w(p, S, true, {"a", "b", "c"});
    for (int i = 0; i < N; ++i) {
      labels.push_back((int64_t)((i * 7 + test::test_seed()) % 3));
      w.append(imgs.data() + (size_t)i * S * S * 3, labels.back());
    }
    EXPECT_FALSE(test::file_exists(p));  // not before commit
    w.commit();
  }
  EXPECT_EQ(test::list_dir(dir), std::vector<std::string>{"d.h5"});
  DatasetReader r(p);
  EXPECT_EQ(r.info().count, N);
  EXPECT_EQ(r.info().image_size, S);
  EXPECT_TRUE(r.info().has_labels);
  EXPECT_EQ(r.info().class_names, (std::vector<std::string>{"a", "b", "c"}));
  std::vector<uint8_t> all((size_t)N * S * S * 3, 0xAB);
  r.read_images(0, N, all.data());
  EXPECT_EQ(all, imgs);
  std::vector<uint8_t> part((size_t)5 * S * S * 3, 0xCD);
  r.read_images(62, 5, part.data());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), imgs.begin() + (size_t)62 * S * S * 3));
  EXPECT_EQ(r.read_labels(), labels);
  EXPECT_THROW(r.read_images(68, 3, part.data()), UserError);
  EXPECT_THROW(r.read_images(-1, 1, part.data()), UserError);
  // Layout as the SPEC states it.
  h5::File f = h5::File::open(p);
  EXPECT_EQ(h5::shape(f, "images"), (std::vector<hsize_t>{N, S, S, 3}));
  EXPECT_EQ(h5::dtype(f, "images"), h5::DType::U8);
  EXPECT_EQ(h5::dtype(f, "labels"), h5::DType::I64);
  EXPECT_EQ(h5::get_attr_str(f, "/", "format"), "unet-dataset");
  EXPECT_EQ(h5::get_attr_i64(f, "/", "version"), 1);
  EXPECT_EQ(h5::get_attr_i64(f, "/", "image_size"), S);
  EXPECT_EQ(h5::get_attr_i64(f, "/", "count"), N);
}

TEST(Dataset, NoLabelsAndUncommitted) {
  std::string dir = test::temp_dir("ds2");
  std::string p = dir + "/d.h5";
  auto img = noise(4 * 4 * 3, test::test_seed() + 1);
  {
    DatasetWriter w(p, 4, false, {});
    w.append(img.data(), 0);
  }  // no commit: nothing left behind
  EXPECT_TRUE(test::list_dir(dir).empty());
  {
    DatasetWriter w(p, 4, false, {});
    w.append(img.data(), 0);
    w.commit();
  }
  DatasetReader r(p);
  EXPECT_FALSE(r.info().has_labels);
  EXPECT_TRUE(r.read_labels().empty());
  std::vector<uint8_t> out(img.size());
  r.read_images(0, 1, out.data());
  EXPECT_EQ(out, img);
}

TEST(Dataset, ReaderValidates) {
  std::string dir = test::temp_dir("ds3");
  auto expect_err = [&](const std::string& p, const std::string& what) {
    try {
      DatasetReader r(p);
      r.read_labels();
      ADD_FAILURE() << p << ": no error, expected " << what;
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
      EXPECT_TRUE(contains(e.what(), what)) << e.what();
    }
  };
  expect_err(dir + "/missing.h5", "no such file");
  write_text(dir + "/junk.h5", std::string(3000, 'z'));
  expect_err(dir + "/junk.h5", "not an HDF5 file");
  auto make = [&](const std::string& name, const std::function<void(h5::File&)>& fn) {
    std::string p = dir + "/" + name;
    h5::File f = h5::File::create(p);
    std::vector<uint8_t> img(2 * 4 * 4 * 3, 9);
    h5::write_u8(f, "images", img.data(), {2, 4, 4, 3});
    h5::set_attr(f, "/", "format", "unet-dataset");
    h5::set_attr(f, "/", "version", 1);
    h5::set_attr(f, "/", "image_size", 4);
    h5::set_attr(f, "/", "count", 2);
    fn(f);
    f.close();
    return p;
  };
  // A valid hand-made file first, so the failures below are due to the one thing changed.
  EXPECT_EQ(DatasetReader(make("ok.h5", [](h5::File&) {})).info().count, 2);
  expect_err(make("nofmt.h5", [](h5::File& f) { H5Adelete(f.id(), "format"); }), "format attribute missing");
  expect_err(make("ckpt.h5", [](h5::File& f) { h5::set_attr(f, "/", "format", "unet-checkpoint"); }),
             "not a unet dataset");
  expect_err(make("ver.h5", [](h5::File& f) { h5::set_attr(f, "/", "version", 7); }), "version 7");
  expect_err(make("count.h5", [](h5::File& f) { h5::set_attr(f, "/", "count", 3); }), "count");
  expect_err(make("size.h5", [](h5::File& f) { h5::set_attr(f, "/", "image_size", 8); }), "shape");
  expect_err(make("dtype.h5",
                  [](h5::File& f) {
                    std::vector<float> x(2 * 4 * 4 * 3);
                    h5::write_f32(f, "images", x.data(), {2, 4, 4, 3});
                  }),
             "float32");
  expect_err(make("noimg.h5", [](h5::File& f) { H5Ldelete(f.id(), "images", H5P_DEFAULT); }), "images");
  expect_err(make("lablen.h5",
                  [](h5::File& f) {
                    int64_t l[3] = {0, 1, 0};
                    h5::write_i64(f, "labels", l, {3});
                  }),
             "labels");
  expect_err(make("labrange.h5",
                  [](h5::File& f) {
                    int64_t l[2] = {0, 5};
                    h5::write_i64(f, "labels", l, {2});
                    h5::set_attr(f, "labels", "class_names", std::vector<std::string>{"a", "b"});
                  }),
             "label 5");
}

TEST(Dataset, H5pyReadsIt) {
  if (std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no h5py";
  std::string p = test::temp_dir("ds4") + "/d.h5";
  auto img = noise(3 * 5 * 5 * 3, test::test_seed() + 2);
  {
    DatasetWriter w(p, 5, true, {"zebra", "ant"});
    for (int i = 0; i < 3; ++i) w.append(img.data() + i * 75, i % 2);
    w.commit();
  }
  std::string py =
      "import h5py, numpy as np, sys\n"
      "f = h5py.File(sys.argv[1], 'r')\n"
      "x = f['images'][()]\n"
      "assert x.dtype == np.uint8 and x.shape == (3, 5, 5, 3), x.shape\n"
      "assert int(x[2, 4, 4, 2]) == int(sys.argv[2])\n"
      "assert f['labels'][()].tolist() == [0, 1, 0]\n"
      "assert list(f['labels'].attrs['class_names']) == ['zebra', 'ant']\n"
      "assert f.attrs['format'] == 'unet-dataset' and f.attrs['count'] == 3\n"
      "assert f['images'].chunks is not None and f['images'].compression == 'gzip'\n";
  std::string script = test::temp_dir("ds4py") + "/c.py";
  write_text(script, py);
  EXPECT_EQ(
      std::system(("/usr/bin/python3 " + script + " " + p + " " + std::to_string(img[3 * 75 - 1])).c_str()),
      0);
}

// ---- unet prepare ----------------------------------------------------------------------------
TEST(Prepare, ClassFoldersPixelsAndLabels) {
  Tree t = make_tree(test::test_seed() + 10);
  std::string outdir = test::temp_dir("prep_out");
  std::string out = outdir + "/d.h5";
  auto r =
      test::run_unet("prepare " + q(t.root) + " -o " + q(out) + " --labels subdirs --image-size 16 --jobs 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "wrote 7 images (3 classes) to " + out + "; skipped 2 unreadable files"))
      << r.out;
  for (auto& j : t.junk) EXPECT_TRUE(contains(r.err, "unet: skipping " + t.root + "/" + j + ": ")) << r.err;
  EXPECT_FALSE(contains(r.err, "hidden")) << r.err;
  EXPECT_FALSE(contains(r.err, "DS_Store")) << r.err;
  EXPECT_EQ(test::list_dir(outdir), std::vector<std::string>{"d.h5"});
  DatasetReader ds(out);
  ASSERT_EQ(ds.info().count, (int64_t)t.images.size());
  EXPECT_EQ(ds.info().image_size, 16);
  // empty_class has no files at all, so it is not a class; classes are sorted.
  EXPECT_EQ(ds.info().class_names, (std::vector<std::string>{"birds", "cats", "dogs"}));
  auto labels = ds.read_labels();
  std::vector<uint8_t> got((size_t)ds.info().count * 16 * 16 * 3);
  ds.read_images(0, ds.info().count, got.data());
  for (size_t i = 0; i < t.images.size(); ++i) {
    EXPECT_EQ(labels[i], t.labels[i]) << t.images[i];
    auto want = expected_pixels(t.root + "/" + t.images[i], 16);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + i * 16 * 16 * 3)) << t.images[i];
  }
}

TEST(Prepare, NoLabelsDeterministicAcrossJobs) {
  Tree t = make_tree(test::test_seed() + 12);
  std::string d = test::temp_dir("prep_nl");
  auto r1 = test::run_unet("prepare " + q(t.root) + " -o " + q(d + "/a.h5") + " --jobs 1 --image-size 12");
  auto r2 = test::run_unet("prepare " + q(t.root) + " -o " + q(d + "/b.h5") + " --jobs 5 --image-size 12");
  ASSERT_EQ(r1.code, 0) << r1.err;
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_EQ(r1.err, r2.err);  // same warnings, same order
  EXPECT_TRUE(contains(r1.out, "wrote 7 images to")) << r1.out;
  DatasetReader a(d + "/a.h5"), b(d + "/b.h5");
  EXPECT_FALSE(a.info().has_labels);
  ASSERT_EQ(a.info().count, 7);
  ASSERT_EQ(b.info().count, 7);
  std::vector<uint8_t> pa(7 * 12 * 12 * 3), pb(pa.size());
  a.read_images(0, 7, pa.data());
  b.read_images(0, 7, pb.data());
  EXPECT_EQ(pa, pb);
  // Without labels the top-level order is the same sorted walk.
  auto want = expected_pixels(t.root + "/" + t.images[3], 12);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), pa.begin() + 3 * 12 * 12 * 3));
}

TEST(Prepare, Limit) {
  Tree t = make_tree(test::test_seed() + 13);
  std::string out = test::temp_dir("prep_lim") + "/d.h5";
  auto r =
      test::run_unet("prepare " + q(t.root) + " -o " + q(out) + " --limit 3 --image-size 8 --labels subdirs");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "wrote 3 images")) << r.out;
  EXPECT_FALSE(contains(r.err, "bad.png")) << "files past the limit are not looked at: " << r.err;
  DatasetReader ds(out);
  ASSERT_EQ(ds.info().count, 3);
  std::vector<uint8_t> got(3 * 8 * 8 * 3);
  ds.read_images(0, 3, got.data());
  for (int i = 0; i < 3; ++i) {
    auto want = expected_pixels(t.root + "/" + t.images[i], 8);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + i * 8 * 8 * 3)) << t.images[i];
  }
}

TEST(Prepare, StrictFailsAndLeavesNothing) {
  Tree t = make_tree(test::test_seed() + 14);
  std::string outdir = test::temp_dir("prep_strict");
  std::string out = outdir + "/d.h5";
  auto r = test::run_unet("prepare " + q(t.root) + " -o " + q(out) + " --strict --image-size 8");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, t.root + "/cats/notes.txt")) << r.err;  // the first bad file in order
  EXPECT_FALSE(contains(r.err, "bad.png")) << r.err;
  EXPECT_TRUE(test::list_dir(outdir).empty());
  // An existing output is not damaged by a failed run.
  write_text(out, "previous contents");
  r = test::run_unet("prepare " + q(t.root) + " -o " + q(out) + " --strict --image-size 8");
  EXPECT_EQ(r.code, 1);
  std::ifstream in(out);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), {}), "previous contents");
  EXPECT_EQ(test::list_dir(outdir), std::vector<std::string>{"d.h5"});
}

TEST(Prepare, TopLevelFilesWithSubdirLabels) {
  Tree t = make_tree(test::test_seed() + 15);
  auto px = noise(20 * 20 * 3, test::test_seed());
  write_png(t.root + "/stray.png", px.data(), 20, 20);
  std::string out = test::temp_dir("prep_top") + "/d.h5";
  auto r = test::run_unet("prepare " + q(t.root) + " -o " + q(out) + " --labels subdirs --image-size 8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "unet: skipping " + t.root + "/stray.png: not inside a class subfolder"))
      << r.err;
  EXPECT_TRUE(contains(r.out, "skipped 3 unreadable files")) << r.out;
  // Without labels the same file is an ordinary image.
  auto r2 = test::run_unet("prepare " + q(t.root) + " -o " + q(out) + " --image-size 8");
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_TRUE(contains(r2.out, "wrote 8 images")) << r2.out;
}

TEST(Prepare, MultipleDirs) {
  Tree a = make_tree(test::test_seed() + 16), b = make_tree(test::test_seed() + 17);
  std::string out = test::temp_dir("prep_multi") + "/d.h5";
  auto r = test::run_unet("prepare " + q(a.root) + " " + q(b.root) + " -o " + q(out) +
                          " --image-size 8 --labels subdirs");
  ASSERT_EQ(r.code, 0) << r.err;
  DatasetReader ds(out);
  ASSERT_EQ(ds.info().count, 14);
  EXPECT_EQ(ds.info().class_names.size(), 3u);
  std::vector<uint8_t> got(14 * 8 * 8 * 3);
  ds.read_images(0, 14, got.data());
  // Second DIR's images follow the first's.
  auto want = expected_pixels(b.root + "/" + b.images[0], 8);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 7 * 8 * 8 * 3));
}

TEST(Prepare, InputAndOutputErrors) {
  std::string d = test::temp_dir("prep_err");
  std::string outdir = test::temp_dir("prep_err_out");
  auto one_line = [](const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; };
  // Missing DIR.
  auto r = test::run_unet("prepare " + q(d + "/nope") + " -o " + q(outdir + "/x.h5"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, d + "/nope: no such directory")) << r.err;
  EXPECT_TRUE(one_line(r.err)) << r.err;
  // DIR is a file.
  write_text(d + "/file.png", "x");
  r = test::run_unet("prepare " + q(d + "/file.png") + " -o " + q(outdir + "/x.h5"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "not a directory")) << r.err;
  // Empty DIR.
  std::string empty = test::temp_dir("prep_empty");
  r = test::run_unet("prepare " + q(empty) + " -o " + q(outdir + "/x.h5"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, empty)) << r.err;
  EXPECT_TRUE(one_line(r.err)) << r.err;
  // Only unreadable files: still "no images", exit 1.
  std::string junk = test::temp_dir("prep_junk");
  write_text(junk + "/a.png", "garbage");
  r = test::run_unet("prepare " + q(junk) + " -o " + q(outdir + "/x.h5"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "no readable images")) << r.err;
  EXPECT_TRUE(test::list_dir(outdir).empty());
  // Output in a missing directory: fails before any work, names the path.
  Tree t = make_tree(test::test_seed() + 18);
  r = test::run_unet("prepare " + q(t.root) + " -o " + q(outdir + "/missing/x.h5"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, outdir + "/missing/x.h5")) << r.err;
  EXPECT_TRUE(one_line(r.err)) << r.err;
  EXPECT_TRUE(test::list_dir(outdir).empty());
  // Output that is a directory.
  r = test::run_unet("prepare " + q(t.root) + " -o " + q(outdir));
  EXPECT_EQ(r.code, 1);
  // Bad flags.
  EXPECT_EQ(test::run_unet("prepare " + q(t.root) + " -o " + q(outdir + "/x.h5") + " --labels folders").code,
            1);
  EXPECT_EQ(test::run_unet("prepare " + q(t.root) + " -o " + q(outdir + "/x.h5") + " --image-size 0").code,
            1);
  EXPECT_EQ(test::run_unet("prepare " + q(t.root) + " -o " + q(outdir + "/x.h5") + " --jobs 0").code, 1);
  EXPECT_EQ(test::run_unet("prepare " + q(t.root)).code, 1);  // -o is required
  EXPECT_TRUE(test::list_dir(outdir).empty());
  // Unwritable directory (meaningless as root, which may write anywhere).
  if (geteuid() != 0) {
    std::string ro = test::temp_dir("prep_ro");
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    r = test::run_unet("prepare " + q(t.root) + " -o " + q(ro + "/x.h5"));
    EXPECT_EQ(r.code, 1);
    EXPECT_TRUE(contains(r.err, "not writable")) << r.err;
    fs::permissions(ro, fs::perms::owner_all);
    EXPECT_TRUE(test::list_dir(ro).empty());
  }
}

TEST(Prepare, Help) {
  auto r = test::run_unet("prepare --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "composited over black")) << r.out;
  EXPECT_TRUE(contains(r.out, "--labels")) << r.out;
}
