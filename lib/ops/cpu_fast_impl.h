// The fast CPU kernels (lib/ops/cpu_fast.h), written once for two instruction sets: included only
// by cpu_fast_avx512.cpp (UNET_FAST_AVX512) and cpu_fast_avx2.cpp (UNET_FAST_AVX2), which CMake
// compiles with those instruction sets enabled. Everything here has internal linkage (an anonymous
// namespace) and uses no library templates or inline functions, so no function compiled with
// AVX-512 can be picked by the linker for baseline code; only the table of function pointers is
// exported, and the CPU is checked (cpu_fast.cpp) before any of it runs.
//
// GEMM: a register tile of MR rows x NV vectors of C, accumulating in order (t, c) with FMAs; A is
// read through a row stride, a column stride and per-tap offsets, which makes the same kernel an
// implicit-GEMM convolution (taps = filter positions over a zero-padded input), a transposed
// product (a_rs = 1) and a plain GEMM. No packing of A; B is a row-major panel.
//
// Winograd F(2x2, 3x3): the input and output transforms of a block of tiles (the 16 GEMMs between
// them are gemm()). Attention: per (batch, head), blocks of query rows. GroupNorm: per sample.
#include <cstddef>
#include <cstdint>

#include "cpu_fast.h"

#if defined(UNET_FAST_AVX512) && defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__FMA__)
#define UNET_FAST_BUILT 1
#define UNET_FAST_NS avx512
#elif defined(UNET_FAST_AVX2) && defined(__AVX2__) && defined(__FMA__)
#define UNET_FAST_BUILT 1
#define UNET_FAST_NS avx2
#elif defined(UNET_FAST_AVX512)
#define UNET_FAST_NS avx512
#else
#define UNET_FAST_NS avx2
#endif

namespace unet::cpufast::UNET_FAST_NS {
namespace {

#if defined(UNET_FAST_BUILT)
}  // namespace
}  // namespace unet::cpufast::UNET_FAST_NS
#include <immintrin.h>
namespace unet::cpufast::UNET_FAST_NS {
namespace {

#define UNET_AI __attribute__((always_inline)) inline

// ---- vectors ------------------------------------------------------------------------------
#if defined(UNET_FAST_AVX512)
constexpr int W = 16;   // lanes
constexpr int kMR = 8;  // rows of the GEMM tile
constexpr int kNV = 2;  // vectors of the GEMM tile (MR x NV accumulators of 32 registers)
typedef __m512 V;
typedef __mmask16 Mask;
UNET_AI Mask mask_n(int n) { return (Mask)(n >= W ? 0xffffu : ((1u << n) - 1u)); }
UNET_AI V vzero() { return _mm512_setzero_ps(); }
UNET_AI V vset(float f) { return _mm512_set1_ps(f); }
UNET_AI V vload(const float* p) { return _mm512_loadu_ps(p); }
UNET_AI V vload_m(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
UNET_AI void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
UNET_AI void vstore_m(float* p, V v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
UNET_AI V vbcast(const float* p) { return _mm512_set1_ps(*p); }
UNET_AI V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
UNET_AI V vadd(V a, V b) { return _mm512_add_ps(a, b); }
UNET_AI V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
UNET_AI V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
UNET_AI V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
UNET_AI V vmax(V a, V b) { return _mm512_max_ps(a, b); }
UNET_AI V vsel(Mask m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }  // m ? a : b
// Horizontal sum / max through memory, in a fixed order (once per softmax row).
UNET_AI float hsum(V v) {
  alignas(64) float f[W];
  _mm512_store_ps(f, v);
  float s = 0;
  for (int i = 0; i < W; ++i) s += f[i];
  return s;
}
UNET_AI float hmax(V v) {
  alignas(64) float f[W];
  _mm512_store_ps(f, v);
  float m = f[0];
  for (int i = 1; i < W; ++i) m = f[i] > m ? f[i] : m;
  return m;
}
// exp(x): Cephes' expf polynomial on x - n ln2, times 2^n by scalef (exact over/underflow).
UNET_AI V vexp(V x) {
  const V n = _mm512_roundscale_ps(vmul(x, vset(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = vfma(n, vset(-0.693359375f), x);
  r = vfma(n, vset(2.12194440e-4f), r);
  V p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset(1.0f)));
  return _mm512_scalef_ps(p, n);
}
#else
constexpr int W = 8;
constexpr int kMR = 6;
constexpr int kNV = 2;  // 6 x 2 accumulators of 16 registers
typedef __m256 V;
typedef __m256i Mask;
UNET_AI Mask mask_n(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
UNET_AI V vzero() { return _mm256_setzero_ps(); }
UNET_AI V vset(float f) { return _mm256_set1_ps(f); }
UNET_AI V vload(const float* p) { return _mm256_loadu_ps(p); }
UNET_AI V vload_m(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
UNET_AI void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
UNET_AI void vstore_m(float* p, V v, Mask m) { _mm256_maskstore_ps(p, m, v); }
UNET_AI V vbcast(const float* p) { return _mm256_broadcast_ss(p); }
UNET_AI V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
UNET_AI V vadd(V a, V b) { return _mm256_add_ps(a, b); }
UNET_AI V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
UNET_AI V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
UNET_AI V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
UNET_AI V vmax(V a, V b) { return _mm256_max_ps(a, b); }
UNET_AI V vsel(Mask m, V a, V b) { return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m)); }
UNET_AI float hsum(V v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
UNET_AI float hmax(V v) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
// exp(x) as above; 2^n = 2^(n/2) 2^(n - n/2) through the exponent bits, so results down to the
// smallest denormal come out (as std::exp's do); below that 0, above FLT_MAX's log inf.
UNET_AI V vexp(V x) {
  const V hi = vset(88.7228317f), lo = vset(-103.972084f);
  const V xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const V n =
      _mm256_round_ps(vmul(xc, vset(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = vfma(n, vset(-0.693359375f), xc);
  r = vfma(n, vset(2.12194440e-4f), r);
  V p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const V e1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const V e2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  V y = vmul(vmul(p, e1), e2);
  y = _mm256_blendv_ps(y, vset(__builtin_inff()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  y = _mm256_blendv_ps(y, vzero(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN stays NaN
}
#endif

UNET_AI int imin(int a, int b) { return a < b ? a : b; }

// ---- GEMM ---------------------------------------------------------------------------------

// One MR x NV tile: rows a/c, columns [0, ncols) of the panel (ncols > (NV-1)*W).
template <int MR, int NV>
__attribute__((noinline)) void tile(const GemmArgs& g, const float* a, const float* b, float* c,
                                    const float* res, const float* bias, const float* bias2, int ncols) {
  V acc[MR][NV];
  const Mask last = mask_n(ncols - (NV - 1) * W);
  if (g.accumulate) {
    for (int r = 0; r < MR; ++r) {
      for (int v = 0; v + 1 < NV; ++v) acc[r][v] = vload(c + r * g.c_rs + v * W);
      acc[r][NV - 1] = vload_m(c + r * g.c_rs + (NV - 1) * W, last);
    }
  } else {
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = vzero();
  }
  const ptrdiff_t a_rs = g.a_rs, a_cs = g.a_cs, ldb = g.ldb;
  for (int t = 0; t < g.ntaps; ++t) {
    const float* ap = a + (g.a_off ? g.a_off[t] : 0);
    const float* bp = b + t * g.b_tap;
#pragma GCC unroll 4
    for (int k = 0; k < g.K; ++k, ap += a_cs, bp += ldb) {
      V bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = vload(bp + v * W);
      for (int r = 0; r < MR; ++r) {
        const V av = vbcast(ap + r * a_rs);
        for (int v = 0; v < NV; ++v) acc[r][v] = vfma(av, bv[v], acc[r][v]);
      }
    }
  }
  for (int v = 0; v < NV; ++v) {
    const Mask m = mask_n(ncols - v * W);
    if (bias) {
      const V e = vload_m(bias + v * W, m);
      for (int r = 0; r < MR; ++r) acc[r][v] = vadd(acc[r][v], e);
    }
    if (bias2) {
      const V e = vload_m(bias2 + v * W, m);
      for (int r = 0; r < MR; ++r) acc[r][v] = vadd(acc[r][v], e);
    }
  }
  if (res)
    for (int r = 0; r < MR; ++r) {
      for (int v = 0; v + 1 < NV; ++v) acc[r][v] = vadd(acc[r][v], vload(res + r * g.res_rs + v * W));
      acc[r][NV - 1] = vadd(acc[r][NV - 1], vload_m(res + r * g.res_rs + (NV - 1) * W, last));
    }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v + 1 < NV; ++v) vstore(c + r * g.c_rs + v * W, acc[r][v]);
    vstore_m(c + r * g.c_rs + (NV - 1) * W, acc[r][NV - 1], last);
  }
}

template <int NV>
void gemm_panel(const GemmArgs& g, int n0, int ncols) {
  const float* b = g.b + n0;
  const float* bias = g.bias ? g.bias + n0 : nullptr;
  const float* bias2 = g.bias2 ? g.bias2 + n0 : nullptr;
  for (int i = 0; i < g.M; i += kMR) {
    const int mr = imin(kMR, g.M - i);
    const float* a = g.a + i * g.a_rs;
    float* c = g.c + i * g.c_rs + n0;
    const float* res = g.res ? g.res + i * g.res_rs + n0 : nullptr;
    switch (mr) {
#define UNET_TILE(R)                                  \
  case R:                                             \
    tile<R, NV>(g, a, b, c, res, bias, bias2, ncols); \
    break;
      UNET_TILE(1)
      UNET_TILE(2)
      UNET_TILE(3)
      UNET_TILE(4)
      UNET_TILE(5)
      UNET_TILE(6)
#if defined(UNET_FAST_AVX512)
      UNET_TILE(7)
      UNET_TILE(8)
#endif
#undef UNET_TILE
    }
  }
}

void gemm(const GemmArgs& g) {
  for (int n0 = 0; n0 < g.N; n0 += kNV * W) {
    const int nc = imin(kNV * W, g.N - n0);
    if (nc > W)
      gemm_panel<kNV>(g, n0, nc);
    else
      gemm_panel<1>(g, n0, nc);
  }
}

// ---- Winograd F(2x2, 3x3) transforms -------------------------------------------------------
// (the GEMMs between them are gemm() above, one per point of the 4x4 transformed tile)

// B^T of one column x of the patch rows (rowp[r]: row 2i-1+r of the image, nullptr outside it):
// u = (d0 - d2, d1 + d2, d2 - d1, d1 - d3), zeros outside the image.
UNET_AI void wino_col(const float* const rowp[4], int x, int width, int C, int c0, Mask k, V u[4]) {
  V d[4];
  for (int r = 0; r < 4; ++r)
    d[r] = (rowp[r] && x >= 0 && x < width) ? vload_m(rowp[r] + (size_t)x * C + c0, k) : vzero();
  u[0] = vsub(d[0], d[2]);
  u[1] = vadd(d[1], d[2]);
  u[2] = vsub(d[2], d[1]);
  u[3] = vsub(d[1], d[3]);
}

// V[xi][t][c] = (B^T d B)[xi] for each tile t of the block, d the 4x4 input patch at rows
// 2i-1.., cols 2j-1.. (zeros outside the image), B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
// Along a row of tiles the patches overlap by two columns: each column's B^T d is computed once.
void wino_input(const WinoArgs& a) {
  const int C = a.C;
  for (int i = a.i0; i < a.i1; ++i) {
    const float* rowp[4];
    for (int r = 0; r < 4; ++r) {
      const int y = 2 * i - 1 + r;
      rowp[r] = (y >= 0 && y < a.H) ? a.x + (size_t)y * a.W * C : nullptr;
    }
    float* vrow = a.v + (size_t)(i - a.i0) * a.tw * C;
    for (int c0 = 0; c0 < C; c0 += W) {
      const Mask k = mask_n(C - c0);
      V u0[4], u1[4], u2[4], u3[4];  // columns 2j-1, 2j, 2j+1, 2j+2 of tile j
      wino_col(rowp, -1, a.W, C, c0, k, u0);
      wino_col(rowp, 0, a.W, C, c0, k, u1);
      for (int j = 0; j < a.tw; ++j) {
        wino_col(rowp, 2 * j + 1, a.W, C, c0, k, u2);
        wino_col(rowp, 2 * j + 2, a.W, C, c0, k, u3);
        float* v = vrow + (size_t)j * C + c0;
        for (int r = 0; r < 4; ++r) {  // (B^T d) B
          vstore_m(v + (4 * r + 0) * a.v_mat, vsub(u0[r], u2[r]), k);
          vstore_m(v + (4 * r + 1) * a.v_mat, vadd(u1[r], u2[r]), k);
          vstore_m(v + (4 * r + 2) * a.v_mat, vsub(u2[r], u1[r]), k);
          vstore_m(v + (4 * r + 3) * a.v_mat, vsub(u1[r], u3[r]), k);
        }
        for (int r = 0; r < 4; ++r) u0[r] = u2[r], u1[r] = u3[r];
      }
    }
  }
}

// y[2x2 outputs of tile t][co] = (A^T m A) + bias + bias2 + res, A^T = [1 1 1 0; 0 1 -1 -1];
// outputs past the image's edge (odd H or W) are not written.
void wino_output(const WinoArgs& a) {
  const int Co = a.Co;
  int t = 0;
  for (int i = a.i0; i < a.i1; ++i)
    for (int j = 0; j < a.tw; ++j, ++t) {
      const float* m = a.m + (size_t)t * a.m_ld;
      for (int c0 = 0; c0 < Co; c0 += W) {
        const Mask k = mask_n(Co - c0);
        V s[2][4];
        for (int q = 0; q < 4; ++q) {  // A^T m, column q
          const V m0 = vload(m + (0 + q) * a.m_mat + c0), m1 = vload(m + (4 + q) * a.m_mat + c0);
          const V m2 = vload(m + (8 + q) * a.m_mat + c0), m3 = vload(m + (12 + q) * a.m_mat + c0);
          s[0][q] = vadd(vadd(m0, m1), m2);
          s[1][q] = vsub(vsub(m1, m2), m3);
        }
        V e = vzero();
        if (a.bias) e = vload_m(a.bias + c0, k);
        const V e2 = a.bias2 ? vload_m(a.bias2 + c0, k) : vzero();
        for (int r = 0; r < 2; ++r) {
          const int y = 2 * i + r;
          if (y >= a.H) break;
          const V o[2] = {vadd(vadd(s[r][0], s[r][1]), s[r][2]), vsub(vsub(s[r][1], s[r][2]), s[r][3])};
          for (int q = 0; q < 2; ++q) {
            const int x = 2 * j + q;
            if (x >= a.W) break;
            const size_t px = (size_t)y * a.W + x;
            V out = o[q];
            if (a.bias) out = vadd(out, e);
            if (a.bias2) out = vadd(out, e2);
            if (a.res) out = vadd(out, vload_m(a.res + px * Co + c0, k));
            vstore_m(a.y + px * Co + c0, out, k);
          }
        }
      }
    }
}

// ---- attention ----------------------------------------------------------------------------

// Softmax of row p[0, T) in place; returns the log-sum-exp of the row.
float softmax_row(float* p, int T) {
  V mx = vset(-__builtin_inff());
  int u = 0;
  for (; u + W <= T; u += W) mx = vmax(mx, vload(p + u));
  float m = hmax(mx);
  for (; u < T; ++u) m = p[u] > m ? p[u] : m;
  const V mv = vset(m);
  V s = vzero();
  for (u = 0; u + W <= T; u += W) {
    const V e = vexp(vsub(vload(p + u), mv));
    vstore(p + u, e);
    s = vadd(s, e);
  }
  if (u < T) {
    const Mask k = mask_n(T - u);
    const V e = vexp(vsub(vload_m(p + u, k), mv));
    vstore_m(p + u, e, k);
    s = vadd(s, vsel(k, e, vzero()));  // masked-off lanes would be exp(-m)
  }
  const float z = hsum(s);
  const V inv = vset(1.0f / z);
  for (u = 0; u + W <= T; u += W) vstore(p + u, vmul(vload(p + u), inv));
  if (u < T) {
    const Mask k = mask_n(T - u);
    vstore_m(p + u, vmul(vload_m(p + u, k), inv), k);
  }
  return (float)((double)m + __builtin_log((double)z));
}

// p[u] = exp(p[u] - l) for u < T.
void exp_row(float* p, int T, float l) {
  const V lv = vset(l);
  int u = 0;
  for (; u + W <= T; u += W) vstore(p + u, vexp(vsub(vload(p + u), lv)));
  if (u < T) {
    const Mask k = mask_n(T - u);
    vstore_m(p + u, vexp(vsub(vload_m(p + u, k), lv)), k);
  }
}

// g[u] = w[u] (g[u] - sum_u' w g) s for u < T.
void softmax_bwd_row(const float* w, float* g, int T, float s) {
  V acc = vzero();
  int u = 0;
  for (; u + W <= T; u += W) acc = vfma(vload(w + u), vload(g + u), acc);
  if (u < T) {
    const Mask k = mask_n(T - u);
    acc = vfma(vload_m(w + u, k), vload_m(g + u, k), acc);
  }
  const V dt = vset(hsum(acc)), sv = vset(s);
  for (u = 0; u + W <= T; u += W) vstore(g + u, vmul(vmul(vload(w + u), vsub(vload(g + u), dt)), sv));
  if (u < T) {
    const Mask k = mask_n(T - u);
    vstore_m(g + u, vmul(vmul(vload_m(w + u, k), vsub(vload_m(g + u, k), dt)), sv), k);
  }
}

// Zeros columns [c0, c1) of `rows` rows of stride ld (the padding a B operand's whole-vector loads
// read; nothing when the shapes are multiples of 16).
void zero_cols(float* p, int rows, size_t ld, size_t c0, size_t c1) {
  if (c0 >= c1) return;
  for (int r = 0; r < rows; ++r)
    for (size_t c = c0; c < c1; ++c) p[r * ld + c] = 0;
}

// Scratch: [T, dd] matrices (A operands, and B operands with N = d), [d, ld] ones (B operands
// with N = T) and two [kAttnRB, ld] blocks of weights (rows of the softmax).
struct AttnBufs {
  size_t ld, dd;
  float *q, *k, *v, *go, *kt, *vt, *p, *dl;
};
AttnBufs attn_bufs(int T, int d, float* s) {
  AttnBufs b;
  b.ld = (size_t)(T + 15) / 16 * 16;
  b.dd = (size_t)(d + 15) / 16 * 16;
  const size_t td = (size_t)T * b.dd, dl = b.dd * b.ld, tl = (size_t)kAttnRB * b.ld;
  b.q = s, b.k = b.q + td, b.v = b.k + td, b.go = b.v + td;
  b.kt = b.go + td, b.vt = b.kt + dl, b.p = b.vt + dl, b.dl = b.p + tl;
  return b;
}

// Per block of kAttnRB query rows (the block's weights stay in cache): logits = q k^T, softmax
// (lse kept), out = w v. Every element is computed as without blocks.
void attn_fwd(const AttnArgs& a, float* scratch) {
  const int T = a.T, d = a.d;
  const size_t row = (size_t)3 * a.C;
  AttnBufs s = attn_bufs(T, d, scratch);
  zero_cols(s.kt, d, s.ld, T, s.ld);  // padding columns of the B operands are read (and dropped)
  zero_cols(s.v, T, s.dd, d, s.dd);
  for (int t = 0; t < T; ++t) {
    const float* r = a.qkv + t * row;
    for (int i = 0; i < d; ++i) {
      s.q[t * s.dd + i] = r[a.q_off + i] * a.scale;
      s.kt[i * s.ld + t] = r[a.k_off + i] * a.scale;
      s.v[t * s.dd + i] = r[a.v_off + i];
    }
  }
  for (int t0 = 0; t0 < T; t0 += kAttnRB) {
    const int rb = imin(kAttnRB, T - t0);
    GemmArgs g = gemm_args();  // logits [rb, T] = q k^T
    g.M = rb, g.N = T, g.K = d, g.a = s.q + t0 * s.dd, g.a_rs = (ptrdiff_t)s.dd, g.b = s.kt;
    g.ldb = (ptrdiff_t)s.ld, g.c = s.p, g.c_rs = (ptrdiff_t)s.ld;
    gemm(g);
    for (int t = 0; t < rb; ++t) a.lse[t0 + t] = softmax_row(s.p + t * s.ld, T);
    GemmArgs o = gemm_args();  // out [rb, d] = w v
    o.M = rb, o.N = d, o.K = T, o.a = s.p, o.a_rs = (ptrdiff_t)s.ld, o.b = s.v, o.ldb = (ptrdiff_t)s.dd;
    o.c = a.out + a.o_off + (size_t)t0 * a.C, o.c_rs = a.C;
    gemm(o);
  }
}

// Per block of kAttnRB query rows t: w = exp(q k^T - lse), dw = dout v^T, dlogit = w (dw - sum w dw)
// scale; dq = dlogit k for the block's rows; dv += w^T dout and dk += dlogit^T q over the blocks in
// order (each element summed over t ascending, as without blocks).
void attn_bwd(const AttnArgs& a, float* scratch) {
  const int T = a.T, d = a.d;
  const size_t row = (size_t)3 * a.C;
  AttnBufs s = attn_bufs(T, d, scratch);
  zero_cols(s.kt, d, s.ld, T, s.ld);
  zero_cols(s.vt, d, s.ld, T, s.ld);
  zero_cols(s.q, T, s.dd, d, s.dd);
  zero_cols(s.k, T, s.dd, d, s.dd);
  zero_cols(s.go, T, s.dd, d, s.dd);
  for (int t = 0; t < T; ++t) {
    const float* r = a.qkv + t * row;
    const float* gr = a.dout + (size_t)t * a.C + a.o_off;
    for (int i = 0; i < d; ++i) {
      s.q[t * s.dd + i] = r[a.q_off + i] * a.scale;
      s.k[t * s.dd + i] = r[a.k_off + i] * a.scale;
      s.kt[i * s.ld + t] = r[a.k_off + i] * a.scale;
      s.vt[i * s.ld + t] = r[a.v_off + i];
      s.go[t * s.dd + i] = gr[i];
    }
  }
  for (int t0 = 0; t0 < T; t0 += kAttnRB) {
    const int rb = imin(kAttnRB, T - t0);
    GemmArgs g = gemm_args();  // weights: exp(q k^T - lse)
    g.M = rb, g.N = T, g.K = d, g.a = s.q + t0 * s.dd, g.a_rs = (ptrdiff_t)s.dd, g.b = s.kt;
    g.ldb = (ptrdiff_t)s.ld, g.c = s.p, g.c_rs = (ptrdiff_t)s.ld;
    gemm(g);
    for (int t = 0; t < rb; ++t) exp_row(s.p + t * s.ld, T, a.lse[t0 + t]);
    GemmArgs dv = gemm_args();  // dv [T, d] += w^T dout
    dv.M = T, dv.N = d, dv.K = rb, dv.a = s.p, dv.a_rs = 1, dv.a_cs = (ptrdiff_t)s.ld,
    dv.b = s.go + t0 * s.dd;
    dv.ldb = (ptrdiff_t)s.dd, dv.c = a.dqkv + a.v_off, dv.c_rs = (ptrdiff_t)row, dv.accumulate = t0 > 0;
    gemm(dv);
    GemmArgs dw = gemm_args();  // dw [rb, T] = dout v^T
    dw.M = rb, dw.N = T, dw.K = d, dw.a = s.go + t0 * s.dd, dw.a_rs = (ptrdiff_t)s.dd, dw.b = s.vt;
    dw.ldb = (ptrdiff_t)s.ld, dw.c = s.dl, dw.c_rs = (ptrdiff_t)s.ld;
    gemm(dw);
    for (int t = 0; t < rb; ++t) softmax_bwd_row(s.p + t * s.ld, s.dl + t * s.ld, T, a.scale);
    GemmArgs dq = gemm_args();  // dq [rb, d] = dlogit k
    dq.M = rb, dq.N = d, dq.K = T, dq.a = s.dl, dq.a_rs = (ptrdiff_t)s.ld, dq.b = s.k,
    dq.ldb = (ptrdiff_t)s.dd;
    dq.c = a.dqkv + a.q_off + (size_t)t0 * row, dq.c_rs = (ptrdiff_t)row;
    gemm(dq);
    GemmArgs dk = gemm_args();  // dk [T, d] += dlogit^T q
    dk.M = T, dk.N = d, dk.K = rb, dk.a = s.dl, dk.a_rs = 1, dk.a_cs = (ptrdiff_t)s.ld,
    dk.b = s.q + t0 * s.dd;
    dk.ldb = (ptrdiff_t)s.dd, dk.c = a.dqkv + a.k_off, dk.c_rs = (ptrdiff_t)row, dk.accumulate = t0 > 0;
    gemm(dk);
  }
}

// ---- groupnorm ----------------------------------------------------------------------------
// Per sample, [HW, C] rows. Sums over rows run per chunk of W channels (masked at the end) in
// blocks of kRB rows: four float accumulators inside a block (rows r % 4), the block's sum added
// to double accumulators, so the statistics keep the reference's double precision where it
// matters (many rows) at float speed. Every order is fixed by the shapes.

constexpr double kEps = 1e-5;  // lib/ops/groupnorm.h's kGroupNormEps
constexpr int kRB = 32;        // rows per float block

#if defined(UNET_FAST_AVX512)
typedef __m512d DV;  // W/2 doubles
constexpr int DW = 8;
UNET_AI DV dzero() { return _mm512_setzero_pd(); }
UNET_AI void dstore(double* p, DV v) { _mm512_storeu_pd(p, v); }
UNET_AI DV dadd(DV a, DV b) { return _mm512_add_pd(a, b); }
UNET_AI DV dlo(V v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
UNET_AI DV dhi(V v) {
  return _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castpd_ps(
      _mm512_shuffle_f64x2(_mm512_castps_pd(v), _mm512_castps_pd(v), _MM_SHUFFLE(3, 2, 3, 2)))));
}
// 1/d to ~1e-8 relative: the 14-bit estimate and one Newton step (d >= 1 here, finite).
UNET_AI V vrcp(V d) {
  const V r = _mm512_rcp14_ps(d);
  return vmul(r, _mm512_fnmadd_ps(d, r, vset(2.0f)));
}
#else
typedef __m256d DV;
constexpr int DW = 4;
UNET_AI DV dzero() { return _mm256_setzero_pd(); }
UNET_AI void dstore(double* p, DV v) { _mm256_storeu_pd(p, v); }
UNET_AI DV dadd(DV a, DV b) { return _mm256_add_pd(a, b); }
UNET_AI DV dlo(V v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
UNET_AI DV dhi(V v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
// 1/d: the 12-bit estimate and two Newton steps (~1e-7 relative).
UNET_AI V vrcp(V d) {
  V r = _mm256_rcp_ps(d);
  r = vmul(r, _mm256_fnmadd_ps(d, r, vset(2.0f)));
  return vmul(r, _mm256_fnmadd_ps(d, r, vset(2.0f)));
}
#endif

// sigmoid(z) = 1 / (1 + exp(-z)); z below -88 is taken as -88 (the result ~1e-38, exp stays
// finite); NaN stays NaN (max returns its second operand for NaN).
UNET_AI V sigmoid_v(V z) {
  const V zc = vmax(vset(-88.0f), z);
  return vrcp(vadd(vset(1.0f), vexp(vsub(vzero(), zc))));
}

// A pair of double vectors holding the running sums of one chunk of W channels.
struct DSum {
  DV lo, hi;
};
UNET_AI void dsum_zero(DSum& s) { s.lo = dzero(), s.hi = dzero(); }
UNET_AI void dsum_add(DSum& s, V v) {
  s.lo = dadd(s.lo, dlo(v));
  s.hi = dadd(s.hi, dhi(v));
}
// Stores the W sums of the chunk at c0 into acc (valid lanes only).
UNET_AI void dsum_store(const DSum& s, double* acc, int c0, int C) {
  alignas(64) double t[W];
  dstore(t, s.lo);
  dstore(t + DW, s.hi);
  for (int i = 0; i < W && c0 + i < C; ++i) acc[c0 + i] = t[i];
}

// Per-channel values (each array padded to whole vectors with zeros): mu, rs (the group's mean and
// rstd), rg = rs gamma, g, b (gamma, beta), sc1 = 1 + scale, sh = shift, ma, mb (backward).
struct GnBufs {
  size_t Cp;
  float *mu, *rs, *rg, *g, *b, *sc1, *sh, *ma, *mb, *dz;
  double *s1, *s2, *s3, *s4;
};
GnBufs gn_bufs(const GnArgs& a, float* s, bool with_dz) {
  GnBufs b;
  const int C = a.C;
  b.Cp = ((size_t)C + 15) / 16 * 16;
  double* d = (double*)s;
  b.s1 = d, b.s2 = d + b.Cp, b.s3 = d + 2 * b.Cp, b.s4 = d + 3 * b.Cp;
  float* f = (float*)(d + 4 * b.Cp);
  float* arr[9];
  for (int i = 0; i < 9; ++i) arr[i] = f + i * b.Cp;
  b.mu = arr[0], b.rs = arr[1], b.rg = arr[2], b.g = arr[3], b.b = arr[4], b.sc1 = arr[5], b.sh = arr[6];
  b.ma = arr[7], b.mb = arr[8];
  b.dz = with_dz ? f + 9 * b.Cp : nullptr;
  for (size_t i = 0; i < 9 * b.Cp; ++i) f[i] = 0;
  for (int c = 0; c < C; ++c) {
    b.g[c] = a.gamma[c];
    b.b[c] = a.beta[c];
    b.sc1[c] = a.ss ? 1.0f + a.ss[c] : 1.0f;
    b.sh[c] = a.ss ? a.ss[C + c] : 0.0f;
  }
  return b;
}

// mu, rs, rg from the sample's mean and rstd.
void gn_params(const GnArgs& a, GnBufs& s) {
  const int C = a.C, cg = C / a.G;
  for (int c = 0; c < C; ++c) {
    s.mu[c] = a.mean[c / cg];
    s.rs[c] = a.rstd[c / cg];
    s.rg[c] = s.rs[c] * s.g[c];
  }
}

// Per-channel sums over rows of f(x row chunk) into acc (double), blocks of kRB rows.
template <class F>
UNET_AI void chunk_sums(const float* x, int HW, int C, int c0, Mask k, double* acc, F f) {
  DSum s;
  dsum_zero(s);
  for (int r0 = 0; r0 < HW; r0 += kRB) {
    const int r1 = imin(HW, r0 + kRB);
    V f0 = vzero(), f1 = vzero(), f2 = vzero(), f3 = vzero();
    int r = r0;
    const float* p = x + (size_t)r0 * C + c0;
    for (; r + 4 <= r1; r += 4, p += 4 * C) {
      f0 = f(f0, vload_m(p, k));
      f1 = f(f1, vload_m(p + C, k));
      f2 = f(f2, vload_m(p + 2 * C, k));
      f3 = f(f3, vload_m(p + 3 * C, k));
    }
    for (; r < r1; ++r, p += C) f0 = f(f0, vload_m(p, k));
    dsum_add(s, vadd(vadd(f0, f1), vadd(f2, f3)));
  }
  dsum_store(s, acc, c0, C);
}

// mean and rstd of the sample: the mean, then the squared deviations from it (rounded to float),
// corrected for that rounding: var = sum (x - m')^2 / n - (m - m')^2.
void gn_stats(const GnArgs& a, GnBufs& s) {
  const int C = a.C, G = a.G, HW = a.HW, cg = C / G;
  const double n = (double)HW * cg;
  for (int c0 = 0; c0 < C; c0 += W)
    chunk_sums(a.x, HW, C, c0, mask_n(C - c0), s.s1, [](V acc, V v) { return vadd(acc, v); });
  double* mg = s.s3;  // per group (G <= C)
  double* vg = s.s4;
  for (int g = 0; g < G; ++g) mg[g] = 0, vg[g] = 0;
  for (int c = 0; c < C; ++c) mg[c / cg] += s.s1[c];
  for (int g = 0; g < G; ++g) mg[g] /= n;
  for (int c = 0; c < C; ++c) s.mu[c] = (float)mg[c / cg];
  for (int c0 = 0; c0 < C; c0 += W) {
    const V m = vload(s.mu + c0);
    chunk_sums(a.x, HW, C, c0, mask_n(C - c0), s.s2, [m](V acc, V v) {
      const V d = vsub(v, m);
      return vfma(d, d, acc);
    });
  }
  for (int c = 0; c < C; ++c) vg[c / cg] += s.s2[c];
  for (int g = 0; g < G; ++g) {
    const double dm = mg[g] - (double)(float)mg[g];
    const double var = vg[g] / n - dm * dm;
    a.mean[g] = (float)mg[g];
    a.rstd[g] = (float)(1.0 / __builtin_sqrt((var > 0 ? var : 0) + kEps));
  }
}

// y = [SiLU]((x - mu) rs gamma + beta [* (1 + scale) + shift]) from the sample's statistics.
void gn_apply_rows(const GnArgs& a, GnBufs& s) {
  const int C = a.C, HW = a.HW;
  const bool ss = a.ss != nullptr, silu = a.silu;
  const float* x = a.x;
  float* y = a.y;
  for (int r = 0; r < HW; ++r, x += C, y += C)
    for (int c0 = 0; c0 < C; c0 += W) {
      const Mask k = mask_n(C - c0);
      V z = vfma(vsub(vload_m(x + c0, k), vload(s.mu + c0)), vload(s.rg + c0), vload(s.b + c0));
      if (ss) z = vfma(z, vload(s.sc1 + c0), vload(s.sh + c0));
      if (silu) z = vmul(z, sigmoid_v(z));
      vstore_m(y + c0, z, k);
    }
}

void gn_fwd(const GnArgs& a, float* scratch) {
  GnBufs s = gn_bufs(a, scratch, false);
  gn_stats(a, s);
  gn_params(a, s);
  gn_apply_rows(a, s);
}

void gn_apply(const GnArgs& a, float* scratch) {
  GnBufs s = gn_bufs(a, scratch, false);
  gn_params(a, s);
  gn_apply_rows(a, s);
}

void gn_bwd(const GnArgs& a, float* scratch) {
  const int C = a.C, HW = a.HW, G = a.G, cg = C / G;
  const double n = (double)HW * cg;
  GnBufs s = gn_bufs(a, scratch, true);
  gn_params(a, s);
  const bool ss = a.ss != nullptr, silu = a.silu;
  // Per chunk of channels, one pass over the rows: nrm = xhat gamma + beta, z = nrm (1 + scale) +
  // shift, dz = dy SiLU'(z) (kept for dx), dn = dz (1 + scale); sums of dz nrm and dz (dss), dn
  // and dn xhat (the norm's gradient), in float blocks of kRB rows added to double.
  for (int c0 = 0; c0 < C; c0 += W) {
    const Mask k = mask_n(C - c0);
    const V mu = vload(s.mu + c0), rs = vload(s.rs + c0), g = vload(s.g + c0), b = vload(s.b + c0),
            sc1 = vload(s.sc1 + c0), sh = vload(s.sh + c0), one = vset(1.0f);
    DSum t_sc, t_sh, t_z, t_zx;
    dsum_zero(t_sc), dsum_zero(t_sh), dsum_zero(t_z), dsum_zero(t_zx);
    for (int r0 = 0; r0 < HW; r0 += kRB) {
      const int r1 = imin(HW, r0 + kRB);
      V f_sc = vzero(), f_sh = vzero(), f_z = vzero(), f_zx = vzero();
      const float* x = a.x + (size_t)r0 * C + c0;
      const float* dy = a.dy + (size_t)r0 * C + c0;
      float* dz = s.dz + (size_t)r0 * C + c0;
      for (int r = r0; r < r1; ++r, x += C, dy += C, dz += C) {
        const V xh = vmul(vsub(vload_m(x, k), mu), rs);
        const V nv = vfma(xh, g, b);
        V gv = vload_m(dy, k);
        if (silu) {
          const V z = ss ? vfma(nv, sc1, sh) : nv;
          const V sg = sigmoid_v(z);
          gv = vmul(gv, vmul(sg, vfma(z, vsub(one, sg), one)));
        }
        vstore_m(dz, gv, k);
        const V dn = vmul(gv, sc1);
        f_sc = vfma(gv, nv, f_sc);
        f_sh = vadd(f_sh, gv);
        f_z = vadd(f_z, dn);
        f_zx = vfma(dn, xh, f_zx);
      }
      dsum_add(t_sc, f_sc), dsum_add(t_sh, f_sh), dsum_add(t_z, f_z), dsum_add(t_zx, f_zx);
    }
    dsum_store(t_z, s.s1, c0, C);
    dsum_store(t_zx, s.s2, c0, C);
    dsum_store(t_sc, s.s3, c0, C);
    dsum_store(t_sh, s.s4, c0, C);
  }
  if (a.dss)
    for (int c = 0; c < C; ++c) a.dss[c] = (float)s.s3[c], a.dss[C + c] = (float)s.s4[c];
  for (int c = 0; c < C; ++c) a.dgamma_part[c] = s.s2[c], a.dbeta_part[c] = s.s1[c];
  if (!a.dx) return;
  for (int gi = 0; gi < G; ++gi) {
    double sa = 0, sb = 0;  // group sums of dn gamma and dn gamma xhat
    for (int c = gi * cg; c < (gi + 1) * cg; ++c) {
      sa += a.gamma[c] * s.s1[c];
      sb += a.gamma[c] * s.s2[c];
    }
    for (int c = gi * cg; c < (gi + 1) * cg; ++c) s.ma[c] = (float)(sa / n), s.mb[c] = (float)(sb / n);
  }
  // dx = rs (dn gamma - ma - xhat mb), dn = dz (1 + scale); rows outer (sequential memory).
  const float* x = a.x;
  const float* dz = s.dz;
  float* dx = a.dx;
  for (int r = 0; r < HW; ++r, x += C, dz += C, dx += C)
    for (int c0 = 0; c0 < C; c0 += W) {
      const Mask k = mask_n(C - c0);
      const V rs = vload(s.rs + c0);
      const V xh = vmul(vsub(vload_m(x + c0, k), vload(s.mu + c0)), rs);
      const V gs = vmul(vload(s.sc1 + c0), vload(s.g + c0));
      const V t = vsub(vfma(vload(dz + c0), gs, vsub(vzero(), vload(s.ma + c0))), vmul(xh, vload(s.mb + c0)));
      vstore_m(dx + c0, vmul(rs, t), k);
    }
}

#undef UNET_AI
#endif  // UNET_FAST_BUILT

}  // namespace
}  // namespace unet::cpufast::UNET_FAST_NS

// The table the including file exports (function pointers only: no code runs to build it).
#if defined(UNET_FAST_BUILT)
#define UNET_FAST_TABLE                                                                                  \
  {                                                                                                      \
    UNET_FAST_NAME, UNET_FAST_NS::W, true, UNET_FAST_NS::gemm, UNET_FAST_NS::wino_input,                 \
        UNET_FAST_NS::wino_output, UNET_FAST_NS::attn_fwd, UNET_FAST_NS::attn_bwd, UNET_FAST_NS::gn_fwd, \
        UNET_FAST_NS::gn_apply, UNET_FAST_NS::gn_bwd                                                     \
  }
#else
#define UNET_FAST_TABLE \
  { UNET_FAST_NAME, 0, false, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr }
#endif
