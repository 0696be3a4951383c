// Host and device plan of ag_gemm (issue: fused AllGather+GEMM): which rows of the gathered A each
// rank's shard holds, in which order the GEMM visits tile rows so that it never waits for the
// network when it need not, and which shards a tile row must wait for. Groundwork: the kernel that
// executes it is not built yet.
//
// Shards may be uneven (a shard of 1 row, a rank with none), so a 128-row tile row can span several
// shards. The order is by shard: this rank's own shard first (no wait), then the peers' in the order
// their shards arrive (all_gather pushes to rank + 1 first, so rank r hears from r - 1 first, then
// r - 2, ...). A tile row spanning shards is computed with the shard that arrives last among them,
// so its wait is never longer than its neighbours'. Everything is closed form over a per-rank table
// small enough for kernel parameters, so nothing is uploaded per shape.
#pragma once

#include <cstdint>
#include <vector>

#include "interlace/base/host_device.h"

namespace interlace {

constexpr int kAgGemmMaxRanks = 72;

struct AgGemmRows {
  int32_t world = 1;
  int32_t rank = 0;
  int32_t tile_m = 128;
  int64_t start[kAgGemmMaxRanks + 1] = {};  // rank q's shard is rows [start[q], start[q + 1])

  IL_HOST_DEVICE int64_t m() const { return start[world]; }
  IL_HOST_DEVICE int32_t tiles_m() const { return static_cast<int32_t>((m() + tile_m - 1) / tile_m); }

  // Position of rank q's shard in the arrival order: 0 for this rank, then r - 1, r - 2, ...
  IL_HOST_DEVICE int32_t arrival(int32_t q) const { return (rank - q + world) % world; }

  // The rank whose shard holds row `row`.
  IL_HOST_DEVICE int32_t owner_of_row(int64_t row) const {
    int32_t lo = 0, hi = world - 1;  // the last q with start[q] <= row, skipping empty shards
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (start[mid] <= row) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }

  // The shards tile row t touches are ranks first_rank(t) .. last_rank(t) (some may be empty).
  IL_HOST_DEVICE int32_t first_rank(int32_t t) const { return owner_of_row(static_cast<int64_t>(t) * tile_m); }
  IL_HOST_DEVICE int32_t last_rank(int32_t t) const {
    const int64_t end = static_cast<int64_t>(t + 1) * tile_m < m() ? static_cast<int64_t>(t + 1) * tile_m : m();
    return owner_of_row(end - 1);
  }

  // The arrival slot a tile row is computed in: the latest arrival among the shards it touches.
  IL_HOST_DEVICE int32_t slot_of(int32_t t) const {
    int32_t latest = 0;
    for (int32_t q = first_rank(t); q <= last_rank(t); ++q) {
      if (start[q + 1] > start[q] && arrival(q) > latest) latest = arrival(q);
    }
    return latest;
  }
};

// The tile rows in visiting order: slot by slot (this rank's shard, then peers' as they arrive),
// ascending within a slot. Host reference; the kernel walks the same order in closed form.
std::vector<int32_t> ag_gemm_tile_row_order(const AgGemmRows& rows);

// Rows per rank (any may be 0; at most kAgGemmMaxRanks ranks) into the plan's table.
AgGemmRows make_ag_gemm_rows(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m = 128);

}  // namespace interlace
