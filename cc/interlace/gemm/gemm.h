// interlace::gemm: out[M, N] = a[M, K] @ b[K, N] on one GPU with the Hopper engine (bf16/fp16 in,
// fp32 accumulation, output in the input dtype). Checks everything before any GPU work.
#pragma once

#include <cuda_runtime_api.h>

#include "interlace/api/tensor.h"

namespace interlace {

struct GemmTuning {
  int band_m = 8;  // tile rows per band of the tile order (L2 reuse); see banded_tile_order
  int tile_n = 0;  // output tile width, 128 or 256; 0: choose_tile_n
  int cluster_m = 1;  // CTAs per cluster along M (2: they share B through TMA multicast)
};

void gemm(const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream, GemmTuning tuning = {});

}  // namespace interlace
