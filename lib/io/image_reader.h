// Random access to the images of a `prepare` dataset from many threads at once, for the streaming
// data loader: host memory stays bounded whatever the dataset's size.
//
// HDF5 (a serial build) is only asked where a chunk lives in the file (under its global lock);
// the chunk itself is read with pread and inflated with zlib outside the lock, so reads of
// different images run in parallel. Chunks of several images are kept in a small LRU cache of
// inflated chunks. Files whose layout is not plain chunks of whole images with deflate (or
// contiguous storage) fall back to HDF5 reads under its lock: correct, but serial.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "h5.h"

namespace unet {

class ImageReader {
 public:
  // Opens `path`'s images [count, S, S, 3] uint8. cache_bytes bounds the inflated-chunk cache.
  explicit ImageReader(const std::string& path, size_t cache_bytes = size_t(64) << 20);
  ~ImageReader();
  ImageReader(const ImageReader&) = delete;
  ImageReader& operator=(const ImageReader&) = delete;

  int64_t count() const { return count_; }
  size_t image_bytes() const { return per_; }
  int64_t chunk_images() const { return chunk_rows_; }  // 0 = contiguous storage
  bool parallel() const { return mode_ != Mode::Fallback; }

  // Image `index` into out (image_bytes()). Thread-safe. UserError naming the file on I/O errors.
  void read(int64_t index, uint8_t* out) const;

 private:
  enum class Mode { Chunked, Contiguous, Fallback };
  void read_chunk(int64_t chunk, std::vector<uint8_t>& out) const;  // inflated, chunk_rows_ images

  std::string path_;
  mutable h5::File file_;
  h5::Handle dset_;
  int fd_ = -1;
  Mode mode_ = Mode::Fallback;
  int64_t count_ = 0, chunk_rows_ = 0;
  size_t per_ = 0;
  bool deflate_ = false;
  uint8_t fill_ = 0;
  uint64_t contiguous_addr_ = 0;
  bool contiguous_allocated_ = false;
  // LRU of inflated chunks (multi-image chunks only).
  size_t cache_cap_;
  mutable std::mutex cache_mu_;
  mutable std::list<std::pair<int64_t, std::shared_ptr<const std::vector<uint8_t>>>> lru_;
  mutable std::unordered_map<int64_t, decltype(lru_)::iterator> where_;
};

}  // namespace unet
