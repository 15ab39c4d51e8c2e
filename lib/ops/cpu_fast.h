// The fast CPU kernels behind the CPU engine's variants "avx512" and "avx2" (conv, attention,
// groupnorm) and "avx512_wino" / "avx2_wino" (3x3 stride-1 conv forward and data gradient);
// lib/ops/<family>_fast.cpp register them ahead of "ref", which stays the ground truth.
//
// lib/ops/cpu_fast_impl.h holds the kernels once; cpu_fast_avx512.cpp and cpu_fast_avx2.cpp compile
// it with their instruction set (CMake sets per-file flags), each into its own namespace and one
// table of function pointers. Nothing in those files runs before the table is chosen: the CPU check
// (avx512_kernels / avx2_kernels, cpu_fast.cpp) is baseline code, so a binary built on any x86-64
// runs anywhere (without AVX2 and FMA, the CPU engine runs "ref").
//
// Determinism: every output element is computed by one call, in an order fixed by the shapes alone
// (never by the thread count or the split of work), so results are bitwise independent of
// OMP_NUM_THREADS and run to run — what bit-exact resume on the CPU needs. They differ from "ref"
// by float summation order and FMA contraction (~1e-7 relative), Winograd's transforms (~1e-6) and
// GroupNorm's float block sums (~1e-6); tests/test_{conv,attention,groupnorm}.cpp bound them.
#pragma once
#include <cstddef>

namespace unet::cpufast {

// The argument structs are plain aggregates (no default member initialisers, so no constructor
// with vague linkage that the linker could take from an AVX-512 file for baseline code):
// value-initialise them (AttnArgs a{}) or start from gemm_args().
//
// C[i, n] (i < M, n < N) = sum_t sum_{c < K} A[i*a_rs + a_off[t] + c*a_cs] * B[t*b_tap + c*ldb + n]
// (t < ntaps; a_off == nullptr: one tap at offset 0), summed t-major, c ascending, one float
// accumulator per element starting at 0 (at C's current value when accumulate), then the
// epilogue adds bias[n], bias2[n] and res[i*res_rs + n] (each nullable) in that order.
// B's rows must be readable up to N rounded up to the kernel's lanes (the extra columns are
// computed and dropped); only C[i, n < N] is written.
struct GemmArgs {
  int M, N, K, ntaps;
  const float* a;
  ptrdiff_t a_rs, a_cs;
  const ptrdiff_t* a_off;
  const float* b;
  ptrdiff_t ldb, b_tap;
  float* c;
  ptrdiff_t c_rs;
  bool accumulate;
  const float* bias;
  const float* bias2;
  const float* res;
  ptrdiff_t res_rs;
};

// Zeroed GemmArgs with one tap and unit column stride.
static inline GemmArgs gemm_args() {
  GemmArgs g{};
  g.ntaps = 1;
  g.a_cs = 1;
  return g;
}

// Winograd F(2x2, 3x3) for a 3x3 stride-1 convolution (padding 1) of one sample, over a block of
// tile rows [i0, i1) (tw tiles a row; tile (i, j) = outputs rows 2i, 2i+1, columns 2j, 2j+1):
//  * wino_input: x [H, W, C] -> V, 16 matrices [tiles, C] at v + xi * v_mat (row stride C);
//  * wino_output: M, 16 matrices [tiles, Co] at m + xi * m_mat (row stride m_ld, whole vectors
//    readable) -> y [H, W, Co], adding bias[co], bias2[co] and res[pixel, co] (each nullable).
struct WinoArgs {
  int H, W, C, Co, tw, i0, i1;
  const float* x;
  float* v;
  ptrdiff_t v_mat;
  const float* m;
  ptrdiff_t m_mat, m_ld;
  float* y;
  const float* bias;
  const float* bias2;
  const float* res;
};

// One (batch, head) of attention (lib/ops/attention.h's algorithm), f32. qkv/out/dout/dqkv point
// at sample b's rows; lse at lse[b, h, 0]. scratch: attn_scratch_floats(T, d) floats, 64-byte
// aligned, owned by the calling thread.
struct AttnArgs {
  int T, C, d;
  int q_off, k_off, v_off;  // channel offsets of this head's q, k, v in a qkv row
  int o_off;                // channel offset of this head in an out / dout row
  float scale;              // d^-1/4, applied to q and k each
  const float* qkv;
  float* out;
  float* lse;
  const float* dout;
  float* dqkv;
};

// One sample of GroupNorm (+ scale-shift + SiLU), f32; statistics summed in float blocks added in
// double.
// x, y, dy, dx: sample b's [HW, C]; ss: its [2C] row (nullable); mean, rstd: its [G] row.
// Backward: dgamma_part / dbeta_part [C] (double) receive this sample's sums (the caller adds
// them over samples in order); dss: its [2C] row (nullable); dx nullable.
// scratch: gn_scratch_floats(HW, C) floats owned by the calling thread.
struct GnArgs {
  int HW, C, G;
  bool silu;
  const float* x;
  const float* gamma;
  const float* beta;
  const float* ss;
  float* y;
  float* mean;
  float* rstd;
  const float* dy;
  float* dx;
  float* dss;
  double* dgamma_part;
  double* dbeta_part;
};

struct Kernels {
  const char* name;  // "avx512" / "avx2": the variant's name
  int lanes;         // floats per vector
  bool built;        // false when the compiler could not target the instruction set
  void (*gemm)(const GemmArgs&);
  void (*wino_input)(const WinoArgs&);
  void (*wino_output)(const WinoArgs&);
  void (*attn_fwd)(const AttnArgs&, float* scratch);
  void (*attn_bwd)(const AttnArgs&, float* scratch);
  void (*gn_fwd)(const GnArgs&, float* scratch);
  void (*gn_apply)(const GnArgs&, float* scratch);  // y from the given mean and rstd
  void (*gn_bwd)(const GnArgs&, float* scratch);
};

// (static: these are compiled into the instruction-set files too, and must not be shared with them)
static inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }
// Row stride of the [T, *] matrices in the attention scratch, and the scratch's size.
// Query rows per block of the attention kernels: the block's softmax weights stay in cache (64 KB
// at T = 256), and the gradients summed over query rows (dk, dv) get 64 of them per GEMM.
constexpr int kAttnRB = 64;
static inline size_t attn_ld(int T) { return round_up((size_t)T, 16); }
static inline size_t attn_scratch_floats(int T, int d) {
  const size_t ld = attn_ld(T), dd = round_up((size_t)d, 16);
  return 2 * (size_t)kAttnRB * ld + 4 * ld * dd + 2 * dd * ld + 64;
}
// GroupNorm: per-channel arrays (4 of doubles, 9 of floats), then HW*C floats for dz.
static inline size_t gn_scratch_floats(int HW, int C) {
  return 17 * round_up((size_t)C, 16) + (size_t)HW * C + 64;
}

// The kernels of an instruction set when this build has them and this CPU runs them, else nullptr.
const Kernels* avx512_kernels();
const Kernels* avx2_kernels();

}  // namespace unet::cpufast
