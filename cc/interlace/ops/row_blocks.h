// Per-rank contiguous row blocks and the slot-by-slot tile order over them: what ag_gemm's plan (a
// rank's shard of the gathered A) and gemm_rs's (the output rows a rank owns) have in common.
//
// Rank q's block is rows [start[q], start[q + 1]): uneven, 1-row and empty blocks allowed, so a tile
// row of tile_m rows may span several blocks. Each op maps a tile row to a slot (ag_gemm: the latest
// arrival among the shards it touches; gemm_rs: the earliest send turn among its owners), and the GEMM
// visits the tiles slot by slot (SlotOrder). Everything is closed form over tables small enough for
// kernel parameters (trivially copyable, no heap), so nothing is uploaded per shape.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "interlace/base/error.h"
#include "interlace/base/host_device.h"
#include "interlace/gemm/tile_plan.h"

namespace interlace {

constexpr int kRowBlocksMaxRanks = 72;

struct RowBlocks {
  int32_t world = 1;
  int32_t rank = 0;
  int32_t tile_m = 128;
  int64_t start[kRowBlocksMaxRanks + 1] = {};  // rank q's block is rows [start[q], start[q + 1])

  IL_HOST_DEVICE int64_t m() const { return start[world]; }
  IL_HOST_DEVICE int32_t tiles_m() const { return static_cast<int32_t>((m() + tile_m - 1) / tile_m); }
  IL_HOST_DEVICE int64_t rows_of(int32_t q) const { return start[q + 1] - start[q]; }

  // The rank whose block holds row `row` (0 <= row < m()): the last q with start[q] <= row, so never
  // an empty block.
  IL_HOST_DEVICE int32_t owner_of_row(int64_t row) const {
    int32_t lo = 0, hi = world - 1;
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

  // Tile row t's rows lie in the blocks of ranks first_owner(t) .. last_owner(t); those between may
  // be empty.
  IL_HOST_DEVICE int32_t first_owner(int32_t t) const { return owner_of_row(static_cast<int64_t>(t) * tile_m); }
  IL_HOST_DEVICE int32_t last_owner(int32_t t) const {
    const int64_t end = static_cast<int64_t>(t + 1) * tile_m;
    return owner_of_row((end < m() ? end : m()) - 1);
  }

  // The tile rows that touch q's block: first_tile_row(q) .. + tile_rows_of(q) - 1 (none if empty).
  IL_HOST_DEVICE int32_t first_tile_row(int32_t q) const { return static_cast<int32_t>(start[q] / tile_m); }
  IL_HOST_DEVICE int32_t tile_rows_of(int32_t q) const {
    if (rows_of(q) == 0) return 0;
    return static_cast<int32_t>((start[q + 1] - 1) / tile_m - start[q] / tile_m + 1);
  }
};

// Rows per rank (any may be 0; 1 to kRowBlocksMaxRanks ranks; under 2^31 rows in all, the kernels'
// 32-bit tile counters) into the table. `op` names the caller in errors.
RowBlocks make_row_blocks(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m, const char* op);

// A GEMM engine Order policy (gemm/tile_plan.h) over (tile row, tile column): slot by slot, and
// within a slot, whose tile rows are one contiguous range, BandedOrder's bands of band_m tile rows
// for L2 reuse.
struct SlotOrder {
  struct Params {
    int32_t tiles_n = 0;
    int32_t band_m = 1;
    int32_t slots = 1;
    int32_t first_position[kRowBlocksMaxRanks + 1] = {};  // slot s: positions [first_position[s], first_position[s + 1])
    int32_t first_row[kRowBlocksMaxRanks] = {};           // slot s: tile rows first_row[s] ...
  };

  // From the slot ranges: slot s (0 <= s < slots) holds tile rows first_row[s] .. + rows[s] - 1, the
  // slots one after another in the order (first_row of an empty slot is not read).
  static Params make(int32_t slots, const int32_t* first_row, const int32_t* rows, int32_t tiles_n, int32_t band_m,
                     const char* op);

  // From a slot function: slot_of(t) in [0, slots) for every tile row t in [0, tiles_m); each slot's
  // tile rows must be contiguous (raises otherwise). One pass over the tile rows (this runs on every
  // call).
  template <class SlotOf>
  static Params make(int32_t tiles_m, int32_t slots, const SlotOf& slot_of, int32_t tiles_n, int32_t band_m,
                     const char* op) {
    IL_CHECK(slots >= 1 && slots <= kRowBlocksMaxRanks, op, ": 1 to ", kRowBlocksMaxRanks, " slots, got ", slots);
    int32_t first_row[kRowBlocksMaxRanks] = {};
    int32_t rows[kRowBlocksMaxRanks] = {};
    for (int32_t t = 0; t < tiles_m; ++t) {
      const int32_t s = slot_of(t);
      IL_CHECK(s >= 0 && s < slots, op, ": tile row ", t, " is in slot ", s, ", out of range for ", slots, " slots");
      if (rows[s]++ == 0) first_row[s] = t;
      IL_CHECK(t == first_row[s] + rows[s] - 1, op, ": slot ", s, "'s tile rows are not contiguous");
    }
    return make(slots, first_row, rows, tiles_n, band_m, op);
  }

  IL_HOST_DEVICE static inline void tile(const Params& p, int32_t i, int32_t& m_idx, int32_t& n_idx) {
    int32_t s = 0;
    while (i >= p.first_position[s + 1]) ++s;
    const int32_t begin = p.first_position[s];
    const int32_t tiles_m = (p.first_position[s + 1] - begin) / p.tiles_n;
    const BandedOrder::Params slot{tiles_m, p.tiles_n, p.band_m < tiles_m ? p.band_m : tiles_m};
    BandedOrder::tile(slot, i - begin, m_idx, n_idx);
    m_idx += p.first_row[s];
  }
};

// The tile rows in SlotOrder's order, slot by slot and ascending within a slot: the host reference
// the closed form is tested against. slot_of as for SlotOrder::make.
template <class SlotOf>
std::vector<int32_t> slot_tile_row_order(int32_t tiles_m, int32_t slots, const SlotOf& slot_of) {
  std::vector<int32_t> order;
  order.reserve(tiles_m);
  for (int32_t slot = 0; slot < slots; ++slot) {
    for (int32_t t = 0; t < tiles_m; ++t) {
      if (slot_of(t) == slot) order.push_back(t);
    }
  }
  return order;
}

// Kernel parameters: copied as bytes, and small enough to leave most of the 4 KiB to the engine.
static_assert(std::is_trivially_copyable<RowBlocks>::value && std::is_trivially_copyable<SlotOrder::Params>::value,
              "row blocks and slot orders are kernel parameters");
static_assert(sizeof(RowBlocks) <= 1024 && sizeof(SlotOrder::Params) <= 1024, "row tables outgrew kernel parameters");

}  // namespace interlace
