#include "dataloader.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "env_vars.h"
#include "rng.h"
#include "util.h"

namespace unet {

bool DataLoader::will_stream(const DatasetInfo& info) {
  const int force = env_stream_data();  // UNET_STREAM_DATA=1|0
  if (force >= 0) return force == 1;
  return (double)info.count * info.image_size * info.image_size * 3 > kResidentBytes;
}

double DataLoader::resident_bytes(const DatasetInfo& info) {
  const double images = will_stream(info) ? 0.0 : (double)info.count * info.image_size * info.image_size * 3;
  const double perm = 2.0 * 8 * info.count;  // the epoch permutations of the producer and of compute()
  const double labels = info.has_labels ? 8.0 * info.count : 0.0;
  return images + perm + labels;
}

// The settings both constructors share (a throw in theirs runs the destructor: no thread yet).
DataLoader::DataLoader(int batch_size, int T, uint64_t seed, bool flip, int64_t start_step)
    : B_(batch_size), T_(T), seed_(seed), flip_(flip), start_(start_step), next_step_(start_step) {}

DataLoader::DataLoader(const std::string& dataset_path, int batch_size, int T, uint64_t seed, bool flip,
                       int64_t start_step, int prefetch, HostAlloc host_alloc, int rank, int world)
    : DataLoader(batch_size, T, seed, flip, start_step) {
  DatasetReader reader(dataset_path);
  info_ = reader.info();
  if (info_.count < 1) throw UserError(dataset_path + ": the dataset has no images");
  const size_t per = static_cast<size_t>(info_.image_size) * info_.image_size * 3;
  if (will_stream(info_)) {
    reader_ = std::make_unique<ImageReader>(dataset_path);
  } else {
    images_.resize(static_cast<size_t>(info_.count) * per);
    reader.read_images(0, info_.count, images_.data());
  }
  if (info_.has_labels) {
    labels_ = reader.read_labels();
    if (static_cast<int64_t>(labels_.size()) != info_.count)
      throw UserError(dataset_path + ": labels has " + std::to_string(labels_.size()) + " entries for " +
                      std::to_string(info_.count) + " images");
  }
  if (host_alloc) alloc_ = std::make_shared<const std::function<void*(size_t)>>(std::move(host_alloc));
  init(prefetch, rank, world);
}

DataLoader::DataLoader(DatasetInfo info, std::vector<uint8_t> images, std::vector<int64_t> labels,
                       int batch_size, int T, uint64_t seed, bool flip, int64_t start_step, int prefetch,
                       HostAlloc host_alloc, int rank, int world)
    : DataLoader(batch_size, T, seed, flip, start_step) {
  info_ = std::move(info);
  images_ = std::move(images);
  labels_ = std::move(labels);
  const size_t per = static_cast<size_t>(info_.image_size) * info_.image_size * 3;
  if (info_.count < 1 || info_.image_size < 1 || images_.size() != static_cast<size_t>(info_.count) * per)
    throw UserError("dataloader: images do not match the dataset description");
  if (info_.has_labels ? static_cast<int64_t>(labels_.size()) != info_.count : !labels_.empty())
    throw UserError("dataloader: labels do not match the dataset description");
  if (host_alloc) alloc_ = std::make_shared<const std::function<void*(size_t)>>(std::move(host_alloc));
  init(prefetch, rank, world);
}

void DataLoader::init(int prefetch, int rank, int world) {
  if (B_ < 1) throw UserError("--batch-size must be >= 1, got " + std::to_string(B_));
  if (world < 1 || rank < 0 || rank >= world) throw std::logic_error("DataLoader: bad rank/world");
  if (B_ % world != 0)
    throw UserError("--batch-size " + std::to_string(B_) + " is not divisible by the " +
                    std::to_string(world) +
                    " ranks (the batch size is global: each rank takes an equal slice)");
  b_ = B_ / world;
  off_ = rank * b_;
  if (T_ < 1) throw UserError("diffusion_steps must be >= 1, got " + std::to_string(T_));
  if (start_ < 0) throw UserError("dataloader: negative start step");
  // One slot is held by the consumer, `prefetch` are filled ahead.
  const int nslots = std::max(1, prefetch) + 1;
  for (int i = 0; i < nslots; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    alloc_batch(slots_.back()->batch, true);
  }
  const int threads = std::min(omp_get_max_threads(), kMaxThreads);
  thread_ = std::thread([this, threads] {
    omp_set_num_threads(threads);
    threads_ = omp_get_max_threads();
    producer();
  });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DataLoader::alloc_batch(Batch& b, bool use_hook) const {
  const size_t n = static_cast<size_t>(b_) * info_.image_size * info_.image_size * 3;
  HostAllocator<float> af(use_hook ? alloc_ : nullptr);
  HostAllocator<int32_t> ai(use_hook ? alloc_ : nullptr);
  b.x0 = HostVector<float>(n, 0.0f, af);
  b.t = HostVector<float>(b_, 0.0f, af);
  b.labels = HostVector<int32_t>(b_, 0, ai);
}

uint64_t DataLoader::noise_key(uint64_t seed, int64_t step) {
  return rng_key(seed, Stream::TrainNoise, static_cast<uint64_t>(step));
}

std::vector<int64_t> DataLoader::epoch_permutation(uint64_t seed, int64_t epoch, int64_t N) {
  std::vector<int64_t> p(N);
  for (int64_t j = 0; j < N; ++j) p[j] = j;
  const uint64_t key = rng_key(seed, Stream::Shuffle, static_cast<uint64_t>(epoch));
  for (int64_t j = N - 1; j > 0; --j) std::swap(p[j], p[randint(key, Stream::Shuffle, j, j + 1)]);
  return p;
}

int64_t DataLoader::dataset_index(int64_t i) const {
  const int64_t N = info_.count;
  return epoch_permutation(seed_, i / N, N)[i % N];
}

Batch DataLoader::compute(int64_t step) const {
  Batch b;
  alloc_batch(b, false);  // plain memory: the hook's (pinned) memory is for the ring only
  PermCache cache;
  fill(step, b, cache);
  return b;
}

void DataLoader::fill(int64_t step, Batch& out, PermCache& cache) const {
  const int64_t N = info_.count;
  const int S = info_.image_size;
  const size_t numel = static_cast<size_t>(S) * S * 3;
  // Dataset indices first (serially: the permutation cache is not shared between threads).
  // Slot j of this rank's batch is sample g = off_ + j of the global batch.
  std::vector<int64_t> idx(b_);
  for (int j = 0; j < b_; ++j) {
    const int64_t i = step * B_ + off_ + j;
    const int64_t e = i / N;
    if (cache.epoch != e) {
      cache.perm = epoch_permutation(seed_, e, N);
      cache.epoch = e;
    }
    idx[j] = cache.perm[i % N];
  }
  const uint64_t kt = rng_key(seed_, Stream::TrainTimestep, static_cast<uint64_t>(step));
  const uint64_t kflip = rng_key(seed_, Stream::TrainFlip, static_cast<uint64_t>(step));
  float* x0 = out.x0.data();
  // Threads cost more than tiny batches; streamed images are worth reading in parallel.
  const bool par = static_cast<size_t>(b_) * numel > 32768 || reader_;
  std::exception_ptr error;
#pragma omp parallel for schedule(static) if (par)
  for (int j = 0; j < b_; ++j) {
    const uint64_t g = static_cast<uint64_t>(off_ + j);
    const uint8_t* img = nullptr;
    if (!reader_) {
      img = images_.data() + static_cast<size_t>(idx[j]) * numel;
    } else {
      thread_local std::vector<uint8_t> tmp;
      tmp.resize(numel);
      try {
        reader_->read(idx[j], tmp.data());
      } catch (...) {
#pragma omp critical(dataloader_error)
        error = std::current_exception();
        continue;
      }
      img = tmp.data();
    }
    float* dst = x0 + j * numel;
    const bool flip = flip_ && uniform01(kflip, Stream::TrainFlip, g) < 0.5f;
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x) {
        const uint8_t* src = img + (static_cast<size_t>(y) * S + (flip ? S - 1 - x : x)) * 3;
        float* d = dst + (static_cast<size_t>(y) * S + x) * 3;
        // As guided-diffusion: arr.astype(np.float32) / 127.5 - 1, in float32.
        for (int c = 0; c < 3; ++c) d[c] = static_cast<float>(src[c]) / 127.5f - 1.0f;
      }
  }
  if (error) std::rethrow_exception(error);
  for (int j = 0; j < b_; ++j) {
    out.t[j] = static_cast<float>(randint(kt, Stream::TrainTimestep, static_cast<uint64_t>(off_ + j), T_));
    out.labels[j] = labels_.empty() ? 0 : static_cast<int32_t>(labels_[idx[j]]);
  }
  out.step = step;
}

void DataLoader::producer() {
  PermCache cache;
  const int nslots = static_cast<int>(slots_.size());
  try {
    for (int64_t s = start_;; ++s) {
      Slot& slot = *slots_[(s - start_) % nslots];
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || slot.state == Slot::Free; });
        if (stop_) return;
      }
      fill(s, slot.batch, cache);
      {
        std::lock_guard<std::mutex> lk(mu_);
        slot.state = Slot::Ready;
      }
      cv_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

Batch* DataLoader::next() {
  std::unique_lock<std::mutex> lk(mu_);
  if (held_ >= 0) {
    slots_[held_]->state = Slot::Free;
    held_ = -1;
    cv_.notify_all();
  }
  const int k = static_cast<int>((next_step_ - start_) % static_cast<int64_t>(slots_.size()));
  Slot& slot = *slots_[k];
  cv_.wait(lk, [&] { return slot.state == Slot::Ready || error_; });
  if (slot.state != Slot::Ready) std::rethrow_exception(error_);
  slot.state = Slot::Held;
  held_ = k;
  ++next_step_;
  return &slot.batch;
}

}  // namespace unet
