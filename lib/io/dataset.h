// The `prepare` dataset file (SPEC §2):
//   images  uint8 [N, S, S, 3] (numpy/PIL HWC layout), chunked per batch of images, gzip
//   labels  int64 [N] with attribute class_names (string array) — only with labels
//   root attributes: format = "unet-dataset", version = 1, image_size = S, count = N
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "h5.h"
#include "util.h"

namespace unet {

struct DatasetInfo {
  int64_t count = 0;
  int image_size = 0;
  bool has_labels = false;
  std::vector<std::string> class_names;
};

// Streams images into "<path>.tmp-<pid>" and renames it to `path` on commit(). Destroying the
// writer without commit() removes the temporary, so a failed prepare leaves nothing behind.
class DatasetWriter {
 public:
  // class_names may be empty with labels (then labels are only checked to be >= 0).
  DatasetWriter(const std::string& path, int image_size, bool labels, std::vector<std::string> class_names);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;
  // One image_size x image_size x 3 uint8 image; `label` is ignored without labels.
  void append(const uint8_t* hwc_image, int64_t label);
  int64_t count() const { return count_; }
  void commit();  // writes the attributes, closes, renames into place; throws UserError on failure

 private:
  void flush();
  std::string path_;
  AtomicFile atomic_;  // declared before file_ so the file is closed before the temp is removed
  h5::File file_;
  int size_;
  bool labels_on_;
  std::vector<std::string> class_names_;
  size_t chunk_images_;
  std::vector<uint8_t> pending_;  // images not yet written, whole chunks are written at once
  std::vector<int64_t> labels_;
  int64_t count_ = 0;
  bool committed_ = false;
};

class DatasetReader {
 public:
  // Opens and validates the layout; throws UserError("<path>: <problem>").
  explicit DatasetReader(const std::string& path);
  const DatasetInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  // Images [start, start+n) into out (n * S * S * 3 bytes). Range errors are UserErrors.
  void read_images(int64_t start, int64_t n, uint8_t* out) const;
  // All labels (empty without labels); each checked to lie in [0, number of classes).
  std::vector<int64_t> read_labels() const;
  // A fingerprint of the content, for checking that a resumed run trains on the same data: a
  // 64-bit hash of count, image size, every label and up to 16 images spread over the file.
  uint64_t fingerprint() const;

 private:
  std::string path_;
  mutable h5::File file_;
  DatasetInfo info_;
};

}  // namespace unet
