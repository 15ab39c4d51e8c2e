// The CUDA engine: the device (memory, stream, fences, graphs, NVTX ranges), the context its
// kernel variants run with, the cuBLAS GEMM wrapper, and the op table's registration.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "cuda_engine.cuh"
#include "env_vars.h"
#include "graph_dag.h"
#include "util.h"

namespace unet {

void cuda_fail(const char* what, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  throw std::runtime_error(std::string("CUDA error at ") + (base ? base + 1 : file) + ":" +
                           std::to_string(line) + ": " + what);
}

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

// A lane's launch state (L: CudaCtx for the main lane, at construction; CudaCtx::Lane for the side
// lane, at its first use; both have these fields): its stream, a cuBLAS handle bound to it with
// its own workspace, the reduction scratch and the tickets.
template <class L>
void make_lane(L& l, int priority) {
  CUDA_CHECK(cudaStreamCreateWithPriority(&l.stream, cudaStreamDefault, priority));
  CUBLAS_CHECK(cublasCreate(&l.cublas));
  // Order matters: cublasSetStream resets the workspace to cuBLAS's own pool.
  CUBLAS_CHECK(cublasSetStream(l.cublas, l.stream));
  CUDA_CHECK(cudaMalloc(&l.cublas_ws, kCublasWorkspaceBytes));
  CUBLAS_CHECK(cublasSetWorkspace(l.cublas, l.cublas_ws, kCublasWorkspaceBytes));
  CUBLAS_CHECK(cublasSetMathMode(l.cublas, CUBLAS_DEFAULT_MATH));  // TF32 only when asked per call
  CUBLAS_CHECK(cublasSetAtomicsMode(l.cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
  CUDA_CHECK(cudaMalloc(&l.scratch, (CudaCtx::kPartialFloats + CudaCtx::kAuxFloats) * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&l.tickets, CudaCtx::kTickets * sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(l.tickets, 0, CudaCtx::kTickets * sizeof(unsigned)));
}
// What make_lane allocates.
constexpr size_t kLaneFixedBytes = kCublasWorkspaceBytes +
                                   (CudaCtx::kPartialFloats + CudaCtx::kAuxFloats) * sizeof(float) +
                                   CudaCtx::kTickets * sizeof(unsigned);
// Its teardown, with the lane's op workspace (no throwing): its work finished, everything freed.
template <class L>
void free_lane(L& l) {
  if (l.stream) cudaStreamSynchronize(l.stream);
  if (l.cublas) cublasDestroy(l.cublas), l.cublas = nullptr;
  if (l.cublas_ws) cudaFree(l.cublas_ws), l.cublas_ws = nullptr;
  if (l.ws) cudaFree(l.ws), l.ws = nullptr;
  if (l.scratch) cudaFree(l.scratch), l.scratch = nullptr;
  if (l.tickets) cudaFree(l.tickets), l.tickets = nullptr;
  if (l.stream) cudaStreamDestroy(l.stream), l.stream = nullptr;
  l.ws_bytes = l.ws_need = 0;
}

std::string no_device_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  cudaGetLastError();  // clear the sticky-free error so later calls start clean
  if (e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
    return "no CUDA device found";
  return std::string("no CUDA device found (") + cudaGetErrorString(e) + ")";
}

cudaDataType cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    default:
      throw std::logic_error("gemm: unsupported dtype");
  }
}

// Whether graph node n runs one of unet's own kernels: namespace unet, so their mangled names start
// "_ZN4unet", and each begins with pdl_entry() (test_engine scans the sources for it).
bool unet_kernel(cudaGraphNode_t n) {
  cudaGraphNodeType t;
  if (cudaGraphNodeGetType(n, &t) != cudaSuccess || t != cudaGraphNodeTypeKernel) return (void)cudaGetLastError(), false;
  cudaKernelNodeParams p = {};
  const char* name = nullptr;
  if (cudaGraphKernelNodeGetParams(n, &p) != cudaSuccess || !p.func || cudaFuncGetName(&name, p.func) != cudaSuccess ||
      !name)
    return (void)cudaGetLastError(), false;
  return std::strncmp(name, "_ZN4unet", 8) == 0;
}
bool kernel_node(cudaGraphNode_t n) {
  cudaGraphNodeType t;
  return cudaGraphNodeGetType(n, &t) == cudaSuccess && t == cudaGraphNodeTypeKernel;
}

// A captured graph's edges, index by index (cudaGraphGetEdges).
struct Edges {
  std::vector<cudaGraphNode_t> from, to;
  std::vector<cudaGraphEdgeData> data;
};
Edges graph_edges(cudaGraph_t g) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  Edges e{std::vector<cudaGraphNode_t>(n), std::vector<cudaGraphNode_t>(n),
          std::vector<cudaGraphEdgeData>(n)};
  CUDA_CHECK(cudaGraphGetEdges(g, e.from.data(), e.to.data(), e.data.data(), &n));
  return e;
}
// Edge i of e in g, given the type (and port) of `type`.
void retype_edge(cudaGraph_t g, const Edges& e, size_t i, const cudaGraphEdgeData& type) {
  CUDA_CHECK(cudaGraphRemoveDependencies(g, &e.from[i], &e.to[i], &e.data[i], 1));
  CUDA_CHECK(cudaGraphAddDependencies(g, &e.from[i], &e.to[i], &type, 1));
}

// Programmatic dependent launch inside a captured graph: every edge from a kernel into a unet
// kernel that has no other predecessor becomes programmatic, so the unet kernel's blocks are
// launched while its predecessor drains (once that one's blocks have all started or exited) and
// wait in pdl_entry() for its completion, instead of being launched after it. cuDNN's kernels
// are launched that way by cuDNN itself (but a capture's programmatic edges between two of them
// become full ones: foreign_programmatic_edges_full, below). Memory order is unchanged:
// pdl_entry() waits for the predecessor's completion and memory flush before the kernel touches
// memory. only_alone: only into the kernels no other kernel can run beside (alone_nodes); blocks
// launched early wait on their SMs, which slowed the other lane's kernels beside them.
void programmatic_edges(cudaGraph_t g, bool only_alone) {
  const Edges es = graph_edges(g);
  const auto &from = es.from, &to = es.to;
  const auto& data = es.data;
  const size_t n = from.size();
  std::unordered_map<cudaGraphNode_t, int> preds;
  for (size_t i = 0; i < n; ++i) ++preds[to[i]];
  std::unordered_map<cudaGraphNode_t, size_t> id;  // (only_alone) node -> index into alone
  std::vector<char> alone;
  if (only_alone) {
    size_t nn = 0;
    CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nn));
    std::vector<cudaGraphNode_t> nodes(nn);
    CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &nn));
    std::vector<char> kernels(nn);
    for (size_t i = 0; i < nn; ++i) id[nodes[i]] = i, kernels[i] = kernel_node(nodes[i]);
    std::vector<std::pair<size_t, size_t>> edges(n);
    for (size_t i = 0; i < n; ++i) edges[i] = {id.at(from[i]), id.at(to[i])};
    alone = alone_nodes(nn, edges, kernels);
  }
  for (size_t i = 0; i < n; ++i) {
    if (preds[to[i]] != 1 || data[i].type != cudaGraphDependencyTypeDefault || data[i].from_port != 0 ||
        !kernel_node(from[i]) || !unet_kernel(to[i]) || (only_alone && !alone[id.at(to[i])]))
      continue;
    cudaGraphEdgeData e = {};
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    e.type = cudaGraphDependencyTypeProgrammatic;
    retype_edge(g, es, i, e);
  }
}

// A memset node's work as a kernel: rows of `width` elements of `es` bytes (1, 2 or 4) set to
// `value`, `pitch` bytes apart; 16-byte stores where the rows allow them.
__global__ void fill_kernel(char* dst, size_t pitch, unsigned value, unsigned es, size_t width, size_t height) {
  pdl_entry();
  const size_t row_bytes = width * es;
  const bool wide = ((uintptr_t)dst | pitch | row_bytes) % 16 == 0;
  unsigned word = value;  // the element pattern repeated over 4 bytes
  if (es == 1) word = (value & 0xffu) * 0x01010101u;
  if (es == 2) word = (value & 0xffffu) * 0x00010001u;
  const size_t per_row = wide ? row_bytes / 16 : width, n = per_row * height;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / per_row, k = i % per_row;
    char* row = dst + r * pitch;
    if (wide) {
      reinterpret_cast<uint4*>(row)[k] = make_uint4(word, word, word, word);
    } else if (es == 4) {
      reinterpret_cast<unsigned*>(row)[k] = value;
    } else if (es == 2) {
      reinterpret_cast<unsigned short*>(row)[k] = (unsigned short)value;
    } else {
      row[k] = (char)value;
    }
  }
}

}  // namespace

// Every programmatic edge between two kernels that are not unet's (cuDNN's, which launches its
// kernels with programmatic stream serialization) becomes a full edge. A stream capture gives such
// a launch a programmatic edge from the stream's capture dependencies, and after a join those
// include the other lane's last kernel, where the eager run had a cudaStreamWaitEvent, a full
// dependency; one of cuDNN's engines evidently does not tolerate that. None of these edges
// appears without lanes. Found with one of cuDNN 9.14's runtime-fused engines (H200, seed64 at
// batch 4, tf32, the 1x1 skip conv 128 -> 64 + bias at 64x64, on the side lane): the training
// step's graph replays gave outputs off by up to 100 (of 300) against the same step run eagerly
// (test_model_golden's lanes tests, when the plan cache picked that engine). 13 such edges in the
// seed64 tf32 step, 11 in sampling's forward; making them full measured level (H200: step 10.86
// -> 10.84 ms, sampling's forward 6.05 -> 6.06, noise). unet's own kernels wait first thing
// (pdl_entry), so edges into them keep their type.
void foreign_programmatic_edges_full(cudaGraph_t g) {
  const Edges e = graph_edges(g);
  for (size_t i = 0; i < e.from.size(); ++i)
    if (e.data[i].type == cudaGraphDependencyTypeProgrammatic && kernel_node(e.to[i]) &&
        !unet_kernel(e.to[i]) && !unet_kernel(e.from[i]))
      retype_edge(g, e, i, cudaGraphEdgeData{});
}

// Every memset node of a captured graph becomes a kernel node doing the same (same dependencies
// both ways). cuDNN's engines memset their workspace before some kernels; in a replayed graph a
// memset node cost 3-10 us of idle GPU around it (H100, CUPTI timelines of seed64's step and
// sampling forward), a kernel node the usual ~0.5 us.
void graph_memsets_as_kernels(cudaGraph_t g) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  for (cudaGraphNode_t m : nodes) {
    cudaGraphNodeType t;
    CUDA_CHECK(cudaGraphNodeGetType(m, &t));
    if (t != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams mp = {};
    CUDA_CHECK(cudaGraphMemsetNodeGetParams(m, &mp));
    if (mp.elementSize != 1 && mp.elementSize != 2 && mp.elementSize != 4) continue;
    size_t np = 0, nd = 0;
    CUDA_CHECK(cudaGraphNodeGetDependencies(m, nullptr, nullptr, &np));
    CUDA_CHECK(cudaGraphNodeGetDependentNodes(m, nullptr, nullptr, &nd));
    std::vector<cudaGraphNode_t> pre(np), post(nd);
    std::vector<cudaGraphEdgeData> pre_e(np), post_e(nd);
    CUDA_CHECK(cudaGraphNodeGetDependencies(m, pre.data(), pre_e.data(), &np));
    CUDA_CHECK(cudaGraphNodeGetDependentNodes(m, post.data(), post_e.data(), &nd));
    char* dst = static_cast<char*>(mp.dst);
    size_t pitch = mp.height > 1 ? mp.pitch : mp.width * mp.elementSize;
    unsigned value = mp.value, es = mp.elementSize;
    size_t width = mp.width, height = mp.height;
    void* args[] = {&dst, &pitch, &value, &es, &width, &height};
    // (fill_kernel's items: 16-byte stores where dst, pitch and the row allow them, else elements)
    const size_t work = ((uintptr_t)dst | pitch | (width * es)) % 16 == 0 ? width * es / 16 * height : width * height;
    cudaKernelNodeParams kp = {};
    kp.func = reinterpret_cast<void*>(fill_kernel);
    kp.gridDim = dim3((unsigned)std::max<size_t>(1, std::min<size_t>((work + 255) / 256, 1056)));
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    cudaGraphNode_t k = nullptr;
    CUDA_CHECK(cudaGraphAddKernelNode(&k, g, nullptr, 0, &kp));
    // The lane's priority: that of the kernel the memset was for (captured nodes carry their
    // stream's; a new node has the default, the least urgent).
    for (cudaGraphNode_t d : post) {
      cudaGraphNodeType dt;
      CUDA_CHECK(cudaGraphNodeGetType(d, &dt));
      if (dt != cudaGraphNodeTypeKernel) continue;
      cudaKernelNodeAttrValue v = {};
      CUDA_CHECK(cudaGraphKernelNodeGetAttribute(d, cudaLaunchAttributePriority, &v));
      CUDA_CHECK(cudaGraphKernelNodeSetAttribute(k, cudaLaunchAttributePriority, &v));
      break;
    }
    for (size_t i = 0; i < np; ++i) CUDA_CHECK(cudaGraphAddDependencies(g, &pre[i], &k, &pre_e[i], 1));
    for (size_t i = 0; i < nd; ++i) CUDA_CHECK(cudaGraphAddDependencies(g, &k, &post[i], &post_e[i], 1));
    CUDA_CHECK(cudaGraphDestroyNode(m));  // (and its edges)
  }
}

namespace {

// Where the block scheduler sends freed SMs first. A kernel fills every SM it can as soon as it is
// issued, and its blocks keep being scheduled ahead of a later kernel's: with one priority, an
// optimizer range (2,112 blocks) or a filter gradient issued just before the main lane's next
// kernel held that kernel back for its whole run (H100 timeline: AdamW ran alone for 0.25 ms of
// the bf16 step). So: the main lane (the step's critical path) most urgent, the side lane (filter
// gradients, joined every few layers) next, the optimizer's updates least. Kernel nodes of a
// captured graph keep their stream's priority, used with cudaGraphInstantiateFlagUseNodePriority.
// UNET_STREAM_PRIORITY=0: all at the default.
struct StreamPriorities {
  int main = 0, side = 0, aside = 0;
};
StreamPriorities stream_priorities() {
  if (!env_stream_priority()) return {};
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return {greatest, std::min(least, greatest + 1), least};
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(Precision p) {
    try {
      int dev = 0;
      CUDA_CHECK(cudaGetDevice(&dev));
      cudaDeviceProp prop;
      CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
      ctx.device_name = prop.name;
      ctx.prec = p;
      const StreamPriorities prio = stream_priorities();
      ctx.prio_side = prio.side;  // (the side lane and the branch are made at their first use)
      // (on the critical path: its result joins the main lane's; at the side lane's priority the
      // bf16 step measured the same, the tf32 step (where the branch is off) 0.03 ms slower)
      ctx.prio_branch = prio.main;
      make_lane(ctx, prio.main);
      CUDA_CHECK(cudaStreamCreateWithPriority(&ctx.aside_stream, cudaStreamDefault, prio.aside));
      CUDA_CHECK(cudaMalloc(&ctx.aside_scratch, CudaCtx::kAsideScratchFloats * sizeof(float)));
      CUDA_CHECK(cudaEventCreateWithFlags(&ctx.aside_fork_ev, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&ctx.aside_join_ev, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&ctx.aside_side_ev, cudaEventDisableTiming));
      for (auto& e : fences_) CUDA_CHECK(cudaEventCreate(&e));  // (timed: fence_ms)
    } catch (...) {
      release();  // a throwing constructor runs no destructor
      throw;
    }
  }
  ~CudaDevice() override { release(); }

  CudaCtx ctx;

  bool is_cuda() const override { return true; }
  std::string name() const override { return "cuda (" + ctx.device_name + ")"; }

  void* alloc(size_t bytes) override {
    if (bytes == 0) bytes = 256;
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);  // 256-byte aligned
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw UserError("out of GPU memory allocating " + std::to_string(bytes >> 20) + " MiB (" +
                      std::to_string(bytes_held() >> 20) + " MiB already held)");
    }
    blocks_.push_back(p);
    bytes_ += bytes;
    return p;
  }
  void* alloc_host(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
    host_blocks_.push_back(p);
    return p;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    // Pageable sources are staged by the driver before this returns; pinned ones (alloc_host)
    // are truly asynchronous and the caller fences before reusing them.
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx.stream));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    ctx.join_all();
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  }
  void sync() override {
    ctx.join_all();
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  }
  size_t bytes_held() const override {
    return bytes_ + kLaneFixedBytes + CudaCtx::kAsideScratchFloats * sizeof(float) + ctx.lane_bytes();
  }
  size_t bytes_free() const override {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return f;
  }

  uint64_t fence() override {
    ctx.join_all();
    ++fence_id_;
    CUDA_CHECK(cudaEventRecord(fences_[fence_id_ % kFences], ctx.stream));
    return fence_id_;
  }
  void fence_wait(uint64_t id) override {
    if (id == 0 || id > fence_id_) return;
    // A slot re-recorded by a later fence is still correct to wait for (it comes after).
    CUDA_CHECK(cudaEventSynchronize(fences_[id % kFences]));
  }
  double fence_ms(uint64_t a, uint64_t b) override {
    if (a == 0 || b <= a || b > fence_id_ || fence_id_ - a >= kFences) return -1.0;
    float ms = 0.f;
    if (cudaEventElapsedTime(&ms, fences_[a % kFences], fences_[b % kFences]) != cudaSuccess) {
      cudaGetLastError();  // (not yet passed)
      return -1.0;
    }
    return ms;
  }

  bool supports_graphs() const override { return true; }
  bool capturing() const override { return ctx.capturing; }
  void* native_stream() override { return ctx.stream; }
  void graph_begin() override {
    ctx.join_all();
    ctx.alloc_workspaces();  // nothing may allocate inside the capture
    // Thread-local mode: other threads (the data loader) may use the CUDA API meanwhile.
    CUDA_CHECK(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal));
    ctx.capturing = true;
  }
  void graph_end(GraphPdl pdl) override {
    ctx.join_all();  // a capture must end with every forked stream joined
    ctx.capturing = false;
    cudaGraph_t g = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(ctx.stream, &g));
    foreign_programmatic_edges_full(g);
    if (env_graph_fill()) graph_memsets_as_kernels(g);
    const int forced = env_pdl();
    if (forced >= 0) pdl = forced ? GraphPdl::All : GraphPdl::Off;
    if (pdl != GraphPdl::Off) programmatic_edges(g, pdl == GraphPdl::Alone);
    if (graph_) {
      CUDA_CHECK(cudaGraphExecDestroy(graph_));
      graph_ = nullptr;
    }
    // Node priorities: each kernel node keeps its capturing stream's, the fill nodes their lane's.
    CUDA_CHECK(cudaGraphInstantiateWithFlags(&graph_, g, cudaGraphInstantiateFlagUseNodePriority));
    CUDA_CHECK(cudaGraphDestroy(g));
  }
  void graph_launch() override {
    if (!graph_) throw std::logic_error("graph_launch without a captured graph");
    CUDA_CHECK(cudaGraphLaunch(graph_, ctx.stream));
  }
  void graph_drop() override {
    if (!graph_) return;
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    CUDA_CHECK(cudaGraphExecDestroy(graph_));
    graph_ = nullptr;
  }

  void range_push(const char* name) override {
    nvtxRangePushA(name);
    Device::range_push(name);
  }
  void range_pop() override {
    nvtxRangePop();
    Device::range_pop();
  }

 private:
  void release() {
    // No throwing here: errors on teardown are ignored.
    ctx.destroy_side();
    if (ctx.on_aside) ctx.stream = ctx.aside_saved, ctx.scratch = ctx.aside_saved_scratch, ctx.on_aside = false;
    if (ctx.aside_stream) cudaStreamSynchronize(ctx.aside_stream), cudaStreamDestroy(ctx.aside_stream);
    if (ctx.aside_scratch) cudaFree(ctx.aside_scratch), ctx.aside_scratch = nullptr;
    for (cudaEvent_t* e : {&ctx.aside_fork_ev, &ctx.aside_join_ev, &ctx.aside_side_ev})
      if (*e) cudaEventDestroy(*e), *e = nullptr;
    ctx.aside_stream = nullptr;
    if (ctx.stream) cudaStreamSynchronize(ctx.stream);
    destroy_cudnn(ctx);
    if (graph_) cudaGraphExecDestroy(graph_), graph_ = nullptr;
    for (auto& e : fences_)
      if (e) cudaEventDestroy(e), e = nullptr;
    for (void* p : blocks_) cudaFree(p);
    blocks_.clear();
    for (void* p : host_blocks_) cudaFreeHost(p);
    host_blocks_.clear();
    free_lane(ctx);
  }
  std::vector<void*> blocks_;
  std::vector<void*> host_blocks_;
  size_t bytes_ = 0;
  static constexpr int kFences = 64;
  cudaEvent_t fences_[kFences] = {};
  uint64_t fence_id_ = 0;
  cudaGraphExec_t graph_ = nullptr;
};

class CudaEngineOps final : public CudaOps {
 public:
  explicit CudaEngineOps(CudaCtx& ctx) : CudaOps(ctx) {
    register_conv_cuda(*this);
    register_linear_group(*this);
    register_linear_cuda(*this);
    register_groupnorm_cuda(*this);
    register_elementwise_cuda(*this);
    register_resample_cuda(*this);
    register_concat_cuda(*this);
    register_embedding_cuda(*this);
    register_attention_cuda(*this);
    register_pool_cuda(*this);
    register_dropout_cuda(*this);
    register_loss_cuda(*this);
    register_diffusion_cuda(*this);
    register_optimizer_cuda(*this);
  }
  void finalize() override { ctx_.alloc_workspaces(); }
  void lane(bool side) override { ctx_.use_lane(side); }
  void join() override { ctx_.join_lanes(); }
  void aside(bool on) override { ctx_.use_aside(on); }
  void join_aside() override { ctx_.join_aside(); }
  void branch(bool on) override { ctx_.use_branch(on); }
  void join_branch() override { ctx_.join_branch(); }
};

}  // namespace

void CudaCtx::need_workspace(size_t bytes) {
  if (bytes > ws_need) ws_need = bytes;
  if (ws_need > ws_bytes && !capturing) alloc_workspace();
  if (bytes > ws_bytes)
    throw std::logic_error("CUDA workspace too small inside a graph capture (plan memory before capturing)");
}

void CudaCtx::alloc_workspace() {
  if (ws_need <= ws_bytes) return;
  if (capturing) throw std::logic_error("CUDA workspace cannot grow inside a graph capture");
  CUDA_CHECK(cudaStreamSynchronize(stream));  // the old workspace may still be in use
  if (ws) {
    CUDA_CHECK(cudaFree(ws));
    ws = nullptr, ws_bytes = 0;
  }
  if (cudaMalloc(&ws, ws_need) != cudaSuccess) {
    cudaGetLastError();
    ws = nullptr;
    throw UserError("out of GPU memory allocating a " + std::to_string(ws_need >> 20) +
                    " MiB kernel workspace");
  }
  ws_bytes = ws_need;
}

namespace {
// The launch state in use and a kept lane's trade places.
void swap_state(CudaCtx& c, CudaCtx::Lane& l) {
  std::swap(c.stream, l.stream);
  std::swap(c.cublas, l.cublas);
  std::swap(c.cublas_ws, l.cublas_ws);
  std::swap(c.ws, l.ws);
  std::swap(c.ws_bytes, l.ws_bytes);
  std::swap(c.ws_need, l.ws_need);
  std::swap(c.scratch, l.scratch);
  std::swap(c.tickets, l.tickets);
}
// The lane in use and the other one trade places.
void swap_lane(CudaCtx& c) {
  swap_state(c, c.other);
  c.on_side = !c.on_side;
}
}  // namespace

// The side lane's own stream, cuBLAS handle (and workspace), reduction scratch and tickets, so
// its kernels share nothing with the main lane's but the buffers the caller hands them.
static void make_side(CudaCtx& c) {
  if (c.capturing) throw std::logic_error("the side lane must be made before a graph capture (plan memory first)");
  make_lane(c.other, c.prio_side);
  CUDA_CHECK(cudaEventCreateWithFlags(&c.fork_ev, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&c.join_ev, cudaEventDisableTiming));
}

// `waiter` runs what is issued to it next after everything issued so far to `s` (ev: scratch).
static void wait_for(cudaStream_t waiter, cudaStream_t s, cudaEvent_t ev) {
  CUDA_CHECK(cudaEventRecord(ev, s));
  CUDA_CHECK(cudaStreamWaitEvent(waiter, ev, 0));
}

void CudaCtx::use_lane(bool side) {
  if (side == on_side) return;
  if (on_branch) throw std::logic_error("the side lane forks from the main lane, not from the branch");
  if (side) {
    if (!other.stream) make_side(*this);
    // the side lane starts after everything issued so far on the main lane
    wait_for(other.stream, stream, fork_ev);
    side_pending = true;
  }
  swap_lane(*this);
}

void CudaCtx::join_lanes() {
  if (on_side) swap_lane(*this);
  if (!side_pending) return;
  wait_for(stream, other.stream, join_ev);
  side_pending = false;
}

void CudaCtx::use_aside(bool on) {
  if (on == on_aside) return;
  if (on) {
    if (on_side || on_branch) throw std::logic_error("the optimizer's stream forks from the main lane");
    // it starts after everything issued so far on the main lane, and on the side lane
    wait_for(aside_stream, stream, aside_fork_ev);
    if (side_pending) wait_for(aside_stream, other.stream, aside_side_ev);
    aside_saved = stream, stream = aside_stream;
    aside_saved_scratch = scratch, scratch = aside_scratch;
    aside_pending = true;
  } else {
    stream = aside_saved;
    scratch = aside_saved_scratch;
  }
  on_aside = on;
}

void CudaCtx::join_aside() {
  use_aside(false);
  if (!aside_pending) return;
  wait_for(stream, aside_stream, aside_join_ev);
  aside_pending = false;
}

// The branch's stream, cuBLAS handle (and workspace), reduction scratch and tickets, as the side
// lane's, and its fork and join events.
static void make_branch(CudaCtx& c) {
  if (c.capturing) throw std::logic_error("the branch must be made before a graph capture (plan memory first)");
  make_lane(c.branch_lane, c.prio_branch);
  CUDA_CHECK(cudaEventCreateWithFlags(&c.branch_fork_ev, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&c.branch_join_ev, cudaEventDisableTiming));
}

void CudaCtx::use_branch(bool on) {
  if (on == on_branch) return;
  if (on) {
    if (on_side || on_aside) throw std::logic_error("the branch forks from the main lane");
    if (!branch_lane.stream) make_branch(*this);
    wait_for(branch_lane.stream, stream, branch_fork_ev);
    branch_pending = true;
  }
  swap_state(*this, branch_lane);
  on_branch = on;
}

void CudaCtx::join_branch() {
  use_branch(false);
  if (!branch_pending) return;
  wait_for(stream, branch_lane.stream, branch_join_ev);
  branch_pending = false;
}

void CudaCtx::alloc_workspaces() {
  alloc_workspace();
  for (Lane* l : {&other, &branch_lane}) {
    if (!l->stream) continue;
    swap_state(*this, *l);
    try {
      alloc_workspace();
    } catch (...) {
      swap_state(*this, *l);
      throw;
    }
    swap_state(*this, *l);
  }
}

// `other` holds a stream exactly when the side lane exists (on either lane), `branch_lane` when
// the branch does; the workspaces are ws, other.ws and branch_lane.ws in some order.
size_t CudaCtx::lane_bytes() const {
  return ws_bytes + other.ws_bytes + branch_lane.ws_bytes + (other.stream ? kLaneFixedBytes : 0) +
         (branch_lane.stream ? kLaneFixedBytes : 0);
}

// Teardown (no throwing): back on the main lane, the side lane's and the branch's work finished,
// their state freed.
void CudaCtx::destroy_side() {
  if (on_branch) swap_state(*this, branch_lane), on_branch = false;
  if (on_side) swap_lane(*this);
  free_lane(other);
  free_lane(branch_lane);
  for (cudaEvent_t* e : {&fork_ev, &join_ev, &branch_fork_ev, &branch_join_ev})
    if (*e) cudaEventDestroy(*e), *e = nullptr;
  side_pending = branch_pending = false;
}

// cuBLAS is column-major; a row-major X[r,c] is the column-major X^T. So row-major
// C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: swap the operands and the
// M/N roles, keep each operand's transpose flag.
void CudaCtx::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const Mat& A, const Mat& B, float beta,
                   const Mat& C, int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  if (A.t != B.t) throw std::logic_error("gemm: A and B must share a dtype");
  const cublasComputeType_t ct =
      A.t == DType::F32 && prec != Precision::FP32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1)
    CUBLAS_CHECK(cublasGemmEx(cublas, opb, opa, N, M, K, &alpha, B.p, cuda_type(B.t), B.ld, A.p,
                              cuda_type(A.t), A.ld, &beta, const_cast<void*>(C.p), cuda_type(C.t), C.ld, ct,
                              CUBLAS_GEMM_DEFAULT));
  else
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas, opb, opa, N, M, K, &alpha, B.p, cuda_type(B.t), B.ld,
                                            B.stride, A.p, cuda_type(A.t), A.ld, A.stride, &beta,
                                            const_cast<void*>(C.p), cuda_type(C.t), C.ld, C.stride, batch, ct,
                                            CUBLAS_GEMM_DEFAULT));
}

bool cuda_available() { return no_device_reason().empty(); }

namespace {
std::atomic<int> g_smem_cap{0};  // cap_cuda_smem_optin's (tests)
}  // namespace

void cap_cuda_smem_optin(int bytes) { g_smem_cap.store(bytes > 0 ? bytes : 0, std::memory_order_relaxed); }

bool device_smem_fits(size_t bytes) {
  static const int v = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  const int cap = g_smem_cap.load(std::memory_order_relaxed);
  return bytes <= (size_t)(cap > 0 && cap < v ? cap : v);
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void cuda_set_device(int index) {
  cudaError_t e = cudaSetDevice(index);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw UserError("cannot use GPU " + std::to_string(index) + ": " + cudaGetErrorString(e));
  }
}

std::unique_ptr<Engine> make_cuda_engine(Precision p, std::string* why_not) {
  std::string why = no_device_reason();
  if (!why.empty()) {
    if (why_not) *why_not = why;
    return nullptr;
  }
  try {
    auto dev = std::make_unique<CudaDevice>(p);
    auto ops = std::make_unique<CudaEngineOps>(dev->ctx);
    return std::make_unique<Engine>(std::move(dev), std::move(ops), p);
  } catch (const std::exception& e) {
    if (why_not) *why_not = std::string("CUDA initialisation failed: ") + e.what();
    return nullptr;
  }
}

}  // namespace unet
