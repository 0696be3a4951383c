// interlace::gemm: out[M, N] = a[M, K] @ b[K, N] on one GPU with the Hopper engine (bf16/fp16 in,
// fp32 accumulation, output in the input dtype). Checks everything before any GPU work.
#pragma once

#include <cuda_runtime_api.h>

#include "interlace/base/tensor.h"

namespace interlace {

// 0 means automatic. The defaults come from bench/results (NOTES.md): ping-pong consumers on
// 128 x 128 tiles, 2-CTA clusters, bands of 8 cluster rows (16 for 256-wide cooperative tiles); on
// a GPU lean on HBM bandwidth, cooperative tiles on large problems (automatic_gemm_schedule, tile_plan.h).
struct GemmTuning {
  int band_m = 0;         // cluster-tile rows per band of the tile order (L2 reuse); see BandedOrder
  int tile_n = 0;         // cooperative only: output tile width, 128 or 256 (0: choose_tile_n)
  int cluster_m = 0;      // CTAs per cluster along M, 1 or 2 (2: the pair shares B through TMA multicast;
                          // automatic: 1 for one tile row, M <= 128)
  bool pingpong = true;   // consumer warpgroups on alternate 128 x 128 tiles; false: cooperative
  // All four automatic (the defaults) at decode sizes with b K-major: the swapped problem (gemm.cu).
};

void gemm(const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream, GemmTuning tuning = {});

}  // namespace interlace
