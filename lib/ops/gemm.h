// The one GEMM helper behind the CPU reference's conv, linear and attention ops.
//
// C[M,N] += A[M,K] * B[K,N], with A(i,p) = A[i*a_rs + p*a_cs] (so A may be read transposed),
// B row-major (row stride ldb), C row-major (row stride ldc).
//
// Every C element starts from its current value and adds its K products in ascending p order,
// whatever the tiling below, so a result depends only on the shapes and the data — never on how
// a caller splits the work over threads. That is what keeps the CPU engine bit-deterministic.
// The register tile (MR x NR accumulators, inner loop over NR contiguous columns of B) is what
// lets the compiler vectorise without reassociating any sum.
#pragma once
#include <algorithm>
#include <cstddef>
#include <type_traits>

namespace unet::ref {

namespace detail {

// lib/ops/gemm.cpp: the float tile in AVX2+FMA, used when the CPU has both.
bool use_avx2_fma();
void sgemm_tile_4x16_avx2(int k0, int k1, const float* A, ptrdiff_t a_rs, ptrdiff_t a_cs, const float* B,
                          ptrdiff_t ldb, float* C, ptrdiff_t ldc);

template <class T, int MR, int NR>
inline void gemm_tile(int k0, int k1, const T* A, ptrdiff_t a_rs, ptrdiff_t a_cs, const T* B, ptrdiff_t ldb,
                      T* C, ptrdiff_t ldc) {
  T acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = C[r * ldc + c];
  for (int p = k0; p < k1; ++p) {
    const T* b = B + p * ldb;
    for (int r = 0; r < MR; ++r) {
      const T a = A[r * a_rs + p * a_cs];
      for (int c = 0; c < NR; ++c) acc[r][c] += a * b[c];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) C[r * ldc + c] = acc[r][c];
}

// Ragged edge tiles: same per-element order (start from C, add products in ascending p).
template <class T>
inline void gemm_edge(int mr, int nr, int k0, int k1, const T* A, ptrdiff_t a_rs, ptrdiff_t a_cs, const T* B,
                      ptrdiff_t ldb, T* C, ptrdiff_t ldc) {
  for (int r = 0; r < mr; ++r)
    for (int c = 0; c < nr; ++c) {
      T s = C[r * ldc + c];
      for (int p = k0; p < k1; ++p) s += A[r * a_rs + p * a_cs] * B[p * ldb + c];
      C[r * ldc + c] = s;
    }
}

}  // namespace detail

// Serial; callers parallelise over independent blocks of C.
template <class T>
void gemm_acc(int M, int N, int K, const T* A, ptrdiff_t a_rs, ptrdiff_t a_cs, const T* B, ptrdiff_t ldb,
              T* C, ptrdiff_t ldc) {
  constexpr int MR = 4, NR = 16, KC = 256;  // KC: a B panel of KC x NR stays in L1
  bool avx2 = false;
  if constexpr (std::is_same_v<T, float>) avx2 = detail::use_avx2_fma();
  for (int k0 = 0; k0 < K; k0 += KC) {
    const int k1 = std::min(K, k0 + KC);
    for (int j = 0; j < N; j += NR) {
      const int nr = std::min(NR, N - j);
      for (int i = 0; i < M; i += MR) {
        const int mr = std::min(MR, M - i);
        const T* a = A + i * a_rs;
        T* c = C + i * ldc + j;
        if (mr == MR && nr == NR) {
          if constexpr (std::is_same_v<T, float>) {
            if (avx2) {
              detail::sgemm_tile_4x16_avx2(k0, k1, a, a_rs, a_cs, B + j, ldb, c, ldc);
              continue;
            }
          }
          detail::gemm_tile<T, MR, NR>(k0, k1, a, a_rs, a_cs, B + j, ldb, c, ldc);
        } else {
          detail::gemm_edge<T>(mr, nr, k0, k1, a, a_rs, a_cs, B + j, ldb, c, ldc);
        }
      }
    }
  }
}

// Parallel over 64x64 blocks of C (each block owned by one thread, so still deterministic).
template <class T>
void gemm_acc_par(int M, int N, int K, const T* A, ptrdiff_t a_rs, ptrdiff_t a_cs, const T* B, ptrdiff_t ldb,
                  T* C, ptrdiff_t ldc) {
  constexpr int BM = 64, BN = 64;
  const int mb = (M + BM - 1) / BM, nb = (N + BN - 1) / BN;
#pragma omp parallel for schedule(dynamic) if ((double)M * N * K > 1e5)
  for (int t = 0; t < mb * nb; ++t) {
    const int i = (t / nb) * BM, j = (t % nb) * BN;
    gemm_acc<T>(std::min(BM, M - i), std::min(BN, N - j), K, A + i * a_rs, a_rs, a_cs, B + j, ldb,
                C + i * ldc + j, ldc);
  }
}

}  // namespace unet::ref
