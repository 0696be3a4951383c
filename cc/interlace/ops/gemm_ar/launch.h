#pragma once

#include <cuda_runtime_api.h>

#include "interlace/base/tensor.h"
#include "interlace/ops/gemm_rs/launch.h"
#include "interlace/runtime/group.h"

namespace interlace {

// out[M, N] = sum over ranks r of a_r @ b_r on every rank, in one launch (fused GEMM + AllReduce):
// a: [M, K_r] row-major, this rank's slice of K (K_r may differ across ranks, but is 0 on all or on
// none); b: [K_r, N], row-major or K-contiguous (a Linear weight [N, K_r] passed transposed). bf16 or
// fp16; partials summed in fp32 in rank order and rounded once, by one owner per tile row, so out is
// bitwise the same on every run and on every rank. Tuning as gemm_rs's. Checks everything before GPU
// work.
void gemm_ar(Group& group, const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream,
             GemmRsTuning tuning = {});

}  // namespace interlace
