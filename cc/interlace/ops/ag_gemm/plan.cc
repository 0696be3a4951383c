#include "interlace/ops/ag_gemm/plan.h"

#include <algorithm>

#include "interlace/base/error.h"

namespace interlace {

AgGemmRows make_ag_gemm_rows(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m) {
  const int world = static_cast<int>(rows_per_rank.size());
  IL_CHECK(world >= 1 && world <= kAgGemmMaxRanks, "ag_gemm: 1 to ", kAgGemmMaxRanks, " ranks, got ", world);
  IL_CHECK(rank >= 0 && rank < world, "ag_gemm: rank ", rank, " is out of range for ", world, " ranks");
  IL_CHECK(tile_m > 0, "ag_gemm: tile_m must be positive");
  AgGemmRows r;
  r.world = world;
  r.rank = rank;
  r.tile_m = tile_m;
  for (int q = 0; q < world; ++q) {
    IL_CHECK(rows_per_rank[q] >= 0, "ag_gemm: rank ", q, "'s shard has ", rows_per_rank[q], " rows");
    // Checked as it grows, so that the sum cannot overflow first.
    IL_CHECK(rows_per_rank[q] < (int64_t{1} << 31) - r.start[q], "ag_gemm: the shards up to rank ", q,
             " hold 2^31 rows or more, past the kernel's 32-bit tile counters");
    r.start[q + 1] = r.start[q] + rows_per_rank[q];
  }
  return r;
}

std::vector<int32_t> ag_gemm_tile_row_order(const AgGemmRows& rows) {
  std::vector<int32_t> order;
  order.reserve(rows.tiles_m());
  for (int32_t slot = 0; slot < rows.world; ++slot) {
    for (int32_t t = 0; t < rows.tiles_m(); ++t) {
      if (rows.slot_of(t) == slot) order.push_back(t);
    }
  }
  return order;
}

AgGemmOrder::Params AgGemmOrder::make(const AgGemmRows& rows, int32_t tiles_n, int32_t band_m) {
  IL_CHECK(tiles_n >= 0 && band_m >= 1, "ag_gemm: bad tile order (tiles_n ", tiles_n, ", band_m ", band_m, ")");
  Params p;
  p.tiles_n = tiles_n;
  p.band_m = band_m;
  p.slots = rows.world;
  // One pass over the tile rows (this runs on every call): each slot's first row and count.
  int32_t count[kAgGemmMaxRanks] = {};
  for (int32_t t = 0; t < rows.tiles_m(); ++t) {
    const int32_t s = rows.slot_of(t);
    if (count[s]++ == 0) p.first_row[s] = t;
    IL_CHECK(t == p.first_row[s] + count[s] - 1, "ag_gemm: slot ", s, "'s tile rows are not contiguous");
  }
  int32_t position = 0;
  for (int32_t s = 0; s < rows.world; ++s) {
    p.first_position[s] = position;
    position += count[s] * tiles_n;
  }
  for (int32_t s = rows.world; s <= kAgGemmMaxRanks; ++s) p.first_position[s] = position;
  return p;
}

int64_t ag_gemm_chunk_rows(const AgGemmRows& rows, int64_t row_bytes, int ctas, int64_t requested) {
  int64_t largest = 0;
  for (int q = 0; q < rows.world; ++q) largest = std::max(largest, rows.start[q + 1] - rows.start[q]);
  const int64_t fewest = std::max<int64_t>(1, (largest + kAgGemmMaxChunks - 1) / kAgGemmMaxChunks);
  if (requested > 0) {
    IL_CHECK(requested >= fewest, "ag_gemm: chunk_rows=", requested, " cuts a shard of ", largest, " rows into more than ",
             kAgGemmMaxChunks, " chunks; use at least ", fewest);
    return std::min(requested, std::max<int64_t>(largest, 1));  // one chunk per shard at most: no overflow
  }
  const int64_t by_bytes = std::max<int64_t>(1, (int64_t{256} << 10) / std::max<int64_t>(row_bytes, 1));
  const int64_t by_ctas = std::max<int64_t>(1, (largest + 2 * ctas - 1) / (2 * std::max(ctas, 1)));
  return std::max(fewest, std::min(by_bytes, by_ctas));
}

}  // namespace interlace
