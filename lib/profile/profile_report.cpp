// Aggregation, roofline math, report formatting and the Chrome trace writer of `unet profile`.
#include "profile_report.h"

#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "profiler_cupti.h"

namespace unet::prof {

using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Kernel summaries

std::string demangle(const std::string& mangled) {
  if (mangled.rfind("_Z", 0) != 0) return mangled;
  int status = 0;
  char* s = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !s) return mangled;
  std::string out(s);
  std::free(s);
  return out;
}

std::vector<SumRow> summarize(const std::vector<Activity>& acts, bool kernels) {
  std::map<std::string, std::vector<uint64_t>> by_name;
  std::map<std::string, uint64_t> bytes;
  for (const auto& a : acts) {
    if ((a.kind == ActivityKind::Kernel) != kernels) continue;
    by_name[a.name].push_back(a.duration());
    bytes[a.name] += a.bytes;
  }
  uint64_t all = 0;
  for (auto& kv : by_name)
    for (uint64_t d : kv.second) all += d;
  std::vector<SumRow> rows;
  for (auto& kv : by_name) {
    auto& d = kv.second;
    std::sort(d.begin(), d.end());
    SumRow r;
    r.name = kv.first;
    r.instances = d.size();
    for (uint64_t x : d) r.total_ns += x;
    r.avg_ns = (double)r.total_ns / d.size();
    const size_t n = d.size();
    r.med_ns = n % 2 ? (double)d[n / 2] : 0.5 * ((double)d[n / 2 - 1] + (double)d[n / 2]);
    r.min_ns = d.front();
    r.max_ns = d.back();
    if (n > 1) {
      double ss = 0;
      for (uint64_t x : d) ss += ((double)x - r.avg_ns) * ((double)x - r.avg_ns);
      r.stddev_ns = std::sqrt(ss / (double)(n - 1));
    }
    r.time_pct = all ? 100.0 * (double)r.total_ns / (double)all : 0.0;
    r.bytes = bytes[kv.first];
    rows.push_back(std::move(r));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const SumRow& a, const SumRow& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  return rows;
}

// ---------------------------------------------------------------------------------------------
// Layer ranges

RangeTracker::RangeTracker(Clock clock) : clock_(std::move(clock)) {
  if (!clock_)
    clock_ = [] {
      return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
}

void RangeTracker::push(const char* name) {
  RangeInstance r;
  r.id = next_id_++;
  r.parent = current();
  r.name = name ? name : "";
  r.depth = (int)stack_.size();
  r.host_start = clock_();
  index_[r.id] = inst_.size();
  inst_.push_back(std::move(r));
  stack_.push_back(inst_.back().id);
  if (on_push) on_push(inst_.back().id);
}

void RangeTracker::pop() {
  if (stack_.empty()) return;  // unbalanced pop: ignore rather than corrupt the tree
  if (on_pop) on_pop();
  auto it = index_.find(stack_.back());
  if (it != index_.end()) inst_[it->second].host_end = clock_();
  stack_.pop_back();
}

void RangeTracker::add_cost(double flops, double bytes) {
  if (!stack_.empty()) {
    auto it = index_.find(stack_.back());
    if (it != index_.end()) {
      inst_[it->second].flops += flops;
      inst_[it->second].bytes += bytes;
      return;
    }
  }
  out_flops_ += flops;
  out_bytes_ += bytes;
}

void RangeTracker::add_variant(const std::string& v) {
  if (stack_.empty()) return;
  auto it = index_.find(stack_.back());
  if (it == index_.end()) return;
  auto& vs = inst_[it->second].variants;
  if (std::find(vs.begin(), vs.end(), v) == vs.end()) vs.push_back(v);
}

void RangeTracker::clear() {
  if (!stack_.empty()) throw std::logic_error("RangeTracker::clear with open ranges");
  inst_.clear();
  index_.clear();
  out_flops_ = out_bytes_ = 0;
}

const RangeInstance* RangeTracker::find(uint64_t id) const {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : &inst_[it->second];
}

std::string range_path(const RangeTracker& t, uint64_t id) {
  std::vector<const std::string*> parts;
  for (const RangeInstance* r = t.find(id); r; r = r->parent ? t.find(r->parent) : nullptr)
    parts.push_back(&r->name);
  std::string p;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!p.empty()) p += '/';
    p += **it;
  }
  return p;
}

void assign_ranges_by_launch_time(std::vector<Activity>& acts, const std::vector<RangeInstance>& inst) {
  if (inst.empty()) return;
  std::vector<size_t> order(inst.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return inst[a].host_start < inst[b].host_start; });
  std::unordered_map<uint64_t, size_t> index;
  for (size_t i = 0; i < inst.size(); ++i) index[inst[i].id] = i;
  for (auto& a : acts) {
    if (a.range || !a.launch) continue;
    // The last range opened at or before the launch; if it had closed already, its enclosing
    // ranges are the candidates (ranges nest, so one of them is the innermost open one).
    auto it = std::upper_bound(order.begin(), order.end(), a.launch,
                               [&](uint64_t t, size_t i) { return t < inst[i].host_start; });
    if (it == order.begin()) continue;
    const RangeInstance* r = &inst[*(it - 1)];
    while (r && r->host_end && r->host_end < a.launch) {
      auto p = r->parent ? index.find(r->parent) : index.end();
      r = p == index.end() ? nullptr : &inst[p->second];
    }
    if (r) a.range = r->id;
  }
}

std::vector<LayerRow> aggregate_layers(const std::vector<RangeInstance>& inst,
                                       const std::vector<Activity>& acts, double outside_flops,
                                       double outside_bytes) {
  struct Node {
    LayerRow row;
    std::vector<size_t> children;
  };
  std::vector<Node> nodes;
  std::vector<size_t> roots;
  std::unordered_map<std::string, size_t> by_path;
  std::unordered_map<uint64_t, size_t> node_of;  // instance id -> node
  std::unordered_map<uint64_t, const RangeInstance*> inst_by_id;
  for (const auto& r : inst) inst_by_id[r.id] = &r;

  // Instances in push order: a parent is always seen before its children.
  std::vector<const RangeInstance*> ordered;
  for (const auto& r : inst) ordered.push_back(&r);
  std::sort(ordered.begin(), ordered.end(), [](auto* a, auto* b) { return a->id < b->id; });
  for (const RangeInstance* r : ordered) {
    auto pn = r->parent ? node_of.find(r->parent) : node_of.end();
    const bool has_parent = pn != node_of.end();
    std::string path = has_parent ? nodes[pn->second].row.path + "/" + r->name : r->name;
    auto it = by_path.find(path);
    size_t n;
    if (it == by_path.end()) {
      n = nodes.size();
      Node node;
      node.row.path = path;
      node.row.name = r->name;
      node.row.depth = has_parent ? nodes[pn->second].row.depth + 1 : 0;
      nodes.push_back(std::move(node));
      by_path[path] = n;
      if (has_parent)
        nodes[pn->second].children.push_back(n);
      else
        roots.push_back(n);
    } else {
      n = it->second;
    }
    node_of[r->id] = n;
    for (const auto& v : r->variants) {
      auto& vs = nodes[n].row.variants;
      if (std::find(vs.begin(), vs.end(), v) == vs.end()) vs.push_back(v);
    }
    nodes[n].row.calls++;
    nodes[n].row.flops += r->flops;
    nodes[n].row.bytes += r->bytes;
  }
  LayerRow outside;
  outside.name = outside.path = "(outside layer ranges)";
  outside.flops = outside_flops;
  outside.bytes = outside_bytes;
  for (const auto& a : acts) {
    auto it = a.range ? node_of.find(a.range) : node_of.end();
    LayerRow& row = it == node_of.end() ? outside : nodes[it->second].row;
    row.time_ns += a.duration();
    row.kernels++;
  }
  // Inclusive totals, children first.
  std::function<void(size_t)> fold = [&](size_t n) {
    for (size_t c : nodes[n].children) {
      fold(c);
      nodes[n].row.time_ns += nodes[c].row.time_ns;
      nodes[n].row.kernels += nodes[c].row.kernels;
      nodes[n].row.flops += nodes[c].row.flops;
      nodes[n].row.bytes += nodes[c].row.bytes;
    }
  };
  for (size_t r : roots) fold(r);
  std::vector<LayerRow> out;
  std::function<void(size_t)> emit = [&](size_t n) {
    std::sort(nodes[n].row.variants.begin(), nodes[n].row.variants.end());
    out.push_back(nodes[n].row);
    for (size_t c : nodes[n].children) emit(c);
  };
  for (size_t r : roots) emit(r);
  if (outside.kernels || outside.flops > 0) out.push_back(outside);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Peaks and roofline

namespace {
struct Datasheet {
  const char* match;  // substring of the CUDA device name
  const char* label;
  double fp32, tf32, bf16, gbps;  // dense TFLOP/s, GB/s
};
// NVIDIA datasheet numbers (dense, no sparsity). Order matters: the first match wins.
const Datasheet kSheets[] = {
    {"H100 NVL", "NVIDIA H100 NVL datasheet", 60.0, 417.5, 835.0, 3900},
    {"H100 PCIe", "NVIDIA H100 PCIe datasheet", 51.2, 378.0, 756.0, 2000},
    {"H100", "NVIDIA H100 SXM5 datasheet", 66.9, 494.7, 989.4, 3352},
    {"H200 NVL", "NVIDIA H200 NVL datasheet", 60.0, 417.5, 835.0, 4800},
    {"H200", "NVIDIA H200 SXM datasheet", 66.9, 494.7, 989.4, 4800},
    {"A100-SXM4-80GB", "NVIDIA A100 SXM4 80GB datasheet", 19.5, 156.0, 312.0, 2039},
    {"A100 80GB PCIe", "NVIDIA A100 PCIe 80GB datasheet", 19.5, 156.0, 312.0, 1935},
    {"A100", "NVIDIA A100 40GB datasheet", 19.5, 156.0, 312.0, 1555},
};

// Dense FLOP per clock per SM: {fp32 CUDA cores, TF32 tensor, BF16 tensor}.
void flop_per_clock(int major, int minor, double out[3], bool* known) {
  *known = true;
  if (major == 9)
    out[0] = 256, out[1] = 2048, out[2] = 4096;
  else if (major == 10)
    out[0] = 256, out[1] = 4096, out[2] = 8192;
  else if (major == 8 && minor == 0)
    out[0] = 128, out[1] = 1024, out[2] = 2048;
  else if (major == 8 || major == 12)
    out[0] = 256, out[1] = 512, out[2] = 1024;
  else if (major == 7)
    out[0] = 128, out[1] = 128, out[2] = 128;  // no TF32/BF16 tensor cores
  else
    out[0] = out[1] = out[2] = 128, *known = false;
}

const char* what_for(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "FP32 CUDA cores";
    case Precision::TF32:
      return "TF32 tensor cores, dense";
    case Precision::BF16:
      return "BF16 tensor cores, dense";
  }
  return "";
}
}  // namespace

Peaks device_peaks(const DeviceInfo& d, Precision p) {
  Peaks pk;
  pk.what = what_for(p);
  const int idx = p == Precision::FP32 ? 0 : p == Precision::TF32 ? 1 : 2;
  for (const auto& s : kSheets) {
    if (d.name.find(s.match) != std::string::npos) {
      const double v[3] = {s.fp32, s.tf32, s.bf16};
      pk.tflops = v[idx];
      pk.gbps = s.gbps;
      pk.source = s.label;
      return pk;
    }
  }
  double fpc[3];
  bool known;
  flop_per_clock(d.cc_major, d.cc_minor, fpc, &known);
  pk.tflops = d.sms * d.sm_clock_mhz * 1e6 * fpc[idx] / 1e12;
  pk.gbps = 2.0 * d.mem_clock_mhz * 1e6 * d.bus_bits / 8.0 / 1e9;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "device properties: %d SMs x %.0f MHz x %.0f FLOP/clock/SM%s; %d-bit bus x %.0f MHz x 2",
                d.sms, d.sm_clock_mhz, fpc[idx], known ? "" : " (unknown architecture, guessed)", d.bus_bits,
                d.mem_clock_mhz);
  pk.source = buf;
  return pk;
}

Roofline roofline(double flops, double bytes, double ns, const Peaks& peaks) {
  Roofline r;
  if (bytes > 0) r.intensity = flops / bytes;
  if (ns <= 0) return r;
  r.tflops = flops / ns / 1e3;  // FLOP/ns = GFLOP/s
  r.gbps = bytes / ns;          // byte/ns = GB/s
  if (peaks.tflops > 0) r.flop_pct = 100.0 * r.tflops / peaks.tflops;
  if (peaks.gbps > 0) r.bw_pct = 100.0 * r.gbps / peaks.gbps;
  // The roofline floor is max(flops/peak_flops, bytes/peak_bw); achieved/roof = the larger pct.
  r.peak_pct = std::max(r.flop_pct, r.bw_pct);
  if (flops > 0 || bytes > 0) r.bound = r.flop_pct >= r.bw_pct ? "compute" : "memory";
  return r;
}

// ---------------------------------------------------------------------------------------------
// Report

double Report::kernel_ms_per_iter() const {
  return iters ? (double)(kernel_ns + memop_ns) / 1e6 / iters : 0.0;
}
double Report::events_ms_per_iter() const { return iters ? events_ms / iters : 0.0; }
double Report::difference_pct() const {
  const double e = events_ms_per_iter();
  return e > 0 ? 100.0 * (e - kernel_ms_per_iter()) / e : 0.0;
}

double Report::idle_ms_per_iter() const {
  return iters ? (double)(span_ns - std::min(span_ns, busy_ns)) / 1e6 / iters : 0.0;
}
double Report::outside_ms_per_iter() const {
  return iters ? (events_ms - (double)span_ns / 1e6) / iters : 0.0;
}

void overlap_stats(Report& r, const std::vector<Activity>& acts) {
  r.overlap_ns.assign(1, 0);
  r.alone_ns.clear();
  // Sweep over starts (+1) and ends (-1); at equal times ends first, so back-to-back activities
  // do not count as overlapping.
  std::vector<std::pair<uint64_t, int64_t>> ev;  // (time, +index+1 | -(index+1))
  ev.reserve(2 * acts.size());
  for (size_t i = 0; i < acts.size(); ++i) {
    if (acts[i].duration() == 0) continue;
    ev.push_back({acts[i].start, (int64_t)i + 1});
    ev.push_back({acts[i].end, -((int64_t)i + 1)});
  }
  std::sort(ev.begin(), ev.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;
  });
  std::set<size_t> active;
  std::map<std::string, uint64_t> alone;
  uint64_t last = ev.empty() ? 0 : ev.front().first;
  for (const auto& e : ev) {
    const uint64_t dt = e.first - last;
    if (dt && !active.empty()) {
      if (r.overlap_ns.size() <= active.size()) r.overlap_ns.resize(active.size() + 1, 0);
      r.overlap_ns[active.size()] += dt;
      if (active.size() == 1) alone[acts[*active.begin()].name] += dt;
    }
    last = e.first;
    if (e.second > 0)
      active.insert((size_t)(e.second - 1));
    else
      active.erase((size_t)(-e.second - 1));
  }
  r.alone_ns.assign(alone.begin(), alone.end());
  std::stable_sort(r.alone_ns.begin(), r.alone_ns.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
}

void build_kernel_tables(Report& r, const std::vector<Activity>& acts) {
  r.span_ns = 0;
  if (!acts.empty()) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& a : acts) lo = std::min(lo, a.start), hi = std::max(hi, std::max(a.start, a.end));
    r.span_ns = hi - lo;
  }
  overlap_stats(r, acts);
  r.busy_ns = 0;  // the union of the intervals: time with at least one running
  for (uint64_t t : r.overlap_ns) r.busy_ns += t;
  r.kernels = summarize(acts, true);
  r.memops = summarize(acts, false);
  r.kernel_ns = r.memop_ns = 0;
  for (const auto& k : r.kernels) r.kernel_ns += k.total_ns;
  for (const auto& k : r.memops) r.memop_ns += k.total_ns;
}

void build_report(Report& r, const std::vector<Activity>& acts, const RangeTracker& ranges) {
  build_kernel_tables(r, acts);
  r.layers = aggregate_layers(ranges.instances(), acts, ranges.outside_flops(), ranges.outside_bytes());
  r.flops = ranges.outside_flops();
  r.bytes = ranges.outside_bytes();
  for (const auto& i : ranges.instances()) r.flops += i.flops, r.bytes += i.bytes;
}

void use_graph_replays(Report& r, const std::vector<Activity>& graph_acts, double graph_events_ms) {
  r.eager.events_ms = r.events_ms;
  r.eager.kernel_ns = r.kernel_ns;
  r.eager.memop_ns = r.memop_ns;
  r.eager.busy_ns = r.busy_ns;
  r.eager.span_ns = r.span_ns;
  r.eager.activities = 0;
  for (const auto& k : r.kernels) r.eager.activities += k.instances;
  for (const auto& k : r.memops) r.eager.activities += k.instances;
  build_kernel_tables(r, graph_acts);
  r.events_ms = graph_events_ms;
  r.mode = "graph";
}

double PassTiming::kernel_ms_per_iter(int iters) const {
  return iters ? (double)(kernel_ns + memop_ns) / 1e6 / iters : 0.0;
}
double PassTiming::events_ms_per_iter(int iters) const { return iters ? events_ms / iters : 0.0; }
double PassTiming::difference_pct(int iters) const {
  const double e = events_ms_per_iter(iters);
  return e > 0 ? 100.0 * (e - kernel_ms_per_iter(iters)) / e : 0.0;
}
double PassTiming::idle_ms_per_iter(int iters) const {
  return iters ? (double)(span_ns - std::min(span_ns, busy_ns)) / 1e6 / iters : 0.0;
}

namespace {
std::string with_commas(const std::string& digits) {
  std::string s = digits, sign;
  if (!s.empty() && s[0] == '-') sign = "-", s = s.substr(1);
  size_t dot = s.find('.');
  std::string ip = s.substr(0, dot), fp = dot == std::string::npos ? "" : s.substr(dot);
  std::string out;
  for (size_t i = 0; i < ip.size(); ++i) {
    if (i && (ip.size() - i) % 3 == 0) out += ',';
    out += ip[i];
  }
  return sign + out + fp;
}
std::string fmt(double v, int decimals) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}
std::string fmt_c(double v, int decimals) { return with_commas(fmt(v, decimals)); }
std::string fmt_u(uint64_t v) { return with_commas(std::to_string(v)); }

// A plain-text table: columns right-aligned except those marked left; widths from the content.
struct TextTable {
  std::vector<std::string> head;
  std::vector<bool> left;
  std::vector<std::vector<std::string>> rows;
  std::string render() const {
    std::vector<size_t> w(head.size());
    for (size_t c = 0; c < head.size(); ++c) {
      w[c] = head[c].size();
      for (const auto& r : rows) w[c] = std::max(w[c], r[c].size());
    }
    std::string out;
    auto line = [&](const std::vector<std::string>& cells) {
      std::string l;
      for (size_t c = 0; c < cells.size(); ++c) {
        const bool last = c + 1 == cells.size();
        const size_t pad = w[c] - std::min(w[c], cells[c].size());
        l += ' ';
        if (left[c]) {
          l += cells[c];
          if (!last) l += std::string(pad, ' ');
        } else {
          l += std::string(pad, ' ') + cells[c];
        }
        if (!last) l += ' ';
      }
      out += l + "\n";
    };
    line(head);
    std::vector<std::string> dashes;
    for (size_t c = 0; c < head.size(); ++c)
      dashes.push_back(std::string(left[c] && c + 1 == head.size() ? head[c].size() : w[c], '-'));
    line(dashes);
    for (const auto& r : rows) line(r);
    return out;
  }
};

std::string clip(const std::string& s, int width) {
  if (width <= 3 || (int)s.size() <= width) return s;
  return s.substr(0, width - 3) + "...";
}

std::string sum_table(const std::vector<SumRow>& rows, bool memops, int name_width) {
  TextTable t;
  t.head = {"Time (%)", "Total Time (ns)", memops ? "Count" : "Instances", "Avg (ns)", "Med (ns)", "Min (ns)",
            "Max (ns)", "StdDev (ns)"};
  if (memops) t.head.push_back("Total (MB)");
  t.head.push_back(memops ? "Operation" : "Name");
  t.left.assign(t.head.size(), false);
  t.left.back() = true;
  for (const auto& r : rows) {
    std::vector<std::string> c = {fmt(r.time_pct, 1), fmt_u(r.total_ns),    fmt_u(r.instances),
                                  fmt_c(r.avg_ns, 1), fmt_c(r.med_ns, 1),   fmt_u(r.min_ns),
                                  fmt_u(r.max_ns),    fmt_c(r.stddev_ns, 1)};
    if (memops) c.push_back(fmt_c((double)r.bytes / 1e6, 3));
    c.push_back(clip(r.name, name_width));
    t.rows.push_back(std::move(c));
  }
  return t.render();
}

// The layer table's pass: its kernel sum is what Step (%) divides by.
bool graph_mode(const Report& r) { return r.mode == "graph" && r.eager.events_ms >= 0; }
double layer_step_ms(const Report& r) {
  return graph_mode(r) ? r.eager.kernel_ms_per_iter(r.iters) : r.kernel_ms_per_iter();
}

ojson layer_json(const Report& r, const LayerRow& l) {
  const double it = r.iters > 0 ? r.iters : 1;
  const Roofline rf = roofline(l.flops, l.bytes, (double)l.time_ns, r.peaks);
  const double step = layer_step_ms(r);
  ojson j;
  j["path"] = l.path;
  j["name"] = l.name;
  j["depth"] = l.depth;
  j["calls_per_iter"] = (double)l.calls / it;
  j["kernels_per_iter"] = (double)l.kernels / it;
  j["ms_per_iter"] = (double)l.time_ns / 1e6 / it;
  j["step_pct"] = step > 0 ? 100.0 * (double)l.time_ns / 1e6 / it / step : 0.0;
  j["flops_per_iter"] = l.flops / it;
  j["bytes_per_iter"] = l.bytes / it;
  j["tflops"] = rf.tflops;
  j["gbps"] = rf.gbps;
  j["flop_pct"] = rf.flop_pct;
  j["bw_pct"] = rf.bw_pct;
  j["peak_pct"] = rf.peak_pct;
  j["intensity"] = rf.intensity;
  j["bound"] = rf.bound;
  j["variants"] = l.variants;
  return j;
}

// The distinct variant names of a layer ("im2col, threepass"), for the table.
std::string variant_names(const LayerRow& l) {
  std::vector<std::string> names;
  for (const auto& v : l.variants) {
    const std::string n = v.substr(v.find('=') + 1);
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ",") + n;
  return s.empty() ? "-" : s;
}
}  // namespace

std::string timing_line(const Report& r) {
  char b[512];
  std::string memop;
  if (r.memop_ns > 0)
    memop = " (incl. " + fmt((double)r.memop_ns / 1e6 / std::max(1, r.iters), 3) + " ms memcpy/memset)";
  std::snprintf(b, sizeof b, "kernel sum %.3f ms/iter%s, CUDA events %.3f ms/iter (%.1f%% difference)",
                r.kernel_ms_per_iter(), memop.c_str(), r.events_ms_per_iter(), r.difference_pct());
  std::string s = b;
  // Kernels on two streams (lanes) overlap: their sum then exceeds the time the GPU was busy.
  const double busy_ms = (double)r.busy_ns / 1e6 / std::max(1, r.iters);
  if (busy_ms > 0 && r.kernel_ms_per_iter() > 1.02 * busy_ms)
    s += "; kernels overlap (several streams): the step's GPU time is the CUDA-event time";
  return s;
}

std::string gap_line(const Report& r) {
  const double it = std::max(1, r.iters);
  char b[400];
  std::snprintf(
      b, sizeof b,
      "GPU busy %.3f ms/iter (union of kernel intervals); idle between kernels %.3f ms/iter; CUDA-event time "
      "outside the kernels' span %.3f ms/iter",
      (double)r.busy_ns / 1e6 / it, r.idle_ms_per_iter(), r.outside_ms_per_iter());
  return b;
}

std::string overlap_line(const Report& r) {
  if (r.overlap_ns.size() < 2) return "";
  const double it = std::max(1, r.iters);
  auto ms = [&](size_t k) { return k < r.overlap_ns.size() ? (double)r.overlap_ns[k] / 1e6 / it : 0.0; };
  double more = 0;
  for (size_t k = 3; k < r.overlap_ns.size(); ++k) more += ms(k);
  char b[300];
  std::snprintf(b, sizeof b,
                "Overlap: 1 activity running %.3f ms/iter, 2 running %.3f ms/iter, 3 or more %.3f ms/iter", ms(1),
                ms(2), more);
  return b;
}

std::string eager_line(const Report& r) {
  if (!graph_mode(r)) return "";
  char b[400];
  std::snprintf(b, sizeof b,
                "eager launches (the layer table's pass): kernel sum %.3f ms/iter, CUDA events %.3f ms/iter "
                "(%.1f%% difference; GPU idle between kernels %.3f ms/iter)",
                r.eager.kernel_ms_per_iter(r.iters), r.eager.events_ms_per_iter(r.iters),
                r.eager.difference_pct(r.iters), r.eager.idle_ms_per_iter(r.iters));
  return b;
}

// Rows of the table's "Running alone" section (JSON and CSV have all of them).
constexpr size_t kAloneRows = 15;

std::string format_table(const Report& r, int name_width) {
  std::ostringstream os;
  os << "GPU: " << r.gpu << " | precision " << r.precision << " | peak " << fmt(r.peaks.tflops, 1)
     << " TFLOP/s (" << r.peaks.what << "), " << fmt(r.peaks.gbps, 0) << " GB/s DRAM | peaks from "
     << r.peaks.source << "\n";
  if (!r.cudnn.empty()) os << "Convolution library: " << r.cudnn << "\n";
  if (r.memory_bytes)
    os << "Device memory held: " << fmt(r.memory_bytes / 1e9, 2)
       << " GB (planned buffers, weights, workspaces)\n";
  const bool graph = graph_mode(r);
  os << "Target: " << r.target << " | pass " << r.pass << " | " << r.iters << " timed iterations after "
     << r.warmup << " warm-up | "
     << (graph ? "kernels timed as CUDA-graph replays, layers from an eager pass"
               : "eager launches (one per kernel)")
     << "\n\n";
  os << "CUDA kernels (CUPTI activity records, all " << r.iters << " timed iterations"
     << (graph ? ", CUDA-graph replays" : ", eager launches") << "):\n\n";
  if (r.kernels.empty())
    os << " (no kernels recorded)\n";
  else
    os << sum_table(r.kernels, false, name_width);
  os << "\nCUDA memcpy / memset:\n\n";
  if (r.memops.empty())
    os << " (none)\n";
  else
    os << sum_table(r.memops, true, name_width);

  if (!r.alone_ns.empty()) {
    const double it = std::max(1, r.iters), ev = r.events_ms_per_iter();
    os << "\nRunning alone (no other kernel or copy on the GPU meanwhile: where overlap did not help), per "
          "iteration, top "
       << std::min<size_t>(kAloneRows, r.alone_ns.size()) << " of " << r.alone_ns.size() << ":\n\n";
    TextTable a;
    a.head = {"Alone (ms)", "Events (%)", "Name"};
    a.left = {false, false, true};
    for (size_t i = 0; i < r.alone_ns.size() && i < kAloneRows; ++i) {
      const double ms = (double)r.alone_ns[i].second / 1e6 / it;
      std::string name = r.alone_ns[i].first;
      if ((int)name.size() > name_width) name = name.substr(0, name_width - 3) + "...";
      a.rows.push_back({fmt(ms, 3), ev > 0 ? fmt(100.0 * ms / ev, 1) : "-", name});
    }
    os << a.render();
  }

  os << "\nLayers (per iteration; time = summed GPU time of the range's kernels, nested ranges "
        "included"
     << (graph ? "; from the eager pass of " + std::to_string(r.iters) +
                     " iterations, as graph replays cannot be matched to ranges"
               : "")
     << "):\n\n";
  TextTable t;
  t.head = {"Layer",   "Calls", "Time (ms)", "Step (%)", "GFLOP",  "MB",
            "TFLOP/s", "GB/s",  "Peak (%)",  "Bound",    "Kernels"};
  t.left = {true, false, false, false, false, false, false, false, false, true, true};
  for (const auto& l : r.layers) {
    ojson j = layer_json(r, l);
    t.rows.push_back(
        {std::string(2 * l.depth, ' ') + l.name,
         l.calls ? fmt(j["calls_per_iter"].get<double>(), l.calls % std::max(1, r.iters) ? 2 : 0) : "-",
         fmt(j["ms_per_iter"].get<double>(), 3), fmt(j["step_pct"].get<double>(), 1),
         fmt(j["flops_per_iter"].get<double>() / 1e9, 2), fmt_c(j["bytes_per_iter"].get<double>() / 1e6, 1),
         fmt(j["tflops"].get<double>(), 2), fmt_c(j["gbps"].get<double>(), 0),
         fmt(j["peak_pct"].get<double>(), 1), j["bound"].get<std::string>(), variant_names(l)});
  }
  if (t.rows.empty())
    os << " (no layer ranges)\n";
  else
    os << t.render();
  const double it = std::max(1, r.iters);
  const Roofline tot = roofline(r.flops, r.bytes, (double)(r.kernel_ns + r.memop_ns), r.peaks);
  os << "\nTotal per iteration: " << fmt(r.flops / it / 1e9, 2) << " GFLOP, " << fmt_c(r.bytes / it / 1e6, 1)
     << " MB minimum traffic; " << fmt(tot.tflops, 2) << " TFLOP/s, " << fmt_c(tot.gbps, 0) << " GB/s ("
     << fmt(tot.peak_pct, 1) << "% of peak, " << tot.bound << "-bound)\n";
  os << (graph ? "CUDA-graph replays: " : "") << timing_line(r) << "\n";
  os << gap_line(r) << "\n";
  if (const std::string ov = overlap_line(r); !ov.empty()) os << ov << "\n";
  if (graph) os << eager_line(r) << "\n";
  if (r.plain_events_ms >= 0)
    os << "without the profiler attached" << (graph ? " (graph replays)" : "") << ": CUDA events "
       << fmt(r.plain_events_ms / it, 3) << " ms/iter\n";
  if (r.dropped)
    os << "warning: CUPTI dropped " << r.dropped << " activity records; the tables are incomplete\n";
  for (const auto& n : r.notes) os << "note: " << n << "\n";
  return os.str();
}

namespace {
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}
std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
}  // namespace

std::string format_csv(const Report& r) {
  static const char* cols[] = {
      "section",     "name",     "path",           "depth",       "time_pct",  "total_ns", "instances",
      "avg_ns",      "med_ns",   "min_ns",         "max_ns",      "stddev_ns", "bytes",    "calls_per_iter",
      "ms_per_iter", "step_pct", "gflop_per_iter", "mb_per_iter", "tflops",    "gbps",     "flop_pct",
      "bw_pct",      "peak_pct", "bound",          "value",       "variants"};
  const size_t ncol = sizeof cols / sizeof cols[0];
  std::ostringstream os;
  for (size_t i = 0; i < ncol; ++i) os << (i ? "," : "") << cols[i];
  os << "\n";
  auto row = [&](std::map<std::string, std::string> f) {
    for (size_t i = 0; i < ncol; ++i) os << (i ? "," : "") << csv_field(f[cols[i]]);
    os << "\n";
  };
  auto info = [&](const std::string& k, const std::string& v) {
    row({{"section", "info"}, {"name", k}, {"value", v}});
  };
  info("gpu", r.gpu);
  if (!r.cudnn.empty()) info("cudnn", r.cudnn);
  info("target", r.target);
  info("pass", r.pass);
  info("precision", r.precision);
  info("iters", std::to_string(r.iters));
  info("warmup", std::to_string(r.warmup));
  info("mode", r.mode);
  info("layers_mode", "eager");
  info("peak_tflops", num(r.peaks.tflops));
  info("peak_gbps", num(r.peaks.gbps));
  info("peak_what", r.peaks.what);
  info("peak_source", r.peaks.source);
  if (r.memory_bytes) info("memory_bytes", std::to_string(r.memory_bytes));
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& k : pass ? r.memops : r.kernels)
      row({{"section", pass ? "memop" : "kernel"},
           {"name", k.name},
           {"time_pct", num(k.time_pct)},
           {"total_ns", std::to_string(k.total_ns)},
           {"instances", std::to_string(k.instances)},
           {"avg_ns", num(k.avg_ns)},
           {"med_ns", num(k.med_ns)},
           {"min_ns", std::to_string(k.min_ns)},
           {"max_ns", std::to_string(k.max_ns)},
           {"stddev_ns", num(k.stddev_ns)},
           {"bytes", std::to_string(k.bytes)}});
  for (const auto& l : r.layers) {
    ojson j = layer_json(r, l);
    row({{"section", "layer"},
         {"name", l.name},
         {"path", l.path},
         {"depth", std::to_string(l.depth)},
         {"total_ns", std::to_string(l.time_ns)},
         {"instances", std::to_string(l.calls)},
         {"calls_per_iter", num(j["calls_per_iter"])},
         {"ms_per_iter", num(j["ms_per_iter"])},
         {"step_pct", num(j["step_pct"])},
         {"gflop_per_iter", num(j["flops_per_iter"].get<double>() / 1e9)},
         {"mb_per_iter", num(j["bytes_per_iter"].get<double>() / 1e6)},
         {"tflops", num(j["tflops"])},
         {"gbps", num(j["gbps"])},
         {"flop_pct", num(j["flop_pct"])},
         {"bw_pct", num(j["bw_pct"])},
         {"peak_pct", num(j["peak_pct"])},
         {"bound", j["bound"].get<std::string>()},
         {"variants", [&] {
            std::string v;
            for (const auto& x : l.variants) v += (v.empty() ? "" : " ") + x;
            return v;
          }()}});
  }
  for (const auto& a : r.alone_ns)
    row({{"section", "alone"},
         {"name", a.first},
         {"total_ns", std::to_string(a.second)},
         {"ms_per_iter", num((double)a.second / 1e6 / std::max(1, r.iters))}});
  auto timing = [&](const std::string& k, double v) {
    row({{"section", "timing"}, {"name", k}, {"value", num(v)}});
  };
  timing("kernel_sum_ms_per_iter", r.kernel_ms_per_iter());
  timing("cuda_events_ms_per_iter", r.events_ms_per_iter());
  timing("difference_pct", r.difference_pct());
  timing("gpu_busy_ms_per_iter", (double)r.busy_ns / 1e6 / std::max(1, r.iters));
  timing("idle_between_kernels_ms_per_iter", r.idle_ms_per_iter());
  timing("outside_kernel_span_ms_per_iter", r.outside_ms_per_iter());
  if (r.plain_events_ms >= 0)
    timing("without_profiler_ms_per_iter", r.plain_events_ms / std::max(1, r.iters));
  if (graph_mode(r)) {
    timing("eager_kernel_sum_ms_per_iter", r.eager.kernel_ms_per_iter(r.iters));
    timing("eager_cuda_events_ms_per_iter", r.eager.events_ms_per_iter(r.iters));
    timing("eager_difference_pct", r.eager.difference_pct(r.iters));
    timing("eager_idle_between_kernels_ms_per_iter", r.eager.idle_ms_per_iter(r.iters));
    timing("eager_activities", (double)r.eager.activities);
  }
  timing("dropped_records", (double)r.dropped);
  return os.str();
}

std::string format_json(const Report& r) {
  ojson j;
  j["gpu"] = r.gpu;
  if (!r.cudnn.empty()) j["cudnn"] = r.cudnn;
  j["target"] = r.target;
  j["pass"] = r.pass;
  j["precision"] = r.precision;
  j["iters"] = r.iters;
  j["warmup"] = r.warmup;
  j["mode"] = r.mode;
  j["layers_mode"] = "eager";
  if (r.memory_bytes) j["memory_bytes"] = r.memory_bytes;
  j["peaks"] = {
      {"tflops", r.peaks.tflops}, {"gbps", r.peaks.gbps}, {"what", r.peaks.what}, {"source", r.peaks.source}};
  for (int pass = 0; pass < 2; ++pass) {
    ojson arr = ojson::array();
    for (const auto& k : pass ? r.memops : r.kernels) {
      ojson e;
      e["name"] = k.name;
      e["time_pct"] = k.time_pct;
      e["total_ns"] = k.total_ns;
      e["instances"] = k.instances;
      e["avg_ns"] = k.avg_ns;
      e["med_ns"] = k.med_ns;
      e["min_ns"] = k.min_ns;
      e["max_ns"] = k.max_ns;
      e["stddev_ns"] = k.stddev_ns;
      if (pass) e["bytes"] = k.bytes;
      arr.push_back(std::move(e));
    }
    j[pass ? "memops" : "kernels"] = std::move(arr);
  }
  ojson layers = ojson::array();
  for (const auto& l : r.layers) layers.push_back(layer_json(r, l));
  j["layers"] = std::move(layers);
  const double it = std::max(1, r.iters);
  const Roofline tot = roofline(r.flops, r.bytes, (double)(r.kernel_ns + r.memop_ns), r.peaks);
  j["totals"] = {{"flops_per_iter", r.flops / it}, {"bytes_per_iter", r.bytes / it},
                 {"tflops", tot.tflops},           {"gbps", tot.gbps},
                 {"peak_pct", tot.peak_pct},       {"bound", tot.bound}};
  ojson tm;
  tm["kernel_sum_ms_per_iter"] = r.kernel_ms_per_iter();
  tm["kernel_only_ms_per_iter"] = (double)r.kernel_ns / 1e6 / it;
  tm["memop_ms_per_iter"] = (double)r.memop_ns / 1e6 / it;
  tm["cuda_events_ms_per_iter"] = r.events_ms_per_iter();
  tm["difference_pct"] = r.difference_pct();
  tm["gpu_busy_ms_per_iter"] = (double)r.busy_ns / 1e6 / it;
  tm["gpu_span_ms_per_iter"] = (double)r.span_ns / 1e6 / it;
  tm["idle_between_kernels_ms_per_iter"] = r.idle_ms_per_iter();
  tm["outside_kernel_span_ms_per_iter"] = r.outside_ms_per_iter();
  {
    ojson ov = ojson::object();
    for (size_t k = 1; k < r.overlap_ns.size(); ++k) ov[std::to_string(k)] = (double)r.overlap_ns[k] / 1e6 / it;
    tm["overlap_ms_per_iter"] = std::move(ov);  // {"1": ms with one activity running, "2": ...}
    ojson al = ojson::array();
    for (const auto& a : r.alone_ns) al.push_back({{"name", a.first}, {"ms_per_iter", (double)a.second / 1e6 / it}});
    tm["alone"] = std::move(al);
  }
  tm["without_profiler_ms_per_iter"] =
      r.plain_events_ms >= 0 ? ojson(r.plain_events_ms / it) : ojson(nullptr);
  if (graph_mode(r)) {
    const int n = r.iters;
    tm["eager"] = {{"kernel_sum_ms_per_iter", r.eager.kernel_ms_per_iter(n)},
                   {"cuda_events_ms_per_iter", r.eager.events_ms_per_iter(n)},
                   {"difference_pct", r.eager.difference_pct(n)},
                   {"gpu_busy_ms_per_iter", (double)r.eager.busy_ns / 1e6 / it},
                   {"idle_between_kernels_ms_per_iter", r.eager.idle_ms_per_iter(n)},
                   {"activities", r.eager.activities}};
  } else {
    tm["eager"] = nullptr;
  }
  j["timing"] = std::move(tm);
  j["dropped_records"] = r.dropped;
  j["notes"] = r.notes;
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------------------------
// Chrome trace

void write_chrome_trace(std::ostream& os, const std::vector<Activity>& acts, const RangeTracker& ranges,
                        const std::string& gpu, const std::vector<Activity>* replays) {
  const auto& inst = ranges.instances();
  uint64_t t0 = UINT64_MAX;
  for (const auto& a : acts) t0 = std::min(t0, a.start);
  for (const auto& r : inst)
    if (r.host_start) t0 = std::min(t0, r.host_start);
  if (t0 == UINT64_MAX) t0 = 0;
  auto us = [&](uint64_t t) { return t >= t0 ? (double)(t - t0) / 1000.0 : -(double)(t0 - t) / 1000.0; };
  constexpr int kGpuPid = 1, kHostPid = 2, kReplayPid = 3, kLayerTid = 0;

  bool first = true;
  os << "{\"displayTimeUnit\":\"ns\",\"otherData\":" << ojson({{"gpu", gpu}, {"tool", "unet profile"}}).dump()
     << ",\"traceEvents\":[\n";
  auto emit = [&](const ojson& e) {
    os << (first ? "" : ",\n") << e.dump();
    first = false;
  };
  auto meta = [&](int pid, int tid, const char* what, const std::string& name, bool thread) {
    emit({{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
    if (thread)
      emit({{"name", "thread_sort_index"},
            {"ph", "M"},
            {"pid", pid},
            {"tid", tid},
            {"args", {{"sort_index", tid}}}});
  };
  meta(kGpuPid, 0, "process_name", "GPU: " + gpu, false);
  meta(kHostPid, 0, "process_name", "host", false);
  meta(kGpuPid, kLayerTid, "thread_name", "layers (GPU time)", true);
  meta(kHostPid, 1, "thread_name", "layer ranges (host)", true);
  std::map<uint32_t, bool> streams;
  for (const auto& a : acts) streams[a.stream] = true;
  for (const auto& s : streams)
    meta(kGpuPid, (int)s.first + 1, "thread_name", "stream " + std::to_string(s.first), true);

  // GPU span of each range: first kernel start to last kernel end, over its kernels and its
  // children's (ranges nest, so the spans nest too on one stream).
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> span;
  for (const auto& a : acts) {
    for (const RangeInstance* r = a.range ? ranges.find(a.range) : nullptr; r;
         r = r->parent ? ranges.find(r->parent) : nullptr) {
      auto it = span.find(r->id);
      if (it == span.end())
        span[r->id] = {a.start, a.end};
      else
        it->second.first = std::min(it->second.first, a.start),
        it->second.second = std::max(it->second.second, a.end);
    }
  }
  for (const auto& r : inst) {
    const std::string path = range_path(ranges, r.id);
    auto it = span.find(r.id);
    if (it != span.end())
      emit({{"name", r.name},
            {"cat", "layer"},
            {"ph", "X"},
            {"pid", kGpuPid},
            {"tid", kLayerTid},
            {"ts", us(it->second.first)},
            {"dur", (double)(it->second.second - it->second.first) / 1000.0},
            {"args", {{"path", path}, {"flops_self", r.flops}, {"bytes_self", r.bytes}}}});
    if (r.host_start && r.host_end >= r.host_start)
      emit({{"name", r.name},
            {"cat", "range"},
            {"ph", "X"},
            {"pid", kHostPid},
            {"tid", 1},
            {"ts", us(r.host_start)},
            {"dur", (double)(r.host_end - r.host_start) / 1000.0},
            {"args", {{"path", path}}}});
  }
  auto activity = [&](const Activity& a, int pid, double ts) {
    ojson args = {{"correlation", a.correlation}};
    if (a.range) args["range"] = range_path(ranges, a.range);
    if (a.kind == ActivityKind::Kernel) {
      args["grid"] = {a.grid[0], a.grid[1], a.grid[2]};
      args["block"] = {a.block[0], a.block[1], a.block[2]};
    } else {
      args["bytes"] = a.bytes;
    }
    emit({{"name", a.name},
          {"cat", a.kind == ActivityKind::Kernel   ? "kernel"
                  : a.kind == ActivityKind::Memcpy ? "memcpy"
                                                   : "memset"},
          {"ph", "X"},
          {"pid", pid},
          {"tid", (int)a.stream + 1},
          {"ts", ts},
          {"dur", (double)a.duration() / 1000.0},
          {"args", std::move(args)}});
  };
  for (const auto& a : acts) activity(a, kGpuPid, us(a.start));
  if (replays && !replays->empty()) {
    meta(kReplayPid, 0, "process_name", "GPU: CUDA-graph replays", false);
    std::set<uint32_t> rstreams;
    uint64_t r0 = UINT64_MAX;
    for (const auto& a : *replays) rstreams.insert(a.stream), r0 = std::min(r0, a.start);
    for (uint32_t st : rstreams) meta(kReplayPid, (int)st + 1, "thread_name", "stream " + std::to_string(st), true);
    for (const auto& a : *replays) activity(a, kReplayPid, (double)(a.start - r0) / 1000.0);
  }
  os << "\n]}\n";
}

// ---------------------------------------------------------------------------------------------
// CPU-only build: no GPU profiler (kernels/profiler_cupti.cpp is compiled only with CUDA).
#ifndef UNET_HAVE_CUDA
std::unique_ptr<GpuProfiler> make_gpu_profiler(std::string* why_not) {
  if (why_not) *why_not = "this unet was built without CUDA";
  return nullptr;
}
#endif

}  // namespace unet::prof
