#include "image_reader.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "util.h"

namespace unet {

namespace {
// pread of exactly n bytes at `at`; UserError naming the file otherwise.
void pread_all(int fd, void* out, size_t n, uint64_t at, const std::string& path) {
  char* c = static_cast<char*>(out);
  while (n) {
    const ssize_t k = ::pread(fd, c, n, (off_t)at);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) throw UserError(path + ": cannot read (" + errno_text(errno) + ")");
    if (k == 0) throw UserError(path + ": corrupt dataset (a chunk lies past the end of the file)");
    c += k, n -= (size_t)k, at += (uint64_t)k;
  }
}
}  // namespace

ImageReader::ImageReader(const std::string& path, size_t cache_bytes) : path_(path), cache_cap_(cache_bytes) {
  file_ = h5::File::open(path);
  std::lock_guard<std::recursive_mutex> lk(h5::mutex());
  dset_ = h5::Handle(H5Dopen2(file_.id(), "images", H5P_DEFAULT), H5Dclose);
  if (!dset_.valid()) throw UserError(path + ": corrupt dataset (no 'images' dataset)");
  {
    h5::Handle space(H5Dget_space(dset_.get()), H5Sclose);
    hsize_t dims[4] = {};
    if (H5Sget_simple_extent_ndims(space.get()) != 4 ||
        H5Sget_simple_extent_dims(space.get(), dims, nullptr) != 4)
      throw UserError(path + ": corrupt dataset (images is not [N,S,S,3])");
    count_ = (int64_t)dims[0];
    per_ = (size_t)(dims[1] * dims[2] * dims[3]);
    h5::Handle dcpl(H5Dget_create_plist(dset_.get()), H5Pclose);
    h5::Handle fcpl(H5Fget_create_plist(file_.id()), H5Pclose);
    hsize_t userblock = 0;
    H5Pget_userblock(fcpl.get(), &userblock);
    H5D_fill_value_t fv = H5D_FILL_VALUE_UNDEFINED;
    if (H5Pfill_value_defined(dcpl.get(), &fv) >= 0 && fv != H5D_FILL_VALUE_UNDEFINED)
      H5Pget_fill_value(dcpl.get(), H5T_NATIVE_UINT8, &fill_);
    bool plain = userblock == 0;  // addresses are file offsets
    const int nf = H5Pget_nfilters(dcpl.get());
    for (int i = 0; i < nf; ++i) {
      unsigned flags = 0, cd[8];
      size_t ncd = 8;
      char name[64];
      const H5Z_filter_t f =
          H5Pget_filter2(dcpl.get(), (unsigned)i, &flags, &ncd, cd, sizeof name, name, nullptr);
      if (f == H5Z_FILTER_DEFLATE)
        deflate_ = true;
      else
        plain = false;  // shuffle, szip, ...: HDF5 decodes
    }
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (plain && layout == H5D_CHUNKED) {
      hsize_t cd[4] = {};
      if (H5Pget_chunk(dcpl.get(), 4, cd) == 4 && cd[1] == dims[1] && cd[2] == dims[2] && cd[3] == dims[3]) {
        chunk_rows_ = (int64_t)cd[0];
        mode_ = Mode::Chunked;
      }
    } else if (plain && layout == H5D_CONTIGUOUS && nf == 0) {
      const haddr_t a = H5Dget_offset(dset_.get());
      contiguous_allocated_ = a != HADDR_UNDEF;
      contiguous_addr_ = contiguous_allocated_ ? (uint64_t)a : 0;
      mode_ = Mode::Contiguous;
    }
  }
  if (mode_ != Mode::Fallback) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw UserError(path + ": cannot open (" + errno_text(errno) + ")");
  }
}

ImageReader::~ImageReader() {
  if (fd_ >= 0) ::close(fd_);
  std::lock_guard<std::recursive_mutex> lk(h5::mutex());
  dset_.reset();
}

void ImageReader::read_chunk(int64_t chunk, std::vector<uint8_t>& out) const {
  const size_t raw = (size_t)chunk_rows_ * per_;
  out.resize(raw);
  unsigned mask = 0;
  haddr_t addr = HADDR_UNDEF;
  hsize_t size = 0;
  {
    std::lock_guard<std::recursive_mutex> lk(h5::mutex());
    hsize_t off[4] = {(hsize_t)(chunk * chunk_rows_), 0, 0, 0};
    if (H5Dget_chunk_info_by_coord(dset_.get(), off, &mask, &addr, &size) < 0)
      throw UserError(path_ + ": corrupt dataset (cannot locate chunk " + std::to_string(chunk) + ")");
  }
  if (addr == HADDR_UNDEF || size == 0) {  // never written: the fill value
    std::memset(out.data(), fill_, raw);
    return;
  }
  const bool inflate = deflate_ && !(mask & 1u);  // bit 0 set: deflate skipped for this chunk
  if (!inflate) {
    if (size != raw)
      throw UserError(path_ + ": corrupt dataset (chunk " + std::to_string(chunk) + " has the wrong size)");
    pread_all(fd_, out.data(), raw, (uint64_t)addr, path_);
    return;
  }
  thread_local std::vector<uint8_t> z;
  z.resize(size);
  pread_all(fd_, z.data(), size, (uint64_t)addr, path_);
  uLongf n = (uLongf)raw;
  if (uncompress(out.data(), &n, z.data(), (uLong)size) != Z_OK || n != raw)
    throw UserError(path_ + ": corrupt dataset (chunk " + std::to_string(chunk) + " does not inflate)");
}

void ImageReader::read(int64_t index, uint8_t* out) const {
  if (index < 0 || index >= count_)
    throw UserError(path_ + ": image " + std::to_string(index) + " out of range (count " +
                    std::to_string(count_) + ")");
  switch (mode_) {
    case Mode::Fallback: {
      h5::read_rows(file_, "images", h5::DType::U8, (hsize_t)index, 1, out);
      return;
    }
    case Mode::Contiguous:
      if (!contiguous_allocated_)
        std::memset(out, fill_, per_);
      else
        pread_all(fd_, out, per_, contiguous_addr_ + (uint64_t)index * per_, path_);
      return;
    case Mode::Chunked:
      break;
  }
  const int64_t chunk = index / chunk_rows_;
  const size_t at = (size_t)(index % chunk_rows_) * per_;
  if (chunk_rows_ == 1 || cache_cap_ == 0) {
    thread_local std::vector<uint8_t> buf;
    read_chunk(chunk, buf);
    std::memcpy(out, buf.data() + at, per_);
    return;
  }
  std::shared_ptr<const std::vector<uint8_t>> c;
  {
    std::lock_guard<std::mutex> lk(cache_mu_);
    auto it = where_.find(chunk);
    if (it != where_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      c = it->second->second;
    }
  }
  if (!c) {
    auto v = std::make_shared<std::vector<uint8_t>>();
    read_chunk(chunk, *v);
    c = v;
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (!where_.count(chunk)) {
      lru_.emplace_front(chunk, c);
      where_[chunk] = lru_.begin();
      const size_t per_chunk = (size_t)chunk_rows_ * per_;
      while (lru_.size() > 1 && lru_.size() * per_chunk > cache_cap_) {
        where_.erase(lru_.back().first);
        lru_.pop_back();
      }
    }
  }
  std::memcpy(out, c->data() + at, per_);
}

}  // namespace unet
