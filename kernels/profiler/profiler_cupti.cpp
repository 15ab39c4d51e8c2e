// CUPTI Activity API collection for `unet profile` (see profiler_cupti.h).
//
// Kernels are mapped to layer ranges with CUPTI external correlation: each range instance
// pushes its id (kind CUSTOM0) while it is open, and CUPTI emits an EXTERNAL_CORRELATION record
// (external id -> API correlation id) before the API record of every CUDA call made inside it.
// Those records only appear when the RUNTIME/DRIVER API kinds are enabled too; their API records
// also give each launch's host time, the fallback used when a correlation record is missing.
#include "profiler_cupti.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cupti.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "util.h"

namespace unet::prof {

namespace {

void cupti_check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  throw UserError(std::string("CUPTI ") + what + ": " + (s ? s : "unknown error"));
}
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("profile: ") + what + ": " + cudaGetErrorString(e));
}
void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("profile: ") + what + ": cuBLAS status " + std::to_string((int)s));
}

const char* memcpy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "[CUDA memcpy Host-to-Device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "[CUDA memcpy Device-to-Host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "[CUDA memcpy Device-to-Device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "[CUDA memcpy Host-to-Host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "[CUDA memcpy Peer-to-Peer]";
    default:
      return "[CUDA memcpy (array)]";
  }
}

constexpr size_t kBufferBytes = 8u << 20;
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,    CUPTI_ACTIVITY_KIND_MEMCPY,  CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};

class CuptiProfiler;
CuptiProfiler* g_active = nullptr;  // CUPTI's buffer callbacks are plain C functions
std::mutex g_mu;

class CuptiProfiler final : public GpuProfiler {
 public:
  CuptiProfiler() {
    int dev = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cudaDeviceProp p{};
    cuda_check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    info_.name = p.name;
    info_.cc_major = p.major;
    info_.cc_minor = p.minor;
    info_.sms = p.multiProcessorCount;
    info_.mem_gib = (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, dev) == cudaSuccess) info_.sm_clock_mhz = v / 1000.0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, dev) == cudaSuccess)
      info_.mem_clock_mhz = v / 1000.0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess) info_.bus_bits = v;
    cuda_check(cudaEventCreate(&ev0_), "cudaEventCreate");
    cuda_check(cudaEventCreate(&ev1_), "cudaEventCreate");
    cuda_check(cudaEventCreate(&ev2_), "cudaEventCreate");
    {
      std::lock_guard<std::mutex> lk(g_mu);
      if (g_active) throw std::logic_error("only one GpuProfiler at a time");
      g_active = this;
    }
    cupti_check(cuptiActivityRegisterCallbacks(&buffer_requested, &buffer_completed), "register callbacks");
  }

  ~CuptiProfiler() override {
    try {
      stop();
    } catch (...) {
    }
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lk(g_mu);
    g_active = nullptr;
    cudaEventDestroy(ev0_);
    cudaEventDestroy(ev1_);
    cudaEventDestroy(ev2_);
  }

  const DeviceInfo& device() const override { return info_; }

  uint64_t timestamp() override {
    uint64_t t = 0;
    cuptiGetTimestamp(&t);
    return t;
  }

  void start() override {
    if (enabled_) return;
    for (auto k : kKinds) cupti_check(cuptiActivityEnable(k), "enable activity");
    enabled_ = true;
  }

  void stop() override {
    if (!enabled_) return;
    for (auto k : kKinds) cuptiActivityDisable(k);
    enabled_ = false;
  }

  void region_begin() override {
    cuda_check(cudaDeviceSynchronize(), "synchronize");
    cupti_check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
    {
      std::lock_guard<std::mutex> lk(g_mu);
      acts_.clear();
      ext_.clear();
      launch_.clear();
      dropped_ = 0;
    }
    // The first CUDA call after a forced flush makes CUPTI set up new buffers, which can stall
    // the host for milliseconds: pay that before the region starts.
    cuda_check(cudaEventRecord(ev2_, 0), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(ev2_), "cudaEventSynchronize");
    t0_ = timestamp();
    // The device is idle, so an event on the legacy stream marks the start whatever stream the
    // backend uses.
    cuda_check(cudaEventRecord(ev0_, 0), "cudaEventRecord");
    t0_after_ = timestamp();
  }

  double region_end() override {
    // An event on the legacy stream waits for all work on blocking streams (the backend's), so
    // recorded right after the last launch it marks the end of the GPU work exactly. If the
    // backend's stream does not synchronise with the legacy stream, that event fires early:
    // then the one recorded after a device synchronisation (a few microseconds late) is used.
    const uint64_t t_end_call = timestamp();
    cuda_check(cudaEventRecord(ev1_, 0), "cudaEventRecord");
    cuda_check(cudaDeviceSynchronize(), "synchronize");
    const uint64_t t_synced = timestamp();
    cuda_check(cudaEventRecord(ev2_, 0), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(ev2_), "cudaEventSynchronize");
    t1_ = timestamp();
    float ms = 0, ms_sync = 0;
    cuda_check(cudaEventElapsedTime(&ms, ev0_, ev1_), "cudaEventElapsedTime");
    cuda_check(cudaEventElapsedTime(&ms_sync, ev0_, ev2_), "cudaEventElapsedTime");
    cupti_check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
    uint64_t first = UINT64_MAX, last = 0;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      for (const auto& a : acts_)
        if (a.start >= t0_ && a.end <= t1_) first = std::min(first, a.start), last = std::max(last, a.end);
    }
    const double span_ms = last > first ? (double)(last - first) / 1e6 : 0.0;
    if (std::getenv("UNET_PROFILE_DEBUG"))
      std::fprintf(
          stderr,
          "profile debug (us from t0): ev0 call %.1f, first activity %.1f, last end %.1f, region_end call "
          "%.1f, synced %.1f, t1 %.1f | events %.3f ms, after sync %.3f ms, span %.3f ms\n",
          (t0_after_ - t0_) / 1e3, (first - (double)t0_) / 1e3, (last - (double)t0_) / 1e3,
          (t_end_call - (double)t0_) / 1e3, (t_synced - (double)t0_) / 1e3, (t1_ - (double)t0_) / 1e3, ms,
          ms_sync, span_ms);
    return ms < 0.99 * span_ms ? ms_sync : ms;
  }

  std::vector<Activity> take_activities() override {
    std::lock_guard<std::mutex> lk(g_mu);
    std::vector<Activity> out;
    out.reserve(acts_.size());
    for (auto& a : acts_) {
      if (a.start < t0_ || a.end > t1_) continue;  // belongs to warm-up or later work
      auto e = ext_.find(a.correlation);
      if (e != ext_.end()) a.range = e->second;
      auto l = launch_.find(a.correlation);
      if (l != launch_.end()) a.launch = l->second;
      out.push_back(std::move(a));
    }
    acts_.clear();
    std::sort(out.begin(), out.end(), [](const Activity& a, const Activity& b) { return a.start < b.start; });
    return out;
  }

  uint64_t dropped() const override { return dropped_; }

  void push_range(uint64_t id) override {
    if (enabled_) cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
    pushed_.push_back(enabled_);
  }
  void pop_range() override {
    if (pushed_.empty()) return;
    if (pushed_.back()) {
      uint64_t last = 0;
      cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
    }
    pushed_.pop_back();
  }

  double time_ms(const std::function<void()>& work) override {
    cuda_check(cudaDeviceSynchronize(), "synchronize");
    cuda_check(cudaEventRecord(ev0_, 0), "cudaEventRecord");
    work();
    cuda_check(cudaEventRecord(ev1_, 0), "cudaEventRecord");  // exact with blocking streams
    cuda_check(cudaDeviceSynchronize(), "synchronize");
    cuda_check(cudaEventRecord(ev2_, 0), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(ev2_), "cudaEventSynchronize");
    float ms = 0, ms_sync = 0;
    cuda_check(cudaEventElapsedTime(&ms, ev0_, ev1_), "cudaEventElapsedTime");
    cuda_check(cudaEventElapsedTime(&ms_sync, ev0_, ev2_), "cudaEventElapsedTime");
    // A non-blocking backend stream would let ev1 fire at once; the synchronised one is safe.
    return ms < 0.5 * ms_sync ? ms_sync : ms;
  }

  Peaks measure_peaks(Precision prec) override;

  // Called from CUPTI (any thread) with a completed buffer.
  void parse(uint8_t* buffer, size_t valid) {
    std::lock_guard<std::mutex> lk(g_mu);
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
          Activity a;
          a.kind = ActivityKind::Kernel;
          a.name = kernel_name(k->name);
          a.start = k->start;
          a.end = k->end;
          a.device = k->deviceId;
          a.stream = k->streamId;
          a.correlation = k->correlationId;
          a.grid[0] = k->gridX, a.grid[1] = k->gridY, a.grid[2] = k->gridZ;
          a.block[0] = k->blockX, a.block[1] = k->blockY, a.block[2] = k->blockZ;
          acts_.push_back(std::move(a));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
          Activity a;
          a.kind = ActivityKind::Memcpy;
          a.name = memcpy_name(m->copyKind);
          a.start = m->start;
          a.end = m->end;
          a.device = m->deviceId;
          a.stream = m->streamId;
          a.correlation = m->correlationId;
          a.bytes = m->bytes;
          acts_.push_back(std::move(a));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
          Activity a;
          a.kind = ActivityKind::Memset;
          a.name = "[CUDA memset]";
          a.start = m->start;
          a.end = m->end;
          a.device = m->deviceId;
          a.stream = m->streamId;
          a.correlation = m->correlationId;
          a.bytes = m->bytes;
          acts_.push_back(std::move(a));
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          auto* e = reinterpret_cast<CUpti_ActivityExternalCorrelation*>(rec);
          if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
            const uint32_t corr = e->correlationId;
            ext_[corr] = e->externalId;
          }
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
          auto* api = reinterpret_cast<CUpti_ActivityAPI*>(rec);
          const uint32_t corr = api->correlationId;
          const uint64_t start = api->start;
          launch_.emplace(corr, start);
          break;
        }
        default:
          break;
      }
    }
  }

  void add_dropped(uint64_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    dropped_ += n;
  }

 private:
  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = kBufferBytes;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *max_records = 0;
  }
  static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t,
                                        size_t valid) {
    if (g_active && buffer && valid) {
      g_active->parse(buffer, valid);
      size_t dropped = 0;
      if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        g_active->add_dropped(dropped);
    }
    std::free(buffer);
  }

  // Kernel names come mangled; nsys shows them demangled. Cache: a step launches the same few
  // dozen kernels thousands of times.
  const std::string& kernel_name(const char* mangled) {
    std::string key = mangled ? mangled : "(unnamed)";
    auto it = names_.find(key);
    if (it == names_.end()) it = names_.emplace(key, demangle(key)).first;
    return it->second;
  }

  DeviceInfo info_;
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr, ev2_ = nullptr;
  bool enabled_ = false;
  uint64_t t0_ = 0, t0_after_ = 0, t1_ = UINT64_MAX;
  std::vector<Activity> acts_;
  std::unordered_map<uint32_t, uint64_t> ext_;     // API correlation id -> range instance id
  std::unordered_map<uint32_t, uint64_t> launch_;  // API correlation id -> host start time
  std::unordered_map<std::string, std::string> names_;
  std::vector<bool> pushed_;
  uint64_t dropped_ = 0;
};

Peaks CuptiProfiler::measure_peaks(Precision prec) {
  Peaks pk;
  const bool was = enabled_;
  stop();  // measure without the profiler's overhead
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  cuda_check(cudaEventCreate(&b), "cudaEventCreate");
  auto timed = [&](int reps, const std::function<void()>& f) {
    f();  // warm-up
    cuda_check(cudaEventRecord(a, s), "cudaEventRecord");
    for (int i = 0; i < reps; ++i) f();
    cuda_check(cudaEventRecord(b, s), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    return ms / 1e3 / reps;  // seconds per call
  };

  // Bandwidth: device-to-device copy of 1 GiB (reads and writes count).
  const size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  cuda_check(cudaMalloc(&src, bytes), "cudaMalloc (peak measurement)");
  cuda_check(cudaMalloc(&dst, bytes), "cudaMalloc (peak measurement)");
  cuda_check(cudaMemsetAsync(src, 0x3c, bytes, s), "cudaMemset");
  const double tcopy =
      timed(10, [&] { cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy"); });
  pk.gbps = 2.0 * bytes / tcopy / 1e9;
  cudaFree(src);
  cudaFree(dst);

  // Compute: an 8192^3 cuBLAS GEMM in the profiled precision.
  const int n = 8192;
  const bool bf16 = prec == Precision::BF16;
  const size_t elt = bf16 ? 2 : 4;
  void *A = nullptr, *B = nullptr, *C = nullptr;
  cuda_check(cudaMalloc(&A, elt * n * n), "cudaMalloc (peak measurement)");
  cuda_check(cudaMalloc(&B, elt * n * n), "cudaMalloc (peak measurement)");
  cuda_check(cudaMalloc(&C, elt * n * n), "cudaMalloc (peak measurement)");
  cuda_check(cudaMemsetAsync(A, 0x3c, elt * n * n, s), "cudaMemset");  // 0x3c3c...: small finite values
  cuda_check(cudaMemsetAsync(B, 0x3c, elt * n * n, s), "cudaMemset");
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), "cublasCreate");
  cublas_check(cublasSetStream(h, s), "cublasSetStream");
  const cudaDataType_t dt = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t ct = prec == Precision::TF32   ? CUBLAS_COMPUTE_32F_FAST_TF32
                                 : prec == Precision::FP32 ? CUBLAS_COMPUTE_32F_PEDANTIC
                                                           : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f, beta = 0.0f;
  const double tgemm = timed(5, [&] {
    cublas_check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, dt, n, B, dt, n, &beta, C, dt,
                              n, ct, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  });
  pk.tflops = 2.0 * n * (double)n * n / tgemm / 1e12;
  cublasDestroy(h);
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  pk.what = std::string(precision_name(prec)) + " cuBLAS GEMM";
  char buf[200];
  std::snprintf(buf, sizeof buf, "measurement: 1 GiB device-to-device copy, cuBLAS %dx%dx%d %s GEMM", n, n, n,
                precision_name(prec));
  pk.source = buf;
  if (was) start();
  return pk;
}

}  // namespace

std::unique_ptr<GpuProfiler> make_gpu_profiler(std::string* why_not) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why_not) *why_not = e != cudaSuccess ? std::string(cudaGetErrorString(e)) : "no CUDA device found";
    return nullptr;
  }
  return std::make_unique<CuptiProfiler>();
}

}  // namespace unet::prof
