// interlace::gemm: out[M, N] = a[M, K] @ b[K, N] on one GPU with the Hopper engine (bf16/fp16 in,
// fp32 accumulation, output in the input dtype). Checks everything before any GPU work.
#pragma once

#include <cuda_runtime_api.h>

#include "interlace/api/tensor.h"

namespace interlace {

// 0 means automatic everywhere. The automatic choices come from bench/results (NOTES.md): 2-CTA
// clusters, bands of 16 cluster rows for 256-wide tiles and 8 for 128-wide ones.
struct GemmTuning {
  int band_m = 0;     // cluster-tile rows per band of the tile order (L2 reuse); see banded_tile_order
  int tile_n = 0;     // output tile width, 128 or 256; see choose_tile_n
  int cluster_m = 0;  // CTAs per cluster along M, 1 or 2 (2: the pair shares B through TMA multicast)
  bool pingpong = false;  // ping-pong consumers on 128 x 128 tiles instead of cooperative ones
};

void gemm(const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream, GemmTuning tuning = {});

}  // namespace interlace
