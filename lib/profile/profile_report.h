// The device-independent half of `unet profile`: GPU activity records in, reports out.
//   * summarize(): nsys `cuda_gpu_kern_sum`-style statistics per kernel name (and memcpy/memset);
//   * RangeTracker + aggregate_layers(): layer ranges (Backend::range_push/pop) with their kernel
//     time, FLOPs and minimum bytes, per layer path ("backward/input_blocks.4.0 bwd");
//   * roofline(), device_peaks(): achieved TFLOP/s and GB/s against the GPU's peak;
//   * format_table/csv/json(), write_chrome_trace().
// No CUDA here: records come from kernels/profiler_cupti.cpp on a GPU and from tests in CI.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "device.h"
#include "profile_hooks.h"

namespace unet::prof {

enum class ActivityKind { Kernel, Memcpy, Memset };

// One GPU activity (CUPTI record), timestamps in ns on CUPTI's clock (the host clock CUPTI
// normalises to, so they compare with RangeTracker times taken with cuptiGetTimestamp).
struct Activity {
  ActivityKind kind = ActivityKind::Kernel;
  std::string name;  // demangled kernel name, or "[CUDA memcpy Device-to-Device]", "[CUDA memset]"
  uint64_t start = 0, end = 0;
  uint32_t device = 0, stream = 0;
  uint32_t correlation = 0;  // CUDA API correlation id
  uint64_t launch = 0;       // host time of the launching API call (0 = unknown)
  uint64_t range = 0;        // innermost layer-range instance (RangeInstance::id), 0 = none
  uint64_t bytes = 0;        // memcpy / memset size
  int grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  uint64_t duration() const { return end > start ? end - start : 0; }
};

// One row of the nsys-style summary. Times in ns over all timed iterations.
struct SumRow {
  std::string name;
  double time_pct = 0;  // share of the table's total time
  uint64_t total_ns = 0, instances = 0;
  double avg_ns = 0, med_ns = 0;
  uint64_t min_ns = 0, max_ns = 0;
  double stddev_ns = 0;  // sample standard deviation (n-1), 0 for one instance, as nsys
  uint64_t bytes = 0;    // memcpy/memset rows: total bytes
};
// kernels=true: Kernel activities by name; false: Memcpy and Memset activities by name. Sorted
// by total time (descending), then name.
std::vector<SumRow> summarize(const std::vector<Activity>& acts, bool kernels);

// A layer range as opened by range_push: `parent` is the enclosing instance (0 = top level).
// flops/bytes are the ops issued directly inside it (not in a child range).
struct RangeInstance {
  uint64_t id = 0, parent = 0;
  std::string name;
  int depth = 0;
  uint64_t host_start = 0, host_end = 0;  // ns, the tracker's clock
  double flops = 0, bytes = 0;
  std::vector<std::string> variants;  // "op=variant" of the ops issued directly inside, unique
};

// Records the range tree as the model pushes and pops names. Instance ids are unique for the
// tracker's lifetime (clear() keeps counting), so ids handed to CUPTI never repeat.
class RangeTracker final : public RangeListener {
 public:
  using Clock = std::function<uint64_t()>;
  explicit RangeTracker(Clock clock = {});
  void push(const char* name) override;
  void pop() override;
  uint64_t current() const { return stack_.empty() ? 0 : stack_.back(); }
  // Adds an op's cost to the innermost open range (or to the "outside any range" bucket).
  void add_cost(double flops, double bytes);
  // Records which kernel variant an op inside the innermost open range ran ("conv_fwd=im2col").
  void add_variant(const std::string& op_variant);
  // Forgets recorded instances and costs (the open stack must be empty).
  void clear();
  const std::vector<RangeInstance>& instances() const { return inst_; }
  const RangeInstance* find(uint64_t id) const;
  double outside_flops() const { return out_flops_; }
  double outside_bytes() const { return out_bytes_; }
  int depth() const { return (int)stack_.size(); }

  // Called with the new instance id after a push / before a pop (CUPTI external correlation).
  std::function<void(uint64_t)> on_push;
  std::function<void()> on_pop;

 private:
  Clock clock_;
  uint64_t next_id_ = 1;
  std::vector<uint64_t> stack_;
  std::vector<RangeInstance> inst_;
  std::unordered_map<uint64_t, size_t> index_;
  double out_flops_ = 0, out_bytes_ = 0;
};

// Fallback for activities whose range is unknown (no external-correlation record): the innermost
// range instance that was open on the host when the launching API call started.
void assign_ranges_by_launch_time(std::vector<Activity>& acts, const std::vector<RangeInstance>& inst);

// Per-layer totals over all timed iterations. Rows in tree order (depth first, children in order
// of first appearance); times, FLOPs and bytes are inclusive of child ranges. Activities outside
// every range, if any, form a last row "(outside layer ranges)".
struct LayerRow {
  std::string path;  // names joined by '/'
  std::string name;
  int depth = 0;
  uint64_t calls = 0;    // instances
  uint64_t time_ns = 0;  // summed kernel + memcpy/memset time
  uint64_t kernels = 0;  // activities
  double flops = 0, bytes = 0;
  std::vector<std::string> variants;  // "op=variant" issued directly inside (sorted, unique)
};
std::vector<LayerRow> aggregate_layers(const std::vector<RangeInstance>& inst,
                                       const std::vector<Activity>& acts, double outside_flops = 0,
                                       double outside_bytes = 0);

// Peak rates the roofline is measured against.
struct Peaks {
  double tflops = 0;   // for the profiled precision (fp32 CUDA cores, TF32 or BF16 tensor cores)
  double gbps = 0;     // DRAM bandwidth
  std::string what;    // e.g. "TF32 tensor core, dense"
  std::string source;  // how the numbers were obtained
};

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0, sms = 0;
  double sm_clock_mhz = 0, mem_clock_mhz = 0;
  int bus_bits = 0;
  double mem_gib = 0;
};
// Datasheet numbers for GPUs we know by name (H100/H200/A100), else SMs x clock x FLOP/clock/SM
// for the architecture and 2 x memory clock x bus width.
Peaks device_peaks(const DeviceInfo& d, Precision p);

struct Roofline {
  double tflops = 0, gbps = 0;      // achieved
  double flop_pct = 0, bw_pct = 0;  // of peak
  double peak_pct = 0;              // max of the two = attained fraction of the roofline
  double intensity = 0;             // FLOP per byte
  const char* bound = "-";          // "compute" or "memory" (which roof limits this work)
};
Roofline roofline(double flops, double bytes, double ns, const Peaks& peaks);

// Timing of the eager attribution pass when the report's kernel table comes from CUDA-graph
// replays (events_ms < 0: no such pass, everything is from eager launches).
struct PassTiming {
  double events_ms = -1;                 // CUDA-event time of the pass (all iterations)
  uint64_t kernel_ns = 0, memop_ns = 0;  // summed activity time
  uint64_t busy_ns = 0, span_ns = 0;     // as Report's
  uint64_t activities = 0;               // kernel + memcpy/memset records
  double kernel_ms_per_iter(int iters) const;
  double events_ms_per_iter(int iters) const;
  double difference_pct(int iters) const;
  double idle_ms_per_iter(int iters) const;
};

struct Report {
  std::string gpu, target, precision, pass;
  std::string cudnn;  // the cuDNN loaded, or why none (cudnn_library()); empty: not reported
  int iters = 0, warmup = 0;
  // Where kernels/memops/kernel_ns/events_ms come from: "eager" (one launch per kernel, the
  // layer table's pass too) or "graph" (replays of one captured iteration; the layer table then
  // comes from the eager pass in `eager`, same iteration count).
  std::string mode = "eager";
  PassTiming eager;
  Peaks peaks;
  std::vector<SumRow> kernels, memops;
  std::vector<LayerRow> layers;
  uint64_t kernel_ns = 0, memop_ns = 0;  // summed over the timed region
  uint64_t span_ns = 0;                  // first activity start to last activity end
  uint64_t busy_ns = 0;                  // union of the activities' intervals (GPU busy)
  // How the activities overlap (streams, lanes): overlap_ns[k] = time with exactly k of them
  // running (index 0 unused; their sum is busy_ns, idle time span - busy). alone_ns: per name, the time it ran with
  // nothing else running (time no overlap hid), descending.
  std::vector<uint64_t> overlap_ns;
  std::vector<std::pair<std::string, uint64_t>> alone_ns;
  double events_ms = 0;                  // CUDA-event time of the timed region (all iterations)
  double plain_events_ms = -1;           // same work without the profiler attached (<0: not run)
  double flops = 0, bytes = 0;           // whole timed region
  uint64_t dropped = 0;                  // CUPTI records lost
  size_t memory_bytes = 0;               // device memory held by the engine (0 = unknown)
  std::vector<std::string> notes;
  // per-iteration helpers
  double kernel_ms_per_iter() const;
  double events_ms_per_iter() const;
  double difference_pct() const;       // (events - kernel sum) / events
  double idle_ms_per_iter() const;     // GPU idle between activities, inside their span
  double outside_ms_per_iter() const;  // CUDA-event time outside the activities' span
};
// Fills kernels/memops/layers/kernel_ns/memop_ns/flops/bytes from the records.
void build_report(Report& r, const std::vector<Activity>& acts, const RangeTracker& ranges);
// Only the activity part: kernels/memops/kernel_ns/memop_ns/span_ns/busy_ns (layers untouched).
void build_kernel_tables(Report& r, const std::vector<Activity>& acts);
// Graph mode: keeps r's activity part (the eager pass) as r.eager, then replaces it with the
// graph replays' records and CUDA-event time; layers, FLOPs and bytes stay the eager pass's.
void use_graph_replays(Report& r, const std::vector<Activity>& graph_acts, double graph_events_ms);

std::string format_table(const Report& r, int name_width = 150);
std::string format_csv(const Report& r);
std::string format_json(const Report& r);
// The closing line: "kernel sum X ms/iter, CUDA events Y ms/iter (Z% difference)".
std::string timing_line(const Report& r);
// Where the difference goes: "GPU busy ..., idle between kernels ..., outside the kernels ...".
std::string gap_line(const Report& r);
// "Overlap: 1 running X ms/iter, 2 running Y, 3 or more Z" ("" without activities).
std::string overlap_line(const Report& r);
// Computes r.overlap_ns and r.alone_ns from the records (build_kernel_tables calls it).
void overlap_stats(Report& r, const std::vector<Activity>& acts);
// Graph mode only (else ""): "eager launches (layer-table pass): kernel sum ..., CUDA events ...".
std::string eager_line(const Report& r);

// Chrome trace-event JSON (Perfetto, chrome://tracing): process "GPU" with one track per stream
// (kernels, memcpy, memset) and a "layers (GPU)" track spanning each range's kernels; process
// "host" with the layer ranges as the host issued them; with `replays` (the CUDA-graph replays'
// activities: no ranges, but the streams and overlap the step really runs with) a third process,
// "GPU: CUDA-graph replays", on its own clock from 0. ts/dur in microseconds.
void write_chrome_trace(std::ostream& os, const std::vector<Activity>& acts, const RangeTracker& ranges,
                        const std::string& gpu, const std::vector<Activity>* replays = nullptr);

std::string demangle(const std::string& mangled);
std::string range_path(const RangeTracker& t, uint64_t id);

}  // namespace unet::prof
