// Concat variants "rows" (below) and "cuda": channel concat of two NHWC tensors (a first) and its split backward,
// f32 or bf16; pure data movement with vector accesses when both channel counts allow.
#include <algorithm>

#include "cuda_engine.cuh"
#include "rowblock.cuh"

namespace unet {

namespace {

// y [R, Ca+Cb] = a [R, Ca] ++ b [R, Cb]; vec4 needs Ca % 4 == 0 and Cb % 4 == 0.
template <class T>
struct ConcatF {
  const T* a;
  const T* b;
  T* y;
  int Ca, Cb;
  __device__ const T* src(size_t i) const {
    const int C = Ca + Cb;
    const size_t r = i / C;
    const int c = (int)(i % C);
    return c < Ca ? a + r * Ca + c : b + r * Cb + (c - Ca);
  }
  __device__ void vec4(size_t j) const { st4(y, j, ld4(src(4 * j), 0)); }
  __device__ void scalar(size_t i) const { y[i] = *src(i); }
};

template <class T>
struct SplitF {
  const T* dy;
  T* da;
  T* db;
  int Ca, Cb;
  __device__ T* dst(size_t i) const {  // nullptr when that part is not wanted
    const int C = Ca + Cb;
    const size_t r = i / C;
    const int c = (int)(i % C);
    if (c < Ca) return da ? da + r * Ca + c : nullptr;
    return db ? db + r * Cb + (c - Ca) : nullptr;
  }
  __device__ void vec4(size_t j) const {
    if (T* d = dst(4 * j)) st4(d, 0, ld4(dy, j));
  }
  __device__ void scalar(size_t i) const {
    if (T* d = dst(i)) *d = dy[i];
  }
};

void concat_fwd(const ConcatFwd& o, CudaCtx& ctx) {
  const int Ca = (int)o.a.last(), Cb = (int)o.b.last();
  with_act(o.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(
        ConcatF<T>{dptr<T>(o.a), dptr<T>(o.b), dptr<T>(o.y), Ca, Cb}, o.y.numel(),
        Ca % 4 == 0 && Cb % 4 == 0 && vec4_ok<T>(o.a.data) && vec4_ok<T>(o.b.data) && vec4_ok<T>(o.y.data),
        ctx.stream);
  });
}

void concat_bwd(const ConcatBwd& o, CudaCtx& ctx) {
  const int C = (int)o.dy.last();
  const int Ca = o.da.defined() ? (int)o.da.last() : C - (int)o.db.last(), Cb = C - Ca;
  with_act(o.dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_map(SplitF<T>{dptr<T>(o.dy), dptr<T>(o.da), dptr<T>(o.db), Ca, Cb}, o.dy.numel(),
               Ca % 4 == 0 && Cb % 4 == 0 && vec4_ok<T>(o.dy.data) &&
                   (!o.da.defined() || vec4_ok<T>(o.da.data)) && (!o.db.defined() || vec4_ok<T>(o.db.data)),
               ctx.stream);
  });
}

// ---- variant "rows": the same moves, a thread owning one chunk position of the row ----
// (16 bytes where Ca and Cb allow, else one element) for a run of rows, so the source/target
// choice and offsets are fixed per thread, with no per-element 64-bit division ("cuda"'s map ran
// at about half of memory speed on the H100's skip concats). Bytes are copied as they are.
template <class W>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(const W* __restrict__ a, const W* __restrict__ b, const W* __restrict__ y, W* __restrict__ da,
                W* __restrict__ db, W* __restrict__ yo, long long rows, int Ca, int Cb, int Cl, int L) {
  pdl_entry();
  // concat: (a | b) -> yo; split: y -> (da | db), either target optional.
  const int t = threadIdx.x, cl = t % Cl, rl = t / Cl, C = Ca + Cb;
  const long long step = (long long)gridDim.x * L;
  constexpr int U = 4;
  for (int c = cl; c < C; c += Cl) {
    const bool first = c < Ca;
    const int w = first ? Ca : Cb, k = first ? c : c - Ca;
    const W* src = yo ? (first ? a : b) : y;
    W* dst = yo ? yo : (first ? da : db);
    if (!dst) continue;
    const int ls = yo ? w : C, ld = yo ? C : w, ks = yo ? k : c, kd = yo ? c : k;
    for (long long r = (long long)blockIdx.x * L + rl; r < rows; r += U * step) {
      W v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r + u * step < rows) v[u] = src[(r + u * step) * ls + ks];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r + u * step < rows) dst[(r + u * step) * ld + kd] = v[u];
    }
  }
}

// Launches rows_kernel over `rows` rows of Ca + Cb elements of size `es` bytes, in 16-byte chunks
// when every row piece and pointer allows.
void move_rows(CudaCtx& ctx, size_t es, const void* a, const void* b, const void* y, void* da, void* db, void* yo,
               long long rows, int Ca, int Cb) {
  const bool wide = (Ca * es) % 16 == 0 && (Cb * es) % 16 == 0 &&
                    [&] {
                      for (const void* p : {a, b, y, (const void*)da, (const void*)db, (const void*)yo})
                        if (p && !aligned16(p)) return false;
                      return true;
                    }();
  auto go = [&](auto tag, int ca, int cb) {
    using W = decltype(tag);
    const int C = ca + cb, Cl = std::min(C, kThreads), L = kThreads / Cl;
    const long long blocks = std::min<long long>((rows + L - 1) / L, 132 * 8);
    rows_kernel<W><<<(unsigned)std::max(1LL, blocks), L * Cl, 0, ctx.stream>>>(
        (const W*)a, (const W*)b, (const W*)y, (W*)da, (W*)db, (W*)yo, rows, ca, cb, Cl, L);
    KERNEL_CHECK();
  };
  if (wide)
    go(uint4{}, (int)(Ca * es / 16), (int)(Cb * es / 16));
  else if (es == 2)
    go(uint16_t{}, Ca, Cb);
  else
    go(uint32_t{}, Ca, Cb);
}

// The concatenation's values for rowblock::stats_rows: channel vector j from a or b (V dividing
// both channel counts, so no vector straddles them).
template <class T, int V>
struct ConcatSrc {
  const T* a;
  const T* b;
  int Ca, Cb;
  struct Chan {
    const T* p;
    int ld, k;
  };
  __device__ Chan chan(int, int j) const {
    const int c = j * V;
    return c < Ca ? Chan{a, Ca, c} : Chan{b, Cb, c - Ca};
  }
  __device__ void load(const Chan& ch, size_t row, int, float* v) const {
    rowblock::Vec<T, V>::load(ch.p + row * ch.ld + ch.k, v);
  }
  // f32 rows streamed through shared memory (16 slots), as GroupNorm's apply pass streams them:
  // sampling's tf32 forward at batch 64 6.080 -> 6.044 ms (H200, same run, 3 rounds); bf16's 8
  // slots measured slower (sampling's forward 3.84 -> 3.90 ms, H200), so bf16 keeps its rows in
  // registers.
  static constexpr int kRing = V == 4 ? 16 : 0;
  __device__ const T* col(const Chan& ch) const { return ch.p + ch.k; }
  __device__ int pitch(const Chan& ch) const { return ch.ld; }
};

// With statistics: one pass that copies and sums (ConcatFwd's mean/rstd; the skip concatenations
// of the UNet's decoder feed a GroupNorm).
void concat_fwd_stats(const ConcatFwd& o, CudaCtx& ctx) {
  const int Ca = (int)o.a.last(), Cb = (int)o.b.last();
  with_act(o.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = rowblock::kWide<T>;
    const bool wide =
        Ca % W == 0 && Cb % W == 0 && rowblock::wide_ok<T>(Ca + Cb, {o.a.data, o.b.data, o.y.data});
    rowblock::with_width<T>(wide, [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      rowblock::stats_rows<T, V>(ctx, ConcatSrc<T, V>{dptr<T>(o.a), dptr<T>(o.b), Ca, Cb}, o.y, o.mean, o.rstd);
    });
  });
}

void concat_fwd_rows(const ConcatFwd& o, CudaCtx& ctx) {
  if (o.mean.defined()) return concat_fwd_stats(o, ctx);
  const int Ca = (int)o.a.last(), Cb = (int)o.b.last();
  move_rows(ctx, o.y.dtype == DType::BF16 ? 2 : 4, o.a.data, o.b.data, nullptr, nullptr, nullptr, o.y.data,
            (long long)(o.y.numel() / (size_t)(Ca + Cb)), Ca, Cb);
}
void concat_bwd_rows(const ConcatBwd& o, CudaCtx& ctx) {
  const int C = (int)o.dy.last();
  const int Ca = o.da.defined() ? (int)o.da.last() : C - (int)o.db.last(), Cb = C - Ca;
  move_rows(ctx, o.dy.dtype == DType::BF16 ? 2 : 4, nullptr, nullptr, o.dy.data, o.da.data, o.db.data, nullptr,
            (long long)(o.dy.numel() / (size_t)C), Ca, Cb);
}
bool fwd_rows_ok(const ConcatFwd& o, const CudaCtx&) {
  return o.a.dtype == o.y.dtype && o.b.dtype == o.y.dtype &&
         (!o.mean.defined() || rowblock::stats_rows_fit(o.y, o.mean));
}
bool bwd_rows_ok(const ConcatBwd& o, const CudaCtx&) {
  return (!o.da.defined() || o.da.dtype == o.dy.dtype) && (!o.db.defined() || o.db.dtype == o.dy.dtype);
}

}  // namespace

void register_concat_cuda(CudaOps& ops) {
  ops.variants<ConcatFwd>().push_back({"rows", fwd_rows_ok, concat_fwd_rows, nullptr});
  ops.variants<ConcatBwd>().push_back({"rows", bwd_rows_ok, concat_bwd_rows, nullptr});
  ops.variants<ConcatFwd>().push_back({"cuda", stats_ok<ConcatFwd>, then_stats<ConcatFwd, concat_fwd>, nullptr});
  ops.variants<ConcatBwd>().push_back({"cuda", nullptr, concat_bwd, nullptr});
}

}  // namespace unet
