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

namespace interlace {

constexpr int kAgGemmMaxRanks = 72;
// Chunks per shard: each has a flag per sender on every receiver (ops/ag_gemm/flags.h).
constexpr int kAgGemmMaxChunks = 1024;

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

// The kernel's order over (tile row, tile column), a GEMM engine Order policy (gemm/tile_plan.h):
// slot by slot, and within a slot, whose tile rows are one contiguous range, in bands of band_m
// tile rows for L2 reuse as BandedOrder does.
struct AgGemmOrder {
  struct Params {
    int32_t tiles_n = 0;
    int32_t band_m = 1;
    int32_t slots = 1;
    int32_t first_position[kAgGemmMaxRanks + 1] = {};  // slot s: positions [first_position[s], first_position[s + 1])
    int32_t first_row[kAgGemmMaxRanks] = {};           // slot s: tile rows first_row[s] ...
  };

  // rows.tile_m is the height of the tiles the order walks (a cluster's).
  static Params make(const AgGemmRows& rows, int32_t tiles_n, int32_t band_m);

  IL_HOST_DEVICE static inline void tile(const Params& p, int32_t i, int32_t& m_idx, int32_t& n_idx) {
    int32_t s = 0;
    while (i >= p.first_position[s + 1]) ++s;
    const int32_t begin = p.first_position[s];
    const int32_t tiles_m = (p.first_position[s + 1] - begin) / p.tiles_n;
    const int32_t band_m = p.band_m < tiles_m ? p.band_m : tiles_m;
    // BandedOrder over the slot's tiles_m x tiles_n.
    const int32_t band_tiles = band_m * p.tiles_n;
    const int32_t band = (i - begin) / band_tiles;
    const int32_t first = band * band_m;
    const int32_t rows = tiles_m - first < band_m ? tiles_m - first : band_m;
    const int32_t in_band = i - begin - band * band_tiles;
    n_idx = in_band / rows;
    m_idx = p.first_row[s] + first + (in_band - n_idx * rows);
  }
};

// Rows per chunk: chunks of about 256 KiB, at least two per CTA of `ctas` where shards are small
// (so that every CTA's helpers push), at most kAgGemmMaxChunks per shard. `requested` > 0 overrides
// (no more than the largest shard).
int64_t ag_gemm_chunk_rows(const AgGemmRows& rows, int64_t row_bytes, int ctas, int64_t requested);

// The tile rows in visiting order: slot by slot (this rank's shard, then peers' as they arrive),
// ascending within a slot. Host reference; the kernel walks the same order in closed form.
std::vector<int32_t> ag_gemm_tile_row_order(const AgGemmRows& rows);

// Rows per rank (any may be 0; at most kAgGemmMaxRanks ranks) into the plan's table.
AgGemmRows make_ag_gemm_rows(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m = 128);

}  // namespace interlace
