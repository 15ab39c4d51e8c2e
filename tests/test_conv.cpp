// conv family: lib/ops/conv.h (reference), lib/ops/conv.cpp (CPU engine), kernels/conv/ (CUDA).
//  * the reference vs a direct 7-loop convolution in PyTorch layout, and vs finite differences;
//  * the fused epilogue (bias, per-sample embedding, residual) and the embedding gradient;
//  * the float engine vs the double template, absent outputs skipped;
//  * every CUDA variant vs the CPU engine at odd small shapes and at every seed64 shape; the
//    cuDNN-fused epilogue (cudnn_epi) forced, and its plan restored from JSON by a second engine;
//  * every fast CPU variant (avx512, avx2) vs the CPU reference at odd small shapes and at every
//    tiny32 shape, bitwise independent of the thread count; the default choice and the forced
//    reference (conv=ref).
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <tuple>

#include "ops_common.h"

using namespace opt;
using namespace unet;

namespace {

struct ConvCase {
  int B, H, W, Ci, Co, k, s;
};
std::ostream& operator<<(std::ostream& o, const ConvCase& c) {
  return o << "B" << c.B << " " << c.H << "x" << c.W << " Ci" << c.Ci << " Co" << c.Co << " k" << c.k << " s"
           << c.s;
}
class Conv : public ::testing::TestWithParam<ConvCase> {};

int out_size(int n, int k, int s) { return (n + 2 * (k / 2) - k) / s + 1; }

TEST_P(Conv, ForwardMatchesDirectConvolutionInTorchLayout) {
  const ConvCase c = GetParam();
  const int p = c.k / 2, Ho = out_size(c.H, c.k, c.s), Wo = out_size(c.W, c.k, c.s);
  V xt = rnd((size_t)c.B * c.Ci * c.H * c.W), wt = rnd((size_t)c.Co * c.Ci * c.k * c.k), bias = rnd(c.Co);
  // Direct 7-loop convolution, PyTorch indexing: x [B,Ci,H,W], w [Co,Ci,k,k], y [B,Co,Ho,Wo].
  V yt((size_t)c.B * c.Co * Ho * Wo);
  for (int b = 0; b < c.B; ++b)
    for (int co = 0; co < c.Co; ++co)
      for (int oy = 0; oy < Ho; ++oy)
        for (int ox = 0; ox < Wo; ++ox) {
          double s = bias[co];
          for (int ci = 0; ci < c.Ci; ++ci)
            for (int ky = 0; ky < c.k; ++ky)
              for (int kx = 0; kx < c.k; ++kx) {
                const int iy = oy * c.s - p + ky, ix = ox * c.s - p + kx;
                if (iy < 0 || iy >= c.H || ix < 0 || ix >= c.W) continue;
                s += wt[((co * c.Ci + ci) * c.k + ky) * c.k + kx] *
                     xt[(((size_t)b * c.Ci + ci) * c.H + iy) * c.W + ix];
              }
          yt[(((size_t)b * c.Co + co) * Ho + oy) * Wo + ox] = s;
        }
  // Engine layouts: x NHWC, w [Co,k,k,Ci].
  V x = nchw_to_nhwc(xt, c.B, c.Ci, c.H, c.W), y_expect = nchw_to_nhwc(yt, c.B, c.Co, Ho, Wo);
  V w(wt.size());
  for (int co = 0; co < c.Co; ++co)
    for (int ci = 0; ci < c.Ci; ++ci)
      for (int t = 0; t < c.k * c.k; ++t)
        w[((size_t)co * c.k * c.k + t) * c.Ci + ci] = wt[((size_t)co * c.Ci + ci) * c.k * c.k + t];
  V y = nans(y_expect.size());
  ref::conv2d_fwd<double>(x.data(), w.data(), bias.data(), y.data(), c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
  EXPECT_LT(rel(y, y_expect), 1e-13);

  Dev d;  // float engine, with and without bias
  Tensor X = d.put(x, {c.B, c.H, c.W, c.Ci}), Wt = d.put(w, {c.Co, c.k, c.k, c.Ci});
  Tensor Y = d.poisoned({c.B, Ho, Wo, c.Co});
  d.run(ConvFwd{X, Wt, d.put(bias), {}, {}, Y, c.s});
  EXPECT_LT(rel(d.get(Y), y_expect), kF32Tol);
  V zero(c.Co, 0.0), y0_expect = nans(y.size());
  ref::conv2d_fwd<double>(x.data(), w.data(), zero.data(), y0_expect.data(), c.B, c.H, c.W, c.Ci, c.Co, c.k,
                          c.s);
  Y = d.poisoned({c.B, Ho, Wo, c.Co});
  d.run(ConvFwd{X, Wt, {}, {}, {}, Y, c.s});
  EXPECT_LT(rel(d.get(Y), y0_expect), kF32Tol);
}

TEST_P(Conv, GradientsMatchFiniteDifferences) {
  const ConvCase c = GetParam();
  const int Ho = out_size(c.H, c.k, c.s), Wo = out_size(c.W, c.k, c.s);
  const size_t nx = (size_t)c.B * c.H * c.W * c.Ci, nw = (size_t)c.Co * c.k * c.k * c.Ci,
               ny = (size_t)c.B * Ho * Wo * c.Co;
  V x = rnd(nx), w = rnd(nw), b = rnd(c.Co), dy = rnd(ny);
  V dx = nans(nx), dw = nans(nw), db = nans(c.Co);
  ref::conv2d_bwd<double>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), c.B, c.H, c.W, c.Ci,
                          c.Co, c.k, c.s);
  V y(ny);
  auto loss = [&] {
    ref::conv2d_fwd<double>(x.data(), w.data(), b.data(), y.data(), c.B, c.H, c.W, c.Ci, c.Co, c.k, c.s);
    return dot(y, dy);
  };
  gradcheck("dx", x, dx, loss);
  gradcheck("dw", w, dw, loss);
  gradcheck("db", b, db, loss);

  // Float engine agrees: data gradient and filter gradient are separate ops; absent outputs skipped.
  Dev d;
  Tensor X = d.put(x, {c.B, c.H, c.W, c.Ci}), Wt = d.put(w, {c.Co, c.k, c.k, c.Ci}),
         DY = d.put(dy, {c.B, Ho, Wo, c.Co});
  Tensor DX = d.poisoned({c.B, c.H, c.W, c.Ci}), DW = d.poisoned({c.Co, c.k, c.k, c.Ci}),
         DB = d.poisoned({c.Co});
  d.run(ConvBwdData{DY, Wt, DX, c.s});
  d.run(ConvBwdFilter{X, DY, DW, DB, {}, c.s});
  EXPECT_LT(rel(d.get(DX), dx), kF32Tol);
  EXPECT_LT(rel(d.get(DW), dw), kF32Tol);
  EXPECT_LT(rel(d.get(DB), db), kF32Tol);
  const F fdb = d.get(DB);
  DB = d.poisoned({c.Co});
  d.run(ConvBwdFilter{X, DY, {}, DB, {}, c.s});
  EXPECT_EQ(d.get(DB), fdb);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Conv,
                         ::testing::Values(ConvCase{2, 5, 6, 3, 4, 3, 1}, ConvCase{2, 5, 6, 3, 4, 3, 2},
                                           ConvCase{2, 7, 7, 5, 6, 3, 2}, ConvCase{1, 6, 7, 5, 6, 1, 1},
                                           ConvCase{2, 6, 5, 4, 3, 1, 2}, ConvCase{1, 1, 1, 2, 3, 3, 1},
                                           // wide enough for the GEMM's full 4x16 register tiles
                                           ConvCase{2, 9, 8, 20, 17, 3, 1}, ConvCase{1, 8, 9, 18, 33, 3, 2},
                                           ConvCase{1, 8, 8, 35, 70, 1, 1}));

// The epilogue: y = conv + bias + emb[b] + res, and demb = per-sample sums of dy (the gradient of
// the embedding added in the epilogue), against the plain ops composed in double.
TEST(ConvFused, EpilogueAndEmbeddingGradient) {
  const int B = 3, H = 5, W = 4, Ci = 6, Co = 7;
  V x = rnd((size_t)B * H * W * Ci), w = rnd((size_t)Co * 9 * Ci), bias = rnd(Co), emb = rnd((size_t)B * Co);
  V res = rnd((size_t)B * H * W * Co), dy = rnd(res.size());
  V want(res.size());
  ref::conv2d_fwd<double>(x.data(), w.data(), bias.data(), want.data(), B, H, W, Ci, Co, 3, 1);
  for (int b = 0; b < B; ++b)
    for (int p = 0; p < H * W; ++p)
      for (int c = 0; c < Co; ++c) {
        const size_t i = ((size_t)b * H * W + p) * Co + c;
        want[i] += emb[b * Co + c] + res[i];
      }
  Dev d;
  Tensor Y = d.poisoned({B, H, W, Co});
  d.run(ConvFwd{d.put(x, {B, H, W, Ci}), d.put(w, {Co, 3, 3, Ci}), d.put(bias), d.put(emb, {B, Co}),
                d.put(res, {B, H, W, Co}), Y, 1});
  EXPECT_LT(rel(d.get(Y), want), kF32Tol);
  // demb: the gradient of sum(y * dy) w.r.t. emb.
  V demb = nans(emb.size());
  ref::add_bcast_bwd<double>(dy.data(), demb.data(), B, H * W, Co);
  V y(res.size());
  gradcheck("demb", emb, demb, [&] {
    ref::conv2d_fwd<double>(x.data(), w.data(), bias.data(), y.data(), B, H, W, Ci, Co, 3, 1);
    ref::conv_epilogue<double>(y.data(), emb.data(), res.data(), B, (size_t)H * W, Co);
    return dot(y, dy);
  });
  Tensor DE = d.poisoned({B, Co});
  d.run(ConvBwdFilter{d.put(x, {B, H, W, Ci}), d.put(dy, {B, H, W, Co}), {}, {}, DE, 1});
  EXPECT_LT(rel(d.get(DE), demb), 1e-6);
}

// ---- CUDA variants vs the CPU engine ----

ConvFwd fwd_op(const Alloc& A, DType act, int B, int H, int Ci, int Co, int k, int s, bool emb, bool res,
               DType out = DType::F32, bool out_act = true) {
  const int Ho = out_size(H, k, s);
  const DType yt = out_act ? act : out;
  return ConvFwd{A(act, {B, H, H, Ci}),
                 A(act, {Co, k, k, Ci}),
                 A(DType::F32, {Co}),
                 emb ? A(DType::F32, {B, Co}) : Tensor{},
                 res ? A(yt, {B, Ho, Ho, Co}) : Tensor{},
                 A(yt, {B, Ho, Ho, Co}),
                 s};
}

void check_conv(const std::string& what, int B, int H, int Ci, int Co, int k, int s, bool emb, bool res) {
  const int Ho = out_size(H, k, s);
  Tol tol;
  check_variants<ConvFwd>(
      what + " fwd", [&](const Alloc& A, DType act) { return fwd_op(A, act, B, H, Ci, Co, k, s, emb, res); },
      tol);
  check_variants<ConvBwdData>(
      what + " dgrad",
      [&](const Alloc& A, DType act) {
        return ConvBwdData{A(act, {B, Ho, Ho, Co}), A(act, {Co, k, k, Ci}), A(act, {B, H, H, Ci}), s};
      },
      tol);
  // dW sums B*Ho*Wo products per element (131072 at 64x64, batch 32): fp32 rounding in another
  // summation order reaches ~sqrt(K) * 6e-8 = 2e-5 relative, so fp32 gets 5e-5 here.
  Tol wtol = tol;
  wtol.fp32 = 5e-5;
  check_variants<ConvBwdFilter>(
      what + " wgrad",
      [&](const Alloc& A, DType act) {
        return ConvBwdFilter{A(act, {B, H, H, Ci}),
                             A(act, {B, Ho, Ho, Co}),
                             A(DType::F32, {Co, k, k, Ci}),
                             A(DType::F32, {Co}),
                             emb ? A(DType::F32, {B, Co}) : Tensor{},
                             s};
      },
      wtol);
}

TEST(ConvVariants, SmallOddShapes) {
  SKIP_WITHOUT_GPU();
  check_conv("3x3 s1 odd", 2, 7, 5, 6, 3, 1, true, true);
  check_conv("3x3 s2 odd", 3, 9, 3, 5, 3, 2, false, false);
  check_conv("1x1", 2, 5, 12, 20, 1, 1, false, true);
  check_conv("3x3 vec", 2, 8, 16, 32, 3, 1, true, false);
  // "simt" (fp32): partial tiles in every direction (M = 507 pixels, Co = 20, 9 Ci = 216) with the
  // filter gradient in 4 pixel ranges, 1x1, and a forward in 18 K ranges (M = 32, K = 2304; its
  // data gradient in 4).
  check_conv("3x3 simt odd", 3, 13, 24, 20, 3, 1, true, true);
  // "narrow_wgrad" (tf32, at most 3 input channels: the model's first layer): seed64's 3 -> 64 at
  // 64x64, partial tiles both ways with 1 and 2 channels, 128 outputs (two channel tiles a warp)
  check_conv("3x3 in conv 64x64", 2, 64, 3, 64, 3, 1, false, false);
  check_conv("3x3 in conv odd", 3, 13, 1, 16, 3, 1, false, true);
  check_conv("3x3 in conv 2 -> 128", 2, 67, 2, 128, 3, 1, false, false);
  // ... and with the roles swapped (at most 3 outputs: the last layer), its bias gradient apart
  check_conv("3x3 out conv 64x64", 2, 64, 64, 3, 3, 1, false, false);
  check_conv("3x3 out conv odd", 3, 13, 16, 1, 3, 1, false, true);
  check_conv("3x3 out conv 128 -> 2", 2, 67, 128, 2, 3, 1, false, false);
  // "narrow_dgrad" (the last layer's data gradient, every precision) takes those too; here also 6
  // outputs (learned sigma) and a run-time count (5) with 9 and 50 channel vectors for 16 lanes
  // and partial row / column tiles
  check_conv("3x3 out conv 192 -> 6", 2, 9, 192, 6, 3, 1, false, false);
  check_conv("3x3 out conv 36 -> 5 odd", 3, 11, 36, 5, 3, 1, false, false);
  check_conv("3x3 out conv 200 -> 8", 1, 70, 200, 8, 3, 1, false, false);
  check_conv("1x1 simt", 2, 9, 40, 36, 1, 1, false, true);
  check_conv("3x3 simt split", 2, 4, 256, 64, 3, 1, true, true);
  // "mma" (bf16 forward): partial pixel tiles (M = 507) with a partial 128-channel tile (Co = 72)
  // and every epilogue term; 1x1 with a partial 64-channel tile and 3 K blocks.
  check_conv("3x3 mma odd", 3, 13, 64, 72, 3, 1, true, true);
  check_conv("1x1 mma", 2, 9, 96, 40, 1, 1, false, true);
  // "wgmma" (3x3 at width 64, H100, tf32 and bf16 forward, tf32 data gradient): partial channel
  // blocks (Ci = 40; the data gradient's 72 inputs) and a partial 128-channel tile (Co = 72) with
  // every epilogue term; 64-channel tiles (48 and 64 outputs). "wgmma_tap" (forward): pixel boxes
  // of whole images past the batch's end (B = 3 at 8x8: boxes of 2 images; 4x4: 8), a partial
  // channel block and a partial 128-channel tile, 1x1 and 3x3 with 256-channel tiles (Co = 200),
  // rows of 128 pixels (W = 128, 256).
  check_conv("3x3 wgmma", 2, 64, 40, 72, 3, 1, true, true);
  check_conv("3x3 wgmma 64", 1, 64, 64, 48, 3, 1, false, true);
  check_conv("3x3 wgmma_tap odd", 3, 8, 36, 72, 3, 1, true, true);
  check_conv("3x3 wgmma_tap 4x4", 3, 4, 64, 64, 3, 1, true, false);
  check_conv("1x1 wgmma_tap", 2, 16, 40, 200, 1, 1, false, true);
  check_conv("3x3 wgmma_tap wide", 1, 256, 32, 16, 3, 1, false, true);
  check_conv("3x3 wgmma_tap 128", 1, 128, 64, 200, 3, 1, true, false);
  // "wgmma_t" (tf32, 3x3 at width 64, at most 64 outputs, blocks of 4 rows): the shapes above (48
  // outputs, a partial M tile; the data gradient's 40 outputs with 72 inputs, a partial K block),
  // 128 -> 64 with every epilogue term over two images, and 30 rows (a last block of 2 rows).
  check_conv("3x3 wgmma_t 128 -> 64", 2, 64, 128, 64, 3, 1, true, true);
  check_variants<ConvFwd>(
      "3x3 wgmma_t 30 rows fwd",
      [](const Alloc& A, DType act) {
        return ConvFwd{A(act, {2, 30, 64, 64}),
                       A(act, {64, 3, 3, 64}),
                       A(DType::F32, {64}),
                       A(DType::F32, {2, 64}),
                       A(act, {2, 30, 64, 64}),
                       A(act, {2, 30, 64, 64}),
                       1};
      },
      Tol{});
  check_variants<ConvBwdData>(
      "3x3 wgmma_t 30 rows dgrad",
      [](const Alloc& A, DType act) {
        return ConvBwdData{A(act, {2, 30, 64, 64}), A(act, {64, 3, 3, 56}), A(act, {2, 30, 64, 56}), 1};
      },
      Tol{});
  // "wgmma"'s filter gradient (tf32 and bf16, 64 x 64-channel blocks, about 66 blocks in all): K blocks of
  // whole 8x8 images (3 splits of 1; 67 images: 33 splits of 2 and a last of 1), of 4 rows x 16 (8
  // splits of 1), of 1 row x 64 (64 splits of 2) and of half rows at W = 128 (64 of 4), with the
  // bias and embedding sums. tf32 takes those from its transposes of dy, each split's per image
  // (the 8x8 ones: 2 images a split; 40 images at 16x16: splits of 3 K blocks, images of 4, so
  // splits straddle images).
  check_conv("3x3 wgmma wgrad 8x8", 3, 8, 64, 128, 3, 1, true, false);
  check_conv("3x3 wgmma wgrad 8x8 two a split", 67, 8, 64, 64, 3, 1, true, false);
  check_conv("3x3 wgmma wgrad 16 straddle", 40, 16, 64, 64, 3, 1, true, false);
  check_conv("3x3 wgmma wgrad 16", 2, 16, 128, 64, 3, 1, false, false);
  check_conv("3x3 wgmma wgrad 32", 2, 32, 64, 128, 3, 1, true, false);
  check_conv("3x3 wgmma wgrad 64", 2, 64, 64, 64, 3, 1, true, true);
  check_conv("3x3 wgmma wgrad 128", 1, 128, 64, 64, 3, 1, false, false);
  // "pointwise" (tf32 1x1 filter gradients, 64 x 64-channel tiles, K blocks of 64 pixels): 1083
  // pixels (4 splits of 4 K blocks and a last of 1, 59 pixels past the end), 8 splits of 4, and 9
  // tiles of one split each (the bias gradient from one split's partials).
  check_conv("1x1 pointwise tail", 3, 19, 64, 128, 1, 1, false, false);
  check_conv("1x1 pointwise splits", 2, 32, 128, 64, 1, 1, false, false);
  check_conv("1x1 pointwise tiles", 1, 8, 192, 192, 1, 1, false, true);
  // The model's output layer: activation inputs, an f32 output (bf16 in, f32 out in bf16 engines),
  // forward only; B, H, Ci, Co, emb, res:
  //  * small, and the released models' 192 -> 6 (learned sigma);
  //  * "narrow_tc" (bf16, tf32): seed64's at its size (64x64: whole 8 x 64 tiles), odd tiles in both
  //    directions with the learned-sigma width and every epilogue term, and channels in several
  //    chunks of 64 (bf16) or 32 (tf32) (imagenet256's 256, 208 = 3 x 64 + 16, 48 = 32 + 16), and
  //    tf32's narrowest K step (8 channels).
  struct Out {
    const char* what;
    int B, H, Ci, Co;
    bool emb, res;
  };
  for (const Out& c : {Out{"out layer", 2, 8, 32, 3, false, false}, Out{"out layer 192->6", 3, 9, 192, 6, false, false},
                       Out{"out layer 64x64", 2, 64, 64, 3, false, false},
                       Out{"out layer 67x67 48->6", 2, 67, 48, 6, true, true},
                       Out{"out layer 256->6", 1, 20, 256, 6, false, false},
                       Out{"out layer 208->3", 2, 13, 208, 3, true, true},
                       Out{"out layer 40->3", 2, 11, 40, 3, false, true}})
    check_variants<ConvFwd>(
        c.what,
        [&c](const Alloc& A, DType act) {
          return fwd_op(A, act, c.B, c.H, c.Ci, c.Co, 3, 1, c.emb, c.res, DType::F32, false);
        },
        Tol{});
  // "narrow"'s vector path with every epilogue term and its widest output (8 channels)
  check_conv("3x3 narrow vec", 2, 8, 64, 8, 3, 1, true, true);
  check_conv("1x1 narrow", 2, 6, 40, 7, 1, 1, true, false);
}

// The model's last layer (C -> 3 or 6 channels) runs on "narrow" by default in fp32 and on
// "narrow_tc" in tf32 and bf16: cuDNN has no engine for its bf16 input with an f32 output, and im2col +
// GEMM at N = 3 was 4% of imagenet64's sampling forward; the first and last layers' tf32 filter
// gradients on "narrow_wgrad", the 1x1 ones on "pointwise", the last layer's data gradient on
// "narrow_dgrad". (Their accuracy is checked with every
// other variant above.)
TEST(ConvVariants, NarrowRunsTheOutputLayer) {
  SKIP_WITHOUT_GPU();
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(p));
    Engine* g = gpu_engine(p);
    ASSERT_TRUE(g);
    auto A = [&](DType t, std::initializer_list<int64_t> d) { return g->alloc(t, d); };
    const ConvFwd out = fwd_op(A, g->act_dtype(), 2, 8, 64, 6, 3, 1, false, false, DType::F32, false);
    EXPECT_EQ(g->base_ops().variant(out), p == Precision::FP32 ? "narrow" : "narrow_tc");
    const ConvFwd wide = fwd_op(A, g->act_dtype(), 2, 8, 64, 16, 3, 1, false, false, DType::F32, false);
    EXPECT_EQ(g->base_ops().variant(wide).rfind("narrow", 0), std::string::npos);  // more than 8 outputs: the GEMM engines
    // the first layer's filter gradient (3 -> 64): "narrow_wgrad" in tf32
    const ConvBwdFilter in{A(g->act_dtype(), {2, 8, 8, 3}), A(g->act_dtype(), {2, 8, 8, 64}),
                           A(DType::F32, {64, 3, 3, 3}), A(DType::F32, {64}), {}, 1};
    EXPECT_EQ(g->base_ops().variant(in) == "narrow_wgrad", p == Precision::TF32) << g->base_ops().variant(in);
    const ConvBwdFilter last{A(g->act_dtype(), {2, 8, 8, 64}), A(g->act_dtype(), {2, 8, 8, 3}),
                             A(DType::F32, {3, 3, 3, 64}), A(DType::F32, {3}), {}, 1};
    EXPECT_EQ(g->base_ops().variant(last) == "narrow_wgrad", p == Precision::TF32) << g->base_ops().variant(last);
    // its data gradient (3 -> 64): "narrow_dgrad" in every precision
    const ConvBwdData last_dx{A(g->act_dtype(), {2, 8, 8, 3}), A(g->act_dtype(), {3, 3, 3, 64}),
                              A(g->act_dtype(), {2, 8, 8, 64}), 1};
    EXPECT_EQ(g->base_ops().variant(last_dx), "narrow_dgrad");
    // a skip connection's filter gradient (192 -> 64, 1x1): "pointwise" in tf32
    const ConvBwdFilter skip{A(g->act_dtype(), {2, 8, 8, 192}), A(g->act_dtype(), {2, 8, 8, 64}),
                             A(DType::F32, {64, 1, 1, 192}), A(DType::F32, {64}), {}, 1};
    EXPECT_EQ(g->base_ops().variant(skip) == "pointwise", p == Precision::TF32) << g->base_ops().variant(skip);
  }
}

// A GPU that lets a block opt into less shared memory than Hopper's 227 KB (99 KB on consumer
// Ampere, Ada and Blackwell, capped so here): the variants whose blocks need more ("narrow_tc" 104 KB,
// "pointwise" 110 KB) decline, and the ops run on the ones that fit, against the CPU reference.
TEST(ConvVariants, SmallSharedMemoryGpu) {
  SKIP_WITHOUT_GPU();
  struct Uncap {
    ~Uncap() { cap_cuda_smem_optin(0); }
  } uncap;
  Engine* g = gpu_engine(Precision::TF32);
  ASSERT_TRUE(g);
  auto A = [&](DType t, std::initializer_list<int64_t> d) { return g->alloc(t, d); };
  auto has = [](const std::vector<std::string>& v, const char* name) {
    return std::find(v.begin(), v.end(), name) != v.end();
  };
  // (shapes no other test uses: the engine caches each shape's choice)
  const ConvFwd out = fwd_op(A, g->act_dtype(), 3, 8, 64, 6, 3, 1, false, false, DType::F32, false);
  const ConvBwdFilter skip{A(g->act_dtype(), {3, 8, 8, 192}),
                           A(g->act_dtype(), {3, 8, 8, 64}),
                           A(DType::F32, {64, 1, 1, 192}),
                           A(DType::F32, {64}),
                           {},
                           1};
  ASSERT_TRUE(has(g->base_ops().variants_for(out), "narrow_tc"));  // (uncapped they take them)
  ASSERT_TRUE(has(g->base_ops().variants_for(skip), "pointwise"));
  cap_cuda_smem_optin(99 * 1024);
  EXPECT_FALSE(has(g->base_ops().variants_for(out), "narrow_tc"));
  EXPECT_FALSE(has(g->base_ops().variants_for(skip), "pointwise"));
  EXPECT_EQ(g->base_ops().variant(out), "narrow");
  check_conv("capped out conv 64 -> 3", 2, 16, 64, 3, 3, 1, false, true);
  check_conv("capped 1x1 192 -> 64", 2, 16, 192, 64, 1, 1, false, false);
  cap_cuda_smem_optin(0);
  EXPECT_TRUE(has(g->base_ops().variants_for(out), "narrow_tc"));
}

// "wgmma"'s forwards and data gradient (and "wgmma_tap") run only when forced: by default the 64x64
// level's forwards and data gradients with at most 64 outputs take "wgmma_t" in tf32, cuDNN the
// rest and bf16's; forced, the forward takes "wgmma" on an H100 / H200. Its filter gradient (tf32
// and bf16) is the default there.
TEST(ConvVariants, WgmmaOnlyWhenForced) {
  SKIP_WITHOUT_GPU();
  for (Precision p : {Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(p));
    Engine* g = gpu_engine(p);
    ASSERT_TRUE(g);
    const std::string dev = g->name();
    if (dev.find("H100") == std::string::npos && dev.find("H200") == std::string::npos)
      GTEST_SKIP() << "not an H100 / H200: " << dev;
    auto A = [&](DType t, std::initializer_list<int64_t> d) { return g->alloc(t, d); };
    const DType act = g->act_dtype();
    const bool tf32 = p == Precision::TF32;
    const std::string f64 = g->base_ops().variant(fwd_op(A, act, 2, 64, 128, 64, 3, 1, true, true));
    if (tf32)
      EXPECT_EQ(f64, "wgmma_t");
    else
      EXPECT_EQ(f64.rfind("wgmma", 0), std::string::npos) << f64;
    EXPECT_EQ(g->base_ops().variant(fwd_op(A, act, 2, 64, 64, 128, 3, 1, true, true)).rfind("wgmma", 0),
              std::string::npos);
    const ConvBwdData d64{A(act, {2, 64, 64, 64}), A(act, {64, 3, 3, 128}), A(act, {2, 64, 64, 128}), 1};
    EXPECT_EQ(g->base_ops().variant(d64).rfind("wgmma", 0), std::string::npos);
    const ConvBwdData d128{A(act, {2, 64, 64, 128}), A(act, {128, 3, 3, 64}), A(act, {2, 64, 64, 64}), 1};
    if (tf32)
      EXPECT_EQ(g->base_ops().variant(d128), "wgmma_t");
    else
      EXPECT_EQ(g->base_ops().variant(d128).rfind("wgmma", 0), std::string::npos);
    const ConvBwdFilter w64{A(act, {2, 64, 64, 128}), A(act, {2, 64, 64, 64}), A(DType::F32, {64, 3, 3, 128}),
                            A(DType::F32, {64}), {}, 1};
    EXPECT_EQ(g->base_ops().variant(w64), "wgmma");
    // With a norm of the input (the model's fused ResBlock convs) tf32 takes "wgmma" unforced, bf16
    // has no variant.
    const NormIn n{A(DType::F32, {128}), A(DType::F32, {128}), {}, A(DType::F32, {2, 32}), A(DType::F32, {2, 32}), {}, {},
                   true};
    ConvFwd fn = fwd_op(A, act, 2, 64, 128, 64, 3, 1, false, true);
    fn.norm = n;
    ConvBwdFilter wn = w64;
    wn.norm = n;
    const auto fv = g->base_ops().variants_for(fn), wv = g->base_ops().variants_for(wn);
    EXPECT_EQ(fv, p == Precision::TF32 ? std::vector<std::string>{"wgmma"} : std::vector<std::string>{});
    EXPECT_EQ(wv, p == Precision::TF32 ? std::vector<std::string>{"wgmma"} : std::vector<std::string>{});
    // (choices are cached per shape: a shape not asked for yet)
    set_kernel_overrides("conv_fwd=wgmma");
    EXPECT_EQ(g->base_ops().variant(fwd_op(A, act, 3, 64, 32, 16, 3, 1, false, false)), "wgmma");
    set_kernel_overrides("");
  }
}

TEST(ConvVariants, EverySeed64ShapeAtBatch32) {
  SKIP_WITHOUT_GPU();
  std::set<std::string> seen;
  each_seed64_layer([&](const Layer& l) {
    auto once = [&](const std::string& key, auto f) {
      if (seen.insert(key).second) f();
    };
    const int r = l.res;
    switch (l.kind) {
      case Layer::Conv:
        once("c" + std::to_string(r) + "_" + std::to_string(l.cin),
             [&] { check_conv(l.prefix, 32, r, l.cin, l.cout, 3, 1, false, false); });
        break;
      case Layer::Down:
        once("d" + std::to_string(r) + "_" + std::to_string(l.cin),
             [&] { check_conv(l.prefix, 32, r, l.cin, l.cout, 3, 2, false, false); });
        break;
      case Layer::Up:
        once("u" + std::to_string(r) + "_" + std::to_string(l.cin),
             [&] { check_conv(l.prefix, 32, 2 * r, l.cin, l.cout, 3, 1, false, false); });
        break;
      case Layer::Res: {
        const std::string k =
            "r" + std::to_string(r) + "_" + std::to_string(l.cin) + "_" + std::to_string(l.cout);
        once(k, [&] {
          check_conv(l.prefix + " conv1", 32, r, l.cin, l.cout, 3, 1, true, false);
          check_conv(l.prefix + " conv2", 32, r, l.cout, l.cout, 3, 1, false, true);
          if (l.cin != l.cout) check_conv(l.prefix + " skip", 32, r, l.cin, l.cout, 1, 1, false, false);
        });
        break;
      }
      case Layer::Attn:
        once("a" + std::to_string(r) + "_" + std::to_string(l.cin), [&] {
          check_conv(l.prefix + " qkv", 32, r, l.cin, 3 * l.cin, 1, 1, false, false);
          check_conv(l.prefix + " proj", 32, r, l.cin, l.cin, 1, 1, false, true);
        });
        break;
    }
  });
  EXPECT_GT(seen.size(), 8u);
}

// "cudnn_fused" differs from "cudnn" only around the cuDNN call (the epilogue and db/demb), and
// that work depends on the output shape alone: at every output shape of seed64 (batch 32), as a
// 1x1 conv from 8 channels, y must equal cudnn's bit for bit (the same additions in the same
// order) and db/demb agree to summation order, on the GPU alone (cheap where the full CPU
// comparison above costs minutes). Odd shapes take the one-channel-per-lane path.
TEST(ConvVariants, FusedEpilogueAndBiasSumsMatchCudnn) {
  SKIP_WITHOUT_GPU();
  std::set<std::pair<int, int>> shapes = {{5, 12}, {3, 6}, {7, 24}};  // (resolution, channels)
  each_seed64_layer([&](const Layer& l) {
    const int r = l.kind == Layer::Down ? l.res / 2 : l.kind == Layer::Up ? 2 * l.res : l.res;
    shapes.insert({r, l.cout});
    if (l.kind == Layer::Attn) shapes.insert({r, 3 * l.cin});
  });
  int checked = 0;
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
    for (auto [H, C] : shapes) {
      const int B = H < 8 ? 3 : 32, Ci = 8;
      SCOPED_TRACE(std::string(precision_name(p)) + " " + std::to_string(H) + "x" + std::to_string(C));
      Engine* g = gpu_engine(p);
      ASSERT_TRUE(g);
      const DType act = g->act_dtype();
      auto A = [&](DType t, std::initializer_list<int64_t> d) { return g->alloc(t, d); };
      const ConvFwd f{A(act, {B, H, H, Ci}), A(act, {C, 1, 1, Ci}), A(DType::F32, {C}), A(DType::F32, {B, C}),
                      A(act, {B, H, H, C}),  A(act, {B, H, H, C}),  1};
      const ConvBwdFilter w{A(act, {B, H, H, Ci}), A(act, {B, H, H, C}), A(DType::F32, {C, 1, 1, Ci}),
                            A(DType::F32, {C}), A(DType::F32, {B, C}), 1};
      const auto vs = g->base_ops().variants_for(f);
      if (std::find(vs.begin(), vs.end(), "cudnn_fused") == vs.end() ||
          std::find(vs.begin(), vs.end(), "cudnn") == vs.end())
        GTEST_SKIP() << "no cuDNN";
      for (const ConvFwd& op :
           {f, ConvFwd{f.x, f.w, f.bias, {}, f.res, f.y, 1}, ConvFwd{f.x, f.w, f.bias, f.emb, {}, f.y, 1}}) {
        ConvFwd o = op;
        randomize(*g, o, test_seed() + 11 * checked + 1);
        const auto in = inputs_of(*g, o);
        std::vector<std::vector<float>> got;
        for (const char* v : {"cudnn", "cudnn_fused"}) {
          load_inputs(*g, o, in);
          g->base_ops().run_variant(o, v);
          got.push_back(to_host(*g, o.y));
        }
        EXPECT_TRUE(got[0] == got[1]) << "y differs from cudnn's, emb " << o.emb.defined() << " res "
                                      << o.res.defined();
      }
      for (const ConvBwdFilter& op :
           {w, ConvBwdFilter{w.x, w.dy, w.dw, w.db, {}, 1}, ConvBwdFilter{w.x, w.dy, w.dw, {}, w.demb, 1}}) {
        ConvBwdFilter o = op;
        randomize(*g, o, test_seed() + 11 * checked + 5);
        const auto in = inputs_of(*g, o);
        std::vector<std::vector<std::pair<std::string, std::vector<float>>>> got;
        for (const char* v : {"cudnn", "cudnn_fused"}) {
          load_inputs(*g, o, in);
          g->base_ops().run_variant(o, v);
          g->device().sync();
          got.push_back(outputs_of(*g, o));
        }
        for (size_t i = 0; i < got[0].size(); ++i)
          EXPECT_LE(rel_l2(got[1][i].second, got[0][i].second), 1e-6) << got[0][i].first;
        load_inputs(*g, o, in);  // bitwise reproducible
        g->base_ops().run_variant(o, "cudnn_fused");
        g->device().sync();
        const auto again = outputs_of(*g, o);
        for (size_t i = 0; i < again.size(); ++i)
          EXPECT_TRUE(again[i].second == got[1][i].second) << again[i].first;
      }
      ++checked;
    }
  EXPECT_GT(checked, 20);
}

// tf32 "wgmma" filter gradients take the bias and embedding gradients from their transposes of dy
// (per split and image, added in double by filter_finish_kernel) where "cudnn" takes them from a
// column-sum pass: at every seed64 3x3 stride-1 shape (batch 32) the two agree to summation order
// (both add dy as stored; f32 within a block, double across) and dW to tf32 rounding order; on the
// GPU alone (cheap where the CPU comparison above costs minutes), bitwise run to run.
TEST(ConvVariants, WgmmaFilterBiasSumsMatchCudnnAtSeed64Shapes) {
  SKIP_WITHOUT_GPU();
  std::set<std::tuple<int, int, int>> shapes;  // (resolution, Ci, Co)
  each_seed64_layer([&](const Layer& l) {
    if (l.kind == Layer::Res) shapes.insert({l.res, l.cin, l.cout}), shapes.insert({l.res, l.cout, l.cout});
    if (l.kind == Layer::Up) shapes.insert({2 * l.res, l.cin, l.cout});
  });
  Engine* g = gpu_engine(Precision::TF32);
  ASSERT_TRUE(g);
  int checked = 0;
  for (auto [H, Ci, Co] : shapes) {
    const int B = 32;
    SCOPED_TRACE(std::to_string(H) + "x" + std::to_string(H) + " " + std::to_string(Ci) + " -> " + std::to_string(Co));
    auto A = [&](DType t, std::initializer_list<int64_t> d) { return g->alloc(t, d); };
    ConvBwdFilter o{A(DType::F32, {B, H, H, Ci}), A(DType::F32, {B, H, H, Co}), A(DType::F32, {Co, 3, 3, Ci}),
                    A(DType::F32, {Co}), A(DType::F32, {B, Co}), 1};
    const auto vs = g->base_ops().variants_for(o);
    if (std::find(vs.begin(), vs.end(), "wgmma") == vs.end() || std::find(vs.begin(), vs.end(), "cudnn") == vs.end())
      continue;
    randomize(*g, o, test_seed() + 17 * checked + 3);
    const auto in = inputs_of(*g, o);
    std::vector<std::vector<std::pair<std::string, std::vector<float>>>> got;
    for (const char* v : {"cudnn", "wgmma", "wgmma"}) {
      load_inputs(*g, o, in);
      g->base_ops().run_variant(o, v);
      g->device().sync();
      got.push_back(outputs_of(*g, o));
    }
    for (size_t i = 0; i < got[0].size(); ++i) {
      const bool sums = got[0][i].first != "dw";
      EXPECT_LE(rel_l2(got[1][i].second, got[0][i].second), sums ? 1e-6 : 2e-3) << got[0][i].first;
      EXPECT_TRUE(got[2][i].second == got[1][i].second) << got[0][i].first << " not bitwise run to run";
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no wgmma (not an sm_90a GPU) or no cuDNN";
  EXPECT_GE(checked, 8);
}

// "cudnn_epi" (bias and residual inside the cuDNN graph, runtime-compiled engines), forced by name
// whether or not it timed faster at these shapes: against the CPU reference at the precision's
// tolerance, bitwise run to run, and the plan a second engine restores from the JSON the first
// saved (the same file, not rewritten) gives the same bits as the first engine's; a damaged JSON
// is compiled again and replaced, with the same bits. Shapes: seed64's conv2 (bias +
// residual) at 16x16, a 1x1 skip conv (bias only), and an odd size.
TEST(ConvVariants, CudnnEpiFusesBiasAndResidual) {
  SKIP_WITHOUT_GPU();
  const std::string dir = test::temp_dir("cudnn-epi");
  const std::string cache = dir + "/plans.txt";
  const test::ScopedEnv cache_env("UNET_CUDNN_CACHE", cache.c_str());
  struct Case {
    int B, H, Ci, Co, k;
    bool res;
  };
  int checked = 0;
  size_t jsons = 0;
  for (Precision p : {Precision::TF32, Precision::BF16})
    for (const Case& c : {Case{4, 16, 64, 64, 3, true}, Case{3, 8, 96, 64, 1, false}, Case{2, 9, 32, 48, 3, true}}) {
      SCOPED_TRACE(std::string(precision_name(p)) + " B" + std::to_string(c.B) + " " + std::to_string(c.H) + " " +
                   std::to_string(c.Ci) + "->" + std::to_string(c.Co) + " k" + std::to_string(c.k));
      Engine& cpu = cpu_engine(p == Precision::BF16 ? Precision::BF16 : Precision::FP32);
      std::vector<std::vector<uint8_t>> ys;
      auto inodes = [&] {  // the JSON files by inode: a rewrite (temporary + rename) changes it
        std::map<std::string, uintmax_t> m;
        std::error_code ec;  // no folder yet: no files
        for (const auto& e : std::filesystem::directory_iterator(cache + ".d", ec)) {
          struct stat st;
          if (::stat(e.path().c_str(), &st) == 0) m[e.path().string()] = st.st_ino;
        }
        return m;
      };
      std::map<std::string, uintmax_t> before, after;
      // round 1: a new engine, the plan from the JSON; round 2: the JSON files cut in half, so the
      // plan is compiled (and saved) again
      for (int round = 0; round < 3; ++round) {
        if (round == 1) before = inodes();
        if (round == 2) {
          after = inodes();
          for (const auto& kv : after) {
            std::ifstream in(kv.first, std::ios::binary);
            const std::string js((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            std::ofstream(kv.first, std::ios::binary | std::ios::trunc) << js.substr(0, js.size() / 2);
          }
        }
        std::unique_ptr<Engine> g = make_cuda_engine(p);
        ASSERT_TRUE(g);
        Alloc ca = [&](DType t, std::initializer_list<int64_t> d) { return cpu.alloc(t, d); };
        Alloc ga = [&](DType t, std::initializer_list<int64_t> d) { return g->alloc(t, d); };
        const DType act = g->act_dtype();
        ConvFwd co = fwd_op(ca, act, c.B, c.H, c.Ci, c.Co, c.k, 1, false, c.res);
        const ConvFwd go = fwd_op(ga, act, c.B, c.H, c.Ci, c.Co, c.k, 1, false, c.res);
        randomize(cpu, co, test_seed() + 13 * (checked / 3) + 5);  // the same inputs in every round
        const auto in = inputs_of(cpu, co);
        load_inputs(cpu, co, in);
        cpu.base_ops().run_variant(co, "ref");
        const std::vector<float> want = to_host(cpu, co.y);
        for (int rep = 0; rep < 2; ++rep) {
          load_inputs(*g, go, in);
          poison(*g, go.y);
          g->base_ops().run_variant(go, "cudnn_epi");
          g->device().sync();
          ys.push_back(raw(*g, go.y));
          if (rep == 0 && round == 0) {
            const double e = rel_l2(to_host(*g, go.y), want);
            std::printf("[cudnn_epi] %s %s rel err %.2e\n", precision_name(p), describe(go).c_str(), e);
            EXPECT_LE(e, Tol{}.for_precision(p)) << describe(go);
          }
        }
        EXPECT_TRUE(ys[ys.size() - 1] == ys[ys.size() - 2]) << "differs between two runs";
        ++checked;
      }
      EXPECT_TRUE(ys[0] == ys[2]) << "the restored plan's output differs";
      EXPECT_TRUE(ys[0] == ys[4]) << "the plan compiled after a damaged JSON gives other bits";
      EXPECT_TRUE(before == after) << "the second engine compiled and saved the plan again";
      EXPECT_FALSE(after == inodes()) << "the damaged JSON was not replaced";
      // A JSON per (shape, precision) where cuDNN serializes the chosen engine (its runtime-
      // compiled ones; a precompiled engine is simply finalized again, cheaply).
      std::printf("[cudnn_epi] %s JSON plans so far: %zu\n", precision_name(p), after.size());
      jsons = after.size();
    }
  std::ifstream f(cache);
  const std::string lines((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::printf("%s", lines.c_str());
  EXPECT_GE(jsons, 3u);
  EXPECT_NE(lines.find("epi3|"), std::string::npos);  // bias + residual
  EXPECT_NE(lines.find("epi1|"), std::string::npos);  // bias only
  EXPECT_EQ(checked, 18);
}

// cuDNN's knob search (kernels/conv/cudnn.cu, tune_knobs): seed64's 32x32 convolution (forward,
// data and filter gradient) planned with an empty cache, so its engines' other tile and cluster
// shapes are timed (tf32; bf16 keeps the listed configs), then by new engines from the cache file:
// the same bits. Entries whose knobs the engine refuses run the config as listed (still within
// tolerance), and with UNET_CUDNN_KNOBS=0 the listed configs alone are timed, under their own
// cache prefix. Every entry reads "index" or "index:type=value,...".
TEST(ConvVariants, CudnnKnobChoiceRestoredFromTheCache) {
  SKIP_WITHOUT_GPU();
  const std::string dir = test::temp_dir("cudnn-knobs");
  const std::string cache = dir + "/plans.txt";
  const test::ScopedEnv cache_env("UNET_CUDNN_CACHE", cache.c_str());
  auto read_lines = [&] {
    std::ifstream f(cache);
    std::vector<std::string> v;
    for (std::string l; std::getline(f, l);) v.push_back(l);
    return v;
  };
  const int B = 8, H = 32, C = 128;
  for (Precision p : {Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(p));
    Engine& cpu = cpu_engine(p == Precision::BF16 ? Precision::BF16 : Precision::FP32);
    Alloc ca = [&](DType t, std::initializer_list<int64_t> d) { return cpu.alloc(t, d); };
    const DType act = p == Precision::BF16 ? DType::BF16 : DType::F32;
    // seed64's 32x32 convolution: forward, data and filter gradient, on one engine's memory
    auto conv_ops = [&](const Alloc& A) {
      return std::tuple{fwd_op(A, act, B, H, C, C, 3, 1, false, false),
                        ConvBwdData{A(act, {B, H, H, C}), A(act, {C, 3, 3, C}), A(act, {B, H, H, C}), 1},
                        ConvBwdFilter{A(act, {B, H, H, C}), A(act, {B, H, H, C}), A(DType::F32, {C, 3, 3, C}),
                                      A(DType::F32, {C}), Tensor{}, 1}};
    };
    auto [cf, cd, cw] = conv_ops(ca);
    // the CPU reference once; each round loads the same inputs
    std::vector<std::vector<std::vector<uint8_t>>> ins;
    std::vector<std::vector<std::pair<std::string, std::vector<float>>>> want;
    auto reference = [&](auto& op, uint64_t seed) {
      randomize(cpu, op, seed);
      ins.push_back(inputs_of(cpu, op));
      load_inputs(cpu, op, ins.back());
      cpu.base_ops().run_variant(op, "ref");
      want.push_back(outputs_of(cpu, op));
    };
    reference(cf, test_seed() + 1);
    reference(cd, test_seed() + 2);
    reference(cw, test_seed() + 3);
    std::vector<std::vector<float>> bits[4];  // per round, every output of the three ops
    int knobbed = 0;                          // entries whose search chose other knobs
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      if (round == 2) {  // every searched entry's knobs replaced by a tile index no engine has
        const std::vector<std::string> lines = read_lines();
        std::ofstream f(cache, std::ios::trunc);
        for (const std::string& l : lines) {
          const size_t bar = l.rfind('|'), colon = l.find(':', bar);
          if (l.find("|c64k|") == std::string::npos) {
            f << l << "\n";
            continue;
          }
          if (colon != std::string::npos && l.find(":2=4096") == std::string::npos) ++knobbed;
          f << l.substr(0, colon) << ":2=4096\n";
        }
      }
      std::unique_ptr<test::ScopedEnv> off;
      if (round == 3) off = std::make_unique<test::ScopedEnv>("UNET_CUDNN_KNOBS", "0");
      std::unique_ptr<Engine> g = make_cuda_engine(p);
      ASSERT_TRUE(g);
      Alloc ga = [&](DType t, std::initializer_list<int64_t> d) { return g->alloc(t, d); };
      const auto [gf, gd, gw] = conv_ops(ga);
      auto run = [&](const auto& op, size_t k) {
        load_inputs(*g, op, ins[k]);
        g->base_ops().run_variant(op, "cudnn");
        g->device().sync();
        const auto got = outputs_of(*g, op);
        for (size_t i = 0; i < got.size(); ++i) {
          const double e = rel_l2(got[i].second, want[k][i].second);
          EXPECT_LE(e, Tol{}.for_precision(p)) << got[i].first << " of " << describe(op);
          bits[round].push_back(got[i].second);
        }
      };
      run(gf, 0);
      run(gd, 1);
      run(gw, 2);
    }
    EXPECT_TRUE(bits[0] == bits[1]) << "the choice restored from the cache gives other bits";
    const std::regex entry(R"(.*\|-?[0-9]+(:[0-9]+=-?[0-9]+(,[0-9]+=-?[0-9]+)*)?)");
    int listed_only = 0;
    for (const std::string& l : read_lines()) {
      EXPECT_TRUE(std::regex_match(l, entry)) << l;
      if (l.find("|c64|") != std::string::npos) {
        EXPECT_EQ(l.find(':', l.rfind('|')), std::string::npos) << "knobs with UNET_CUDNN_KNOBS=0: " << l;
        ++listed_only;
      }
    }
    EXPECT_GE(listed_only, 3);
    std::printf("[cudnn knobs] %s: %d of the searched entries so far chose other knobs\n", precision_name(p),
                knobbed);
  }
  for (const std::string& l : read_lines()) std::printf("  %s\n", l.c_str());
}

// ConvFwd's optional GroupNorm statistics of y (mean, rstd [B, G]): every variant against the CPU
// engine's, with and without the epilogue terms ("cudnn_fused" computes them in its epilogue's
// pass, the other variants and an epilogue-free cudnn_fused by a statistics pass after), with
// 1 and 8 channels per vector, and at seed64's sizes.
TEST(ConvVariants, GroupNormStatisticsOfTheOutput) {
  SKIP_WITHOUT_GPU();
  struct S {
    int B, H, Ci, Co, G, k;
    bool bias, emb, res;
  };
  for (const S c : {S{3, 5, 6, 12, 4, 3, true, true, true}, S{2, 7, 5, 12, 3, 3, false, false, false},
                    S{2, 6, 8, 24, 8, 1, true, false, true}, S{2, 9, 16, 40, 8, 3, false, true, false},
                    S{4, 64, 32, 64, 32, 3, true, true, false}, S{2, 64, 64, 192, 32, 3, true, false, true},
                    S{3, 8, 16, 256, 32, 3, true, true, true}}) {
    const std::string what = "stats " + std::to_string(c.H) + "x" + std::to_string(c.Co) + " G" +
                             std::to_string(c.G) + (c.bias ? " bias" : "") + (c.emb ? " emb" : "") +
                             (c.res ? " res" : "");
    check_variants<ConvFwd>(
        what,
        [&](const Alloc& A, DType act) {
          ConvFwd o{A(act, {c.B, c.H, c.H, c.Ci}),
                    A(act, {c.Co, c.k, c.k, c.Ci}),
                    c.bias ? A(DType::F32, {c.Co}) : Tensor{},
                    c.emb ? A(DType::F32, {c.B, c.Co}) : Tensor{},
                    c.res ? A(act, {c.B, c.H, c.H, c.Co}) : Tensor{},
                    A(act, {c.B, c.H, c.H, c.Co}),
                    1};
          o.mean = A(DType::F32, {c.B, c.G}), o.rstd = A(DType::F32, {c.B, c.G});
          return o;
        },
        Tol{});
  }
}

// A GroupNorm (+ scale-shift) + SiLU of the input applied by the conv as it reads it (ConvFwd's and
// ConvBwdFilter's norm: "wgmma" in tf32 on Hopper, the forward at width 64, the filter gradient at
// widths 8 to 64; every other variant declines), against the CPU reference (the norm applied, then
// the conv): the padding after the norm (zeros where the norm of 0 is not), channels past a
// partial 32-channel block, the input offsets (bias, embedding) and scale-shift, 64- and 128-channel
// output tiles. Random statistics (negative rstd included: the arithmetic, not a real norm).
TEST(ConvVariants, NormOfTheInput) {
  SKIP_WITHOUT_GPU();
  struct S {
    const char* what;
    int B, H, Ci, Co, G;
    bool offsets, ss, silu;
  };
  Engine* g = gpu_engine(Precision::TF32);
  ASSERT_TRUE(g);
  const std::string dev = g->name();
  const bool hopper = dev.find("H100") != std::string::npos || dev.find("H200") != std::string::npos;
  for (const S c : {S{"norm 64", 2, 64, 64, 64, 32, false, false, true}, S{"norm 64 offsets", 1, 64, 64, 128, 32, true, false, true},
                    S{"norm 64 ss", 2, 64, 128, 64, 32, false, true, true}, S{"norm 64 partial block", 1, 64, 40, 72, 8, true, false, false},
                    S{"norm 32", 2, 32, 128, 64, 32, true, false, true}, S{"norm 16 ss", 2, 16, 64, 128, 32, false, true, true},
                    S{"norm 8", 3, 8, 64, 64, 16, true, false, true}}) {
    auto norm = [&](const Alloc& A, int C) {
      NormIn n{A(DType::F32, {C}), A(DType::F32, {C}), c.ss ? A(DType::F32, {c.B, 2 * C}) : Tensor{},
               A(DType::F32, {c.B, c.G}), A(DType::F32, {c.B, c.G}), c.offsets ? A(DType::F32, {C}) : Tensor{},
               c.offsets ? A(DType::F32, {c.B, C}) : Tensor{}, c.silu};
      return n;
    };
    const int fwd = check_variants<ConvFwd>(
        std::string(c.what) + " fwd",
        [&](const Alloc& A, DType act) {
          ConvFwd o = fwd_op(A, act, c.B, c.H, c.Ci, c.Co, 3, 1, false, true);
          o.norm = norm(A, c.Ci);
          return o;
        },
        Tol{}, nullptr, {Precision::TF32});
    Tol wtol;
    const int filt = check_variants<ConvBwdFilter>(
        std::string(c.what) + " wgrad",
        [&](const Alloc& A, DType act) {
          ConvBwdFilter o{A(act, {c.B, c.H, c.H, c.Ci}), A(act, {c.B, c.H, c.H, c.Co}),
                          A(DType::F32, {c.Co, 3, 3, c.Ci}), A(DType::F32, {c.Co}), {}, 1};
          o.norm = norm(A, c.Ci);
          return o;
        },
        wtol, nullptr, {Precision::TF32});
    if (!hopper) continue;
    // (so that the checks above ran something: the forward where it tiles, the filter gradient
    // where its 64-channel blocks do)
    EXPECT_EQ(fwd, c.H == 64 && c.Co <= 128 ? 1 : 0) << c.what;
    EXPECT_EQ(filt, c.Ci % 64 == 0 && c.Co % 64 == 0 ? 1 : 0) << c.what;
  }
}

// ---- fast CPU variants vs the CPU reference ----

// Forward (with the epilogue terms asked for), data gradient and filter gradient (with db, and
// demb when emb) of one conv shape: every CPU variant against "ref".
// precs: fp32 and the bf16 emulation unless told.
int check_conv_cpu(const std::string& what, int B, int H, int Ci, int Co, int k, int s, bool emb, bool res,
                   int Wd = 0, std::vector<Precision> precs = {Precision::FP32, Precision::BF16}) {
  const int W = Wd ? Wd : H, Ho = out_size(H, k, s), Wo = out_size(W, k, s);
  int n = check_cpu_variants<ConvFwd>(
      what + " fwd",
      [&](const Alloc& A, DType act) {
        return ConvFwd{A(act, {B, H, W, Ci}),
                       A(act, {Co, k, k, Ci}),
                       A(DType::F32, {Co}),
                       emb ? A(DType::F32, {B, Co}) : Tensor{},
                       res ? A(act, {B, Ho, Wo, Co}) : Tensor{},
                       A(act, {B, Ho, Wo, Co}),
                       s};
      },
      kCpuTol, nullptr, precs);
  n += check_cpu_variants<ConvBwdData>(
      what + " dgrad",
      [&](const Alloc& A, DType act) {
        return ConvBwdData{A(act, {B, Ho, Wo, Co}), A(act, {Co, k, k, Ci}), A(act, {B, H, W, Ci}), s};
      },
      kCpuTol, nullptr, precs);
  n += check_cpu_variants<ConvBwdFilter>(
      what + " wgrad",
      [&](const Alloc& A, DType act) {
        return ConvBwdFilter{A(act, {B, H, W, Ci}),
                             A(act, {B, Ho, Wo, Co}),
                             A(DType::F32, {Co, k, k, Ci}),
                             A(DType::F32, {Co}),
                             emb ? A(DType::F32, {B, Co}) : Tensor{},
                             s};
      },
      kCpuTol, nullptr, precs);
  return n;
}

// The variants this CPU runs besides ref (none on a CPU without AVX2 and FMA).
std::vector<std::string> fast_conv_variants() {
  Dev d;
  const ConvFwd op{
      d.poisoned({1, 4, 4, 8}), d.poisoned({8, 3, 3, 8}), {}, {}, {}, d.poisoned({1, 4, 4, 8}), 1};
  std::vector<std::string> v = d.eng->base_ops().variants_for(op);
  v.erase(std::remove(v.begin(), v.end(), std::string("ref")), v.end());
  return v;
}

#define SKIP_WITHOUT_FAST_CPU() \
  if (fast_conv_variants().empty()) GTEST_SKIP() << "this CPU has neither AVX-512 nor AVX2+FMA"

TEST(ConvCpuVariants, SmallOddShapes) {
  SKIP_WITHOUT_FAST_CPU();
  int n = 0;
  n += check_conv_cpu("3x3 s1 odd", 2, 7, 5, 6, 3, 1, true, true, 5);
  n += check_conv_cpu("3x3 s2 odd", 3, 9, 3, 5, 3, 2, false, false, 6);
  n += check_conv_cpu("3x3 s2 even", 2, 8, 17, 33, 3, 2, true, false);
  n += check_conv_cpu("1x1 s1", 2, 5, 12, 20, 1, 1, false, true, 7);
  n += check_conv_cpu("1x1 s2", 2, 6, 4, 3, 1, 2, false, false, 5);
  n += check_conv_cpu("1x1 pixel", 1, 1, 2, 3, 3, 1, false, false);
  n += check_conv_cpu("3x3 wide", 2, 9, 20, 70, 3, 1, true, true, 8);
  n += check_conv_cpu("3x3 long row", 1, 3, 7, 9, 3, 1, false, true, 41);
  n += check_conv_cpu("3x3 s2 1 row", 2, 1, 6, 5, 3, 2, false, false, 9);
  n += check_conv_cpu("1x1 many ch", 2, 3, 130, 48, 1, 1, true, false, 5);
  n += check_conv_cpu("3x3 one channel", 3, 5, 1, 1, 3, 1, true, true, 4);
  n += check_conv_cpu("3x3 s2 2x2", 1, 2, 3, 40, 3, 2, false, true);
  n += check_conv_cpu("3x3 s2 wide Co", 2, 5, 9, 131, 3, 2, true, false, 7);
  n += check_conv_cpu("3x3 1 column", 2, 6, 4, 5, 3, 1, false, false, 1);
  EXPECT_GE(n, 42);
}

// The optional parts: no bias, a bf16 model's f32 output layer (y f32, x and w bf16), a filter
// gradient with only db and demb, or dw without db.
TEST(ConvCpuVariants, OptionalTerms) {
  SKIP_WITHOUT_FAST_CPU();
  const int B = 2, H = 5, W = 6, Ci = 7, Co = 18;
  int n = check_cpu_variants<ConvFwd>("fwd no bias", [&](const Alloc& A, DType act) {
    return ConvFwd{A(act, {B, H, W, Ci}), A(act, {Co, 3, 3, Ci}), {}, A(DType::F32, {B, Co}),
                   A(act, {B, H, W, Co}), A(act, {B, H, W, Co}),  1};
  });
  n += check_cpu_variants<ConvFwd>("fwd f32 out", [&](const Alloc& A, DType act) {
    return ConvFwd{A(act, {B, H, W, Ci}),
                   A(act, {Co, 3, 3, Ci}),
                   A(DType::F32, {Co}),
                   {},
                   {},
                   A(DType::F32, {B, H, W, Co}),
                   1};
  });
  n += check_cpu_variants<ConvBwdFilter>("wgrad db demb only", [&](const Alloc& A, DType act) {
    return ConvBwdFilter{A(act, {B, H, W, Ci}), A(act, {B, H, W, Co}),  {},
                         A(DType::F32, {Co}),   A(DType::F32, {B, Co}), 1};
  });
  n += check_cpu_variants<ConvBwdFilter>("wgrad dw only", [&](const Alloc& A, DType act) {
    return ConvBwdFilter{
        A(act, {B, H, W, Ci}), A(act, {B, 3, 3, Co}), A(DType::F32, {Co, 3, 3, Ci}), {}, {}, 2};
  });
  EXPECT_GE(n, 8);
}

// ConvFwd's statistics on the CPU: against GroupNormFwd's of the y the conv wrote (another
// implementation where the fast GroupNorm variants run), and every CPU conv variant against "ref".
TEST(ConvCpuVariants, GroupNormStatisticsOfTheOutput) {
  const int B = 3, H = 6, W = 5, Ci = 7, Co = 24, G = 8;
  V x = rnd((size_t)B * H * W * Ci), w = rnd((size_t)Co * 9 * Ci), bias = rnd(Co), emb = rnd((size_t)B * Co);
  V res = rnd((size_t)B * H * W * Co);
  for (double& v : res) v += 3.0;  // an offset the statistics must not lose
  Dev d;
  ConvFwd o{d.put(x, {B, H, W, Ci}), d.put(w, {Co, 3, 3, Ci}), d.put(bias), d.put(emb, {B, Co}),
            d.put(res, {B, H, W, Co}), d.poisoned({B, H, W, Co}), 1};
  o.mean = d.poisoned({B, G}), o.rstd = d.poisoned({B, G});
  d.run(o);
  Tensor M = d.poisoned({B, G}), R = d.poisoned({B, G});
  d.run(GroupNormFwd{o.y, d.put(V(Co, 1.0)), d.put(V(Co, 0.0)), {}, d.poisoned({B, H, W, Co}), M, R, false});
  { const F gm = d.get(M); EXPECT_LT(rel(d.get(o.mean), V(gm.begin(), gm.end())), 1e-6); }
  { const F gr = d.get(R); EXPECT_LT(rel(d.get(o.rstd), V(gr.begin(), gr.end())), 1e-6); }
  const F m = d.get(o.mean);
  EXPECT_GT(std::fabs(m[0]), 1.0);  // the offset is there
  if (fast_conv_variants().empty()) return;
  const int n = check_cpu_variants<ConvFwd>("fwd stats", [&](const Alloc& A, DType act) {
    ConvFwd c{A(act, {B, H, W, Ci}), A(act, {Co, 3, 3, Ci}), A(DType::F32, {Co}), A(DType::F32, {B, Co}),
              A(act, {B, H, W, Co}), A(act, {B, H, W, Co}), 1};
    c.mean = A(DType::F32, {B, G}), c.rstd = A(DType::F32, {B, G});
    return c;
  });
  EXPECT_GE(n, 2);
}

// Every conv of tiny32 (the CPU demo's model) at batch 16: input and output layers, each ResBlock's
// convs (with the epilogue they use), skip 1x1s, attention's qkv and proj, down- and upsampling.
TEST(ConvCpuVariants, EveryTiny32ShapeAtBatch16) {
  SKIP_WITHOUT_FAST_CPU();
  const ModelConfig cfg = preset("tiny32");
  const Arch a = build_arch(cfg);
  const int B = 16, S = cfg.image_size;
  std::set<std::string> seen;
  auto once = [&](const std::string& key, auto f) {
    if (seen.insert(key).second) f();
  };
  const std::vector<Precision> f32{Precision::FP32};  // (bf16: the odd shapes above)
  once("in", [&] { check_conv_cpu("input conv", B, S, 3, cfg.num_channels, 3, 1, false, false, 0, f32); });
  once("out", [&] { check_conv_cpu("output conv", B, S, a.out_cin, 3, 3, 1, false, false, 0, f32); });
  each_layer(a, [&](const Layer& l) {
    const int r = l.res;
    const std::string sz = std::to_string(r) + "_" + std::to_string(l.cin) + "_" + std::to_string(l.cout);
    switch (l.kind) {
      case Layer::Conv:
        break;
      case Layer::Down:
        once("d" + sz, [&] { check_conv_cpu(l.prefix, B, r, l.cin, l.cout, 3, 2, false, false, 0, f32); });
        break;
      case Layer::Up:
        once("u" + sz,
             [&] { check_conv_cpu(l.prefix, B, 2 * r, l.cin, l.cout, 3, 1, false, false, 0, f32); });
        break;
      case Layer::Res:
        once("r" + sz, [&] {
          check_conv_cpu(l.prefix + " conv1", B, r, l.cin, l.cout, 3, 1, !cfg.use_scale_shift_norm, false, 0,
                         f32);
          check_conv_cpu(l.prefix + " conv2", B, r, l.cout, l.cout, 3, 1, false, true, 0, f32);
          if (l.cin != l.cout)
            check_conv_cpu(l.prefix + " skip", B, r, l.cin, l.cout, 1, 1, false, false, 0, f32);
        });
        break;
      case Layer::Attn:
        once("a" + sz, [&] {
          check_conv_cpu(l.prefix + " qkv", B, r, l.cin, 3 * l.cin, 1, 1, false, false, 0, f32);
          check_conv_cpu(l.prefix + " proj", B, r, l.cin, l.cin, 1, 1, false, true, 0, f32);
        });
        break;
    }
  });
  EXPECT_GT(seen.size(), 8u);
}

// The fast variant is the CPU engine's default for convs, f32 and the bf16 emulation; a forced
// conv=ref (UNET_KERNELS or --kernels, the same overrides) runs the reference and gives its
// result bit for bit.
TEST(ConvCpuVariants, DefaultAndForcedReference) {
  SKIP_WITHOUT_FAST_CPU();
  const std::vector<std::string> fast = fast_conv_variants();
  const int B = 2, H = 6, Ci = 8, Co = 12;
  V x = rnd((size_t)B * H * H * Ci), w = rnd((size_t)Co * 9 * Ci), bias = rnd(Co);
  auto run = [&](std::string* chose) {
    Dev d;  // a fresh engine: the chooser caches its choice per op signature
    Tensor Y = d.poisoned({B, H, H, Co});
    const ConvFwd op{d.put(x, {B, H, H, Ci}), d.put(w, {Co, 3, 3, Ci}), d.put(bias), {}, {}, Y, 1};
    *chose = d.eng->ops().variant(op);
    d.run(op);
    return d.get(Y);
  };
  std::string v;
  const F y_fast = run(&v);
  EXPECT_EQ(v, fast.front());
  auto bf16 = make_cpu_engine(Precision::BF16);
  const ConvFwd opb{bf16->alloc(DType::BF16, {B, H, H, Ci}),
                    bf16->alloc(DType::BF16, {Co, 3, 3, Ci}),
                    {},
                    {},
                    {},
                    bf16->alloc(DType::BF16, {B, H, H, Co}),
                    1};
  EXPECT_EQ(bf16->ops().variant(opb), fast.front());

  set_kernel_overrides("conv=ref");
  const F y_ref = run(&v);
  set_kernel_overrides("");
  EXPECT_EQ(v, "ref");
  Dev d;
  Tensor Y = d.poisoned({B, H, H, Co});
  d.eng->base_ops().run_variant(
      ConvFwd{d.put(x, {B, H, H, Ci}), d.put(w, {Co, 3, 3, Ci}), d.put(bias), {}, {}, Y, 1}, "ref");
  EXPECT_EQ(0, std::memcmp(d.get(Y).data(), y_ref.data(), y_ref.size() * 4));
  EXPECT_LT(rel(y_fast, V(y_ref.begin(), y_ref.end())), 1e-5);
  const F y_again = run(&v);  // the override is gone: the fast variant again
  EXPECT_EQ(v, fast.front());
  EXPECT_EQ(0, std::memcmp(y_again.data(), y_fast.data(), y_fast.size() * 4));
}

}  // namespace

// The cuDNN the CUDA engine loads, as unet profile reports it: its version and file, checked against
// that file's own cudnnGetVersion (opened again here). Without cuDNN on this machine: the reason.
TEST(CudnnLibrary, NamesVersionAndFile) {
  const std::string s = cudnn_library();
  if (s.rfind("no cuDNN (", 0) == 0) {
    EXPECT_EQ(s.back(), ')') << s;
    if (const char* e = std::getenv("UNET_CUDNN"); e && *e) {  // the reason names the file asked for
      EXPECT_NE(s.find(std::string("UNET_CUDNN=") + e + ": "), std::string::npos) << s;
    }
    GTEST_SKIP() << s;
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_match(s, m, std::regex(R"(cuDNN (\d+)\.(\d+)\.(\d+) \((/.+)\))"))) << s;
  EXPECT_EQ(std::stoi(m[1]), 9);
  const std::string path = m[4];
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto version = reinterpret_cast<size_t (*)()>(dlsym(h, "cudnnGetVersion"));
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version(), (size_t)(std::stoi(m[1]) * 10000 + std::stoi(m[2]) * 100 + std::stoi(m[3]))) << s;
  dlclose(h);
}

// UNET_CUDNN naming a file that is not cuDNN: that file's loader error, not another cuDNN found on
// the usual paths (this binary again, in a child process, as the library is loaded once per process).
// The child drops the parent's sharding and report variables: inherited, a shard of it may hold none of
// the one test asked for (it then runs 0 tests), and its report would overwrite the parent's.
TEST(CudnnLibrary, AnExplicitChoiceIsNotReplaced) {
  if (cudnn_library().find("built without CUDA") != std::string::npos) GTEST_SKIP() << cudnn_library();
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  const std::string cmd =
      "env -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX -u GTEST_SHARD_STATUS_FILE "
      "-u GTEST_OUTPUT UNET_CUDNN=/bin/sh '" +
      std::string(self, (size_t)n) + "' --gtest_filter=CudnnLibrary.NamesVersionAndFile 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t k; (k = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, k);
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("no cuDNN (UNET_CUDNN=/bin/sh: "), std::string::npos) << out;
  EXPECT_NE(out.find("[  SKIPPED ] 1 test"), std::string::npos) << out;
}
