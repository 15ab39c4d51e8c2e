// Training batches for `unet train`, produced by a background thread a few steps ahead.
//
// Everything in a batch is a pure function of (seed, step): sample b of step s is run-sample
// i = s*B + b, which shows dataset image perm_e[i % N] with e = i / N and perm_e a Fisher-Yates
// shuffle driven by rng(seed, Shuffle, e); its flip and timestep are drawn from
// rng(seed, <stream>, s) at index b, and its noise (not in the batch: the trainers draw it with
// their engine, where it is used) from noise_key(seed, s). So resuming at step k only needs k, and
// the batches never depend on thread timing or prefetch depth.
//
// Data-parallel runs: B is the global batch; rank r of W makes only its slice, the samples
// b = r*B/W ... (r+1)*B/W - 1 of every step, with exactly the values a single process would give
// them, so W ranks compute the step of one process (up to the order of the gradient sum).
//
// Datasets up to kResidentBytes of images are read into memory; larger ones are streamed: each
// batch's images are read (chunk by chunk, in parallel, ImageReader) by the background thread, so
// host memory stays bounded (the batches in flight, the epoch permutation of 8 bytes per image,
// the labels). UNET_STREAM_DATA=1 or 0 forces either way.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dataset.h"
#include "image_reader.h"

namespace unet {

// Allocator whose memory may come from a caller-supplied function (e.g. pinned host memory from
// Backend::alloc_host, which the backend owns: such memory is never freed here). Without one
// it is operator new/delete. Buffers are sized once, so nothing is ever reallocated.
template <class T>
struct HostAllocator {
  using value_type = T;
  // Assignment and swap carry the allocator along, so a vector never migrates to other memory.
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  std::shared_ptr<const std::function<void*(size_t)>> fn;
  HostAllocator() = default;
  explicit HostAllocator(std::shared_ptr<const std::function<void*(size_t)>> f) : fn(std::move(f)) {}
  template <class U>
  HostAllocator(const HostAllocator<U>& o) : fn(o.fn) {}
  T* allocate(size_t n) {
    if (fn && *fn) return static_cast<T*>((*fn)(n * sizeof(T)));
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t) {
    if (!(fn && *fn)) ::operator delete(p);
  }
  template <class U>
  bool operator==(const HostAllocator<U>& o) const {
    return fn == o.fn;
  }
  template <class U>
  bool operator!=(const HostAllocator<U>& o) const {
    return fn != o.fn;
  }
};
template <class T>
using HostVector = std::vector<T, HostAllocator<T>>;

struct Batch {
  HostVector<float> x0;        // [B,H,W,C] NHWC in [-1,1] (u8/127.5 - 1), flipped per sample unless no_flip
  HostVector<float> t;         // [B] integer timesteps in [0,T) as float, uniform
  HostVector<int32_t> labels;  // [B] (zeros when the dataset has no labels)
  int64_t step = -1;
};

class DataLoader {
 public:
  using HostAlloc = std::function<void*(size_t bytes)>;
  // Reads the whole `images` array into RAM here (HDF5 is not thread-safe; the background thread
  // never touches it). Throws UserError on a bad file or arguments.
  // rank/world: this process's slice of every global batch (batch_size divisible by world).
  DataLoader(const std::string& dataset_path, int batch_size, int T, uint64_t seed, bool flip,
             int64_t start_step, int prefetch = 3, HostAlloc host_alloc = nullptr, int rank = 0,
             int world = 1);
  // An in-memory dataset: images uint8 [count, S, S, 3], labels [count] or empty.
  DataLoader(DatasetInfo info, std::vector<uint8_t> images, std::vector<int64_t> labels, int batch_size,
             int T, uint64_t seed, bool flip, int64_t start_step, int prefetch = 3,
             HostAlloc host_alloc = nullptr, int rank = 0, int world = 1);
  ~DataLoader();  // stops and joins the background thread
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  const DatasetInfo& info() const { return info_; }
  int batch_size() const { return B_; }   // global
  int local_batch() const { return b_; }  // this rank's slice: the size of every Batch
  int first() const { return off_; }      // the slice's first sample in the global batch
  bool streaming() const { return reader_ != nullptr; }

  // Image bytes up to which a dataset is held in memory (larger ones are streamed).
  static constexpr double kResidentBytes = 256.0 * (1 << 20);
  // Whether a dataset is streamed (UNET_STREAM_DATA overrides), and the host memory the loader
  // holds for it beyond the batches: the images when resident, the permutations, the labels.
  static bool will_stream(const DatasetInfo& info);
  static double resident_bytes(const DatasetInfo& info);

  // Blocks until the batch of the next step (start_step, start_step+1, ...) is ready. The pointer
  // stays valid, and the buffer untouched, until the following next() call. Rethrows an error of
  // the background thread.
  Batch* next();

  // OpenMP threads of the background thread's parallel loops: those of the thread that made the
  // loader (omp_set_num_threads sets only the calling thread's count, and a new thread starts
  // from OMP_NUM_THREADS or every core: unet train's ranks under mpirun had 2 x 32 threads on 32
  // cores), at most kMaxThreads. 0 until the background thread has started.
  int threads() const { return threads_.load(); }
  // A batch needs few threads (seed64's 32 images: the same speed with 1), and OpenMP's idle
  // workers spin at the end of each loop: four 1-GPU `unet train` runs side by side on a 4-GPU,
  // 64-core host, each loader with 64 threads, took 24-34 ms a tf32 step instead of 10.6 (H200s,
  // 2026-11-30; with OMP_NUM_THREADS=8 or 1, or passive waits: 10.6-10.7). Streamed datasets
  // read and inflate their images in these threads.
  static constexpr int kMaxThreads = 8;

  // The key of step's noise: sample g's value j is normal(noise_key(seed, step), TrainNoise,
  // g x H x W x C + j) (lib/rng.h), g its index in the global batch (draw_train_noise, trainer.h).
  static uint64_t noise_key(uint64_t seed, int64_t step);

  // ---- the pure functions the thread evaluates (for tests and tools) ----
  // Dataset image shown as run-sample i (= step*B + b).
  int64_t dataset_index(int64_t i) const;
  // The batch of `step`, computed on the calling thread (same values next() delivers).
  Batch compute(int64_t step) const;
  // perm[j] for epoch e of an N-image dataset: Fisher-Yates with randint(key(seed, Shuffle, e), j).
  static std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t N);

 private:
  struct PermCache {
    int64_t epoch = -1;
    std::vector<int64_t> perm;
  };
  struct Slot {
    Batch batch;
    enum State { Free, Ready, Held } state = Free;
  };
  DataLoader(int batch_size, int T, uint64_t seed, bool flip, int64_t start_step);
  void init(int prefetch, int rank, int world);
  void fill(int64_t step, Batch& out, PermCache& cache) const;
  void alloc_batch(Batch& b, bool use_hook) const;
  void producer();

  DatasetInfo info_;
  std::vector<uint8_t> images_;          // resident datasets
  std::unique_ptr<ImageReader> reader_;  // streamed datasets
  std::vector<int64_t> labels_;
  int B_, T_;
  int b_ = 0, off_ = 0;  // this rank's slice of a batch: samples [off_, off_ + b_)
  uint64_t seed_;
  bool flip_;
  int64_t start_;
  std::shared_ptr<const std::function<void*(size_t)>> alloc_;

  std::vector<std::unique_ptr<Slot>> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t next_step_;  // the step next() returns next
  int held_ = -1;      // slot held by the consumer
  std::thread thread_;
  std::atomic<int> threads_{0};
};

}  // namespace unet
