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
    r.start[q + 1] = r.start[q] + rows_per_rank[q];
  }
  IL_CHECK(r.m() < (int64_t{1} << 31), "ag_gemm: ", r.m(), " rows in all exceed the kernel's 32-bit tile counters");
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

}  // namespace interlace
