#include "h5.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "util.h"

namespace unet::h5 {

std::recursive_mutex& mutex() {
  static std::recursive_mutex m;
  return m;
}

namespace {

// Takes the global lock and, the first time, silences HDF5's error-stack printing so that no
// library chatter ever reaches the user (failures are reported through UserError instead).
struct Lock {
  std::lock_guard<std::recursive_mutex> g;
  Lock() : g(mutex()) {
    static bool once = [] {
      // A file whose close failed (disk full) stays registered with a half-freed object, and the
      // library's atexit shutdown then crashes on it (H5_term_library -> H5F__close_cb). Every
      // file is closed explicitly (RAII), so the shutdown has nothing else to do: skip it.
      H5dont_atexit();
      H5open();
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      return true;
    }();
    (void)once;
  }
};

std::string where(const File& f, const std::string& path) { return f.path() + ": " + path; }
[[noreturn]] void fail(const File& f, const std::string& path, const std::string& what) {
  throw UserError(where(f, path) + ": " + what);
}

// The operating system's reason for the failure HDF5 just reported, from its error stack: the
// sec2 driver records "errno = 28, error message = 'No space left on device'".
std::string os_cause() {
  std::string cause;
  auto cb = [](unsigned, const H5E_error2_t* e, void* op) -> herr_t {
    auto* out = static_cast<std::string*>(op);
    const char* d = e->desc ? std::strstr(e->desc, "error message = '") : nullptr;
    if (d && out->empty()) {
      d += std::strlen("error message = '");
      const char* q = std::strchr(d, '\'');
      *out = q ? std::string(d, q) : std::string(d);
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, cb, &cause);
  return cause;
}
std::string io_cause() {
  std::string c = os_cause();
  return c.empty() ? "disk full or I/O error" : c;
}

// A write that failed: the file and the cause, no internal dataset path (the user cannot act on it).
[[noreturn]] void write_fail(const File& f) {
  throw UserError(f.path() + ": cannot write (" + io_cause() + ")");
}
// Creating an object fails for an I/O reason (metadata written out) or a structural one.
[[noreturn]] void create_fail(const File& f, const std::string& path, const std::string& what) {
  if (!os_cause().empty()) write_fail(f);
  fail(f, path, what);
}

const char* obj_name(const std::string& p) { return p.empty() ? "/" : p.c_str(); }

std::string shape_str(const std::vector<hsize_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string((unsigned long long)s[i]);
  return r + "]";
}

hid_t mem_type(DType t) {
  switch (t) {
    case DType::F32:
      return H5T_NATIVE_FLOAT;
    case DType::F64:
      return H5T_NATIVE_DOUBLE;
    case DType::U8:
      return H5T_NATIVE_UINT8;
    case DType::I8:
      return H5T_NATIVE_INT8;
    case DType::I16:
      return H5T_NATIVE_INT16;
    case DType::U16:
      return H5T_NATIVE_UINT16;
    case DType::I32:
      return H5T_NATIVE_INT32;
    case DType::U32:
      return H5T_NATIVE_UINT32;
    case DType::I64:
      return H5T_NATIVE_INT64;
    case DType::U64:
      return H5T_NATIVE_UINT64;
    default:
      throw std::logic_error("h5: no memory type for this dtype");
  }
}

// Stored types are little-endian standard types, whatever the host.
hid_t file_type(DType t) {
  switch (t) {
    case DType::F32:
      return H5T_IEEE_F32LE;
    case DType::F64:
      return H5T_IEEE_F64LE;
    case DType::U8:
      return H5T_STD_U8LE;
    case DType::I8:
      return H5T_STD_I8LE;
    case DType::I16:
      return H5T_STD_I16LE;
    case DType::U16:
      return H5T_STD_U16LE;
    case DType::I32:
      return H5T_STD_I32LE;
    case DType::U32:
      return H5T_STD_U32LE;
    case DType::I64:
      return H5T_STD_I64LE;
    case DType::U64:
      return H5T_STD_U64LE;
    default:
      throw std::logic_error("h5: no file type for this dtype");
  }
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::U8:
    case DType::I8:
      return 1;
    case DType::U16:
    case DType::I16:
      return 2;
    case DType::F32:
    case DType::I32:
    case DType::U32:
      return 4;
    default:
      return 8;
  }
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F64; }
bool is_int(DType t) {
  return t == DType::U8 || t == DType::I8 || t == DType::U16 || t == DType::I16 || t == DType::U32 ||
         t == DType::I32 || t == DType::U64 || t == DType::I64;
}

DType classify(hid_t type) {
  size_t sz = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      return sz == 4 ? DType::F32 : sz == 8 ? DType::F64 : DType::Other;
    case H5T_INTEGER: {
      bool s = H5Tget_sign(type) == H5T_SGN_2;
      switch (sz) {
        case 1:
          return s ? DType::I8 : DType::U8;
        case 2:
          return s ? DType::I16 : DType::U16;
        case 4:
          return s ? DType::I32 : DType::U32;
        case 8:
          return s ? DType::I64 : DType::U64;
        default:
          return DType::Other;
      }
    }
    case H5T_STRING:
      return DType::Str;
    default:
      return DType::Other;
  }
}

// Conversion is allowed within a class (float<->float, int<->int), never across.
bool compatible(DType want, DType have) {
  return (is_float(want) && is_float(have)) || (is_int(want) && is_int(have));
}

Handle lcpl_intermediate() {
  Handle p(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(p.get(), 1);
  return p;
}

Handle open_dataset(File& f, const std::string& path) {
  if (!f.is_open()) throw UserError(f.path() + ": file is not open");
  if (!exists(f, path)) fail(f, path, "no such dataset");
  hid_t d = H5Dopen2(f.id(), path.c_str(), H5P_DEFAULT);
  if (d < 0) fail(f, path, "is not a dataset (or cannot be opened)");
  return Handle(d, H5Dclose);
}

Handle open_object(File& f, const std::string& path) {
  if (!f.is_open()) throw UserError(f.path() + ": file is not open");
  if (!(path.empty() || path == "/") && !exists(f, path)) fail(f, path, "no such object");
  hid_t o = H5Oopen(f.id(), obj_name(path), H5P_DEFAULT);
  if (o < 0) fail(f, path, "cannot open object");
  return Handle(o, H5Oclose);
}

std::vector<hsize_t> space_dims(hid_t space) {
  int r = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> d(r > 0 ? r : 0);
  if (r > 0) H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return d;
}

Handle make_space(const std::vector<hsize_t>& shape) {
  if (shape.empty()) return Handle(H5Screate(H5S_SCALAR), H5Sclose);
  return Handle(H5Screate_simple((int)shape.size(), shape.data(), nullptr), H5Sclose);
}

Handle vlen_str_type() {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::F64:
      return "float64";
    case DType::U8:
      return "uint8";
    case DType::I8:
      return "int8";
    case DType::I16:
      return "int16";
    case DType::U16:
      return "uint16";
    case DType::I32:
      return "int32";
    case DType::U32:
      return "uint32";
    case DType::I64:
      return "int64";
    case DType::U64:
      return "uint64";
    case DType::Str:
      return "string";
    default:
      return "unsupported type";
  }
}

// ---- Handle ----------------------------------------------------------------------------------
Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = -1;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && closer_) {
    Lock l;
    closer_(id_);
  }
  id_ = -1;
}

// ---- File ------------------------------------------------------------------------------------
namespace {
Handle make_fapl() {
  Handle p(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // Close every object with the file so data is flushed when File goes away.
  H5Pset_fclose_degree(p.get(), H5F_CLOSE_STRONG);
  // 1.8 format: readable by any h5py/HDF5 of the last decade, yet allows large attributes.
  H5Pset_libver_bounds(p.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
#if H5_VERSION_GE(1, 10, 7)
  // File systems without flock (some NFS) should not make every open fail.
  H5Pset_file_locking(p.get(), true, true);
#endif
  return p;
}
}  // namespace

File File::create(const std::string& path, const std::string& display) {
  Lock l;
  const std::string& name = display.empty() ? path : display;
  check_writable_dir_for(path);
  Handle fapl = make_fapl();
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) {
    if (access(path.c_str(), F_OK) == 0 && access(path.c_str(), W_OK) != 0)
      throw UserError(name + ": cannot create (permission denied)");
    throw UserError(name + ": cannot create HDF5 file (" + io_cause() + ")");
  }
  File f;
  f.path_ = name;
  f.h_ = Handle(id, H5Fclose);
  return f;
}

File File::open(const std::string& path, bool writable) {
  Lock l;
  const struct stat st = check_input_exists(path);
  if (S_ISDIR(st.st_mode)) throw UserError(path + ": is a directory, not an HDF5 file");
  if (!S_ISREG(st.st_mode))  // (HDF5 seeks: a FIFO or device is never one; its size reads 0)
    throw UserError(path + ": is " + file_kind(st.st_mode) + ", not an HDF5 file");
  if (access(path.c_str(), R_OK) != 0) throw UserError(path + ": cannot open (permission denied)");
  if (writable && access(path.c_str(), W_OK) != 0)
    throw UserError(path + ": cannot open for writing (permission denied)");
  if (st.st_size == 0) throw UserError(path + ": not an HDF5 file (empty)");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw UserError(path + ": not an HDF5 file");
  Handle fapl = make_fapl();
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get());
  if (id < 0)
    throw UserError(path + ": cannot open (corrupt or truncated HDF5 file, or in use by another writer)");
  File f;
  f.path_ = path;
  f.h_ = Handle(id, H5Fclose);
  return f;
}

File::~File() { h_.reset(); }

void File::close() {
  Lock l;
  if (!h_.valid()) return;
  std::string cause;
  if (H5Fflush(h_.get(), H5F_SCOPE_LOCAL) < 0) cause = io_cause();
  // Release first so a failing close is not retried by the destructor (the object is freed even
  // when H5Fclose fails; closing it again would touch freed memory).
  if (H5Fclose(h_.release()) < 0 && cause.empty()) cause = io_cause();
  if (!cause.empty()) throw UserError(path_ + ": cannot write (" + cause + ")");
}

// ---- queries ---------------------------------------------------------------------------------
bool exists(File& f, const std::string& path) {
  Lock l;
  if (!f.is_open()) return false;
  if (path.empty() || path == "/") return true;
  // H5Lexists fails (rather than returning false) when an intermediate group is missing, so
  // walk the path one component at a time.
  std::string prefix;
  size_t i = 0;
  if (path[0] == '/') {
    prefix = "/";
    i = 1;
  }
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) {
      if (!prefix.empty() && prefix.back() != '/') prefix += '/';
      prefix += path.substr(i, j - i);
      if (H5Lexists(f.id(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      if (j < path.size()) {  // an intermediate component must be a group to descend into
        H5O_info_t info;
        if (H5Oget_info_by_name(f.id(), prefix.c_str(), &info, H5P_DEFAULT) < 0 ||
            info.type != H5O_TYPE_GROUP)
          return false;
      }
    }
    i = j + 1;
  }
  return true;
}

static H5O_type_t obj_type(File& f, const std::string& path) {
  Lock l;
  if (!exists(f, path)) return H5O_TYPE_UNKNOWN;
  H5O_info_t info;
  if (H5Oget_info_by_name(f.id(), obj_name(path), &info, H5P_DEFAULT) < 0) return H5O_TYPE_UNKNOWN;
  return info.type;
}

bool is_dataset(File& f, const std::string& path) { return obj_type(f, path) == H5O_TYPE_DATASET; }
bool is_group(File& f, const std::string& path) { return obj_type(f, path) == H5O_TYPE_GROUP; }

std::vector<hsize_t> shape(File& f, const std::string& path) {
  Lock l;
  Handle d = open_dataset(f, path);
  Handle s(H5Dget_space(d.get()), H5Sclose);
  return space_dims(s.get());
}

DType dtype(File& f, const std::string& path) {
  Lock l;
  Handle d = open_dataset(f, path);
  Handle t(H5Dget_type(d.get()), H5Tclose);
  return classify(t.get());
}

std::vector<std::string> list(File& f, const std::string& group_path) {
  Lock l;
  if (!is_group(f, group_path))
    fail(f, group_path, exists(f, group_path) ? "is not a group" : "no such group");
  Handle g(H5Gopen2(f.id(), obj_name(group_path), H5P_DEFAULT), H5Gclose);
  if (!g.valid()) fail(f, group_path, "cannot open group");
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5L_info_t*, void* op) -> herr_t {
    static_cast<std::vector<std::string>*>(op)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_NATIVE, &idx, cb, &names) < 0)
    fail(f, group_path, "cannot list group");
  std::sort(names.begin(), names.end());
  return names;
}

void create_group(File& f, const std::string& path) {
  Lock l;
  if (path.empty() || path == "/") return;
  if (is_group(f, path)) return;
  if (exists(f, path)) fail(f, path, "exists and is not a group");
  Handle lcpl = lcpl_intermediate();
  Handle g(H5Gcreate2(f.id(), path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.valid()) fail(f, path, "cannot create group");
}

// ---- datasets: write -------------------------------------------------------------------------
void write(File& f, const std::string& path, DType t, const void* data, const std::vector<hsize_t>& shp,
           const std::vector<hsize_t>& chunk_in, int gzip) {
  Lock l;
  if (!f.is_open()) throw UserError(f.path() + ": file is not open");
  if (exists(f, path) && H5Ldelete(f.id(), path.c_str(), H5P_DEFAULT) < 0)
    fail(f, path, "cannot replace dataset");
  size_t n = 1;
  for (hsize_t d : shp) n *= d;
  Handle space = make_space(shp);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!shp.empty() && n > 0 && (!chunk_in.empty() || gzip > 0)) {
    std::vector<hsize_t> chunk = chunk_in;
    if (chunk.empty()) {
      // One chunk for the array, capped at ~1 MiB along the leading dimension.
      chunk = shp;
      size_t row = dtype_size(t);
      for (size_t i = 1; i < shp.size(); ++i) row *= shp[i];
      chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(shp[0], (1u << 20) / std::max<size_t>(row, 1)));
    }
    if (chunk.size() != shp.size()) fail(f, path, "chunk rank differs from dataset rank");
    for (size_t i = 0; i < shp.size(); ++i) chunk[i] = std::max<hsize_t>(1, std::min(chunk[i], shp[i]));
    H5Pset_chunk(dcpl.get(), (int)chunk.size(), chunk.data());
    if (gzip > 0) H5Pset_deflate(dcpl.get(), std::min(gzip, 9));
  }
  Handle lcpl = lcpl_intermediate();
  Handle d(H5Dcreate2(f.id(), path.c_str(), file_type(t), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
           H5Dclose);
  if (!d.valid()) create_fail(f, path, "cannot create dataset");
  if (n > 0 && H5Dwrite(d.get(), mem_type(t), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) write_fail(f);
}

void create_extendible(File& f, const std::string& path, DType t, const std::vector<hsize_t>& row_shape,
                       hsize_t chunk_rows, int gzip) {
  Lock l;
  if (!f.is_open()) throw UserError(f.path() + ": file is not open");
  if (exists(f, path) && H5Ldelete(f.id(), path.c_str(), H5P_DEFAULT) < 0)
    fail(f, path, "cannot replace dataset");
  std::vector<hsize_t> dims{0}, maxd{H5S_UNLIMITED}, chunk{std::max<hsize_t>(1, chunk_rows)};
  for (hsize_t r : row_shape) {
    if (r == 0) fail(f, path, "zero-sized row dimension");
    dims.push_back(r);
    maxd.push_back(r);
    chunk.push_back(r);
  }
  Handle space(H5Screate_simple((int)dims.size(), dims.data(), maxd.data()), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), (int)chunk.size(), chunk.data());
  if (gzip > 0) H5Pset_deflate(dcpl.get(), std::min(gzip, 9));
  Handle lcpl = lcpl_intermediate();
  Handle d(H5Dcreate2(f.id(), path.c_str(), file_type(t), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
           H5Dclose);
  if (!d.valid()) create_fail(f, path, "cannot create dataset");
}

void append_rows(File& f, const std::string& path, DType t, const void* data, hsize_t nrows) {
  Lock l;
  if (nrows == 0) return;
  Handle d = open_dataset(f, path);
  std::vector<hsize_t> dims;
  {
    Handle s(H5Dget_space(d.get()), H5Sclose);
    dims = space_dims(s.get());
  }
  if (dims.empty()) fail(f, path, "cannot append to a scalar dataset");
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = dims[0];
  count[0] = nrows;
  dims[0] += nrows;
  if (H5Dset_extent(d.get(), dims.data()) < 0) write_fail(f);
  Handle fs(H5Dget_space(d.get()), H5Sclose);
  H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  Handle ms(H5Screate_simple((int)count.size(), count.data(), nullptr), H5Sclose);
  if (H5Dwrite(d.get(), mem_type(t), ms.get(), fs.get(), H5P_DEFAULT, data) < 0) write_fail(f);
}

// ---- datasets: read --------------------------------------------------------------------------
namespace {
void check_type(File& f, const std::string& path, hid_t d, DType want) {
  Handle ft(H5Dget_type(d), H5Tclose);
  DType have = classify(ft.get());
  if (!compatible(want, have))
    fail(f, path, std::string("expected ") + dtype_name(want) + ", found " + dtype_name(have));
}
}  // namespace

void read(File& f, const std::string& path, DType t, void* out, size_t n) {
  Lock l;
  Handle d = open_dataset(f, path);
  check_type(f, path, d.get(), t);
  Handle s(H5Dget_space(d.get()), H5Sclose);
  hssize_t np = H5Sget_simple_extent_npoints(s.get());
  if (np < 0 || (size_t)np != n)
    fail(f, path,
         "has " + std::to_string((long long)np) + " elements (shape " + shape_str(space_dims(s.get())) +
             "), expected " + std::to_string(n));
  if (n > 0 && H5Dread(d.get(), mem_type(t), H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    fail(f, path, "cannot read dataset (corrupt file?)");
}

void read_rows(File& f, const std::string& path, DType t, hsize_t start, hsize_t count, void* out) {
  Lock l;
  Handle d = open_dataset(f, path);
  check_type(f, path, d.get(), t);
  Handle fs(H5Dget_space(d.get()), H5Sclose);
  std::vector<hsize_t> dims = space_dims(fs.get());
  if (dims.empty()) fail(f, path, "is a scalar; cannot read rows");
  if (start > dims[0] || count > dims[0] - start)
    fail(f, path,
         "rows [" + std::to_string((unsigned long long)start) + ", " +
             std::to_string((unsigned long long)(start + count)) + ") out of range (shape " +
             shape_str(dims) + ")");
  if (count == 0) return;
  std::vector<hsize_t> st(dims.size(), 0), cnt = dims;
  st[0] = start;
  cnt[0] = count;
  H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, st.data(), nullptr, cnt.data(), nullptr);
  Handle ms(H5Screate_simple((int)cnt.size(), cnt.data(), nullptr), H5Sclose);
  if (H5Dread(d.get(), mem_type(t), ms.get(), fs.get(), H5P_DEFAULT, out) < 0)
    fail(f, path, "cannot read dataset (corrupt file?)");
}

namespace {
template <class T>
std::vector<T> read_all(File& f, const std::string& path, DType t) {
  Lock l;
  std::vector<hsize_t> s = shape(f, path);
  double bytes = sizeof(T);
  for (hsize_t d : s) bytes *= (double)d;
  // A dataset's shape is the file's claim (a chunked dataset of any shape fits in a tiny file):
  // check it against memory before allocating.
  check_memory(bytes, where(f, path) + " (shape " + shape_str(s) + ")");
  size_t n = 1;
  for (hsize_t d : s) n *= d;
  std::vector<T> v(n);
  read(f, path, t, v.data(), n);
  return v;
}
template <class T>
std::vector<T> read_some(File& f, const std::string& path, DType t, hsize_t start, hsize_t count) {
  Lock l;
  std::vector<hsize_t> s = shape(f, path);
  size_t row = 1;
  for (size_t i = 1; i < s.size(); ++i) row *= s[i];
  check_memory((double)sizeof(T) * (double)row * (double)count, where(f, path) + " (rows)");
  std::vector<T> v;
  if (!s.empty() && start <= s[0] && count <= s[0] - start) v.resize(count * row);
  read_rows(f, path, t, start, count, v.data());
  return v;
}
}  // namespace

std::vector<float> read_f32(File& f, const std::string& p) { return read_all<float>(f, p, DType::F32); }
std::vector<uint8_t> read_u8(File& f, const std::string& p) { return read_all<uint8_t>(f, p, DType::U8); }
std::vector<int64_t> read_i64(File& f, const std::string& p) { return read_all<int64_t>(f, p, DType::I64); }
std::vector<float> read_f32(File& f, const std::string& p, hsize_t s, hsize_t c) {
  return read_some<float>(f, p, DType::F32, s, c);
}
std::vector<uint8_t> read_u8(File& f, const std::string& p, hsize_t s, hsize_t c) {
  return read_some<uint8_t>(f, p, DType::U8, s, c);
}
std::vector<int64_t> read_i64(File& f, const std::string& p, hsize_t s, hsize_t c) {
  return read_some<int64_t>(f, p, DType::I64, s, c);
}

// ---- attributes ------------------------------------------------------------------------------
namespace {
std::string attr_where(const std::string& obj, const std::string& name) {
  return (obj.empty() || obj == "/" ? std::string("attribute '") : obj + ": attribute '") + name + "'";
}
[[noreturn]] void attr_fail(File& f, const std::string& obj, const std::string& name,
                            const std::string& what) {
  throw UserError(f.path() + ": " + attr_where(obj, name) + ": " + what);
}

void write_attr(File& f, const std::string& obj, const std::string& name, hid_t ftype, hid_t mtype,
                const std::vector<hsize_t>& shp, const void* data) {
  Lock l;
  Handle o = open_object(f, obj);
  if (H5Aexists(o.get(), name.c_str()) > 0 && H5Adelete(o.get(), name.c_str()) < 0)
    attr_fail(f, obj, name, "cannot replace");
  Handle space = make_space(shp);
  Handle a(H5Acreate2(o.get(), name.c_str(), ftype, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) {
    if (!os_cause().empty()) write_fail(f);
    attr_fail(f, obj, name, "cannot create");
  }
  size_t n = 1;
  for (hsize_t d : shp) n *= d;
  if (n > 0 && H5Awrite(a.get(), mtype, data) < 0) {
    if (!os_cause().empty()) write_fail(f);
    attr_fail(f, obj, name, "cannot write");
  }
}

constexpr size_t kMaxAttrElements = 1u << 22;

struct OpenAttr {
  Handle obj, attr, type, space;
  DType dt;
  H5T_class_t cls;
  size_t n;
};

OpenAttr open_attr(File& f, const std::string& obj, const std::string& name) {
  OpenAttr r;
  r.obj = open_object(f, obj);
  if (H5Aexists(r.obj.get(), name.c_str()) <= 0) attr_fail(f, obj, name, "missing");
  r.attr = Handle(H5Aopen(r.obj.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!r.attr.valid()) attr_fail(f, obj, name, "cannot open");
  r.type = Handle(H5Aget_type(r.attr.get()), H5Tclose);
  r.space = Handle(H5Aget_space(r.attr.get()), H5Sclose);
  r.cls = H5Tget_class(r.type.get());
  r.dt = classify(r.type.get());
  hssize_t np = H5Sget_simple_extent_npoints(r.space.get());
  if (np < 0) attr_fail(f, obj, name, "cannot read (corrupt?)");
  // Attributes are small by nature; a huge one is corrupt or hostile and must not be allocated.
  if (np > (hssize_t)kMaxAttrElements)
    attr_fail(f, obj, name,
              "has " + std::to_string((long long)np) + " values (at most " +
                  std::to_string(kMaxAttrElements) + ")");
  r.n = (size_t)np;
  return r;
}

std::vector<int64_t> read_int_attr(File& f, const std::string& obj, const std::string& name) {
  Lock l;
  OpenAttr a = open_attr(f, obj, name);
  std::vector<int64_t> v(a.n);
  if (a.cls == H5T_ENUM) {
    // h5py stores numpy bools as an int8 enum; HDF5 will not convert enum -> int, so read the raw
    // base integers and widen them here.
    Handle base(H5Tget_super(a.type.get()), H5Tclose);
    size_t sz = H5Tget_size(base.get());
    bool sgn = H5Tget_sign(base.get()) == H5T_SGN_2;
    if (H5Tget_class(base.get()) != H5T_INTEGER || (sz != 1 && sz != 2 && sz != 4 && sz != 8))
      attr_fail(f, obj, name, "unsupported enum type");
    Handle mt(H5Tget_native_type(a.type.get(), H5T_DIR_ASCEND), H5Tclose);
    std::vector<uint8_t> raw(a.n * sz);
    if (a.n && H5Aread(a.attr.get(), mt.get(), raw.data()) < 0) attr_fail(f, obj, name, "cannot read");
    for (size_t i = 0; i < a.n; ++i) {
      const uint8_t* p = raw.data() + i * sz;
      int64_t x = 0;
      if (sz == 1) x = sgn ? (int64_t) * (const int8_t*)p : (int64_t) * (const uint8_t*)p;
      if (sz == 2) x = sgn ? (int64_t) * (const int16_t*)p : (int64_t) * (const uint16_t*)p;
      if (sz == 4) x = sgn ? (int64_t) * (const int32_t*)p : (int64_t) * (const uint32_t*)p;
      if (sz == 8) memcpy(&x, p, 8);
      v[i] = x;
    }
    return v;
  }
  if (!is_int(a.dt)) attr_fail(f, obj, name, std::string("expected an integer, found ") + dtype_name(a.dt));
  if (a.n && H5Aread(a.attr.get(), H5T_NATIVE_INT64, v.data()) < 0) attr_fail(f, obj, name, "cannot read");
  return v;
}

std::vector<double> read_f64_attr(File& f, const std::string& obj, const std::string& name) {
  Lock l;
  OpenAttr a = open_attr(f, obj, name);
  if (a.cls == H5T_ENUM || is_int(a.dt)) {
    std::vector<int64_t> iv = read_int_attr(f, obj, name);
    return std::vector<double>(iv.begin(), iv.end());
  }
  if (!is_float(a.dt)) attr_fail(f, obj, name, std::string("expected a number, found ") + dtype_name(a.dt));
  std::vector<double> v(a.n);
  if (a.n && H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, v.data()) < 0) attr_fail(f, obj, name, "cannot read");
  return v;
}

// A variable-length string attribute's strings as HDF5 reads them (into memory it allocates).
bool read_vlen_strings(const OpenAttr& a, std::vector<char*>& ptrs, Handle& mt) {
  mt = Handle(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mt.get(), H5T_VARIABLE);
  H5Tset_cset(mt.get(), H5Tget_cset(a.type.get()));
  ptrs.assign(a.n, nullptr);
  return H5Aread(a.attr.get(), mt.get(), ptrs.data()) >= 0;
}

// Reads a variable-length string attribute's strings into out; returns why it could not ("" when
// it could). HDF5 1.10 trusts the object sizes in a file's global heap, where these strings live:
// a damaged size makes H5Aread copy past its buffer (a crash, or memory silently overwritten). So
// the read runs in a forked child that sends the strings back through a pipe, and a damaged file
// can only hurt that throwaway process. The caller holds the HDF5 lock, so no other thread of ours
// is inside the library at the fork. Where no process can be forked, the read runs here.
std::string read_vlen_strings_apart(const OpenAttr& a, std::vector<std::string>& out) {
  const std::string corrupt = "cannot read (a damaged variable-length string: the file is corrupt)";
  auto in_process = [&] {
    std::vector<char*> ptrs;
    Handle mt;
    if (!read_vlen_strings(a, ptrs, mt)) return std::string("cannot read");
    for (char* p : ptrs) out.emplace_back(p ? p : "");
    H5Dvlen_reclaim(mt.get(), a.space.get(), H5P_DEFAULT, ptrs.data());
    return std::string();
  };
  int fds[2];
  if (pipe(fds) != 0) return in_process();
  std::fflush(stdout);  // the child leaves through _exit: nothing buffered is written twice
  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(fds[0]), ::close(fds[1]);
    return in_process();
  }
  if (pid == 0) {
    // Child: a Ctrl-C meant for the run must not look like a damaged file; it dies with the run.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    signal(SIGINT, SIG_IGN), signal(SIGTERM, SIG_IGN), signal(SIGHUP, SIG_IGN), signal(SIGPIPE, SIG_DFL);
    ::close(fds[0]);
    std::vector<char*> ptrs;
    Handle mt;
    if (!read_vlen_strings(a, ptrs, mt)) _exit(2);
    for (char* p : ptrs) {
      const uint64_t len = p ? std::strlen(p) : 0;
      if (!write_all(fds[1], &len, sizeof len) || (len && !write_all(fds[1], p, len))) _exit(3);
    }
    _exit(0);
  }
  ::close(fds[1]);
  std::string buf;
  char chunk[65536];
  // A few strings take milliseconds; a child still reading after 20 s is stuck (a damaged heap
  // can send HDF5 round a loop forever), and more than 64 MiB of strings in attributes (which are
  // small by nature) is a damaged length.
  const int limit_s = 20;
  const size_t limit_bytes = size_t(64) << 20;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{fds[0], POLLIN, 0};
    int pr = left.count() > 0 ? poll(&pfd, 1, (int)left.count()) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      timed_out = true;
      break;
    }
    ssize_t r = ::read(fds[0], chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    buf.append(chunk, (size_t)r);
    if (buf.size() > limit_bytes) break;
  }
  ::close(fds[0]);
  const bool too_long = buf.size() > limit_bytes;
  if (timed_out || too_long) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return "cannot read (HDF5 still reading after " + std::to_string(limit_s) +
           " s: the file is corrupt, or its file system stalled)";
  if (too_long) return corrupt;  // over 64 MiB
  if (WIFEXITED(status) && WEXITSTATUS(status) == 2) return "cannot read";
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return corrupt;
  size_t at = 0;
  for (size_t i = 0; i < a.n; ++i) {
    uint64_t len = 0;
    if (buf.size() - at < sizeof len) return corrupt;
    std::memcpy(&len, buf.data() + at, sizeof len);
    at += sizeof len;
    if (buf.size() - at < len) return corrupt;
    out.emplace_back(buf.data() + at, (size_t)len);
    at += (size_t)len;
  }
  if (at != buf.size()) return corrupt;
  return "";
}

std::vector<std::string> read_str_attr(File& f, const std::string& obj, const std::string& name) {
  Lock l;
  OpenAttr a = open_attr(f, obj, name);
  if (a.cls != H5T_STRING)
    attr_fail(f, obj, name, std::string("expected a string, found ") + dtype_name(a.dt));
  std::vector<std::string> out;
  if (H5Tis_variable_str(a.type.get()) > 0) {
    if (a.n) {
      const std::string why = read_vlen_strings_apart(a, out);
      if (!why.empty()) attr_fail(f, obj, name, why);
    }
  } else {
    size_t sz = H5Tget_size(a.type.get());
    bool spacepad = H5Tget_strpad(a.type.get()) == H5T_STR_SPACEPAD;
    std::vector<char> raw(a.n * sz + 1, 0);
    if (a.n && H5Aread(a.attr.get(), a.type.get(), raw.data()) < 0) attr_fail(f, obj, name, "cannot read");
    for (size_t i = 0; i < a.n; ++i) {
      const char* p = raw.data() + i * sz;
      size_t len = strnlen(p, sz);
      std::string s(p, len);
      if (spacepad)
        while (!s.empty() && s.back() == ' ') s.pop_back();
      out.push_back(std::move(s));
    }
  }
  return out;
}

template <class T>
T one(File& f, const std::string& obj, const std::string& name, std::vector<T> v) {
  if (v.size() != 1)
    attr_fail(f, obj, name, "expected a scalar, found " + std::to_string(v.size()) + " values");
  return std::move(v[0]);
}
}  // namespace

bool has_attr(File& f, const std::string& obj, const std::string& name) {
  Lock l;
  if (!(obj.empty() || obj == "/") && !exists(f, obj)) return false;
  Handle o = open_object(f, obj);
  return H5Aexists(o.get(), name.c_str()) > 0;
}

void set_attr(File& f, const std::string& obj, const std::string& name, int64_t v) {
  write_attr(f, obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, {}, &v);
}
void set_attr(File& f, const std::string& obj, const std::string& name, double v) {
  write_attr(f, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {}, &v);
}
void set_attr(File& f, const std::string& obj, const std::string& name, const std::string& v) {
  Lock l;
  Handle t = vlen_str_type();
  const char* p = v.c_str();
  write_attr(f, obj, name, t.get(), t.get(), {}, &p);
}
void set_attr(File& f, const std::string& obj, const std::string& name, const char* v) {
  set_attr(f, obj, name, std::string(v));
}
void set_attr(File& f, const std::string& obj, const std::string& name, const std::vector<int64_t>& v) {
  write_attr(f, obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, {(hsize_t)v.size()}, v.data());
}
void set_attr(File& f, const std::string& obj, const std::string& name, const std::vector<double>& v) {
  write_attr(f, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {(hsize_t)v.size()}, v.data());
}
void set_attr(File& f, const std::string& obj, const std::string& name, const std::vector<std::string>& v) {
  Lock l;
  Handle t = vlen_str_type();
  std::vector<const char*> ptrs;
  for (auto& s : v) ptrs.push_back(s.c_str());
  write_attr(f, obj, name, t.get(), t.get(), {(hsize_t)v.size()}, ptrs.data());
}

int64_t get_attr_i64(File& f, const std::string& o, const std::string& n) {
  return one(f, o, n, read_int_attr(f, o, n));
}
double get_attr_f64(File& f, const std::string& o, const std::string& n) {
  return one(f, o, n, read_f64_attr(f, o, n));
}
std::string get_attr_str(File& f, const std::string& o, const std::string& n) {
  return one(f, o, n, read_str_attr(f, o, n));
}
std::vector<int64_t> get_attr_i64v(File& f, const std::string& o, const std::string& n) {
  return read_int_attr(f, o, n);
}
std::vector<double> get_attr_f64v(File& f, const std::string& o, const std::string& n) {
  return read_f64_attr(f, o, n);
}
std::vector<std::string> get_attr_strv(File& f, const std::string& o, const std::string& n) {
  return read_str_attr(f, o, n);
}

DType attr_dtype(File& f, const std::string& obj, const std::string& name) {
  Lock l;
  OpenAttr a = open_attr(f, obj, name);
  return a.cls == H5T_ENUM ? DType::I8 : a.dt;
}

std::vector<std::string> list_attrs(File& f, const std::string& obj) {
  Lock l;
  Handle o = open_object(f, obj);
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5A_info_t*, void* op) -> herr_t {
    static_cast<std::vector<std::string>*>(op)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Aiterate2(o.get(), H5_INDEX_NAME, H5_ITER_NATIVE, &idx, cb, &names) < 0)
    fail(f, obj, "cannot list attributes");
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace unet::h5
