// Convolution variant "cudnn": cuDNN 9's backend graph API (forward, dgrad, wgrad; NHWC; f32 with
// or without TF32 tensor cores, bf16), loaded at run time.
//
//  * libcudnn.so.9 is dlopen'ed on first use (UNET_CUDNN names a file to use instead; otherwise
//    the loader's path, then the CUDA toolkit's folders). Without it the variant says it cannot
//    run anything, once, and the engine's own kernels (im2col) take over.
//  * Each op signature gets an execution plan when memory is planned (prepare()): the engines of
//    cuDNN's heuristics that are deterministic (exact resume relies on it) and honour the
//    precision (no TF32 for fp32, no reduced-precision reductions, no FFT/Winograd for fp32) are
//    timed on scratch buffers and the fastest is kept. The choice is cached in a file
//    (UNET_CUDNN_CACHE, default ~/.cache/unet/cudnn-plans.txt) keyed by GPU, cuDNN version,
//    precision and op, so later runs skip the timing.
//  * ConvFwd's epilogue (bias, per-sample embedding, residual) and ConvBwdFilter's db/demb run as
//    the engine's own kernels after the cuDNN call, except in variant "cudnn_epi": there bias and
//    residual are part of the cuDNN graph (conv -> + bias -> + res, one kernel of cuDNN's
//    runtime-compiled engines), kept for a shape only where it timed faster than the conv and
//    unet's epilogue pass. Those engines are compiled with NVRTC when planned (0.5-2 s each), so
//    the chosen plan is also stored as cuDNN's JSON form beside the cache file and restored from
//    it by later runs (~2 ms). bf16 wgrad writes a bf16 dW into the
//    workspace (cuDNN wants the filter in the data type) which is widened into the f32 gradient.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda_engine.cuh"
#include "cudnn.h"
#include "env_vars.h"
#include "reduce.cuh"
#include "rng.h"
#include "rowblock.cuh"
#include "util.h"

namespace unet {

namespace {

// ---- the library, loaded at run time ----
struct Lib {
  bool ok = false;
  std::string why;
  size_t version = 0;
#define UNET_CUDNN_FN(name) decltype(&::name) name = nullptr;
  UNET_CUDNN_FN(cudnnGetVersion)
  UNET_CUDNN_FN(cudnnGetErrorString)
  UNET_CUDNN_FN(cudnnCreate)
  UNET_CUDNN_FN(cudnnDestroy)
  UNET_CUDNN_FN(cudnnSetStream)
  UNET_CUDNN_FN(cudnnBackendCreateDescriptor)
  UNET_CUDNN_FN(cudnnBackendDestroyDescriptor)
  UNET_CUDNN_FN(cudnnBackendSetAttribute)
  UNET_CUDNN_FN(cudnnBackendGetAttribute)
  UNET_CUDNN_FN(cudnnBackendFinalize)
  UNET_CUDNN_FN(cudnnBackendExecute)
#undef UNET_CUDNN_FN
};

const Lib& lib() {
  static Lib l = [] {
    Lib r;
    // UNET_CUDNN names the library, and then only it is tried (the two cuDNNs on the GPU
    // machines differ by 1% in speed).
    std::vector<std::string> names{"libcudnn.so.9"};
    for (const char* dir : {"/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/lib/x86_64-linux-gnu"})
      names.push_back(std::string(dir) + "/libcudnn.so.9");
    const LoadedLibrary found = load_library("UNET_CUDNN", names);
    void* h = found.handle;
    if (!h) {
      r.why = !found.error.empty() ? found.error : "libcudnn.so.9 not found (set UNET_CUDNN or LD_LIBRARY_PATH)";
      return r;
    }
#define UNET_CUDNN_SYM(name)                                    \
  r.name = reinterpret_cast<decltype(r.name)>(dlsym(h, #name)); \
  if (!r.name) {                                                \
    r.why = std::string("libcudnn.so.9 lacks ") + #name;        \
    return r;                                                   \
  }
    UNET_CUDNN_SYM(cudnnGetVersion)
    UNET_CUDNN_SYM(cudnnGetErrorString)
    UNET_CUDNN_SYM(cudnnCreate)
    UNET_CUDNN_SYM(cudnnDestroy)
    UNET_CUDNN_SYM(cudnnSetStream)
    UNET_CUDNN_SYM(cudnnBackendCreateDescriptor)
    UNET_CUDNN_SYM(cudnnBackendDestroyDescriptor)
    UNET_CUDNN_SYM(cudnnBackendSetAttribute)
    UNET_CUDNN_SYM(cudnnBackendGetAttribute)
    UNET_CUDNN_SYM(cudnnBackendFinalize)
    UNET_CUDNN_SYM(cudnnBackendExecute)
#undef UNET_CUDNN_SYM
    r.version = r.cudnnGetVersion();
    if (r.version < 90000) {
      r.why = "cuDNN " + std::to_string(r.version) + " is older than 9.0";
      return r;
    }
    r.ok = true;
    return r;
  }();
  return l;
}

void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuDNN ") + what + ": " + lib().cudnnGetErrorString(s));
}

// An owned backend descriptor.
struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t t) {
    check(lib().cudnnBackendCreateDescriptor(t, &d), "create");
  }
  Desc(Desc&& o) noexcept : d(o.d) { o.d = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d, o.d);
    return *this;
  }
  ~Desc() {
    if (d) lib().cudnnBackendDestroyDescriptor(d);
  }
  template <class T>
  void set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const T* v) {
    check(lib().cudnnBackendSetAttribute(d, a, t, n, v), "set attribute");
  }
  void set_desc(cudnnBackendAttributeName_t a, const Desc& o) {
    set(a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o.d);
  }
  cudnnStatus_t finalize() { return lib().cudnnBackendFinalize(d); }
};

enum Kind { Fwd = 0, Data = 1, Filter = 2 };

// A tuned plan for one op signature (and everything it references).
struct Plan {
  std::vector<Desc> keep;  // tensors, conv, op, graph, config: alive as long as the plan
  Desc plan;
  int64_t ws = 0;
  int64_t uid_x = 1, uid_w = 2, uid_y = 3;
};

// Per-engine (per CudaCtx) state: the handle and the plans by op signature.
struct State {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;  // the handle's
  std::map<std::string, std::shared_ptr<Plan>> plans;  // nullptr: cuDNN cannot run this op
  std::map<std::string, int> file_cache;               // key -> candidate index
  std::map<std::string, std::string> file_knobs;       // key -> its knobs, where they differ
  bool file_loaded = false;
  struct Epi {                    // variant cudnn_epi's choice for a fused shape
    bool decided = false, wins = false;
    int idx = -1;                 // the fastest candidate
    std::shared_ptr<Plan> plan;   // built when it runs (or was timed in this process)
  };
  std::map<std::string, Epi> epi;
  ~State() {
    plans.clear();
    if (handle) lib().cudnnDestroy(handle);
  }
};

std::mutex g_mu;
std::map<const CudaCtx*, std::unique_ptr<State>> g_states;

State& state(CudaCtx& ctx) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& s = g_states[&ctx];
  if (!s) {
    s = std::make_unique<State>();
    check(lib().cudnnCreate(&s->handle), "create handle");
  }
  // the lane in use (CudaCtx::use_lane): one handle, pointed at the stream of the moment
  if (s->stream != ctx.stream) {
    check(lib().cudnnSetStream(s->handle, ctx.stream), "set stream");
    s->stream = ctx.stream;
  }
  return *s;
}

cudnnDataType_t dt(DType t) { return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT; }

// NHWC activation [N,H,W,C] as cuDNN's [N,C,H,W] dims with NHWC strides; KRSC filter likewise.
Desc tensor(int64_t uid, DType t, int64_t n, int64_t h, int64_t w, int64_t c, bool is_virtual = false) {
  Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  if (is_virtual) d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  const cudnnDataType_t ty = dt(t);
  const int64_t dims[4] = {n, c, h, w}, strides[4] = {h * w * c, 1, w * c, c}, align = 16;
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ty);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  check(d.finalize(), "tensor");
  return d;
}

// The fused epilogue terms of a forward graph (variant cudnn_epi): bits of kEpiBias, kEpiRes.
constexpr int kEpiBias = 1, kEpiRes = 2;
// uids: x 1, w 2, y 3, bias 4, res 5; the graph's virtual f32 intermediates 10, 11.
constexpr int64_t kUidBias = 4, kUidRes = 5;

struct Shape {
  Kind kind;
  DType t;
  int64_t B, H, W, Ci, Ho, Wo, Co, k, s;
  int epi = 0;
};

std::string shape_key(const Shape& s, Precision p) {
  char b[256];
  std::snprintf(b, sizeof b, "%d %s %s B%lld %lldx%lld ci%lld -> %lldx%lld co%lld k%lld s%lld", (int)s.kind,
                dtype_name(s.t), precision_name(p), (long long)s.B, (long long)s.H, (long long)s.W,
                (long long)s.Ci, (long long)s.Ho, (long long)s.Wo, (long long)s.Co, (long long)s.k,
                (long long)s.s);
  return s.epi ? std::string(b) + " epi" + std::to_string(s.epi) : std::string(b);
}

// y = conv + bias (+ res) as pointwise ADDs in f32 after the conv (kept in the vector; returns
// them in graph order).
std::vector<cudnnBackendDescriptor_t> epilogue_ops(const Shape& s, Desc& conv_y, std::vector<Desc>& keep) {
  std::vector<cudnnBackendDescriptor_t> ops;
  auto add = [&](Desc& a, Desc b, Desc& y) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnPointwiseMode_t mode = CUDNN_POINTWISE_ADD;
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    check(pw.finalize(), "pointwise");
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, a);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    check(op.finalize(), "pointwise operation");
    ops.push_back(op.d);
    keep.push_back(std::move(pw));
    keep.push_back(std::move(b));
    keep.push_back(std::move(op));
  };
  Desc* cur = &conv_y;
  if (s.epi & kEpiBias) {
    Desc bias = tensor(kUidBias, DType::F32, 1, 1, 1, s.Co);
    if (s.epi & kEpiRes) {
      keep.push_back(tensor(11, DType::F32, s.B, s.Ho, s.Wo, s.Co, true));
      Desc& mid = keep.back();
      add(*cur, std::move(bias), mid);
      cur = &mid;
    } else {
      add(*cur, std::move(bias), keep[2]);  // keep[2]: y
    }
  }
  if (s.epi & kEpiRes) add(*cur, tensor(kUidRes, s.t, s.B, s.Ho, s.Wo, s.Co), keep[2]);
  return ops;
}

// The operation graph of one convolution (x uid 1, w uid 2, y uid 3).
std::vector<Desc> graph(const Shape& s, cudnnHandle_t h) {
  std::vector<Desc> v;
  v.reserve(32);  // epilogue_ops keeps references into it
  v.push_back(tensor(1, s.t, s.B, s.H, s.W, s.Ci));
  v.push_back(tensor(2, s.t, s.Co, s.k, s.k, s.Ci));
  v.push_back(tensor(3, s.t, s.B, s.Ho, s.Wo, s.Co));
  if (s.epi) v.push_back(tensor(10, DType::F32, s.B, s.Ho, s.Wo, s.Co, true));  // the conv's f32 result
  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t nd = 2, pad[2] = {s.k / 2, s.k / 2}, dil[2] = {1, 1}, str[2] = {s.s, s.s};
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nd);
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str);
  check(conv.finalize(), "convolution");
  const float alpha = 1.f, beta = 0.f;
  static const cudnnBackendDescriptorType_t types[3] = {
      CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
  Desc op(types[s.kind]);
  switch (s.kind) {
    case Fwd:
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, v[0]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, v[1]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, s.epi ? v[3] : v[2]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
      op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
      op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
      break;
    case Data:
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, v[0]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, v[1]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, v[2]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv);
      op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
      op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
      break;
    case Filter:
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, v[0]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, v[1]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, v[2]);
      op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, conv);
      op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
      op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
      break;
  }
  check(op.finalize(), "operation");
  std::vector<cudnnBackendDescriptor_t> ops{op.d};
  if (s.epi)
    for (auto d : epilogue_ops(s, v[3], v)) ops.push_back(d);
  Desc g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data());
  g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  check(g.finalize(), "operation graph");
  v.push_back(std::move(conv));
  v.push_back(std::move(op));
  v.push_back(std::move(g));  // v.back() is the graph
  return v;
}

// Does the engine of this config meet unet's rules for the precision?
bool acceptable(const Desc& cfg, DType t, Precision p, bool allow_rt) {
  Desc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  if (lib().cudnnBackendGetAttribute(cfg.d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                     &eng.d) != CUDNN_STATUS_SUCCESS)
    return false;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  n = 0;
  lib().cudnnBackendGetAttribute(eng.d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes);
  for (int64_t i = 0; i < n; ++i) {
    switch (notes[i]) {
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:  // bit-exact resume needs deterministic kernels
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
        return false;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        if (t == DType::F32 && p == Precision::FP32) return false;  // that would be TF32
        break;
      case CUDNN_NUMERICAL_NOTE_FFT:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
        if (p == Precision::FP32) return false;  // transforms cost accuracy fp32 promises
        break;
      default:
        break;
    }
  }
  cudnnBackendBehaviorNote_t beh[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  n = 0;
  lib().cudnnBackendGetAttribute(eng.d, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                 CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, beh);
  for (int64_t i = 0; i < n; ++i)
    if (beh[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION && !allow_rt) return false;  // NVRTC at plan time
  return true;
}

// UNET_CUDNN_CACHE, else under $XDG_CACHE_HOME or ~/.cache (env_vars.h; the commands check it
// up front: no special file, none of their inputs).
std::string cache_path() { return cudnn_cache_path(); }

// (Re)reads the file's entries for this GPU and cuDNN (later lines win).
void read_cache(State& st, const std::string& prefix) {
  std::ifstream f(cache_path());
  std::string line;
  while (std::getline(f, line)) {
    const size_t bar = line.rfind('|');
    if (bar == std::string::npos || line.compare(0, prefix.size(), prefix) != 0) continue;
    // "index" or "index:knobs" (a listed config's engine with other knob values)
    const std::string key = line.substr(prefix.size(), bar - prefix.size());
    st.file_cache[key] = std::atoi(line.c_str() + bar + 1);
    const size_t colon = line.find(':', bar);
    if (colon != std::string::npos)
      st.file_knobs[key] = line.substr(colon + 1);
    else
      st.file_knobs.erase(key);
  }
}
void load_cache(State& st, const std::string& prefix) {
  if (st.file_loaded) return;
  st.file_loaded = true;
  read_cache(st, prefix);
}

// mkdir -p of the cache file's folder, best effort: the cache is optional.
void make_cache_dir(const std::string& p) {
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return;
  std::string dir;
  std::stringstream ss(p.substr(0, slash));
  std::string part;
  while (std::getline(ss, part, '/')) {
    dir += part + "/";
    ::mkdir(dir.c_str(), 0755);
  }
}

// An exclusive lock on the cache (a ".lock" file beside it) while a shape's engines are timed and
// stored. The ranks of a multi-GPU run plan the same shapes at once; without it each timed its
// own, the choices could differ between ranks, and the file kept the last writer's, so a later
// run (a resume) could pick other engines than the first: measured on 2 H200s, 2.5e-7 between
// two identical fp32 runs. With it the first rank times, the others read its choice.
struct CacheLock {
  int fd = -1;
  explicit CacheLock(const std::string& path) {
    if (path.empty()) return;
    make_cache_dir(path);
    fd = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd >= 0 && ::flock(fd, LOCK_EX) != 0) ::close(fd), fd = -1;
  }
  ~CacheLock() {
    if (fd < 0) return;
    ::flock(fd, LOCK_UN);
    ::close(fd);
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;
};

void store_cache(const std::string& prefix, const std::string& key, const std::string& idx) {
  const std::string p = cache_path();
  if (p.empty()) return;
  make_cache_dir(p);
  std::ofstream f(p, std::ios::app);
  if (f) f << prefix << key << "|" << idx << "\n";
}

// cuDNN's heuristics (mode A) for an operation graph: its engine configs, best first.
struct Heur {
  Desc heur;
  std::vector<Desc> cfgs;
};
Heur heuristics(const Desc& graph) {
  Heur h{Desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR), {}};
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  h.heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  h.heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  check(h.heur.finalize(), "heuristics");
  int64_t n = 0;
  check(lib().cudnnBackendGetAttribute(h.heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                       &n, nullptr),
        "heuristics count");
  for (int64_t i = 0; i < n; ++i) h.cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw;
  for (auto& c : h.cfgs) raw.push_back(c.d);
  int64_t got = 0;
  check(lib().cudnnBackendGetAttribute(h.heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                                       &got, raw.data()),
        "heuristics results");
  h.cfgs.resize((size_t)std::max<int64_t>(0, std::min(got, n)));
  return h;
}

int64_t workspace_of(const Desc& plan) {
  int64_t ws = 0, c = 0;
  check(lib().cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &c,
                                       &ws),
        "workspace size");
  return ws;
}

// Candidate plans, in heuristic order, that meet the rules and finalize (at most `most`).
struct Cand {
  size_t cfg;
  Desc plan;
  int64_t ws;
};
std::vector<Cand> candidates(State& st, const Heur& h, const Shape& s, Precision p, bool allow_rt, size_t most) {
  // A finalized plan of config i, or an empty Desc when cuDNN refuses it.
  auto finalize = [&](size_t i) {
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, h.cfgs[i]);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &st.handle);
    return plan.finalize() == CUDNN_STATUS_SUCCESS ? std::move(plan) : Desc();
  };
  std::vector<Cand> cands;
  size_t next = 0;
  while (cands.size() < most && next < h.cfgs.size()) {
    // The next configs that meet the rules, as many as are still wanted. Runtime-compiled ones
    // are finalized in parallel threads (each is an NVRTC compilation, 0.5-2 s of one CPU
    // core); the others one by one, in order.
    std::vector<size_t> batch;
    for (; next < h.cfgs.size() && cands.size() + batch.size() < most; ++next)
      if (acceptable(h.cfgs[next], s.t, p, allow_rt)) {
        batch.push_back(next);
        if (!allow_rt) {
          ++next;
          break;
        }
      }
    std::vector<Desc> plans(batch.size());
    if (batch.size() == 1) {
      plans[0] = finalize(batch[0]);
    } else {
      std::vector<std::thread> threads;
      for (size_t j = 0; j < batch.size(); ++j)
        threads.emplace_back([&, j] {
          try {
            plans[j] = finalize(batch[j]);
          } catch (const std::runtime_error&) {  // refused: stays empty
          }
        });
      for (auto& t : threads) t.join();
    }
    for (size_t j = 0; j < batch.size(); ++j) {
      if (!plans[j].d) continue;
      const int64_t ws = workspace_of(plans[j]);
      if (ws > (int64_t(1) << 30)) continue;  // a GiB of workspace is not worth it
      cands.push_back({batch[j], std::move(plans[j]), ws});
    }
  }
  return cands;
}

// Pseudo-random values in [-1, 1) for candidates' timing and comparison (constant data could
// flatter a kernel in timing, and would hide a wrong one in a comparison).
__global__ void scratch_random_kernel(void* p, size_t n, int is_bf16, unsigned seed) {
  pdl_entry();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float v = (float)(hash64(seed, i) >> 40) * (2.f / 16777216.f) - 1.f;  // uniform in [-1, 1)
    if (is_bf16)
      static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(p)[i] = v;
  }
}

// Device buffers for timing candidates at plan time (allocation is allowed there), filled with
// non-zero data (timings on zeros can flatter a kernel).
struct Scratch {
  std::vector<void*> p;
  void* add(size_t bytes, int fill, cudaStream_t stream) {
    void* q = nullptr;
    if (bytes) {
      CUDA_CHECK(cudaMalloc(&q, bytes));
      CUDA_CHECK(cudaMemsetAsync(q, fill, bytes, stream));
    }
    p.push_back(q);
    return q;
  }
  void* random(size_t n, DType t, unsigned seed, cudaStream_t stream) {
    void* q = add(n * dtype_size(t), 0, stream);
    if (n) scratch_random_kernel<<<256, 256, 0, stream>>>(q, n, t == DType::BF16, seed);
    CUDA_CHECK(cudaGetLastError());
    return q;
  }
  ~Scratch() {
    cudaDeviceSynchronize();
    for (void* q : p)
      if (q) cudaFree(q);
  }
};

// Milliseconds per call of run() (once untimed, then three timed); a negative result when the
// untimed call fails.
template <class F>
float time_ms(cudaStream_t stream, F&& run) {
  if (!run()) return -1.f;
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaEventRecord(e0, stream));
  for (int r = 0; r < 3; ++r) run();
  CUDA_CHECK(cudaEventRecord(e1, stream));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / 3;
}

// A variant pack of (uid, pointer) pairs and the workspace.
Desc variant_pack(std::initializer_list<std::pair<int64_t, const void*>> bufs, void* ws) {
  std::vector<void*> ptrs;
  std::vector<int64_t> uids;
  for (auto [u, q] : bufs)
    if (q) uids.push_back(u), ptrs.push_back(const_cast<void*>(q));
  Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  vp.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data());
  vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
  vp.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  check(vp.finalize(), "variant pack");
  return vp;
}

// Scratch x, w and y of a conv shape.
struct ConvBuffers {
  void *x, *w, *y;
};
ConvBuffers conv_buffers(Scratch& sc, const Shape& s, cudaStream_t stream) {
  return {sc.random((size_t)s.B * s.H * s.W * s.Ci, s.t, 1, stream),
          sc.random((size_t)s.Co * s.k * s.k * s.Ci, s.t, 2, stream),
          sc.random((size_t)s.B * s.Ho * s.Wo * s.Co, s.t, 3, stream)};
}
// The buffer an op of this kind writes, and its element count.
std::pair<void*, size_t> conv_output(const ConvBuffers& b, const Shape& s) {
  switch (s.kind) {
    case Fwd:
      return {b.y, (size_t)(s.B * s.Ho * s.Wo * s.Co)};
    case Data:
      return {b.x, (size_t)(s.B * s.H * s.W * s.Ci)};
    default:
      return {b.w, (size_t)(s.Co * s.k * s.k * s.Ci)};
  }
}

// The fastest candidate on the variant pack's buffers, and its milliseconds (1e30 when none ran).
// times: each candidate's milliseconds (negative where it failed), when given.
std::pair<size_t, float> fastest(State& st, cudaStream_t stream, const std::vector<Cand>& cands,
                                 const Desc& vp, std::vector<float>* times = nullptr) {
  std::pair<size_t, float> best{0, 1e30f};
  for (size_t i = 0; i < cands.size(); ++i) {
    const float ms = time_ms(stream, [&] {
      return lib().cudnnBackendExecute(st.handle, cands[i].plan.d, vp.d) == CUDNN_STATUS_SUCCESS;
    });
    if (times) times->push_back(ms);
    if (ms >= 0 && ms < best.second) best = {i, ms};
  }
  return best;
}

// The chosen candidate as a Plan that keeps alive what its plan references.
std::shared_ptr<Plan> adopt(Cand& c, std::vector<Desc>&& graph, Heur& h) {
  auto p = std::make_shared<Plan>();
  p->ws = c.ws;
  p->plan = std::move(c.plan);
  p->keep = std::move(graph);
  p->keep.push_back(std::move(h.heur));
  p->keep.push_back(std::move(h.cfgs[c.cfg]));
  return p;
}

// ---- engine knobs: configurations beyond the ones the heuristics list ----
// An engine config's knob choices as (knob type, value), sorted by type.
using Knobs = std::vector<std::pair<int64_t, int64_t>>;

Desc engine_of(const Desc& cfg) {
  Desc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  check(lib().cudnnBackendGetAttribute(cfg.d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                       &n, &eng.d),
        "engine of a config");
  return eng;
}

// Up to one descriptor per knob type of an attribute holding an array of them (cuDNN 9.14 does
// not answer a count query for these: ask for as many as there are knob types).
std::vector<Desc> knob_descs(const Desc& of, cudnnBackendAttributeName_t a, cudnnBackendDescriptorType_t t) {
  std::vector<Desc> ds;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < (int)CUDNN_KNOB_TYPE_COUNTS; ++i) ds.emplace_back(t), raw.push_back(ds.back().d);
  int64_t got = 0;
  check(lib().cudnnBackendGetAttribute(of.d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)raw.size(), &got,
                                       raw.data()),
        "knobs");
  ds.resize((size_t)std::clamp<int64_t>(got, 0, (int64_t)ds.size()));
  return ds;
}

Knobs knob_choices(const Desc& cfg) {
  Knobs k;
  for (const Desc& d :
       knob_descs(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)) {
    cudnnBackendKnobType_t t;
    int64_t n = 0, v = 0;
    check(lib().cudnnBackendGetAttribute(d.d, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n,
                                         &t),
          "knob type");
    check(lib().cudnnBackendGetAttribute(d.d, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &n, &v),
          "knob value");
    k.push_back({(int64_t)t, v});
  }
  std::sort(k.begin(), k.end());
  return k;
}

// The values an engine offers for each of its knobs, by knob type.
std::map<int64_t, std::vector<int64_t>> knob_ranges(const Desc& eng) {
  std::map<int64_t, std::vector<int64_t>> r;
  for (const Desc& d : knob_descs(eng, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR)) {
    cudnnBackendKnobType_t t;
    int64_t n = 0, lo = 0, hi = -1, stride = 1;
    auto get = [&](cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t ty, void* v) {
      check(lib().cudnnBackendGetAttribute(d.d, a, ty, 1, &n, v), "knob");
    };
    get(CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, &t);
    get(CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, &lo);
    get(CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, &hi);
    get(CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, &stride);
    std::vector<int64_t>& v = r[(int64_t)t];
    for (int64_t x = lo; x <= hi && v.size() < 64; x += std::max<int64_t>(1, stride)) v.push_back(x);
  }
  return r;
}

std::string knob_text(const Knobs& k) {
  std::string s;
  for (auto [t, v] : k) s += (s.empty() ? "" : ",") + std::to_string(t) + "=" + std::to_string(v);
  return s;
}
Knobs parse_knobs(const std::string& s) {
  Knobs k;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    if (eq != std::string::npos) k.push_back({std::atoll(item.c_str()), std::atoll(item.c_str() + eq + 1)});
  }
  return k;
}

// A finalized plan of `eng` with `knobs` (what it references appended to keep), or an empty Desc
// when cuDNN refuses the combination.
Desc knob_plan(State& st, const Desc& eng, const Knobs& knobs, std::vector<Desc>& keep) {
  try {
    std::vector<Desc> own;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (auto [t, v] : knobs) {
      Desc k(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
      const cudnnBackendKnobType_t kt = (cudnnBackendKnobType_t)t;
      k.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &kt);
      k.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &v);
      if (k.finalize() != CUDNN_STATUS_SUCCESS) return Desc();
      raw.push_back(k.d);
      own.push_back(std::move(k));
    }
    Desc cfg(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    cfg.set_desc(CUDNN_ATTR_ENGINECFG_ENGINE, eng);
    if (!raw.empty())
      cfg.set(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)raw.size(),
              raw.data());
    if (cfg.finalize() != CUDNN_STATUS_SUCCESS) return Desc();
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &st.handle);
    if (plan.finalize() != CUDNN_STATUS_SUCCESS) return Desc();
    for (auto& k : own) keep.push_back(std::move(k));
    keep.push_back(std::move(cfg));
    return plan;
  } catch (const std::runtime_error&) {  // a value the engine does not take
    return Desc();
  }
}

// sum((a - b)^2) and sum(b^2) in acc[0], acc[1] (f32 or bf16 data).
__global__ void scratch_diff_kernel(const void* a, const void* b, size_t n, int is_bf16, double* acc) {
  pdl_entry();
  double d = 0, r = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float x =
        is_bf16 ? __bfloat162float(static_cast<const bf16*>(a)[i]) : static_cast<const float*>(a)[i];
    const float y =
        is_bf16 ? __bfloat162float(static_cast<const bf16*>(b)[i]) : static_cast<const float*>(b)[i];
    d += (double)(x - y) * (x - y);
    r += (double)y * y;
  }
  for (int o = 16; o > 0; o >>= 1) {
    d += __shfl_xor_sync(0xffffffffu, d, o);
    r += __shfl_xor_sync(0xffffffffu, r, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(acc, d);
    atomicAdd(acc + 1, r);
  }
}

// The knobs searched: the tile shape and the thread-block cluster's shape (powers of two). On
// seed64's 3x3 shapes (H200, cuDNN 9.14, tf32, each convolution alone) the heuristics' list held
// one or two tilings of the fastest engine, and another tile or cluster ran up to 22% faster
// (forwards at batch 64: 1.059 -> 0.987 ms summed; data gradients at batch 32: 0.192 -> 0.178 ms).
// In the model (same run, CUDA events of graph replays): tf32 step 11.14 -> 11.03 ms, sampling's
// forward at batch 64 6.35 -> 6.21 ms.
constexpr int64_t kSearched[] = {CUDNN_KNOB_TYPE_TILE_SIZE, CUDNN_KNOB_TYPE_TILE_CGA_M,
                                 CUDNN_KNOB_TYPE_TILE_CGA_N};

// The listed config's knobs with each searched knob set to each value the engine offers
// (their product; the config itself left out).
std::vector<Knobs> knob_variants(const Desc& cfg, const Desc& eng) {
  const Knobs base = knob_choices(cfg);
  const auto ranges = knob_ranges(eng);
  std::vector<Knobs> out{base};
  for (int64_t t : kSearched) {
    const auto range = ranges.find(t);
    if (range == ranges.end()) continue;
    std::vector<int64_t> vals;
    for (int64_t v : range->second)
      if (t == CUDNN_KNOB_TYPE_TILE_SIZE || (v > 0 && (v & (v - 1)) == 0)) vals.push_back(v);
    if (vals.empty()) continue;
    std::vector<Knobs> next;
    for (const Knobs& k : out)
      for (int64_t v : vals) {
        Knobs w = k;
        auto it = std::find_if(w.begin(), w.end(), [&](const auto& p) { return p.first == t; });
        if (it != w.end())
          it->second = v;
        else
          w.push_back({t, v});
        std::sort(w.begin(), w.end());
        next.push_back(std::move(w));
      }
    out.swap(next);
  }
  out.erase(std::remove(out.begin(), out.end(), base), out.end());
  return out;
}

// tf32 only: in bf16 the configs it chose (fewer, on the H200) ran no faster in the model (step
// 7.009 -> 7.016 ms, sampling's forward 3.913 -> 3.920), while tf32 gained (above); fp32 not measured.
bool search_knobs(const CudaCtx& ctx) { return ctx.prec == Precision::TF32 && env_cudnn_knobs(); }

// A knob variant that beats the listed candidate `pick` (pick_ms): the engines whose fastest
// listed config is within 20% of pick's are searched, every variant timed once on the scratch
// buffers, the fastest re-timed beside pick and kept when it is 3% faster and writes the same
// output as pick within the precision's tolerance. Returns (index of the listed config it varies,
// its knobs), or an empty Knobs.
std::pair<size_t, Knobs> tune_knobs(State& st, const CudaCtx& ctx, const Shape& s,
                                    const std::vector<Cand>& cands, const Heur& h,
                                    const std::vector<float>& ms, size_t pick, const Desc& vp,
                                    const ConvBuffers& b, int64_t wsmax, Scratch& sc) {
  const cudaStream_t stream = ctx.stream;
  auto runs = [&](const Desc& plan) {
    return [&] { return lib().cudnnBackendExecute(st.handle, plan.d, vp.d) == CUDNN_STATUS_SUCCESS; };
  };
  const float pick_ms = ms[pick];
  // The fastest listed config of each engine (by global index).
  std::map<int64_t, size_t> per_engine;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (ms[i] < 0 || ms[i] > 1.2f * pick_ms) continue;
    const Desc eng = engine_of(h.cfgs[cands[i].cfg]);
    int64_t g = -1, n = 0;
    lib().cudnnBackendGetAttribute(eng.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &g);
    auto it = per_engine.find(g);
    if (it == per_engine.end() || ms[i] < ms[it->second]) per_engine[g] = i;
  }
  struct Var {
    float ms;
    size_t base;
    Knobs knobs;
    Desc plan;
    std::vector<Desc> keep;
  };
  std::vector<Var> timed;
  std::vector<Desc> engines;  // alive as long as the variants' plans
  for (auto [g, i] : per_engine) {
    engines.push_back(engine_of(h.cfgs[cands[i].cfg]));
    for (const Knobs& k : knob_variants(h.cfgs[cands[i].cfg], engines.back())) {
      Var v{0, i, k, Desc(), {}};
      v.plan = knob_plan(st, engines.back(), k, v.keep);
      if (!v.plan.d || workspace_of(v.plan) > wsmax) continue;
      v.ms = time_ms(stream, runs(v.plan));
      if (v.ms >= 0) timed.push_back(std::move(v));
    }
  }
  std::sort(timed.begin(), timed.end(), [](const Var& x, const Var& y) { return x.ms < y.ms; });
  if (timed.empty() || timed[0].ms > 0.97f * pick_ms) return {0, {}};
  // Re-timed beside pick (the fastest of two rounds each), then compared with pick's output.
  const auto [out, n] = conv_output(b, s);
  const size_t bytes = n * dtype_size(s.t);
  void* ref = sc.add(bytes, 0, stream);
  double* acc = static_cast<double*>(sc.add(2 * sizeof(double), 0, stream));
  const float pick_again =
      std::min(time_ms(stream, runs(cands[pick].plan)), time_ms(stream, runs(cands[pick].plan)));
  CUDA_CHECK(cudaMemcpyAsync(ref, out, bytes, cudaMemcpyDeviceToDevice, stream));
  const double tol = ctx.prec == Precision::FP32 ? 1e-5 : ctx.prec == Precision::TF32 ? 1e-3 : 2e-2;
  for (size_t v = 0; v < timed.size() && v < 3; ++v) {
    const float t = std::min(time_ms(stream, runs(timed[v].plan)), time_ms(stream, runs(timed[v].plan)));
    if (t < 0 || t > 0.97f * pick_again) continue;
    CUDA_CHECK(cudaMemsetAsync(acc, 0, 2 * sizeof(double), stream));
    scratch_diff_kernel<<<256, 256, 0, stream>>>(out, ref, n, s.t == DType::BF16, acc);
    double h_acc[2] = {0, 0};
    CUDA_CHECK(cudaMemcpyAsync(h_acc, acc, sizeof h_acc, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (h_acc[0] <= tol * tol * h_acc[1]) return {timed[v].base, timed[v].knobs};  // NaN compares false
  }
  return {0, {}};
}

std::string cache_prefix(const CudaCtx& ctx) {
  // "c64": choices among up to 64 candidates (entries of the 8-candidate days are not reused);
  // "c64k": and among their engines' other tile and cluster shapes (tf32, UNET_CUDNN_KNOBS)
  return ctx.device_name + "|" + std::to_string(lib().version) + (search_knobs(ctx) ? "|c64k|" : "|c64|");
}

// Builds (and on a cache miss times) the plan of an op shape; nullptr when cuDNN cannot run it.
std::shared_ptr<Plan> plan_for(CudaCtx& ctx, const Shape& s) {
  State& st = state(ctx);
  const std::string key = shape_key(s, ctx.prec);
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return it->second;
  if (ctx.capturing) throw std::logic_error("cuDNN plan built inside a graph capture (plan memory first)");
  const std::string prefix = cache_prefix(ctx);
  load_cache(st, prefix);
  std::shared_ptr<Plan> best;
  try {
    std::vector<Desc> g = graph(s, st.handle);
    Heur h = heuristics(g.back());
    // Up to 64 candidates (every one cuDNN 9.19 lists for seed64's shapes): the first 8 of the
    // heuristics' order missed faster engines; measured (H200, same run, seed64 b32 step) tf32
    // 15.91 -> 15.73 ms, bf16 9.17 -> 9.01 ms, the same memory. Timing them is once per shape.
    std::vector<Cand> cands = candidates(st, h, s, ctx.prec, false, 64);
    if (!cands.empty()) {
      size_t pick = 0;
      auto cached_pick = [&]() {
        auto c = st.file_cache.find(key);
        return c != st.file_cache.end() && c->second >= 0 && (size_t)c->second < cands.size() ? c->second : -1;
      };
      const bool search = search_knobs(ctx);
      std::unique_ptr<CacheLock> lock;
      if (cached_pick() < 0 && (cands.size() > 1 || search)) {  // another rank may be timing it now
        lock = std::make_unique<CacheLock>(cache_path());
        read_cache(st, prefix);
      }
      Knobs knobs;
      if (cached_pick() >= 0) {
        pick = (size_t)cached_pick();
        auto k = st.file_knobs.find(key);
        if (k != st.file_knobs.end()) knobs = parse_knobs(k->second);
      } else if (cands.size() > 1 || search) {
        int64_t wsmax = 0;
        for (auto& c : cands) wsmax = std::max(wsmax, c.ws);
        Scratch sc;
        const ConvBuffers b = conv_buffers(sc, s, ctx.stream);
        const Desc vp = variant_pack({{1, b.x}, {2, b.w}, {3, b.y}}, sc.add((size_t)wsmax, 0, ctx.stream));
        std::vector<float> ms;
        pick = fastest(st, ctx.stream, cands, vp, &ms).first;
        if (search && ms[pick] >= 0) {
          try {  // a failure here leaves the listed configs, not the shape without cuDNN
            auto [base, k] = tune_knobs(st, ctx, s, cands, h, ms, pick, vp, b, wsmax, sc);
            if (!k.empty()) pick = base, knobs = std::move(k);
          } catch (const std::runtime_error&) {
            cudaGetLastError();
          }
        }
        store_cache(prefix, key, std::to_string(pick) + (knobs.empty() ? "" : ":" + knob_text(knobs)));
      }
      if (!knobs.empty()) {  // the listed config's engine with other knobs (refused: the config as listed)
        std::vector<Desc> keep;
        Desc eng, plan;
        int64_t ws = 0;
        try {
          eng = engine_of(h.cfgs[cands[pick].cfg]);
          plan = knob_plan(st, eng, knobs, keep);
          if (plan.d) ws = workspace_of(plan);
        } catch (const std::runtime_error&) {
          plan = Desc();  // the config as listed
        }
        if (plan.d) {
          best = adopt(cands[pick], std::move(g), h);
          best->ws = ws;
          best->plan = std::move(plan);
          for (auto& d : keep) best->keep.push_back(std::move(d));
          best->keep.push_back(std::move(eng));
        }
      }
      if (!best) best = adopt(cands[pick], std::move(g), h);
    }
  } catch (const std::runtime_error&) {
    cudaGetLastError();
    best = nullptr;  // cuDNN refused this shape: the next variant runs it
  }
  st.plans[key] = best;
  return best;
}

// Variant packs (pointers, uids, workspace: nothing of the plan) are cached by those pointers:
// a repeated call (every eager step, every sampling step) costs a map lookup instead of building
// and finalizing a descriptor.
struct PackKey {
  const void *x, *w, *y, *bias, *res, *ws;
  bool operator<(const PackKey& o) const {
    return std::tie(x, w, y, bias, res, ws) < std::tie(o.x, o.w, o.y, o.bias, o.res, o.ws);
  }
};

void execute(CudaCtx& ctx, const Plan& p, const void* x, const void* w, const void* y, const void* bias = nullptr,
             const void* res = nullptr) {
  State& st = state(ctx);
  static thread_local std::map<PackKey, Desc> packs;
  const PackKey key{x, w, y, bias, res, ctx.ws};
  auto it = packs.find(key);
  if (it == packs.end()) {
    if (packs.size() > 4096) packs.clear();
    it = packs.emplace(key, variant_pack({{1, x}, {2, w}, {3, y}, {kUidBias, bias}, {kUidRes, res}}, ctx.ws)).first;
  }
  check(lib().cudnnBackendExecute(st.handle, p.plan.d, it->second.d), "execute");
}

}  // namespace

std::string cudnn_library() {
  const Lib& l = lib();
  if (!l.ok) return "no cuDNN (" + l.why + ")";
  const size_t v = l.version;  // cuDNN 9: major * 10000 + minor * 100 + patch
  std::string s = "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                  std::to_string(v % 100);
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(l.cudnnGetVersion), &info) && info.dli_fname)
    s += " (" + std::string(info.dli_fname) + ")";
  return s;
}

namespace {

bool available() {
  const Lib& l = lib();
  if (!l.ok)
    kernel_notice_once("unet: cuDNN unavailable (" + l.why + "); convolutions run on unet's own kernels");
  return l.ok;
}

Shape fwd_shape(const ConvFwd& o) {
  return {Fwd,        o.x.dtype,  o.x.dim[0], o.x.dim[1], o.x.dim[2], o.x.dim[3],
          o.y.dim[1], o.y.dim[2], o.w.dim[0], o.w.dim[1], o.stride};
}
Shape data_shape(const ConvBwdData& o) {
  return {Data,        o.dy.dtype,  o.dx.dim[0], o.dx.dim[1], o.dx.dim[2], o.dx.dim[3],
          o.dy.dim[1], o.dy.dim[2], o.w.dim[0],  o.w.dim[1],  o.stride};
}
Shape filter_shape(const ConvBwdFilter& o) {
  return {Filter,      o.x.dtype,   o.x.dim[0],  o.x.dim[1],  o.x.dim[2], o.x.dim[3],
          o.dy.dim[1], o.dy.dim[2], o.dw.dim[0], o.dw.dim[1], o.stride};
}

// y (+)= bias[c] + emb[b, c] + res, as the im2col variant's epilogue.
template <class TY>
struct Epilogue {
  TY* y;
  const float* bias;
  const float* emb;
  const TY* res;
  size_t HWC;
  int C;
  __device__ float one(size_t i, float v) const {
    const int c = (int)(i % C);
    if (bias) v += bias[c];
    if (emb) v += emb[(i / HWC) * C + c];
    if (res) v += ldf(res, i);
    return v;
  }
  __device__ void vec4(size_t j) const {
    const size_t i = 4 * j;
    const float4 u = ld4(y, j);
    st4(y, j, make_float4(one(i, u.x), one(i + 1, u.y), one(i + 2, u.z), one(i + 3, u.w)));
  }
  __device__ void scalar(size_t i) const { stf(y, i, one(i, ldf(y, i))); }
};

template <class T>
struct DyRows {
  const T* dy;
  int R, C;
  __device__ float2 operator()(int b, int r, int c) const {
    return make_float2(ldf(dy, ((size_t)b * R + r) * C + c), 0.f);
  }
};
struct WriteRow {
  float* out;
  int C;
  __device__ void operator()(int b, int c, double x, double) const { out[(size_t)b * C + c] = (float)x; }
};
// bf16 wgrad writes a bf16 dW (cuDNN 9.19 on the H100 has no engine with bf16 x and dy and an f32
// dW: measured 2026-11-23, every bf16 filter shape of seed64 refused it), widened into the f32
// gradient.
struct Widen {
  const bf16* x;
  float* y;
  __device__ void vec4(size_t j) const { st4(y, j, ld4(x, j)); }
  __device__ void scalar(size_t i) const { y[i] = __bfloat162float(x[i]); }
};


bool fwd_ok(const ConvFwd& o, const CudaCtx& c) {
  return o.y.dtype == o.x.dtype && available() && plan_for(const_cast<CudaCtx&>(c), fwd_shape(o)) != nullptr;
}
bool data_ok(const ConvBwdData& o, const CudaCtx& c) {
  return available() && plan_for(const_cast<CudaCtx&>(c), data_shape(o)) != nullptr;
}
bool filter_ok(const ConvBwdFilter& o, const CudaCtx& c) {
  return o.dw.defined() && available() && plan_for(const_cast<CudaCtx&>(c), filter_shape(o)) != nullptr;
}
size_t fwd_ws(const ConvFwd& o, const CudaCtx& c) {
  return (size_t)plan_for(const_cast<CudaCtx&>(c), fwd_shape(o))->ws;
}
size_t data_ws(const ConvBwdData& o, const CudaCtx& c) {
  return (size_t)plan_for(const_cast<CudaCtx&>(c), data_shape(o))->ws;
}
size_t filter_ws(const ConvBwdFilter& o, const CudaCtx& c) {
  return (o.x.dtype == DType::BF16 ? round256(o.dw.numel() * 2) : 0) +
         round256((size_t)plan_for(const_cast<CudaCtx&>(c), filter_shape(o))->ws);
}

void conv_fwd(const ConvFwd& o, CudaCtx& ctx) {
  execute(ctx, *plan_for(ctx, fwd_shape(o)), o.x.data, o.w.data, o.y.data);
  if (!o.bias.defined() && !o.emb.defined() && !o.res.defined()) return;
  const int Co = (int)o.y.dim[3];
  with_act(o.y.dtype, [&](auto tag) {
    using TY = decltype(tag);
    Epilogue<TY> e{dptr<TY>(o.y),   dptr<float>(o.bias), dptr<float>(o.emb),
                   dptr<TY>(o.res), o.y.per_sample(),    Co};
    const bool v = Co % 4 == 0 && vec4_ok<TY>(o.y.data) && (!o.res.defined() || vec4_ok<TY>(o.res.data));
    launch_map(e, o.y.numel(), v, ctx.stream);
  });
}

void conv_data(const ConvBwdData& o, CudaCtx& ctx) {
  execute(ctx, *plan_for(ctx, data_shape(o)), o.dx.data, o.w.data, o.dy.data);
}

// dW from cuDNN: f32 straight into the gradient; bf16 at the end of the workspace, then widened
// into it.
void filter_grad(const ConvBwdFilter& o, CudaCtx& ctx) {
  const Plan& p = *plan_for(ctx, filter_shape(o));
  if (o.x.dtype == DType::F32) {
    execute(ctx, p, o.x.data, o.dw.data, o.dy.data);
    return;
  }
  bf16* tmp = reinterpret_cast<bf16*>(static_cast<char*>(ctx.ws) + round256((size_t)p.ws));
  execute(ctx, p, o.x.data, tmp, o.dy.data);
  launch_map(Widen{tmp, dptr<float>(o.dw)}, o.dw.numel(), vec4_ok<bf16>(tmp) && aligned16(o.dw.data),
             ctx.stream);
}

void conv_filter(const ConvBwdFilter& o, CudaCtx& ctx) {
  const int B = (int)o.dy.dim[0], HWo = (int)(o.dy.dim[1] * o.dy.dim[2]), Co = (int)o.dy.dim[3];
  if (o.db.defined()) bias_grad(ctx, o.dy, o.db, B * HWo, Co);
  if (o.demb.defined())
    with_act(o.dy.dtype, [&](auto tag) {
      using T = decltype(tag);
      colsum2(ctx, DyRows<T>{dptr<T>(o.dy), HWo, Co}, WriteRow{dptr<float>(o.demb), Co}, B, HWo, Co);
    });
  filter_grad(o, ctx);
}

// ---- variant "cudnn_fused": the same cuDNN plans, with the work around them as row-block
// kernels (rowblock.cuh). On the H100 (seed64, bf16) "cudnn"'s epilogue map ran at about half of
// memory speed (index arithmetic and bias/embedding loads per element) and its bias gradient was
// a column reduction whose final kernel added 256 splits per channel on one thread each, plus a
// second read of dy for the embedding gradient. Here the epilogue keeps bias and embedding in
// registers (same additions in the same order: bitwise the same y), and db and demb come from one
// read of dy in one launch (per-sample sums, then their sum over the batch).

// y += bias[c] (+ emb[b, c]) (+ res) over [B, R, C].
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    epilogue_kernel(T* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ emb,
                    const T* __restrict__ res, int R, int C, int Cl, int L, int rps) {
  pdl_entry();
  const int t = threadIdx.x, cl = t % Cl, rl = t / Cl;
  const int s = blockIdx.x, b = blockIdx.y, Cv = C / V;
  const int r1 = min(R, s * rps + rps);
  const size_t base = (size_t)b * R * C;
  constexpr int U = 2;  // two inputs per row (y and res)
  for (int j = cl; j < Cv; j += Cl) {
    float bv[V], ev[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      bv[k] = bias ? bias[j * V + k] : 0.f;
      ev[k] = emb ? emb[(size_t)b * C + j * V + k] : 0.f;
    }
    for (int r = s * rps + rl; r < r1; r += U * L) {
      float v[U][V], q[U][V];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r + u * L < r1) {
          const size_t o = base + (size_t)(r + u * L) * C + j * V;
          rowblock::Vec<T, V>::load(y + o, v[u]);
          if (res) rowblock::Vec<T, V>::load(res + o, q[u]);
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r + u * L < r1) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            if (bias) v[u][k] += bv[k];
            if (emb) v[u][k] += ev[k];
            if (res) v[u][k] += q[u][k];
          }
          rowblock::Vec<T, V>::store(y + base + (size_t)(r + u * L) * C + j * V, v[u]);
        }
    }
  }
}

// y (dtype t, [B, R, C]) += bias + emb + res: epilogue_kernel at the widest vector y and res allow.
void launch_epilogue(CudaCtx& ctx, DType t, void* y, const float* bias, const float* emb, const void* res, int B,
                     int R, int C) {
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    rowblock::with_width<T>(rowblock::wide_ok<T>(C, {y, res}), [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      const rowblock::Plan p = rowblock::plan(epilogue_kernel<T, V>, B, R, C, V, 2);
      epilogue_kernel<T, V><<<p.grid(), p.nt, 0, ctx.stream>>>(static_cast<T*>(y), bias, emb,
                                                               static_cast<const T*>(res), R, C, p.Cl, p.L, p.rps);
      KERNEL_CHECK();
    });
  });
}

// y's epilogue terms, for rowblock::stats_rows: y (in place) + bias + emb + res, added in
// epilogue_kernel's order (so y is bitwise the same).
template <class T, int V>
struct EpilogueSrc {
  const T* y;
  const float* bias;
  const float* emb;
  const T* res;
  int C;
  struct Chan {
    float bv[V], ev[V];
  };
  __device__ Chan chan(int b, int j) const {
    Chan ch;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      ch.bv[k] = bias ? bias[j * V + k] : 0.f;
      ch.ev[k] = emb ? emb[(size_t)b * C + j * V + k] : 0.f;
    }
    return ch;
  }
  __device__ void load(const Chan& ch, size_t row, int j, float* v) const {
    const size_t o = row * C + j * V;
    float q[V];
    rowblock::Vec<T, V>::load(y + o, v);
    if (res) rowblock::Vec<T, V>::load(res + o, q);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (bias) v[k] += ch.bv[k];
      if (emb) v[k] += ch.ev[k];
      if (res) v[k] += q[k];
    }
  }
};

void conv_fwd_fused(const ConvFwd& o, CudaCtx& ctx) {
  execute(ctx, *plan_for(ctx, fwd_shape(o)), o.x.data, o.w.data, o.y.data);
  const bool epi = o.bias.defined() || o.emb.defined() || o.res.defined();
  if (!epi) {
    if (o.mean.defined()) groupnorm_stats(ctx, o.y, o.mean, o.rstd);
    return;
  }
  const int B = (int)o.y.dim[0], R = (int)(o.y.dim[1] * o.y.dim[2]), C = (int)o.y.dim[3];
  if (!o.mean.defined())
    return launch_epilogue(ctx, o.y.dtype, o.y.data, dptr<float>(o.bias), dptr<float>(o.emb), o.res.data, B, R, C);
  with_act(o.y.dtype, [&](auto tag) {  // the epilogue and the statistics of its result in one pass
    using T = decltype(tag);
    rowblock::with_width<T>(rowblock::wide_ok<T>(C, {o.y.data, o.res.data}), [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      rowblock::stats_rows<T, V>(
          ctx, EpilogueSrc<T, V>{dptr<T>(o.y), dptr<float>(o.bias), dptr<float>(o.emb), dptr<T>(o.res), C}, o.y,
          o.mean, o.rstd);
    });
  });
}

void conv_filter_fused(const ConvBwdFilter& o, CudaCtx& ctx) {
  rowblock::column_sums(ctx, o.dy, o.demb, o.db);
  filter_grad(o, ctx);
}

bool fwd_fused_ok(const ConvFwd& o, const CudaCtx& c) {
  return o.y.dim[0] < 65536 && (!o.mean.defined() || rowblock::stats_rows_fit(o.y, o.mean)) && fwd_ok(o, c);
}
bool filter_fused_ok(const ConvBwdFilter& o, const CudaCtx& c) {
  return (!(o.db.defined() || o.demb.defined()) || rowblock::column_sums_fit(o.dy)) && filter_ok(o, c);
}

// ---- variant "cudnn_epi": bias and residual inside the cuDNN graph (see the top of the file).
// Measured with scripts/cudnn_fusion_probe.cu (H100, cuDNN 9.19, bf16, batch 16, 256x256, 256
// channels): conv 1.57 ms + unet's epilogue pass 0.60 ms against 1.71 ms fused; each runtime-
// compiled candidate took 0.5-2 s to finalize, restoring one from its JSON 1-2 ms.

Shape epi_shape(const ConvFwd& o) {
  Shape s = fwd_shape(o);
  s.epi = (o.bias.defined() ? kEpiBias : 0) | (o.res.defined() ? kEpiRes : 0);
  return s;
}

// Candidates finalized (so compiled) per fused shape when it is first timed.
constexpr size_t kEpiCandidates = 4;

std::string json_path(const std::string& prefix, const std::string& key) {
  const std::string c = cache_path();
  if (c.empty()) return "";
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the cache line's key
  for (unsigned char ch : prefix + key) h = (h ^ ch) * 1099511628211ull;
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)h);
  return c + ".d/" + b + ".json";
}

// A plan restored from the JSON save_plan wrote; nullptr when there is none or cuDNN refuses it.
std::shared_ptr<Plan> restore_plan(State& st, const std::string& path) {
  if (path.empty()) return nullptr;
  std::ifstream f(path, std::ios::binary);
  const std::string js((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (js.empty()) return nullptr;
  auto p = std::make_shared<Plan>();
  p->plan = Desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  p->plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &st.handle);
  if (lib().cudnnBackendSetAttribute(p->plan.d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                     (int64_t)js.size(), js.data()) != CUDNN_STATUS_SUCCESS ||
      p->plan.finalize() != CUDNN_STATUS_SUCCESS)
    return nullptr;
  p->ws = workspace_of(p->plan);
  return p;
}

// Best effort, like the cache file: written to a temporary name, then renamed into place.
void save_plan(const Desc& plan, const std::string& path) {
  if (path.empty()) return;
  int64_t n = 0;
  if (lib().cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n,
                                     nullptr) != CUDNN_STATUS_SUCCESS ||
      n <= 0)
    return;
  std::string js((size_t)n, '\0');
  if (lib().cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n,
                                     js.data()) != CUDNN_STATUS_SUCCESS)
    return;
  while (!js.empty() && js.back() == '\0') js.pop_back();
  make_cache_dir(path);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f << js;
    if (!f) {
      ::unlink(tmp.c_str());
      return;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
}

// The fused shape's choice: decided from the cache file, else by timing up to kEpiCandidates
// fused plans against the plain conv's plan followed by unet's epilogue kernel. need_plan: also
// build (restore) the fused plan when the choice was read from the file.
State::Epi& epi_choice(CudaCtx& ctx, const Shape& s, bool need_plan) {
  State& st = state(ctx);
  const std::string key = shape_key(s, ctx.prec);
  State::Epi& e = st.epi[key];
  if (e.decided && (e.plan || !need_plan)) return e;
  if (ctx.capturing) throw std::logic_error("cuDNN plan built inside a graph capture (plan memory first)");
  Shape plain_shape = s;
  plain_shape.epi = 0;
  const std::shared_ptr<Plan> plain = plan_for(ctx, plain_shape);  // before the lock: it may take it
  const std::string prefix = cache_prefix(ctx), path = json_path(prefix, key);
  load_cache(st, prefix);
  try {
    auto from_file = [&]() {
      auto c = st.file_cache.find(key);
      if (c == st.file_cache.end()) return false;
      e.decided = true;
      e.wins = c->second >= 0;
      e.idx = c->second >= 0 ? c->second : -1 - c->second;  // a losing choice is stored as -1 - idx
      return true;
    };
    std::unique_ptr<CacheLock> lock;
    if (!e.decided && !from_file()) {  // another rank may be timing it now
      lock = std::make_unique<CacheLock>(cache_path());
      read_cache(st, prefix);
      from_file();
    }
    if (e.decided) {
      if (!need_plan && !e.wins) return e;
      if ((e.plan = restore_plan(st, path))) return e;
    }
    kernel_notice_once(cache_path().empty()
                           ? "unet: compiling cuDNN's fused convolution kernels (no cache folder: HOME is unset)"
                           : "unet: compiling cuDNN's fused convolution kernels for new shapes (once; kept in " +
                                 cache_path() + ".d)");
    std::vector<Desc> g = graph(s, st.handle);
    Heur h = heuristics(g.back());
    std::vector<Cand> cands = candidates(st, h, s, ctx.prec, true, e.decided ? (size_t)e.idx + 1 : kEpiCandidates);
    if (cands.empty() || (e.decided && (size_t)e.idx >= cands.size())) {
      e.decided = true;
      e.wins = false;
      return e;
    }
    if (!e.decided) {
      int64_t wsmax = plain ? plain->ws : 0;
      for (auto& c : cands) wsmax = std::max(wsmax, c.ws);
      Scratch sc;
      const ConvBuffers b = conv_buffers(sc, s, ctx.stream);
      void* bias = (s.epi & kEpiBias) ? sc.add((size_t)s.Co * 4, 0x3d, ctx.stream) : nullptr;
      void* res = (s.epi & kEpiRes) ? sc.add((size_t)s.B * s.Ho * s.Wo * s.Co * dtype_size(s.t), 0x3e, ctx.stream)
                                    : nullptr;
      void* ws = sc.add((size_t)wsmax, 0, ctx.stream);
      const Desc vp = variant_pack({{1, b.x}, {2, b.w}, {3, b.y}, {kUidBias, bias}, {kUidRes, res}}, ws);
      const auto [pick, fused_ms] = fastest(st, ctx.stream, cands, vp);
      float plain_ms = -1.f;
      if (plain) {
        const Desc pvp = variant_pack({{1, b.x}, {2, b.w}, {3, b.y}}, ws);
        plain_ms = time_ms(ctx.stream, [&] {
          if (lib().cudnnBackendExecute(st.handle, plain->plan.d, pvp.d) != CUDNN_STATUS_SUCCESS) return false;
          launch_epilogue(ctx, s.t, b.y, static_cast<const float*>(bias), nullptr, res, (int)s.B,
                          (int)(s.Ho * s.Wo), (int)s.Co);
          return true;
        });
      }
      e.decided = true;
      e.wins = fused_ms < (plain_ms < 0 ? 1e30f : plain_ms);
      e.idx = (int)pick;
      store_cache(prefix, key, std::to_string(e.wins ? e.idx : -1 - e.idx));
    }
    Cand& c = cands[(size_t)e.idx];
    save_plan(c.plan, path);
    e.plan = adopt(c, std::move(g), h);
  } catch (const std::runtime_error&) {
    cudaGetLastError();
    e.decided = true;  // cuDNN refused the fused graph: the other variants run it
    e.wins = false;
    e.plan = nullptr;
  }
  return e;
}

// Not in fp32 (its engines would use TF32); not with the embedding (a per-sample term: the probe's
// engine failed with a misaligned address) or the statistics epilogue.
bool epi_ok(const ConvFwd& o, const CudaCtx& c) {
  if (c.prec == Precision::FP32 || o.y.dtype != o.x.dtype || o.emb.defined() || o.mean.defined() ||
      !(o.bias.defined() || o.res.defined()) || !available())
    return false;
  return epi_choice(const_cast<CudaCtx&>(c), epi_shape(o), false).wins;
}

const Plan& epi_plan(const ConvFwd& o, CudaCtx& c) {
  const State::Epi& e = epi_choice(c, epi_shape(o), true);
  if (!e.plan) throw std::runtime_error("cuDNN has no fused engine for " + describe(o));
  return *e.plan;
}

size_t epi_ws(const ConvFwd& o, const CudaCtx& c) {
  // the plain conv's too: conv_fwd_epi falls back to it for unaligned buffers
  return std::max(epi_plan(o, const_cast<CudaCtx&>(c)).ws, plan_for(const_cast<CudaCtx&>(c), fwd_shape(o))->ws);
}

void conv_fwd_epi(const ConvFwd& o, CudaCtx& ctx) {
  // The graph declares 16-byte alignment; the chooser's choice is per shape, not per pointer.
  if (!aligned16(o.x.data) || !aligned16(o.w.data) || !aligned16(o.y.data) ||
      (o.bias.defined() && !aligned16(o.bias.data)) || (o.res.defined() && !aligned16(o.res.data)))
    return conv_fwd_fused(o, ctx);
  execute(ctx, epi_plan(o, ctx), o.x.data, o.w.data, o.y.data, o.bias.data, o.res.data);
}

}  // namespace

void destroy_cudnn(CudaCtx& ctx) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_states.erase(&ctx);
}

void register_conv_cudnn_epi(CudaOps& ops) {
  ops.variants<ConvFwd>().push_back({"cudnn_epi", no_norm<ConvFwd, epi_ok>, conv_fwd_epi, epi_ws});
}

void register_conv_cudnn_fused(CudaOps& ops) {
  ops.variants<ConvFwd>().push_back({"cudnn_fused", no_norm<ConvFwd, fwd_fused_ok>, conv_fwd_fused, fwd_ws});
  ops.variants<ConvBwdData>().push_back({"cudnn_fused", data_ok, conv_data, data_ws});
  ops.variants<ConvBwdFilter>().push_back({"cudnn_fused", no_norm<ConvBwdFilter, filter_fused_ok>, conv_filter_fused, filter_ws});
}

void register_conv_cudnn(CudaOps& ops) {
  ops.variants<ConvFwd>().push_back({"cudnn", no_norm<ConvFwd, stats_ok<ConvFwd, fwd_ok>>, then_stats<ConvFwd, conv_fwd>, fwd_ws});
  ops.variants<ConvBwdData>().push_back({"cudnn", data_ok, conv_data, data_ws});
  ops.variants<ConvBwdFilter>().push_back({"cudnn", no_norm<ConvBwdFilter, filter_ok>, conv_filter, filter_ws});
}

}  // namespace unet
