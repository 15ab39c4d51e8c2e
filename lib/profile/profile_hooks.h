// Layer-range hook between the model (Backend::range_push/pop) and the profiler.
// The CUDA backend calls NVTX and, when a listener is installed (unet profile), the listener.
#pragma once

namespace unet {

struct RangeListener {
  virtual ~RangeListener() = default;
  virtual void push(const char* name) = 0;
  virtual void pop() = 0;
};

// nullptr when no profiler is attached (the common case: zero overhead beyond a branch).
RangeListener* range_listener();
void set_range_listener(RangeListener* l);

}  // namespace unet
