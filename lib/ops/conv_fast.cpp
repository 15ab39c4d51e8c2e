// CPU engine, conv family: the fast variants (registered ahead of "ref" by register_conv_cpu), f32
// (bf16 through the emulation):
//  * "avx512_wino", "avx2_wino" (first where they apply: 3x3, stride 1, >= 16 channels in and
//    out): Winograd F(2x2, 3x3) forward and data gradient, 2.25x fewer multiplies; per sample and
//    block of ~32 tiles an input transform, 16 GEMMs and an output transform with the epilogue;
//  * "avx512", "avx2": implicit GEMM on the register-tiled kernel of cpu_fast_impl.h.
//    Forward: the input zero-padded once, then per output row (b, oy) C[ox, co] = sum over the
//    k*k taps and ci of xpad[b, oy*s + ky, ox*s + kx, ci] w[co, ky, kx, ci], with the epilogue
//    (bias, emb[b], res) applied in registers; a 1x1 stride-1 conv is a plain GEMM over pixels.
//    Data gradient: per stride phase (iy % s, ix % s) a convolution of the padded dy with the taps
//    that reach that phase (all k*k for stride 1), written to every s-th pixel of dx. Filter
//    gradient: dw[co, tap, ci] = sum over samples and pixels (in order) of dy[p, co] x[p + tap, ci]
//    over the pixels whose tap lies in the image (no padded copy), each (tap, block of 8 co) owned
//    by one thread, which runs samples outer (one sample's data stays in its cache); db and demb
//    as in the reference.
// Every output element is summed by one task in an order fixed by the shapes: the results do not
// depend on the thread count (tests/test_conv.cpp, tests/test_determinism.cpp).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "conv.h"
#include "cpu_fast_variants.h"
#include "elementwise.h"

namespace unet {
namespace {

using cpufast::gemm_args;
using cpufast::GemmArgs;
using cpufast::Kernels;
using cpufast::round_up;
using cpufast::thread_buffer;

// Padded B rows: every B row is read in whole 16-float vectors (the widest kernel's).
constexpr int kPadN = 16;
// Slack after an A/B buffer read by whole vectors from its last row.
constexpr size_t kSlack = 64;

bool par(double flops) { return flops > 2e5; }

// One sample x [H, W, C] zero-padded by p rows and columns on every side ([H + 2p, W + 2p, C], then
// kSlack zeros), in buffer `slot` of the calling thread: each thread pads the samples it works on,
// so the copy is hot in its cache and the scratch is one sample, not the batch.
const float* pad_sample(const float* x, int H, int W, int C, int p, int slot) {
  const int Hp = H + 2 * p, Wp = W + 2 * p;
  const size_t rowp = (size_t)Wp * C, row = (size_t)W * C;
  float* xp = thread_buffer(slot, (size_t)Hp * rowp + kSlack);
  std::memset(xp, 0, sizeof(float) * p * rowp);
  for (int y = 0; y < H; ++y) {
    float* d = xp + (size_t)(y + p) * rowp;
    std::memset(d, 0, sizeof(float) * p * C);
    std::memcpy(d + (size_t)p * C, x + (size_t)y * row, sizeof(float) * row);
    std::memset(d + (size_t)(p + W) * C, 0, sizeof(float) * p * C);
  }
  std::memset(xp + (size_t)(p + H) * rowp, 0, sizeof(float) * (p * rowp + kSlack));
  return xp;
}

bool k_and_stride_ok(int k, int stride) { return (k == 1 || k == 3) && (stride == 1 || stride == 2); }
bool fwd_ok(const ConvFwd& o) { return k_and_stride_ok((int)o.w.dim[1], o.stride); }
bool bwd_data_ok(const ConvBwdData& o) { return k_and_stride_ok((int)o.w.dim[1], o.stride); }
bool bwd_filter_ok(const ConvBwdFilter& o) {
  return k_and_stride_ok(o.dw.defined() ? (int)o.dw.dim[1] : 1, o.stride);
}

// ---- Winograd F(2x2, 3x3): 3x3 stride-1 convolutions with 2.25x fewer multiplies ----

// U[xi][in][out] = G g G^T of each 3x3 filter, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1], from
// gt [9][nin][ldu] (gt[ky * 3 + kx][in][out] = g(out, ky, kx, in), zeros for out >= nout, so U's
// padding is zeros too); in buffer `slot` of the calling thread. The inner loop runs over out
// (contiguous in gt and U), which the compiler vectorises.
float* wino_filters(const float* gt, int nin, size_t ldu, int slot) {
  float* U = thread_buffer(slot, 16 * (size_t)nin * ldu);
#pragma omp parallel for schedule(static) if ((size_t)nin * ldu > 1024)
  for (int in = 0; in < nin; ++in) {
    const float* g[9];
    float* u[16];
    for (int tap = 0; tap < 9; ++tap) g[tap] = gt + ((size_t)tap * nin + in) * ldu;
    for (int xi = 0; xi < 16; ++xi) u[xi] = U + ((size_t)xi * nin + in) * ldu;
#pragma omp simd
    for (size_t o = 0; o < ldu; ++o) {
      float t[4][3];
      for (int kx = 0; kx < 3; ++kx) {
        const float g0 = g[kx][o], g1 = g[3 + kx][o], g2 = g[6 + kx][o];
        t[0][kx] = g0;
        t[1][kx] = 0.5f * (g0 + g1 + g2);
        t[2][kx] = 0.5f * (g0 - g1 + g2);
        t[3][kx] = g2;
      }
      for (int r = 0; r < 4; ++r) {
        u[4 * r + 0][o] = t[r][0];
        u[4 * r + 1][o] = 0.5f * (t[r][0] + t[r][1] + t[r][2]);
        u[4 * r + 2][o] = 0.5f * (t[r][0] - t[r][1] + t[r][2]);
        u[4 * r + 3][o] = t[r][2];
      }
    }
  }
  return U;
}

// y [B, H, W, nout] = conv3x3(x [B, H, W, nin]) (stride 1, padding 1) + bias + emb[b] + res, from
// U (wino_filters). A task = one sample's block of tile rows (~32 tiles): input transform, 16
// GEMMs [tiles, nin] x [nin, nout], output transform with the epilogue, all in the thread's cache.
void wino_conv(const Kernels& K, const float* x, int B, int H, int W, int nin, int nout, const float* U,
               size_t ldu, float* y, const float* bias, const float* emb, const float* res) {
  const int th = (H + 1) / 2, tw = (W + 1) / 2;
  const int rb = std::min(th, std::max(1, 32 / tw)), nblk = (th + rb - 1) / rb;
  const size_t m_ld = round_up(nout, kPadN), ntmax = (size_t)rb * tw;
  const bool parallel = par(2.0 * B * H * W * nin * nout * 4);
#pragma omp parallel for schedule(static) if (parallel)
  for (int task = 0; task < B * nblk; ++task) {
    const int b = task / nblk, i0 = task % nblk * rb, i1 = std::min(th, i0 + rb), nt = (i1 - i0) * tw;
    float* vb = thread_buffer(4, 16 * ntmax * nin);
    float* mb = thread_buffer(5, 16 * ntmax * m_ld);
    cpufast::WinoArgs a{};
    a.H = H, a.W = W, a.C = nin, a.Co = nout, a.tw = tw, a.i0 = i0, a.i1 = i1;
    a.x = x + (size_t)b * H * W * nin, a.v = vb, a.v_mat = (ptrdiff_t)nt * nin;
    a.m = mb, a.m_mat = (ptrdiff_t)(nt * m_ld), a.m_ld = (ptrdiff_t)m_ld;
    a.y = y + (size_t)b * H * W * nout, a.bias = bias, a.bias2 = emb ? emb + (size_t)b * nout : nullptr;
    a.res = res ? res + (size_t)b * H * W * nout : nullptr;
    K.wino_input(a);
    for (int xi = 0; xi < 16; ++xi) {
      GemmArgs g = gemm_args();
      g.M = nt, g.N = nout, g.K = nin, g.a = a.v + xi * a.v_mat, g.a_rs = nin;
      g.b = U + (size_t)xi * nin * ldu, g.ldb = (ptrdiff_t)ldu, g.c = mb + xi * a.m_mat,
      g.c_rs = (ptrdiff_t)m_ld;
      K.gemm(g);
    }
    K.wino_output(a);
  }
}

// Where Winograd pays: 3x3, stride 1, at least 16 channels in and out (narrower convs waste the
// transforms' vector lanes).
bool wino_fwd_ok(const ConvFwd& o) {
  return o.w.dim[1] == 3 && o.stride == 1 && o.w.dim[0] >= 16 && o.w.dim[3] >= 16;
}
bool wino_bwd_data_ok(const ConvBwdData& o) {
  return o.w.dim[1] == 3 && o.stride == 1 && o.w.dim[0] >= 16 && o.w.dim[3] >= 16;
}

void wino_fwd(const Kernels& K, const ConvFwd& o) {
  const int B = (int)o.x.dim[0], H = (int)o.x.dim[1], W = (int)o.x.dim[2], Ci = (int)o.x.dim[3];
  const int Co = (int)o.w.dim[0];
  const float* w = o.w.f32();
  const size_t ldu = round_up(Co, kPadN);
  float* gt = thread_buffer(6, 9 * (size_t)Ci * ldu);  // gt[tap][ci][co] = w[co, tap, ci]
  for (int tap = 0; tap < 9; ++tap)
    for (int ci = 0; ci < Ci; ++ci) {
      float* d = gt + ((size_t)tap * Ci + ci) * ldu;
      for (int co = 0; co < Co; ++co) d[co] = w[((size_t)co * 9 + tap) * Ci + ci];
      std::fill(d + Co, d + ldu, 0.0f);
    }
  const float* U = wino_filters(gt, Ci, ldu, 0);
  wino_conv(K, o.x.f32(), B, H, W, Ci, Co, U, ldu, o.y.f32(), o.bias.defined() ? o.bias.f32() : nullptr,
            o.emb.defined() ? o.emb.f32() : nullptr, o.res.defined() ? o.res.f32() : nullptr);
}

// dx = conv3x3(dy) with the filters flipped and their channels swapped: g(ci, ky, kx, co) =
// w[co, 2 - ky, 2 - kx, ci].
void wino_bwd_data(const Kernels& K, const ConvBwdData& o) {
  const int B = (int)o.dx.dim[0], H = (int)o.dx.dim[1], W = (int)o.dx.dim[2], Ci = (int)o.dx.dim[3];
  const int Co = (int)o.w.dim[0];
  const float* w = o.w.f32();
  const size_t ldu = round_up(Ci, kPadN);
  float* gt = thread_buffer(6, 9 * (size_t)Co * ldu);  // gt[tap][co][ci] = w[co, 8 - tap, ci]
  for (int tap = 0; tap < 9; ++tap)
    for (int co = 0; co < Co; ++co) {
      float* d = gt + ((size_t)tap * Co + co) * ldu;
      std::memcpy(d, w + ((size_t)co * 9 + (8 - tap)) * Ci, sizeof(float) * Ci);
      std::fill(d + Ci, d + ldu, 0.0f);
    }
  const float* U = wino_filters(gt, Co, ldu, 0);
  wino_conv(K, o.dy.f32(), B, H, W, Co, Ci, U, ldu, o.dx.f32(), nullptr, nullptr, nullptr);
}

void conv_fwd(const Kernels& K, const ConvFwd& o) {
  const int B = (int)o.x.dim[0], H = (int)o.x.dim[1], W = (int)o.x.dim[2], Ci = (int)o.x.dim[3];
  const int Co = (int)o.w.dim[0], k = (int)o.w.dim[1], s = o.stride, p = k / 2, taps = k * k;
  const int Ho = (int)o.y.dim[1], Wo = (int)o.y.dim[2];
  const float* x = o.x.f32();
  const float* w = o.w.f32();
  float* y = o.y.f32();
  const float* bias = o.bias.defined() ? o.bias.f32() : nullptr;
  const float* emb = o.emb.defined() ? o.emb.f32() : nullptr;
  const float* res = o.res.defined() ? o.res.f32() : nullptr;
  // B [tap][ci][co] (co padded with zeros).
  const size_t ldb = round_up(Co, kPadN);
  float* wp = thread_buffer(0, (size_t)taps * Ci * ldb);
  for (int t = 0; t < taps; ++t)
    for (int ci = 0; ci < Ci; ++ci) {
      float* d = wp + ((size_t)t * Ci + ci) * ldb;
      for (int co = 0; co < Co; ++co) d[co] = w[((size_t)co * taps + t) * Ci + ci];
      std::fill(d + Co, d + ldb, 0.0f);
    }
  const bool parallel = par(2.0 * B * Ho * Wo * Co * Ci * taps);
  GemmArgs g0 = gemm_args();
  g0.N = Co, g0.K = Ci, g0.b = wp, g0.ldb = (ptrdiff_t)ldb, g0.b_tap = (ptrdiff_t)(Ci * ldb), g0.c_rs = Co;
  g0.bias = bias, g0.res_rs = Co;
  if (k == 1 && s == 1) {  // a GEMM over the pixels, in blocks of rows inside one sample
    const int HW = H * W, BLK = 64, nblk = (HW + BLK - 1) / BLK;
#pragma omp parallel for schedule(static) if (parallel)
    for (int task = 0; task < B * nblk; ++task) {
      const int b = task / nblk, r0 = task % nblk * BLK;
      const size_t row0 = (size_t)b * HW + r0;
      GemmArgs g = g0;
      g.M = std::min(BLK, HW - r0), g.a = x + row0 * Ci, g.a_rs = Ci, g.c = y + row0 * Co;
      g.bias2 = emb ? emb + (size_t)b * Co : nullptr, g.res = res ? res + row0 * Co : nullptr;
      K.gemm(g);
    }
    return;
  }
  const int Wp = W + 2 * p;
  ptrdiff_t off[9];
  for (int t = 0; t < taps; ++t) off[t] = ((ptrdiff_t)(t / k) * Wp + t % k) * Ci;
  g0.ntaps = taps, g0.a_off = off, g0.a_rs = (ptrdiff_t)s * Ci;
#pragma omp parallel if (parallel)
  {
    int cur = -1;  // the sample padded in this thread's buffer
    const float* xb = nullptr;
#pragma omp for schedule(static)
    for (int r = 0; r < B * Ho; ++r) {
      const int b = r / Ho, oy = r % Ho;
      if (b != cur) {
        const float* xs = x + (size_t)b * H * W * Ci;
        xb = p ? pad_sample(xs, H, W, Ci, p, 1) : xs;
        cur = b;
      }
      GemmArgs g = g0;
      g.M = Wo, g.a = xb + (size_t)oy * s * Wp * Ci, g.c = y + (size_t)r * Wo * Co;
      g.bias2 = emb ? emb + (size_t)b * Co : nullptr, g.res = res ? res + (size_t)r * Wo * Co : nullptr;
      K.gemm(g);
    }
  }
}

void conv_bwd_data(const Kernels& K, const ConvBwdData& o) {
  const int B = (int)o.dx.dim[0], H = (int)o.dx.dim[1], W = (int)o.dx.dim[2], Ci = (int)o.dx.dim[3];
  const int Co = (int)o.w.dim[0], k = (int)o.w.dim[1], s = o.stride, p = k / 2, taps = k * k;
  const int Ho = (int)o.dy.dim[1], Wo = (int)o.dy.dim[2];
  const float* w = o.w.f32();
  float* dx = o.dx.f32();
  // dy padded by P = 1 (k = 3: taps reach one row/column past either side).
  const int P = k == 3 ? 1 : 0, Wq = Wo + 2 * P;
  const float* dy = o.dy.f32();
  const size_t ldb = round_up(Ci, kPadN);
  // Per phase (py, px): the taps reaching it, their dy offsets and B [tap][co][ci] = w[co, tap, ci].
  struct Phase {
    int ntaps = 0;
    ptrdiff_t off[9];
    float* b = nullptr;
  };
  Phase ph[4];
  float* wp = thread_buffer(0, (size_t)taps * Co * ldb);  // the phases' taps partition the k*k taps
  size_t used = 0;
  for (int py = 0; py < s; ++py)
    for (int px = 0; px < s; ++px) {
      Phase& f = ph[py * s + px];
      f.b = wp + used;
      for (int ky = 0; ky < k; ++ky)
        for (int kx = 0; kx < k; ++kx) {
          const int ny = py + p - ky, nx = px + p - kx;  // = s * (dy offset) when the tap reaches the phase
          if (ny % s != 0 || nx % s != 0) continue;
          f.off[f.ntaps] = ((ptrdiff_t)(ny / s) * Wq + nx / s) * Co;
          float* d = f.b + (size_t)f.ntaps * Co * ldb;
          for (int co = 0; co < Co; ++co) {
            std::memcpy(d + co * ldb, w + ((size_t)co * taps + ky * k + kx) * Ci, sizeof(float) * Ci);
            std::fill(d + co * ldb + Ci, d + (co + 1) * ldb, 0.0f);
          }
          ++f.ntaps;
          used += (size_t)Co * ldb;
        }
    }
  // Tasks: (b, phase, m) = one row iy = py + s m of one phase of sample b.
  const int mrows = (H + s - 1) / s;
  const bool parallel = par(2.0 * B * H * W * Ci * Co * taps / (s * s));
#pragma omp parallel if (parallel)
  {
    int cur = -1;  // the sample of dy padded in this thread's buffer
    const float* dq = nullptr;
#pragma omp for schedule(static)
    for (int task = 0; task < s * s * B * mrows; ++task) {
      const int b = task / (s * s * mrows), phase = task / mrows % (s * s), m = task % mrows;
      const int py = phase / s, px = phase % s, iy = py + s * m;
      if (iy >= H || px >= W) continue;
      const int nj = (W - px + s - 1) / s;  // pixels ix = px + s j of this row
      float* c = dx + (((size_t)b * H + iy) * W + px) * Ci;
      const Phase& f = ph[phase];
      if (f.ntaps == 0) {
        for (int j = 0; j < nj; ++j) std::memset(c + (size_t)j * s * Ci, 0, sizeof(float) * Ci);
        continue;
      }
      if (b != cur) {
        const float* ds = dy + (size_t)b * Ho * Wo * Co;
        dq = P ? pad_sample(ds, Ho, Wo, Co, P, 1) : ds;
        cur = b;
      }
      GemmArgs g = gemm_args();
      g.M = nj, g.N = Ci, g.K = Co, g.ntaps = f.ntaps, g.a_off = f.off;
      g.a = dq + ((size_t)(m + P) * Wq + P) * Co, g.a_rs = Co;
      g.b = f.b, g.ldb = (ptrdiff_t)ldb, g.b_tap = (ptrdiff_t)(Co * ldb);
      g.c = c, g.c_rs = (ptrdiff_t)s * Ci;
      K.gemm(g);
    }
  }
}

void conv_bwd_filter(const Kernels& K, const ConvBwdFilter& o) {
  const int B = (int)o.dy.dim[0], Ho = (int)o.dy.dim[1], Wo = (int)o.dy.dim[2], Co = (int)o.dy.dim[3];
  const float* dy = o.dy.f32();
  const size_t P = (size_t)B * Ho * Wo;
  if (o.db.defined()) {  // as the reference: per channel over the pixels in order; channels split
    float* db = o.db.f32();
#pragma omp parallel for schedule(static) if (P * Co > 65536)
    for (int c0 = 0; c0 < Co; c0 += 16) {
      const int c1 = std::min(Co, c0 + 16);
      float acc[16] = {};
      for (size_t q = 0; q < P; ++q)
        for (int co = c0; co < c1; ++co) acc[co - c0] += dy[q * Co + co];
      for (int co = c0; co < c1; ++co) db[co] = acc[co - c0];
    }
  }
  if (o.demb.defined()) ref::add_bcast_bwd<float>(dy, o.demb.f32(), B, Ho * Wo, Co);
  if (!o.dw.defined()) return;
  const int H = (int)o.x.dim[1], W = (int)o.x.dim[2], Ci = (int)o.x.dim[3];
  const int k = (int)o.dw.dim[1], s = o.stride, p = k / 2, taps = k * k;
  float* dw = o.dw.f32();
  const float* x = o.x.f32();
  // Per tap (ky, kx), the output pixels whose input pixel (oy s + ky - p, ox s + kx - p) lies in
  // the image: rows [oy0, oy1), columns [ox0, ox1) (the padding's zeros add nothing).
  struct Range {
    int oy0, oy1, ox0, ox1;
  };
  auto range = [s, p](int kk, int n, int no, int* lo, int* hi) {
    *lo = std::max(0, (p - kk + s - 1) / s);  // (p - kk < 0: 0)
    const int last = n - 1 + p - kk;          // oy s <= last
    *hi = last < 0 ? *lo : std::max(*lo, std::min(no, last / s + 1));
  };
  std::vector<Range> rg(taps);
  for (int t = 0; t < taps; ++t) {
    range(t / k, H, Ho, &rg[t].oy0, &rg[t].oy1);
    range(t % k, W, Wo, &rg[t].ox0, &rg[t].ox1);
  }
  // "Taps" of the kernel = the output rows of one sample: A(co, (oy, ox)) = dy[b, oy, ox, co],
  // B((oy, ox), ci) = x[b, oy s + ky - p, ox s + kx - p, ci]; a task = (tap, block of 8 co) owns
  // dw[co block, tap, :] and sums it over the samples in order. Each thread takes a fixed range of
  // tasks and runs samples outer, so one sample's dy and x stay in its cache across its tasks.
  std::vector<ptrdiff_t> rows(Ho);
  for (int oy = 0; oy < Ho; ++oy) rows[oy] = (ptrdiff_t)oy * Wo * Co;
  constexpr int CO_BLK = 8;
  const int ncb = (Co + CO_BLK - 1) / CO_BLK, ntask = taps * ncb;
  const bool parallel = par(2.0 * B * Ho * Wo * Co * Ci * taps);
#pragma omp parallel if (parallel)
  {
    const int nt = omp_get_num_threads(), me = omp_get_thread_num();
    const int t0 = (int)((long)ntask * me / nt), t1 = (int)((long)ntask * (me + 1) / nt);
    for (int b = 0; b < B; ++b) {
      if (t0 == t1) break;
      // B rows are pixels of x, read in whole vectors: x itself when its rows are whole vectors,
      // else a copy with slack at its end
      const float* xs = x + (size_t)b * H * W * Ci;
      const float* xb = Ci % kPadN == 0 ? xs : pad_sample(xs, H, W, Ci, 0, 1);
      for (int task = t0; task < t1; ++task) {
        const int t = task / ncb, co0 = task % ncb * CO_BLK, ky = t / k, kx = t % k;
        const Range& r = rg[t];
        GemmArgs g = gemm_args();
        g.M = std::min(CO_BLK, Co - co0), g.N = Ci, g.K = r.ox1 - r.ox0, g.ntaps = r.oy1 - r.oy0;
        g.a_off = rows.data() + r.oy0, g.a_rs = 1, g.a_cs = Co;
        g.a = dy + ((size_t)b * Ho * Wo + r.ox0) * Co + co0;
        g.b = xb + ((size_t)(r.oy0 * s + ky - p) * W + (r.ox0 * s + kx - p)) * Ci;
        g.ldb = (ptrdiff_t)s * Ci, g.b_tap = (ptrdiff_t)s * W * Ci;
        g.c = dw + (size_t)co0 * taps * Ci + (size_t)t * Ci, g.c_rs = (ptrdiff_t)taps * Ci;
        g.accumulate = b > 0;
        K.gemm(g);
      }
    }
  }
}

template <int I>
void wino_fwd_run(const ConvFwd& o) {
  wino_fwd(*cpufast::kernels<I>(), o);
}
template <int I>
void wino_bwd_data_run(const ConvBwdData& o) {
  wino_bwd_data(*cpufast::kernels<I>(), o);
}
template <int I>
void fwd_run(const ConvFwd& o) {
  conv_fwd(*cpufast::kernels<I>(), o);
}
template <int I>
void bwd_data_run(const ConvBwdData& o) {
  conv_bwd_data(*cpufast::kernels<I>(), o);
}
template <int I>
void bwd_filter_run(const ConvBwdFilter& o) {
  conv_bwd_filter(*cpufast::kernels<I>(), o);
}

}  // namespace

void register_conv_fast_cpu(CpuOps& ops) {
  // ConvFwd's statistics (of y as stored) after each
  cpufast::add_fast_variants<ConvFwd, fwd_ok, fwd_run<0>, fwd_run<1>, conv_gn_stats>(ops);
  cpufast::add_fast_variants<ConvBwdData, bwd_data_ok, bwd_data_run<0>, bwd_data_run<1>>(ops);
  cpufast::add_fast_variants<ConvBwdFilter, bwd_filter_ok, bwd_filter_run<0>, bwd_filter_run<1>>(ops);
  // ahead of those where they apply
  cpufast::add_fast_variants<ConvFwd, wino_fwd_ok, wino_fwd_run<0>, wino_fwd_run<1>, conv_gn_stats>(
      ops, "avx512_wino", "avx2_wino");
  cpufast::add_fast_variants<ConvBwdData, wino_bwd_data_ok, wino_bwd_data_run<0>, wino_bwd_data_run<1>>(
      ops, "avx512_wino", "avx2_wino");
}

}  // namespace unet
