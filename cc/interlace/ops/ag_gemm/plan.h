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
#include <string>
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

// Tile rows per band of the order (AgGemmOrder), for `rows` in the order's tile height. A band's
// first tile column needs all of its rows, so a band spanning a whole shard would wait for that
// shard's last chunk: at most half the largest shard (at least 2), and `preferred` (what keeps the
// bands' B in L2) where shards are tall. `requested` > 0 overrides. Measured on 2 x H200: M = 4096
// (8 tile rows per shard) went from 0.50 to 0.44 ms with 4 instead of 8; taller shards keep 8.
int32_t ag_gemm_band_m(const AgGemmRows& rows, int32_t preferred, int32_t requested);

// How the shards travel to the GPUs that need them.
enum class AgGemmTransfer : int32_t {
  kAuto = 0,        // ag_gemm_transfer decides
  kCopyEngine = 1,  // each rank's copy engines pull the peers' shards: the GEMM keeps every SM
  kCopyCtas = 2,    // CTAs set aside from the GEMM push (ag_gemm_copy_ctas of them)
};

// The transfer for these shards: the copy engines unless another is requested.
AgGemmTransfer ag_gemm_transfer(AgGemmTransfer requested);
// The transfer named by the Python API's transfer= ("auto", "copy_engine", "ctas").
AgGemmTransfer ag_gemm_transfer_named(const std::string& name);

// Rows per chunk (one flag each; at most kAgGemmMaxChunks per shard). For the copy engines, chunks of
// about 4 MiB and at most kAgGemmCopyEngineChunks per shard (each is a copy and a flag write queued
// on the host); for SM pushes, about 256 KiB, at least two per pushing CTA of `ctas` where shards
// are small, so that every CTA pushes. `requested` > 0 overrides (no more than the largest shard).
constexpr int64_t kAgGemmCopyEngineChunks = 32;
int64_t ag_gemm_chunk_rows(const AgGemmRows& rows, int64_t row_bytes, AgGemmTransfer transfer, int ctas,
                           int64_t requested);

// With AgGemmTransfer::kCopyCtas: the CTAs set aside to push, a multiple of `cluster` that leaves
// at least one cluster of the `ctas` to compute; requested 0 means kAgGemmCopyCtas (or fewer on a
// small GPU).
constexpr int kAgGemmCopyCtas = 8;
int ag_gemm_copy_ctas(int ctas, int cluster, int requested);

// The tile rows in visiting order: slot by slot (this rank's shard, then peers' as they arrive),
// ascending within a slot. Host reference; the kernel walks the same order in closed form.
std::vector<int32_t> ag_gemm_tile_row_order(const AgGemmRows& rows);

// Rows per rank (any may be 0; at most kAgGemmMaxRanks ranks) into the plan's table.
AgGemmRows make_ag_gemm_rows(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m = 128);

}  // namespace interlace
