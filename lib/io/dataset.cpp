#include "dataset.h"

#include <algorithm>

namespace unet {

namespace {
constexpr int kGzip = 4;  // images compress ~2-4x; level 4 is near the knee of size vs speed

// Images per chunk: about 16 KiB of pixels (a single image from 64x64 up), at most 64. The
// streaming data loader reads images in random order and a chunk is what it reads and inflates
// for one image, so chunks stay small; the chunk index costs HDF5 a few bytes per chunk.
size_t chunk_images_for(int size) {
  size_t bytes = (size_t)size * size * 3;
  return std::clamp<size_t>((16u << 10) / bytes, 1, 64);
}
}  // namespace

DatasetWriter::DatasetWriter(const std::string& path, int image_size, bool labels,
                             std::vector<std::string> class_names)
    : path_(path),
      atomic_(path),
      size_(image_size),
      labels_on_(labels),
      class_names_(std::move(class_names)),
      chunk_images_(chunk_images_for(image_size)) {
  if (image_size <= 0) throw UserError(path + ": image size must be positive");
  file_ = h5::File::create(atomic_.tmp_path(), path);
  const hsize_t s = (hsize_t)image_size;
  h5::create_extendible(file_, "images", h5::DType::U8, {s, s, 3}, chunk_images_, kGzip);
  h5::set_attr(file_, "/", "format", "unet-dataset");
  h5::set_attr(file_, "/", "version", 1);
  h5::set_attr(file_, "/", "image_size", image_size);
}

DatasetWriter::~DatasetWriter() {
  // Without commit(): close quietly; atomic_ then removes the temporary.
  try {
    if (!committed_) file_ = h5::File();
  } catch (...) {
  }
}

void DatasetWriter::append(const uint8_t* img, int64_t label) {
  if (committed_) throw std::logic_error("DatasetWriter::append after commit");
  if (labels_on_) {
    if (label < 0 || (!class_names_.empty() && label >= (int64_t)class_names_.size()))
      throw std::logic_error("DatasetWriter: label out of range");
    labels_.push_back(label);
  }
  const size_t per = (size_t)size_ * size_ * 3;
  pending_.insert(pending_.end(), img, img + per);
  ++count_;
  // Whole chunks, about 1 MiB at a time (one HDF5 write per image would be slow).
  const size_t chunk_bytes = chunk_images_ * per;
  if (pending_.size() >= std::max<size_t>(1, (1u << 20) / chunk_bytes) * chunk_bytes) flush();
}

void DatasetWriter::flush() {
  const size_t per = (size_t)size_ * size_ * 3;
  if (pending_.empty()) return;
  h5::append_rows(file_, "images", h5::DType::U8, pending_.data(), pending_.size() / per);
  pending_.clear();
}

void DatasetWriter::commit() {
  if (committed_) return;
  flush();
  if (labels_on_) {
    h5::write_i64(file_, "labels", labels_.data(), {(hsize_t)labels_.size()}, {},
                  labels_.empty() ? 0 : kGzip);
    h5::set_attr(file_, "labels", "class_names", class_names_);
  }
  h5::set_attr(file_, "/", "count", (int64_t)count_);
  file_.close();  // throws on a failed flush (disk full)
  atomic_.commit();
  committed_ = true;
}

// ---- reader ----------------------------------------------------------------------------------
DatasetReader::DatasetReader(const std::string& path) : path_(path) {
  file_ = h5::File::open(path);
  auto bad = [&](const std::string& why) { throw UserError(path + ": " + why); };
  if (!h5::has_attr(file_, "/", "format")) {
    if (h5::has_attr(file_, "/", "image_size") && h5::exists(file_, "model"))
      bad("not a unet dataset (this looks like a checkpoint)");
    bad("not a unet dataset (format attribute missing)");
  }
  std::string fmt;
  try {
    fmt = h5::get_attr_str(file_, "/", "format");
  } catch (const UserError&) {
    bad("not a unet dataset (format attribute is not a string)");
  }
  if (fmt != "unet-dataset") bad("not a unet dataset (format is '" + fmt + "')");
  auto int_attr = [&](const char* name) -> int64_t {
    if (!h5::has_attr(file_, "/", name)) bad(std::string("corrupt dataset (attribute ") + name + " missing)");
    return h5::get_attr_i64(file_, "/", name);
  };
  int64_t version = int_attr("version");
  if (version != 1)
    bad("unsupported dataset version " + std::to_string(version) + " (this build reads version 1)");
  int64_t size = int_attr("image_size");
  int64_t count = int_attr("count");
  if (size <= 0 || size > (1 << 16)) bad("corrupt dataset (image_size " + std::to_string(size) + ")");
  if (count < 0) bad("corrupt dataset (count " + std::to_string(count) + ")");
  if (!h5::is_dataset(file_, "images")) bad("corrupt dataset (no 'images' dataset)");
  if (h5::dtype(file_, "images") != h5::DType::U8)
    bad(std::string("corrupt dataset (images is ") + h5::dtype_name(h5::dtype(file_, "images")) +
        ", expected uint8)");
  std::vector<hsize_t> s = h5::shape(file_, "images");
  auto shape_str = [](const std::vector<hsize_t>& v) {
    std::string r = "[";
    for (size_t i = 0; i < v.size(); ++i) r += (i ? "," : "") + std::to_string((unsigned long long)v[i]);
    return r + "]";
  };
  if (s.size() != 4 || s[1] != (hsize_t)size || s[2] != (hsize_t)size || s[3] != 3)
    bad("corrupt dataset (images has shape " + shape_str(s) + ", expected [N," + std::to_string(size) + "," +
        std::to_string(size) + ",3])");
  if ((int64_t)s[0] != count)
    bad("corrupt dataset (count attribute says " + std::to_string(count) + " but images holds " +
        std::to_string((unsigned long long)s[0]) + ")");
  info_.count = count;
  info_.image_size = (int)size;
  if (h5::exists(file_, "labels")) {
    if (!h5::is_dataset(file_, "labels")) bad("corrupt dataset ('labels' is not a dataset)");
    h5::DType t = h5::dtype(file_, "labels");
    if (t != h5::DType::I64 && t != h5::DType::I32 && t != h5::DType::U8 && t != h5::DType::I8 &&
        t != h5::DType::I16 && t != h5::DType::U16 && t != h5::DType::U32)
      bad(std::string("corrupt dataset (labels is ") + h5::dtype_name(t) + ", expected int64)");
    std::vector<hsize_t> ls = h5::shape(file_, "labels");
    if (ls.size() != 1 || (int64_t)ls[0] != count)
      bad("corrupt dataset (labels has shape " + shape_str(ls) + ", expected [" + std::to_string(count) +
          "])");
    info_.has_labels = true;
    if (h5::has_attr(file_, "labels", "class_names"))
      info_.class_names = h5::get_attr_strv(file_, "labels", "class_names");
  }
}

void DatasetReader::read_images(int64_t start, int64_t n, uint8_t* out) const {
  if (start < 0 || n < 0 || start > info_.count || n > info_.count - start)
    throw UserError(path_ + ": images [" + std::to_string(start) + ", " + std::to_string(start + n) +
                    ") out of range (count " + std::to_string(info_.count) + ")");
  if (n == 0) return;
  h5::read_rows(file_, "images", h5::DType::U8, (hsize_t)start, (hsize_t)n, out);
}

std::vector<int64_t> DatasetReader::read_labels() const {
  if (!info_.has_labels) return {};
  std::vector<int64_t> v = h5::read_i64(file_, "labels");
  int64_t nc = (int64_t)info_.class_names.size();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] < 0 || (nc > 0 && v[i] >= nc))
      throw UserError(path_ + ": corrupt dataset (label " + std::to_string(v[i]) + " at index " +
                      std::to_string(i) +
                      (nc > 0 ? " outside [0, " + std::to_string(nc) + "))" : std::string(" is negative)")));
  return v;
}

uint64_t DatasetReader::fingerprint() const {
  // FNV-1a: simple, stable across platforms and versions (the value is stored in checkpoints).
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  const int64_t head[3] = {info_.count, info_.image_size, info_.has_labels ? 1 : 0};
  mix(head, sizeof head);
  const std::vector<int64_t> labels = read_labels();
  mix(labels.data(), labels.size() * sizeof(int64_t));
  const int64_t k = std::min<int64_t>(16, info_.count);
  std::vector<uint8_t> img((size_t)info_.image_size * info_.image_size * 3);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t i = k > 1 ? j * (info_.count - 1) / (k - 1) : 0;
    read_images(i, 1, img.data());
    mix(&i, sizeof i);
    mix(img.data(), img.size());
  }
  return h;
}

}  // namespace unet
