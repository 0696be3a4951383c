// Host-side checks of interlace::gemm's arguments: everything is validated before any GPU work.
#pragma once

#include <cstdint>

#include "interlace/base/tensor.h"

namespace interlace {

enum class GemmDtype { kBf16, kF16 };

// The kernel counts rows, columns and K in 32-bit integers, and its coordinates run up to a cluster
// tile (256) past the edge and round K up to a whole k-tile (64): dimensions stay this far below 2^31.
inline constexpr int64_t kMaxGemmDim = (int64_t{1} << 31) - 1024;
// TMA descriptors take row strides below 2^40 bytes: 2^39 16-bit elements.
inline constexpr int64_t kMaxGemmRowStride = int64_t{1} << 39;

struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  GemmDtype dtype = GemmDtype::kBf16;
  bool b_k_major = false;  // b is [K, N] with K contiguous (a Linear weight [N, K], passed as weight.t())
  int64_t lda = 0, ldb = 0, ldc = 0;  // leading strides in elements; 0 for an operand without elements
};

// a: [M, K] row-major; b: [K, N], row-major or column-major (weight.t() of a [N, K] weight);
// out: [M, N] row-major. bf16 or fp16, all alike, on CUDA `device`. Rows 16-byte aligned (TMA).
// Dimensions up to kMaxGemmDim, row strides below kMaxGemmRowStride. An operand without elements
// (K = 0, or M or N = 0) is never touched, so its layout is not checked. out's bytes may not overlap
// a's or b's (byte ranges from the lowest to the highest element, so interleaved views count).
GemmProblem check_gemm_args(const TensorView& a, const TensorView& b, const TensorView& out, int device);

// out^T = b^T a^T over the same memory, for a b with K contiguous (b_k_major): b^T [N, K] row-major
// is b's memory with row stride ldb, and a [M, K] is a K-major [K, M] with column stride lda. The
// decode sizes' swapped GEMM (decode_swap_tile_n); ldc is still out's.
inline GemmProblem transposed(const GemmProblem& p) {
  GemmProblem t = p;
  t.m = p.n;
  t.n = p.m;
  t.lda = p.ldb;
  t.ldb = p.lda;
  return t;
}

// Whether two 2-D tensors share a byte, from the lowest to the highest element of each (strides
// included, so interleaved views count).
bool overlap_2d(const TensorView& a, const TensorView& b);

}  // namespace interlace
