// A thin RAII layer over the HDF5 C API (Debian libhdf5 1.10, serial build).
//
// Every function here takes one global recursive mutex, because the Debian build is not
// thread-safe; callers that make several raw H5* calls in a row can take h5::mutex() themselves.
// HDF5's automatic error-stack printing is switched off before the first call: every failure
// surfaces as unet::UserError("<file>: <path>: <problem>") instead.
//
// Objects are addressed by '/'-separated paths relative to the root ("images", "model/out.2.weight");
// "/" or "" is the root group. Writers create intermediate groups. Strings are written as
// variable-length UTF-8 (h5py reads them back as str); readers accept variable- and fixed-length.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace unet::h5 {

// The lock every wrapper takes. Recursive so wrappers can call each other.
std::recursive_mutex& mutex();

// Owns one hid_t and closes it with the matching H5*close. Move-only.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();      // closes now (errors ignored)
  hid_t release() {  // gives up ownership without closing
    hid_t i = id_;
    id_ = -1;
    return i;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Element types the project stores. Other is anything else (reported by name in errors).
enum class DType { F32, F64, U8, I8, I32, I64, U16, U32, U64, I16, Str, Other };
const char* dtype_name(DType t);  // "float32", "uint8", ...

class File {
 public:
  File() = default;
  // Creates (truncating) a file. Callers normally pass AtomicFile::tmp_path() and the final name
  // as `display`, which every error message then names instead of the temporary.
  static File create(const std::string& path, const std::string& display = "");
  // Opens an existing file. Throws UserError: "<path>: no such file", "<path>: not an HDF5 file",
  // "<path>: cannot open (permission denied)", "<path>: is a directory", ...
  static File open(const std::string& path, bool writable = false);
  File(File&&) noexcept = default;
  File& operator=(File&&) noexcept = default;
  ~File();

  const std::string& path() const { return path_; }  // the display name
  hid_t id() const { return h_.get(); }
  bool is_open() const { return h_.valid(); }
  // Flushes and closes; throws UserError "<path>: cannot write (<OS reason>)" when the flush
  // fails (disk full, I/O error). Idempotent.
  void close();

 private:
  std::string path_;
  Handle h_;
};

// ---- queries -------------------------------------------------------------------------------
bool exists(File& f, const std::string& path);  // any link (group or dataset) at path
bool is_dataset(File& f, const std::string& path);
bool is_group(File& f, const std::string& path);
std::vector<hsize_t> shape(File& f, const std::string& path);  // dataset dims ({} for scalar)
DType dtype(File& f, const std::string& path);
// Names of the children of a group (datasets and groups), sorted by byte order.
std::vector<std::string> list(File& f, const std::string& group_path);
void create_group(File& f, const std::string& path);  // with intermediates; no-op if present

// ---- datasets: write -----------------------------------------------------------------------
// Writes (replacing any existing dataset at `path`) a dataset of `shape`. An empty chunk means
// contiguous storage unless gzip > 0, in which case the whole array is one chunk (capped to ~1 MiB
// along the leading dimension). gzip: 0 = off, 1..9 = deflate level.
void write(File& f, const std::string& path, DType t, const void* data, const std::vector<hsize_t>& shape,
           const std::vector<hsize_t>& chunk = {}, int gzip = 0);
inline void write_f32(File& f, const std::string& p, const float* d, const std::vector<hsize_t>& s,
                      const std::vector<hsize_t>& chunk = {}, int gzip = 0) {
  write(f, p, DType::F32, d, s, chunk, gzip);
}
inline void write_u8(File& f, const std::string& p, const uint8_t* d, const std::vector<hsize_t>& s,
                     const std::vector<hsize_t>& chunk = {}, int gzip = 0) {
  write(f, p, DType::U8, d, s, chunk, gzip);
}
inline void write_i64(File& f, const std::string& p, const int64_t* d, const std::vector<hsize_t>& s,
                      const std::vector<hsize_t>& chunk = {}, int gzip = 0) {
  write(f, p, DType::I64, d, s, chunk, gzip);
}

// Extendible datasets, for writers that do not know N in advance: shape [0, row_shape...] with an
// unlimited leading dimension, chunked by chunk_rows rows. append_rows grows it and writes `nrows`
// rows at the end.
void create_extendible(File& f, const std::string& path, DType t, const std::vector<hsize_t>& row_shape,
                       hsize_t chunk_rows, int gzip = 0);
void append_rows(File& f, const std::string& path, DType t, const void* data, hsize_t nrows);

// ---- datasets: read ------------------------------------------------------------------------
// Reads the whole dataset into `out`, which must hold exactly `n` elements (UserError on a size
// mismatch). Conversion happens within a class only (float64 -> float32 is fine; an int dataset
// read as float is a UserError naming both types).
void read(File& f, const std::string& path, DType t, void* out, size_t n);
// Reads rows [start, start+count) of the leading dimension into `out` (count * row elements).
void read_rows(File& f, const std::string& path, DType t, hsize_t start, hsize_t count, void* out);

std::vector<float> read_f32(File& f, const std::string& path);
std::vector<uint8_t> read_u8(File& f, const std::string& path);
std::vector<int64_t> read_i64(File& f, const std::string& path);
inline void read_f32_into(File& f, const std::string& p, float* out, size_t n) {
  read(f, p, DType::F32, out, n);
}
inline void read_u8_into(File& f, const std::string& p, uint8_t* out, size_t n) {
  read(f, p, DType::U8, out, n);
}
inline void read_i64_into(File& f, const std::string& p, int64_t* out, size_t n) {
  read(f, p, DType::I64, out, n);
}
std::vector<float> read_f32(File& f, const std::string& path, hsize_t start, hsize_t count);
std::vector<uint8_t> read_u8(File& f, const std::string& path, hsize_t start, hsize_t count);
std::vector<int64_t> read_i64(File& f, const std::string& path, hsize_t start, hsize_t count);

// ---- attributes on "/" or any group/dataset path -------------------------------------------
bool has_attr(File& f, const std::string& obj_path, const std::string& name);
void set_attr(File& f, const std::string& obj_path, const std::string& name, int64_t v);
void set_attr(File& f, const std::string& obj_path, const std::string& name, double v);
void set_attr(File& f, const std::string& obj_path, const std::string& name, const std::string& v);
void set_attr(File& f, const std::string& obj_path, const std::string& name, const char* v);
void set_attr(File& f, const std::string& obj_path, const std::string& name, const std::vector<int64_t>& v);
void set_attr(File& f, const std::string& obj_path, const std::string& name, const std::vector<double>& v);
void set_attr(File& f, const std::string& obj_path, const std::string& name,
              const std::vector<std::string>& v);
// Avoid int -> {int64,double} ambiguity at call sites.
inline void set_attr(File& f, const std::string& o, const std::string& n, int v) {
  set_attr(f, o, n, (int64_t)v);
}
inline void set_attr(File& f, const std::string& o, const std::string& n, bool v) {
  set_attr(f, o, n, (int64_t)v);
}

// Getters accept a scalar or a 1-element array for the scalar forms and a scalar as a 1-element
// vector for the vector forms. Integer attributes of any width/sign read as int64; doubles accept
// float and integer attributes. Missing attribute or wrong class -> UserError.
int64_t get_attr_i64(File& f, const std::string& obj_path, const std::string& name);
double get_attr_f64(File& f, const std::string& obj_path, const std::string& name);
std::string get_attr_str(File& f, const std::string& obj_path, const std::string& name);
std::vector<int64_t> get_attr_i64v(File& f, const std::string& obj_path, const std::string& name);
std::vector<double> get_attr_f64v(File& f, const std::string& obj_path, const std::string& name);
std::vector<std::string> get_attr_strv(File& f, const std::string& obj_path, const std::string& name);
std::vector<std::string> list_attrs(File& f, const std::string& obj_path);  // sorted
// The element type of an attribute (an h5py bool enum reads as I8). UserError when missing.
DType attr_dtype(File& f, const std::string& obj_path, const std::string& name);

}  // namespace unet::h5
