#include "interlace/ops/row_blocks.h"

#include "interlace/base/error.h"

namespace interlace {

RowBlocks make_row_blocks(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m, const char* op) {
  const int world = static_cast<int>(rows_per_rank.size());
  IL_CHECK(world >= 1 && world <= kRowBlocksMaxRanks, op, ": 1 to ", kRowBlocksMaxRanks, " ranks, got ", world);
  IL_CHECK(rank >= 0 && rank < world, op, ": rank ", rank, " is out of range for ", world, " ranks");
  IL_CHECK(tile_m > 0, op, ": tile_m must be positive, got ", tile_m);
  RowBlocks r;
  r.world = world;
  r.rank = rank;
  r.tile_m = tile_m;
  for (int q = 0; q < world; ++q) {
    IL_CHECK(rows_per_rank[q] >= 0, op, ": rank ", q, " has ", rows_per_rank[q], " rows");
    // Checked as it grows, so that the sum cannot overflow first.
    IL_CHECK(rows_per_rank[q] < (int64_t{1} << 31) - r.start[q], op, ": the rows of ranks 0 to ", q,
             " number 2^31 or more, past the kernel's 32-bit tile counters");
    r.start[q + 1] = r.start[q] + rows_per_rank[q];
  }
  return r;
}

SlotOrder::Params SlotOrder::make(int32_t slots, const int32_t* first_row, const int32_t* rows, int32_t tiles_n,
                                  int32_t band_m, const char* op) {
  IL_CHECK(tiles_n >= 0 && band_m >= 1, op, ": bad tile order (tiles_n ", tiles_n, ", band_m ", band_m, ")");
  IL_CHECK(slots >= 1 && slots <= kRowBlocksMaxRanks, op, ": 1 to ", kRowBlocksMaxRanks, " slots, got ", slots);
  int64_t tiles_m = 0;
  for (int32_t s = 0; s < slots; ++s) {
    IL_CHECK(rows[s] >= 0 && (rows[s] == 0 || first_row[s] >= 0), op, ": slot ", s, " has ", rows[s],
             " tile rows from ", first_row[s]);
    tiles_m += rows[s];
  }
  IL_CHECK(tiles_m * tiles_n <= kMaxGemmTiles, op, ": ", tiles_m, " x ", tiles_n, " tiles exceed the engine's ",
           kMaxGemmTiles);
  Params p;
  p.tiles_n = tiles_n;
  p.band_m = band_m;
  p.slots = slots;
  int32_t position = 0;
  for (int32_t s = 0; s < slots; ++s) {
    p.first_position[s] = position;
    p.first_row[s] = rows[s] > 0 ? first_row[s] : 0;
    position += rows[s] * tiles_n;
  }
  for (int32_t s = slots; s <= kRowBlocksMaxRanks; ++s) p.first_position[s] = position;
  return p;
}

}  // namespace interlace
