// HDF5 layer: round trips of every type, hyperslabs, attributes, errors, and h5py interop.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "h5.h"
#include "testutil.h"
#include "util.h"

using namespace unet;

namespace {

std::string tmpfile(const std::string& name) { return test::temp_dir("h5") + "/" + name; }

std::string capture_stderr_of(const std::function<void()>& fn) {
  fflush(stderr);
  std::string path = tmpfile("stderr.txt");
  int saved = dup(2);
  FILE* f = fopen(path.c_str(), "w");
  dup2(fileno(f), 2);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(f);
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool has_h5py() { return std::system("/usr/bin/python3 -c 'import h5py, numpy' >/dev/null 2>&1") == 0; }

}  // namespace

TEST(H5, RoundTripDatasets) {
  uint64_t seed = test::test_seed();
  std::string p = tmpfile("rt.h5");
  std::vector<float> f32 = test::randn(2 * 3 * 5, seed);
  std::mt19937_64 g(seed + 1);
  std::vector<uint8_t> u8(4 * 7 * 3);
  for (auto& x : u8) x = (uint8_t)g();
  std::vector<int64_t> i64(9);
  for (auto& x : i64) x = (int64_t)g();
  {
    h5::File f = h5::File::create(p);
    h5::write_f32(f, "model/a.b.weight", f32.data(), {2, 3, 5});
    h5::write_u8(f, "images", u8.data(), {4, 7, 3}, {2, 7, 3}, 4);
    h5::write_i64(f, "deep/er/labels", i64.data(), {9}, {}, 1);
    float scalar = 3.25f;
    h5::write_f32(f, "scalar", &scalar, {});
    f.close();
  }
  h5::File f = h5::File::open(p);
  EXPECT_EQ(h5::read_f32(f, "model/a.b.weight"), f32);
  EXPECT_EQ(h5::read_u8(f, "images"), u8);
  EXPECT_EQ(h5::read_i64(f, "deep/er/labels"), i64);
  EXPECT_EQ(h5::read_f32(f, "scalar"), std::vector<float>{3.25f});
  EXPECT_EQ(h5::shape(f, "model/a.b.weight"), (std::vector<hsize_t>{2, 3, 5}));
  EXPECT_EQ(h5::shape(f, "scalar"), std::vector<hsize_t>{});
  EXPECT_EQ(h5::dtype(f, "model/a.b.weight"), h5::DType::F32);
  EXPECT_EQ(h5::dtype(f, "images"), h5::DType::U8);
  EXPECT_EQ(h5::dtype(f, "deep/er/labels"), h5::DType::I64);
  EXPECT_TRUE(h5::exists(f, "deep/er"));
  EXPECT_TRUE(h5::is_group(f, "deep/er"));
  EXPECT_TRUE(h5::is_dataset(f, "/deep/er/labels"));
  EXPECT_FALSE(h5::exists(f, "deep/nope/labels"));
  EXPECT_FALSE(h5::exists(f, "images/sub"));
  EXPECT_EQ(h5::list(f, "/"), (std::vector<std::string>{"deep", "images", "model", "scalar"}));
  EXPECT_EQ(h5::list(f, "model"), std::vector<std::string>{"a.b.weight"});
  // Into-buffer read with the wrong size is a UserError, not an overflow.
  std::vector<float> small(5);
  EXPECT_THROW(h5::read_f32_into(f, "model/a.b.weight", small.data(), small.size()), UserError);
  // Class mismatch is an error; conversions within a class are fine.
  EXPECT_THROW(h5::read_f32(f, "images"), UserError);
  EXPECT_THROW(h5::read_u8(f, "model/a.b.weight"), UserError);
  EXPECT_THROW(h5::read_f32(f, "missing"), UserError);
  EXPECT_THROW(h5::list(f, "images"), UserError);
}

TEST(H5, Hyperslab) {
  uint64_t seed = test::test_seed() + 7;
  std::string p = tmpfile("hs.h5");
  std::vector<float> a = test::randn(10 * 4 * 2, seed);
  std::vector<uint8_t> b(10 * 6);
  std::vector<int64_t> c(10);
  for (size_t i = 0; i < b.size(); ++i) b[i] = (uint8_t)(i * 37 + seed);
  for (size_t i = 0; i < c.size(); ++i) c[i] = (int64_t)(i * 1000003 + seed);
  h5::File f = h5::File::create(p);
  h5::write_f32(f, "a", a.data(), {10, 4, 2}, {3, 4, 2}, 6);
  h5::write_u8(f, "b", b.data(), {10, 6});
  h5::write_i64(f, "c", c.data(), {10});
  auto ra = h5::read_f32(f, "a", 3, 5);
  EXPECT_EQ(ra, std::vector<float>(a.begin() + 3 * 8, a.begin() + 8 * 8));
  auto rb = h5::read_u8(f, "b", 9, 1);
  EXPECT_EQ(rb, std::vector<uint8_t>(b.begin() + 54, b.end()));
  auto rc = h5::read_i64(f, "c", 0, 10);
  EXPECT_EQ(rc, c);
  EXPECT_TRUE(h5::read_i64(f, "c", 10, 0).empty());
  EXPECT_THROW(h5::read_i64(f, "c", 8, 3), UserError);
  EXPECT_THROW(h5::read_i64(f, "c", 11, 0), UserError);
}

TEST(H5, Extendible) {
  std::string p = tmpfile("ext.h5");
  std::mt19937 g(test::test_seed());
  std::vector<uint8_t> all;
  {
    h5::File f = h5::File::create(p);
    h5::create_extendible(f, "images", h5::DType::U8, {2, 3}, 4, 4);
    EXPECT_EQ(h5::shape(f, "images"), (std::vector<hsize_t>{0, 2, 3}));
    for (int k : {1, 5, 3}) {
      std::vector<uint8_t> rows(k * 6);
      for (auto& x : rows) x = (uint8_t)g();
      h5::append_rows(f, "images", h5::DType::U8, rows.data(), k);
      all.insert(all.end(), rows.begin(), rows.end());
    }
    f.close();
  }
  h5::File f = h5::File::open(p);
  EXPECT_EQ(h5::shape(f, "images"), (std::vector<hsize_t>{9, 2, 3}));
  EXPECT_EQ(h5::read_u8(f, "images"), all);
  EXPECT_EQ(h5::read_u8(f, "images", 4, 3), std::vector<uint8_t>(all.begin() + 24, all.begin() + 42));
}

TEST(H5, Attributes) {
  std::string p = tmpfile("attr.h5");
  {
    h5::File f = h5::File::create(p);
    float x = 1;
    h5::write_f32(f, "g/d", &x, {1});
    h5::set_attr(f, "/", "format", "unet-checkpoint");
    h5::set_attr(f, "/", "version", 1);
    h5::set_attr(f, "/", "big", (int64_t)-1234567890123LL);
    h5::set_attr(f, "/", "lr", 1e-4);
    h5::set_attr(f, "/", "flag", true);
    h5::set_attr(f, "g", "mult", std::vector<int64_t>{1, 2, 3, 4});
    h5::set_attr(f, "g/d", "betas", std::vector<double>{0.9, 0.999});
    h5::set_attr(f, "g/d", "names", std::vector<std::string>{"cat", "dog", "", "ünïcode"});
    h5::set_attr(f, "g", "empty", std::vector<int64_t>{});
    h5::set_attr(f, "/", "version", 2);  // overwrite
    f.close();
  }
  h5::File f = h5::File::open(p);
  EXPECT_EQ(h5::get_attr_str(f, "/", "format"), "unet-checkpoint");
  EXPECT_EQ(h5::get_attr_i64(f, "/", "version"), 2);
  EXPECT_EQ(h5::get_attr_i64(f, "", "big"), -1234567890123LL);
  EXPECT_EQ(h5::get_attr_f64(f, "/", "lr"), 1e-4);
  EXPECT_EQ(h5::get_attr_i64(f, "/", "flag"), 1);
  EXPECT_EQ(h5::get_attr_f64(f, "/", "version"), 2.0);  // ints read as doubles
  EXPECT_EQ(h5::get_attr_i64v(f, "g", "mult"), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(h5::get_attr_i64v(f, "/", "version"), std::vector<int64_t>{2});  // scalar as vector
  EXPECT_EQ(h5::get_attr_f64v(f, "g/d", "betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(h5::get_attr_strv(f, "g/d", "names"), (std::vector<std::string>{"cat", "dog", "", "ünïcode"}));
  EXPECT_TRUE(h5::get_attr_i64v(f, "g", "empty").empty());
  EXPECT_TRUE(h5::has_attr(f, "/", "lr"));
  EXPECT_FALSE(h5::has_attr(f, "/", "nope"));
  EXPECT_FALSE(h5::has_attr(f, "nope/x", "lr"));
  EXPECT_EQ(h5::list_attrs(f, "/"), (std::vector<std::string>{"big", "flag", "format", "lr", "version"}));
  // Type mismatches and missing items name the file.
  try {
    h5::get_attr_i64(f, "/", "format");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("format"), std::string::npos) << e.what();
  }
  EXPECT_THROW(h5::get_attr_str(f, "/", "lr"), UserError);
  EXPECT_THROW(h5::get_attr_f64(f, "/", "format"), UserError);
  EXPECT_THROW(h5::get_attr_i64(f, "g", "mult"), UserError);  // not a scalar
  EXPECT_THROW(h5::get_attr_i64(f, "/", "missing"), UserError);
  EXPECT_THROW(h5::get_attr_i64(f, "no/such", "x"), UserError);
}

// HDF5 1.10 trusts the object sizes in a file's global heap, where variable-length strings live:
// a damaged size made H5Aread copy past its buffer and crash (a byte flipped in a dataset's
// class_names, found by fuzzing `unet train`). The strings are read in a child process: a size far
// past the heap is a UserError naming the file and attribute; a small overrun may leave the child
// alive with strings that are wrong (they come from a damaged file) but never harms this process.
TEST(H5, DamagedVariableLengthStringIsAnError) {
  std::mt19937_64 rng(test::test_seed());
  const std::string word = "word" + std::to_string(rng() % 1000000);
  const std::vector<std::string> names{"first", word, "third"};
  const std::string p = tmpfile("gheap.h5");
  {
    h5::File f = h5::File::create(p);
    h5::set_attr(f, "/", "format", "unet-dataset");
    h5::set_attr(f, "/", "names", names);
    f.close();
  }
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // A global heap collection: "GCOL", version, 3 reserved, its size (8); then objects: index (2),
  // references (2), 4 reserved, size (8), the data. Find the object holding `word`.
  const size_t gcol = bytes.find("GCOL");
  ASSERT_NE(gcol, std::string::npos);
  const size_t at = bytes.find(word, gcol);
  ASSERT_NE(at, std::string::npos);
  uint64_t size = 0;
  std::memcpy(&size, bytes.data() + at - 8, 8);
  ASSERT_EQ(size, word.size());
  // A copy of the file with the 8 bytes at pos set to v.
  auto damaged = [&](size_t pos, uint64_t v, const std::string& name) {
    std::string d = bytes;
    std::memcpy(&d[pos], &v, 8);
    const std::string q = tmpfile(name);
    std::ofstream out(q, std::ios::binary);
    out << d;
    return q;
  };
  // Reading names from q is a UserError naming the file and the attribute and saying why; the
  // file's other strings still read where their heap objects are intact.
  auto refused = [&](const std::string& q, const std::string& why, bool others_intact) {
    h5::File f = h5::File::open(q);
    try {
      h5::get_attr_strv(f, "/", "names");
      ADD_FAILURE() << q << ": the damaged strings were read";
    } catch (const UserError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(q), std::string::npos) << m;
      EXPECT_NE(m.find("'names'"), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
    }
    if (others_intact) {
      EXPECT_EQ(h5::get_attr_str(f, "/", "format"), "unet-dataset");
    }
  };
  // Far past the collection (the fuzzer's case; a crash before).
  refused(damaged(at - 8, size + (uint64_t(0xa6) << 24), "gheap_far.h5"), "damaged", true);
  // A little past it (memory overwritten in the reading process): an error or 3 strings, and this
  // process goes on (the test's own heap would be damaged if the read ran here).
  const std::string near = damaged(at - 8, size + 4096, "gheap_near.h5");
  {
    h5::File f = h5::File::open(near);
    try {
      EXPECT_EQ(h5::get_attr_strv(f, "/", "names").size(), names.size());
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(near), std::string::npos) << e.what();
    }
    EXPECT_EQ(h5::get_attr_str(f, "/", "format"), "unet-dataset");
  }
  // The heap's free space (object 0, after the others) with size 0: HDF5 1.10 parses the
  // collection in a loop that then never moves on. The reading child is given up after 20 s.
  size_t obj = gcol + 16;
  uint16_t idx = 1;
  while (obj + 16 <= bytes.size()) {
    std::memcpy(&idx, bytes.data() + obj, 2);
    if (idx == 0) break;
    uint64_t sz = 0;
    std::memcpy(&sz, bytes.data() + obj + 8, 8);
    obj += 16 + (sz + 7) / 8 * 8;
  }
  ASSERT_EQ(idx, 0);
  const auto t0 = std::chrono::steady_clock::now();
  refused(damaged(obj + 8, 0, "gheap_loop.h5"), "still reading after", false);  // one heap for all
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60);
  std::vector<std::string> big(1000);
  for (auto& s : big) s = std::to_string(rng());
  {
    h5::File f = h5::File::open(p, true);
    h5::set_attr(f, "/", "big", big);
  }
  // The intact file reads through the same path, a thousand strings too.
  h5::File g = h5::File::open(p);
  EXPECT_EQ(h5::get_attr_strv(g, "/", "names"), names);
  EXPECT_EQ(h5::get_attr_strv(g, "/", "big"), big);
}

TEST(H5, OpenErrors) {
  std::string dir = test::temp_dir("h5err");
  auto expect_err = [](const std::string& path, const std::string& what, bool writable = false) {
    std::string msg;
    std::string err = capture_stderr_of([&] {
      try {
        h5::File::open(path, writable);
      } catch (const UserError& e) {
        msg = e.what();
      }
    });
    EXPECT_EQ(err, "") << "HDF5 printed to stderr";
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  expect_err(dir + "/missing.h5", "no such file");
  expect_err(dir + "/nodir/missing.h5", "no such file");
  expect_err(dir, "directory");
  {
    std::ofstream o(dir + "/garbage.h5", std::ios::binary);
    std::mt19937 g(test::test_seed());
    for (int i = 0; i < 4096; ++i) o.put((char)g());
  }
  expect_err(dir + "/garbage.h5", "not an HDF5 file");
  { std::ofstream o(dir + "/empty.h5"); }
  expect_err(dir + "/empty.h5", "not an HDF5 file");
  // A truncated real file: valid signature, missing the rest.
  {
    h5::File f = h5::File::create(dir + "/full.h5");
    std::vector<float> v = test::randn(100000, test::test_seed());
    h5::write_f32(f, "x", v.data(), {100000});
    f.close();
    std::ifstream in(dir + "/full.h5", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream o(dir + "/trunc.h5", std::ios::binary);
    o.write(bytes.data(), 1000);
  }
  std::string msg;
  std::string err = capture_stderr_of([&] {
    try {
      h5::File f = h5::File::open(dir + "/trunc.h5");
      h5::read_f32(f, "x");
    } catch (const UserError& e) {
      msg = e.what();
    }
  });
  EXPECT_EQ(err, "");
  EXPECT_NE(msg.find("trunc.h5"), std::string::npos) << msg;
  if (geteuid() != 0) {
    std::string p = dir + "/noperm.h5";
    { h5::File::create(p).close(); }
    chmod(p.c_str(), 0);
    expect_err(p, "permission denied");
    chmod(p.c_str(), 0444);
    expect_err(p, "permission denied", true);
  }
  EXPECT_THROW(h5::File::create(dir + "/no/such/dir/x.h5"), UserError);
}

TEST(H5, ConcurrentUse) {
  // The lock makes concurrent use from several threads safe (the HDF5 build is not thread-safe).
  std::string dir = test::temp_dir("h5mt");
  std::vector<std::thread> ts;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::string p = dir + "/f" + std::to_string(t) + ".h5";
      std::vector<float> v = test::randn(1000, test::test_seed() + t);
      for (int r = 0; r < 5; ++r) {
        h5::File f = h5::File::create(p);
        h5::write_f32(f, "v", v.data(), {1000}, {}, 3);
        h5::set_attr(f, "v", "t", (int64_t)t);
        f.close();
        h5::File g = h5::File::open(p);
        if (h5::read_f32(g, "v") == v && h5::get_attr_i64(g, "v", "t") == t) ok[t]++;
      }
    });
  for (auto& t : ts) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 5);
}

TEST(H5, H5pyInterop) {
  if (!has_h5py()) GTEST_SKIP() << "/usr/bin/python3 lacks h5py";
  std::string dir = test::temp_dir("h5py");
  std::string p = dir + "/ours.h5";
  std::vector<float> v = test::randn(6, test::test_seed());
  {
    h5::File f = h5::File::create(p);
    h5::write_f32(f, "model/w", v.data(), {2, 3});
    std::vector<uint8_t> img{1, 2, 3, 250, 251, 252};
    h5::write_u8(f, "images", img.data(), {1, 1, 2, 3}, {1, 1, 2, 3}, 4);
    int64_t lab = 7;
    h5::write_i64(f, "labels", &lab, {1});
    h5::set_attr(f, "/", "format", "unet-dataset");
    h5::set_attr(f, "/", "version", 1);
    h5::set_attr(f, "/", "lr", 0.5);
    h5::set_attr(f, "/", "mult", std::vector<int64_t>{1, 2});
    h5::set_attr(f, "labels", "class_names", std::vector<std::string>{"circles", "squares"});
    f.close();
  }
  char val[64];
  snprintf(val, sizeof val, "%.9g", v[4]);
  std::string py =
      "import h5py, numpy as np, sys\n"
      "f = h5py.File(sys.argv[1], 'r')\n"
      "assert f['model/w'].dtype == np.float32 and f['model/w'].shape == (2, 3)\n"
      "assert abs(float(f['model/w'][1, 1]) - float(sys.argv[2])) < 1e-6\n"
      "assert f['images'].dtype == np.uint8 and f['images'][0, 0, 1].tolist() == [250, 251, 252]\n"
      "assert f['labels'].dtype == np.int64 and f['labels'][0] == 7\n"
      "a = f.attrs\n"
      "assert isinstance(a['format'], str) and a['format'] == 'unet-dataset', repr(a['format'])\n"
      "assert a['version'] == 1 and a['lr'] == 0.5 and list(a['mult']) == [1, 2]\n"
      "cn = f['labels'].attrs['class_names']\n"
      "assert [str(x) for x in cn] == ['circles', 'squares'] and isinstance(cn[0], str), repr(cn)\n"
      // and the reverse direction: h5py writes, we read
      "g = h5py.File(sys.argv[3], 'w')\n"
      "g['x'] = np.arange(6, dtype=np.float64).reshape(2, 3)\n"
      "g['y'] = np.arange(4, dtype=np.int32)\n"
      "g.attrs['s'] = 'hello'\n"
      "g.attrs['fixed'] = np.bytes_('fixedlen')\n"
      "g.attrs['b'] = True\n"
      "g.attrs['i32'] = np.int32(-5)\n"
      "g.attrs['names'] = ['a', 'bb']\n"
      "g.attrs['fl'] = np.array([1.5, 2.5], dtype=np.float32)\n"
      "g.close()\n";
  std::string script = dir + "/check.py";
  std::ofstream(script) << py;
  std::string p2 = dir + "/theirs.h5";
  int rc = std::system(("/usr/bin/python3 " + script + " " + p + " " + val + " " + p2).c_str());
  ASSERT_EQ(rc, 0);
  h5::File g = h5::File::open(p2);
  EXPECT_EQ(h5::read_f32(g, "x"), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(h5::read_i64(g, "y"), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(h5::dtype(g, "x"), h5::DType::F64);
  EXPECT_EQ(h5::get_attr_str(g, "/", "s"), "hello");
  EXPECT_EQ(h5::get_attr_str(g, "/", "fixed"), "fixedlen");
  EXPECT_EQ(h5::get_attr_i64(g, "/", "b"), 1);
  EXPECT_EQ(h5::get_attr_i64(g, "/", "i32"), -5);
  EXPECT_EQ(h5::get_attr_strv(g, "/", "names"), (std::vector<std::string>{"a", "bb"}));
  EXPECT_EQ(h5::get_attr_f64v(g, "/", "fl"), (std::vector<double>{1.5, 2.5}));
}
