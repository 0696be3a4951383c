#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "interlace/base/tensor.h"
#include "interlace/ops/ag_gemm/plan.h"
#include "interlace/runtime/group.h"

namespace interlace {

// 0 means automatic.
struct AgGemmTuning {
  int64_t chunk_rows = 0;  // rows per transfer chunk (one flag each); see ag_gemm_chunk_rows
  int band_m = 0;          // cluster-tile rows per band of the tile order within a shard (L2 reuse)
  int tile_n = 0;          // cooperative only: output tile width, 128 or 256 (0: choose_tile_n)
  bool pingpong = true;    // consumer warpgroups on alternate 128 x 128 tiles (as gemm); false: cooperative
  AgGemmTransfer transfer = AgGemmTransfer::kAuto;  // how the shards travel
  int copy_ctas = 0;       // with kCopyCtas: CTAs (SMs) set aside to push, a multiple of 2 (the cluster)
};

// out[M, N] = A[M, K] @ b, where A is every rank's a_shard ([M_r, K], row-major) stacked in rank
// order, in one launch: the shards travel over NVLink while the GEMM computes on those that have
// landed. b is [K, N], row-major or K-contiguous (a Linear weight [N, K] passed transposed).
// shard_rows: every rank's M_r, the same list on every rank; empty means even shards (M_r = M / W).
// gathered (optional, [M, K]) receives A; when it lies in the group's heap the shards land there
// directly, otherwise in heap scratch from which it is copied. Checks everything before GPU work.
void ag_gemm(Group& group, const TensorView& a_shard, const TensorView& b, const TensorView& out,
             const TensorView* gathered, const std::vector<int64_t>& shard_rows, cudaStream_t stream,
             AgGemmTuning tuning = {});

}  // namespace interlace
