// Probe (not part of the build): which cuDNN 9 fusions exist for seed64's 3x3 convolutions on
// this GPU, and how fast, against the plain convolution and a separate epilogue pass.
//   nvcc -O2 -arch=sm_90 -std=c++17 -include cuda_bf16.h scripts/cudnn_fusion_probe.cu -o probe -lcudnn
//   ./probe 32        (batch; on the GPU machine with LD_LIBRARY_PATH at PyTorch's nvidia/cudnn/lib)
//   ./probe 16 serial (imagenet256's shapes: conv, epilogue pass, fused, fused with the per-(sample,
//                      channel) sums of y and y^2 that GroupNorm's statistics need (kind 7: slower
//                      than a separate statistics pass, README), and each runtime-compiled plan's
//                      JSON round trip)
// Each graph runs in its own process (a failing engine leaves a sticky CUDA error). Runtime-
// compiled engines (NVRTC) are allowed here, unlike in kernels/conv/cudnn.cu. Findings
// (H100, cuDNN 9.19, 2026-11-23) are in README.md's speed section.
#include <cuda_runtime.h>
#include <cudnn.h>

#include "cudnn_probe.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                   cudnnBackendDescriptor_t y) {
  D pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  CK(cudnnBackendFinalize(pw.d));
  D op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.setd(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
  if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  return keep_op(std::move(pw), std::move(op));
}

// y[n, c, 1, 1] = sum over (h, w) of x[n, c, h, w], in f32
cudnnBackendDescriptor_t reduction(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  D red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnReduceTensorOp_t op = CUDNN_REDUCE_TENSOR_ADD;
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op);
  red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  CK(cudnnBackendFinalize(red.d));
  D o(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  o.setd(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
  o.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  o.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  return keep_op(std::move(red), std::move(o));
}

cudnnBackendDescriptor_t conv_op(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y) {
  D conv = conv3x3();
  D op(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  const float alpha = 1.f, beta = 0.f;
  op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
  op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  op.setd(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
  op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
  op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  return keep_op(std::move(conv), std::move(op));
}

struct Buf {
  int64_t uid;
  size_t bytes;
};

__global__ void fill(unsigned short* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    // bf16 in [-1, 1): 0x3f80 | random mantissa, random sign, random small exponent
    const unsigned short e = 0x3c00 + ((h >> 8) & 0x3ff);
    p[i] = (unsigned short)(e | ((h & 1) << 15));
  }
}

// a plain vectorised epilogue for comparison: y = y + bias[c] + emb[b,c] (+ res), bf16, 8 per thread
__global__ void epi_kernel(__nv_bfloat16* y, const float* bias, const float* emb, const __nv_bfloat16* res, int HW,
                           int C, size_t n8) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
    const size_t e = i * 8;
    const int c = (int)(e % C);
    const size_t b = e / ((size_t)HW * C);
    uint4 v = reinterpret_cast<uint4*>(y)[i];
    uint4 r = res ? reinterpret_cast<const uint4*>(res)[i] : uint4{};
    __nv_bfloat16* pv = reinterpret_cast<__nv_bfloat16*>(&v);
    const __nv_bfloat16* pr = reinterpret_cast<const __nv_bfloat16*>(&r);
    for (int k = 0; k < 8; ++k) {
      float f = __bfloat162float(pv[k]) + bias[c + k] + (emb ? emb[b * C + c + k] : 0.f);
      if (res) f += __bfloat162float(pr[k]);
      pv[k] = __float2bfloat16(f);
    }
    reinterpret_cast<uint4*>(y)[i] = v;
  }
}

cudnnHandle_t H;
cudaStream_t S;
bool g_serial = false;

// A runtime-compiled plan's JSON form: its size, how long a plan takes to finalize from it, and
// whether the restored plan writes the same bytes (the last buffer is the output).
void serial_check(const D& plan, const D& vp, const std::vector<void*>& ptrs, const std::vector<Buf>& bufs,
                  const char* nm) {
  int64_t n = 0;
  if (cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n,
                               nullptr) != CUDNN_STATUS_SUCCESS) {
    std::printf("    %s: no JSON\n", nm);
    return;
  }
  std::vector<char> js(n + 1, 0);
  CK(cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n,
                              js.data()));
  auto t0 = std::chrono::steady_clock::now();
  D q(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  q.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &H);
  q.set(CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, js.data());
  const cudnnStatus_t st = cudnnBackendFinalize(q.d);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (st != CUDNN_STATUS_SUCCESS) {
    std::printf("    %s: JSON %lld bytes, restore failed: %s\n", nm, (long long)n, cudnnGetErrorString(st));
    return;
  }
  const size_t ob = bufs[2].bytes;  // y is the third buffer in every graph here
  void* ref;
  cudaMalloc(&ref, ob);
  std::vector<char> a(ob), b(ob);
  cudnnBackendExecute(H, plan.d, vp.d);
  cudaMemcpy(a.data(), ptrs[2], ob, cudaMemcpyDeviceToHost);
  cudaMemset(ptrs[2], 0x55, ob);
  const cudnnStatus_t ex = cudnnBackendExecute(H, q.d, vp.d);
  cudaMemcpy(b.data(), ptrs[2], ob, cudaMemcpyDeviceToHost);
  cudaFree(ref);
  std::printf("    %s: JSON %lld bytes, restored in %.3f s, run %s, output %s; head %.80s\n", nm, (long long)n, s,
              ex == CUDNN_STATUS_SUCCESS ? "ok" : cudnnGetErrorString(ex), a == b ? "bitwise equal" : "DIFFERS",
              js.data());
}

// Times every engine config of the graph made of ops; returns best ms (or -1).
double run_graph(const char* name, std::vector<cudnnBackendDescriptor_t> ops, const std::vector<Buf>& bufs,
                 bool allow_rt, std::string* best_name) {
  D g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data());
  g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &H);
  cudnnStatus_t st = cudnnBackendFinalize(g.d);
  if (st != CUDNN_STATUS_SUCCESS) {
    std::printf("  %-28s graph finalize: %s\n", name, cudnnGetErrorString(st));
    return -1;
  }
  std::vector<void*> ptrs;
  std::vector<int64_t> uids;
  for (auto& b : bufs) {
    void* p;
    cudaMalloc(&p, b.bytes);
    fill<<<1024, 256, 0, S>>>((unsigned short*)p, b.bytes / 2, (unsigned)b.uid * 7919u);
    ptrs.push_back(p);
    uids.push_back(b.uid);
  }
  double best = -1;
  int ncfg_total = 0, nfinal = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<D> cfgs = heuristic_configs(g, mode);
    const int64_t got = (int64_t)cfgs.size();
    ncfg_total += (int)got;
    for (int64_t i = 0; i < got && i < 24; ++i) {
      // engine notes
      D eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      int64_t c = 0;
      cudnnBackendGetAttribute(cfgs[i].d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, &eng.d);
      cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
      int64_t nn = 0;
      cudnnBackendGetAttribute(eng.d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes);
      bool nondet = false, rpr = false;
      for (int64_t k = 0; k < nn; ++k) {
        if (notes[k] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) nondet = true;
        if (notes[k] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION ||
            notes[k] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
          rpr = true;
      }
      cudnnBackendBehaviorNote_t beh[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
      nn = 0;
      cudnnBackendGetAttribute(eng.d, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &nn, beh);
      bool rt = false;
      for (int64_t k = 0; k < nn; ++k)
        if (beh[k] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) rt = true;
      int64_t gidx = -1;
      cudnnBackendGetAttribute(eng.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &c, &gidx);
      if (nondet || rpr || (rt && !allow_rt)) continue;
      D p(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      p.setd(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[i]);
      p.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &H);
      auto t0 = std::chrono::steady_clock::now();
      if (cudnnBackendFinalize(p.d) != CUDNN_STATUS_SUCCESS) continue;
      const double fin_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++nfinal;
      int64_t ws = 0;
      cudnnBackendGetAttribute(p.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &c, &ws);
      void* wsp = nullptr;
      if (ws) cudaMalloc(&wsp, ws);
      D vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      vp.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data());
      vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
      vp.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp);
      CK(cudnnBackendFinalize(vp.d));
      if (cudnnBackendExecute(H, p.d, vp.d) != CUDNN_STATUS_SUCCESS || cudaStreamSynchronize(S) != cudaSuccess) {
        std::printf("    %s#%lld%s failed: %s\n", mode == CUDNN_HEUR_MODE_A ? "A" : "F", (long long)gidx, rt ? "rt" : "", cudaGetErrorString(cudaGetLastError()));
        if (cudaGetLastError() != cudaSuccess || cudaStreamQuery(S) != cudaSuccess) { std::printf("    sticky error, stopping\n"); return best; }
        if (wsp) cudaFree(wsp);
        continue;
      }
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0), cudaEventCreate(&e1);
      cudaEventRecord(e0, S);
      const int R = 20;
      for (int r = 0; r < R; ++r) cudnnBackendExecute(H, p.d, vp.d);
      cudaEventRecord(e1, S);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      ms /= R;
      char nm[128];
      std::snprintf(nm, sizeof nm, "%s#%lld%s", mode == CUDNN_HEUR_MODE_A ? "A" : "F", (long long)gidx,
                    rt ? "rt" : "");
      if (best < 0 || ms < best) best = ms, *best_name = nm;
      if (rt && g_serial) serial_check(p, vp, ptrs, bufs, nm);
      if (rt && fin_s > 0.5) std::printf("    (%s finalize %.1f s)\n", nm, fin_s);
      cudaEventDestroy(e0), cudaEventDestroy(e1);
      if (wsp) cudaFree(wsp);
    }
  }
  cudaError_t ce = cudaGetLastError();
  std::printf("  %-28s configs %d finalized %d best %.4f ms (%s)%s\n", name, ncfg_total, nfinal, best,
              best_name->c_str(), ce != cudaSuccess ? cudaGetErrorString(ce) : "");
  for (void* p : ptrs) cudaFree(p);
  return best;
}


struct Sh {
  int H, Ci, Co;
};
void one_test(int prec, Sh s, int B, int kind) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  cudaStreamCreate(&S);
  CK(cudnnCreate(&H));
  CK(cudnnSetStream(H, S));
  const cudnnDataType_t T = prec == 0 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  const size_t es = prec == 0 ? 2 : 4;
  const size_t nx = (size_t)B * s.H * s.H * s.Ci, ny = (size_t)B * s.H * s.H * s.Co, nw = (size_t)s.Co * 9 * s.Ci;
  std::string bn;
  const cudnnDataType_t F = CUDNN_DATA_FLOAT;
  keep.clear();
  next_uid = 1;
  if (kind == 0) {
    int64_t ux, uw, uy;
    auto x = tensor(T, B, s.Ci, s.H, s.H, false, &ux);
    auto w = tensor(T, s.Co, s.Ci, 3, 3, false, &uw);
    auto y = tensor(T, B, s.Co, s.H, s.H, false, &uy);
    run_graph("base", {conv_op(x, w, y)}, {{ux, nx * es}, {uw, nw * es}, {uy, ny * es}}, false, &bn);
    run_graph("base (rt allowed)", {conv_op(x, w, y)}, {{ux, nx * es}, {uw, nw * es}, {uy, ny * es}}, true, &bn);
    return;
  }
  if (kind == 1) {
    if (prec != 0) return;
    __nv_bfloat16 *y, *res;
    float *bias, *emb;
    cudaMalloc(&y, ny * 2), cudaMalloc(&res, ny * 2), cudaMalloc(&bias, s.Co * 4), cudaMalloc(&emb, B * s.Co * 4);
    cudaMemset(bias, 0, s.Co * 4), cudaMemset(emb, 0, B * s.Co * 4);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int withres = 0; withres < 2; ++withres) {
      epi_kernel<<<264, 512, 0, S>>>(y, bias, emb, withres ? res : nullptr, s.H * s.H, s.Co, ny / 8);
      cudaEventRecord(e0, S);
      for (int r = 0; r < 20; ++r)
        epi_kernel<<<528, 512, 0, S>>>(y, bias, withres ? nullptr : emb, withres ? res : nullptr, s.H * s.H, s.Co,
                                       ny / 8);
      cudaEventRecord(e1, S);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      std::printf("  %-28s %.4f ms\n", withres ? "separate epilogue bias+res" : "separate epilogue bias+emb", ms / 20);
    }
    return;
  }
  if (kind >= 2 && kind <= 5) {  // 2 bias, 3 bias+emb, 4 bias+res, 5 res
    int64_t ux, uw, uy, ub, ue, ur;
    auto x = tensor(T, B, s.Ci, s.H, s.H, false, &ux);
    auto w = tensor(T, s.Co, s.Ci, 3, 3, false, &uw);
    auto c0 = tensor(F, B, s.Co, s.H, s.H, true);
    auto y = tensor(T, B, s.Co, s.H, s.H, false, &uy);
    std::vector<cudnnBackendDescriptor_t> ops{conv_op(x, w, c0)};
    std::vector<Buf> bufs{{ux, nx * es}, {uw, nw * es}, {uy, ny * es}};
    const char* nm = "";
    if (kind == 2) {
      auto bias = tensor(F, 1, s.Co, 1, 1, false, &ub);
      ops.push_back(pointwise(CUDNN_POINTWISE_ADD, c0, bias, y));
      bufs.push_back({ub, (size_t)s.Co * 4});
      nm = "epi bias";
    } else if (kind == 5) {
      auto res = tensor(T, B, s.Co, s.H, s.H, false, &ur);
      ops.push_back(pointwise(CUDNN_POINTWISE_ADD, c0, res, y));
      bufs.push_back({ur, ny * es});
      nm = "epi res";
    } else {
      auto bias = tensor(F, 1, s.Co, 1, 1, false, &ub);
      auto c1 = tensor(F, B, s.Co, s.H, s.H, true);
      ops.push_back(pointwise(CUDNN_POINTWISE_ADD, c0, bias, c1));
      bufs.push_back({ub, (size_t)s.Co * 4});
      if (kind == 4) {
        auto res = tensor(T, B, s.Co, s.H, s.H, false, &ur);
        ops.push_back(pointwise(CUDNN_POINTWISE_ADD, c1, res, y));
        bufs.push_back({ur, ny * es});
        nm = "epi bias+res";
      } else {
        auto emb = tensor(F, B, s.Co, 1, 1, false, &ue);
        ops.push_back(pointwise(CUDNN_POINTWISE_ADD, c1, emb, y));
        bufs.push_back({ue, (size_t)B * s.Co * 4});
        nm = "epi bias+emb";
      }
    }
    run_graph(nm, ops, bufs, true, &bn);
    return;
  }
  if (kind == 7) {  // bias + res, and the per-(sample, channel) sums of y and y^2 (GroupNorm's statistics)
    int64_t ux, uw, uy, ub, ur, us1, us2;
    auto x = tensor(T, B, s.Ci, s.H, s.H, false, &ux);
    auto w = tensor(T, s.Co, s.Ci, 3, 3, false, &uw);
    auto c0 = tensor(F, B, s.Co, s.H, s.H, true);
    auto bias = tensor(F, 1, s.Co, 1, 1, false, &ub);
    auto c1 = tensor(F, B, s.Co, s.H, s.H, true);
    auto res = tensor(T, B, s.Co, s.H, s.H, false, &ur);
    auto c2 = tensor(F, B, s.Co, s.H, s.H, true);
    auto y = tensor(T, B, s.Co, s.H, s.H, false, &uy);
    auto c3 = tensor(F, B, s.Co, s.H, s.H, true);
    auto s1 = tensor(F, B, s.Co, 1, 1, false, &us1);
    auto s2 = tensor(F, B, s.Co, 1, 1, false, &us2);
    run_graph("epi bias+res+sums", {conv_op(x, w, c0), pointwise(CUDNN_POINTWISE_ADD, c0, bias, c1),
                                     pointwise(CUDNN_POINTWISE_ADD, c1, res, c2),
                                     pointwise(CUDNN_POINTWISE_IDENTITY, c2, nullptr, y), reduction(c2, s1),
                                     pointwise(CUDNN_POINTWISE_MUL, c2, c2, c3), reduction(c3, s2)},
              {{ux, nx * es}, {uw, nw * es}, {uy, ny * es}, {ub, (size_t)s.Co * 4}, {ur, ny * es},
               {us1, (size_t)B * s.Co * 4}, {us2, (size_t)B * s.Co * 4}},
              true, &bn);
    return;
  }
  if (kind == 6) {  // per-channel prologue + swish
    int64_t ux, uw, uy, ua, ubb;
    auto x = tensor(T, B, s.Ci, s.H, s.H, false, &ux);
    auto a = tensor(F, 1, s.Ci, 1, 1, false, &ua);
    auto bb = tensor(F, 1, s.Ci, 1, 1, false, &ubb);
    auto p0 = tensor(F, B, s.Ci, s.H, s.H, true);
    auto p1 = tensor(F, B, s.Ci, s.H, s.H, true);
    auto p2 = tensor(T, B, s.Ci, s.H, s.H, true);
    auto w = tensor(T, s.Co, s.Ci, 3, 3, false, &uw);
    auto y = tensor(T, B, s.Co, s.H, s.H, false, &uy);
    run_graph("pro [C] swish",
              {pointwise(CUDNN_POINTWISE_MUL, x, a, p0), pointwise(CUDNN_POINTWISE_ADD, p0, bb, p1),
               pointwise(CUDNN_POINTWISE_SWISH_FWD, p1, nullptr, p2), conv_op(p2, w, y)},
              {{ux, nx * es}, {uw, nw * es}, {uy, ny * es}, {ua, (size_t)s.Ci * 4}, {ubb, (size_t)s.Ci * 4}}, true,
              &bn);
  }
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  const Sh seed64[] = {{64, 64, 64}, {64, 128, 64}, {32, 128, 128}, {16, 192, 192}, {8, 256, 256}};
  const Sh in256[] = {{256, 256, 256}, {128, 256, 256}, {64, 512, 512}, {32, 512, 512}, {16, 1024, 1024}, {8, 1024, 1024}};
  const int B = argc > 1 ? std::atoi(argv[1]) : 32;
  // Each graph in its own process (a failing engine leaves a sticky CUDA error).
  auto isolated = [&](int prec, const Sh& s, int kind) {
    const pid_t pid = fork();
    if (pid == 0) {
      try {
        one_test(prec, s, B, kind);
      } catch (...) {
        std::printf("  kind %d threw\n", kind);
      }
      std::fflush(stdout);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
  };
  // argv[2]: "serial" = the imagenet256 shapes, bf16, conv / separate epilogue / bias+res, with the
  // JSON round trip of each runtime-compiled plan
  g_serial = argc > 2 && std::string(argv[2]) == "serial";
  if (g_serial) {
    for (const Sh& s : in256) {
      std::printf("B%d %dx%d %d->%d\n", B, s.H, s.H, s.Ci, s.Co);
      for (int kind : {0, 1, 4, 7}) isolated(0, s, kind);
    }
    return 0;
  }
  for (int prec = 0; prec < 2; ++prec) {
    std::printf("=== %s\n", prec == 0 ? "bf16" : "f32 (tf32 allowed)");
    for (const Sh& s : seed64) {
      std::printf("B%d %dx%d %d->%d\n", B, s.H, s.H, s.Ci, s.Co);
      for (int kind = 0; kind <= 7; ++kind) isolated(prec, s, kind);
    }
  }
  return 0;
}
