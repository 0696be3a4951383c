#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "interlace/base/tensor.h"
#include "interlace/runtime/group.h"

namespace interlace {

// 0 means automatic.
struct GemmRsTuning {
  int band_m = 0;        // cluster-tile rows per band of the tile order within an owner's block (L2 reuse)
  int tile_n = 0;        // cooperative only: output tile width, 128 or 256 (0: choose_tile_n)
  bool pingpong = true;  // consumer warpgroups on alternate 128 x 128 tiles (as gemm); false: cooperative
  // CTAs (SMs) set aside from the GEMM to sum this rank's tiles, a multiple of 2. 0: none where every
  // block starts on the 256-row cluster-tile grid (owners sum in the GEMM's epilogue) and on gemm_ar's
  // one-shot path (every rank sums in the epilogue), else 32. Given, it forces that many reducers (to
  // time one path against the other).
  int reduce_ctas = 0;
  // Blocks on the 256-row grid: cluster-tile rows per owner per round of the tile order
  // (GemmRsOrder::make_rounds), spreading the pushes over the whole GEMM; 0: automatic (the thinnest
  // that fit; off the grid, each owner's block whole, peers' first); a whole block or more: whole blocks.
  int round_m = 0;
};

// out = this rank's rows of sum over ranks r of a_r @ b_r, in one launch (fused GEMM + ReduceScatter).
// a: [M, K_r] row-major, this rank's slice of K (K_r may differ across ranks, but is 0 on all or on
// none); b: [K_r, N], row-major or K-contiguous (a Linear weight [N, K_r] passed transposed); out:
// [rows of this rank, N]. shard_rows: every rank's output rows, the same list on every rank; empty
// means even blocks (M / W). bf16 or fp16; partials summed in fp32 in rank order, rounded once.
// Checks everything before GPU work.
void gemm_rs(Group& group, const TensorView& a, const TensorView& b, const TensorView& out,
             const std::vector<int64_t>& shard_rows, cudaStream_t stream, GemmRsTuning tuning = {});

}  // namespace interlace
