// Host-side checks of interlace::gemm's arguments: everything is validated before any GPU work.
#pragma once

#include <cstdint>

#include "interlace/base/tensor.h"

namespace interlace {

enum class GemmDtype { kBf16, kF16 };

struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  GemmDtype dtype = GemmDtype::kBf16;
  bool b_k_major = false;  // b is [K, N] with K contiguous (a Linear weight [N, K], passed as weight.t())
  int64_t lda = 0, ldb = 0, ldc = 0;  // leading strides in elements
};

// a: [M, K] row-major; b: [K, N], row-major or column-major (weight.t() of a [N, K] weight);
// out: [M, N] row-major. bf16 or fp16, all alike, on CUDA `device`. Rows 16-byte aligned (TMA).
GemmProblem check_gemm_args(const TensorView& a, const TensorView& b, const TensorView& out, int device);

}  // namespace interlace
