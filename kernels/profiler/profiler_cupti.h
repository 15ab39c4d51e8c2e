// GPU-side collection for `unet profile`: CUPTI Activity API records (concurrent kernels,
// memcpy, memset) with real GPU start/end times, mapped to layer ranges through CUPTI external
// correlation ids; CUDA-event timing of the same region; optional measured peaks.
//
// This header has no CUDA types so cmd/ can include it in every build; the CUDA build defines
// make_gpu_profiler() in kernels/profiler_cupti.cpp, the CPU-only build in lib/profile_report.cpp
// (it returns nullptr with the reason).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "profile_report.h"

namespace unet::prof {

class GpuProfiler {
 public:
  virtual ~GpuProfiler() = default;
  virtual const DeviceInfo& device() const = 0;
  // CUPTI's clock in ns (the clock of the activity records); use it for RangeTracker.
  virtual uint64_t timestamp() = 0;
  // Enables activity collection. Costs CUPTI's one-time setup, so call it before warm-up.
  virtual void start() = 0;
  // Synchronises the device, then marks the start of the measured region (CUPTI time and a
  // CUDA event). Records from before this point are dropped.
  virtual void region_begin() = 0;
  // Synchronises the device, records the closing CUDA event and flushes CUPTI. Returns the
  // CUDA-event time of the region in ms.
  virtual double region_end() = 0;
  // Disables activity collection.
  virtual void stop() = 0;
  // The activities of the last region, in start order, with `range` set from the external
  // correlation ids pushed by push_range() (0 where none was open) and `launch` from the API
  // records.
  virtual std::vector<Activity> take_activities() = 0;
  virtual uint64_t dropped() const = 0;  // records CUPTI could not store
  // Opens/closes an external-correlation scope: every CUDA API call in between is tagged `id`.
  virtual void push_range(uint64_t id) = 0;
  virtual void pop_range() = 0;
  // CUDA-event time in ms of `work` (device synchronised before and after), profiler detached.
  virtual double time_ms(const std::function<void()>& work) = 0;
  // Measured peaks: a 1 GiB device-to-device copy and a cuBLAS GEMM in precision p.
  virtual Peaks measure_peaks(Precision p) = 0;
};

// nullptr (with the reason in *why_not) without a usable GPU or in a CPU-only build.
std::unique_ptr<GpuProfiler> make_gpu_profiler(std::string* why_not = nullptr);

}  // namespace unet::prof
