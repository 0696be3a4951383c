// Host and device plan of ag_gemm (issue: fused AllGather+GEMM): which rows of the gathered A each
// rank's shard holds, in which order the GEMM visits tile rows so that it never waits for the
// network when it need not, and which shards a tile row must wait for.
//
// Shards may be uneven (a shard of 1 row, a rank with none), so a 128-row tile row can span several
// shards. The order is by shard: this rank's own shard first (no wait), then the peers' in the order
// their shards arrive (ag_gemm's helpers push to rank + 1 first, so rank r hears from r - 1 first,
// then r - 2, ...). A tile row spanning shards is computed with the shard that arrives last among them,
// so its wait is never longer than its neighbours'. Everything is closed form over a per-rank table
// small enough for kernel parameters, so nothing is uploaded per shape.
//
// Each shard travels in chunks of chunk_rows rows, one flag per chunk and sender on every receiver.
#pragma once

#include <cstdint>
#include <vector>

#include "interlace/base/host_device.h"
#include "interlace/ops/row_blocks.h"

namespace interlace {

constexpr int kAgGemmMaxRanks = kRowBlocksMaxRanks;
// Chunks per shard: each has a flag per sender on every receiver (ops/ag_gemm/flags.h).
constexpr int kAgGemmMaxChunks = 1024;

// The shards as row blocks (ops/row_blocks.h): rank q's shard is rows [start[q], start[q + 1]).
struct AgGemmRows : RowBlocks {
  // Position of rank q's shard in the arrival order: 0 for this rank, then r - 1, r - 2, ...
  IL_HOST_DEVICE int32_t arrival(int32_t q) const { return (rank - q + world) % world; }

  // The arrival slot a tile row is computed in: the latest arrival among the shards it touches.
  IL_HOST_DEVICE int32_t slot_of(int32_t t) const {
    int32_t latest = 0;
    for (int32_t q = first_owner(t); q <= last_owner(t); ++q) {
      if (rows_of(q) > 0 && arrival(q) > latest) latest = arrival(q);
    }
    return latest;
  }
};

// The kernel's order over (tile row, tile column), a GEMM engine Order policy: SlotOrder over the
// arrival slots (slot_of), bands of band_m tile rows within a slot.
struct AgGemmOrder : SlotOrder {
  // rows.tile_m is the height of the tiles the order walks (a cluster's).
  static Params make(const AgGemmRows& rows, int32_t tiles_n, int32_t band_m);
};

// Rows per chunk: chunks of about 256 KiB, at least two per CTA of `ctas` where shards are small
// (so that every CTA's helpers push), at most kAgGemmMaxChunks per shard. `requested` > 0 overrides
// (no more than the largest shard).
int64_t ag_gemm_chunk_rows(const AgGemmRows& rows, int64_t row_bytes, int ctas, int64_t requested);

// CTAs set aside to push this rank's shard (AgGemmTuning::copy_ctas), a multiple of `cluster` that
// leaves at least one cluster of the `ctas` to compute. Automatic (requested 0): kAgGemmCopyCtas
// when there are peers and rows, else none; -1: none (the GEMM CTAs' idle warps push).
constexpr int kAgGemmCopyCtas = 8;
int ag_gemm_copy_ctas(const AgGemmRows& rows, int64_t row_bytes, int ctas, int cluster, int requested);

// The tile rows in visiting order: slot by slot (this rank's shard, then peers' as they arrive),
// ascending within a slot. Host reference; the kernel walks the same order in closed form.
std::vector<int32_t> ag_gemm_tile_row_order(const AgGemmRows& rows);

// Rows per rank (any may be 0; at most kAgGemmMaxRanks ranks) into the plan's table.
AgGemmRows make_ag_gemm_rows(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m = 128);

}  // namespace interlace
