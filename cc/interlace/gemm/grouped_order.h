// The tile order of a grouped GEMM (grouped_gemm.h): G problems of C rows each, group g using only its
// first rows[g] rows, a count the GPU reads when the kernel runs (a mixture of experts' token counts,
// never synced to the host). Positions run over every tile the groups could have, G x ceil(C / 128)
// tile rows by tiles_n columns; tile() says whether a position is a tile of this launch, and the
// engine's walk passes over those that are not. Within a group, column by column and down the tile
// rows of each column, so the CTAs running at one time share a column of b[g] (an expert's weights,
// the large operand when C is small) and read it from memory once.
#pragma once

#include <cstdint>

#include "interlace/base/host_device.h"

namespace interlace {

struct GroupedOrder {
  struct Params {
    const int32_t* rows = nullptr;  // [G] on the GPU: the rows each group uses (clamped to capacity)
    int32_t capacity = 0;           // C
    int32_t tile_rows = 0;          // ceil(C / kTileM): tile rows per group
    int32_t tiles_n = 0;
  };

  static constexpr int32_t kTileM = 128;

  // Group g's rows, at most C (a count past capacity is the caller's overflow, reported elsewhere).
  IL_HOST_DEVICE static inline int32_t rows_of(const Params& p, int32_t g) {
    const int32_t r = p.rows[g];
    return r < 0 ? 0 : r < p.capacity ? r : p.capacity;
  }

  // Position i to its tile: m_idx counts tile rows across groups (g * tile_rows + row in the group).
  // False where the tile row lies past the group's rows: nothing to compute there.
  IL_HOST_DEVICE static inline bool tile(const Params& p, int32_t i, int32_t& m_idx, int32_t& n_idx) {
    const int32_t group_tiles = p.tile_rows * p.tiles_n;
    const int32_t g = i / group_tiles;
    const int32_t in_group = i - g * group_tiles;
    n_idx = in_group / p.tile_rows;
    const int32_t row = in_group - n_idx * p.tile_rows;
    m_idx = g * p.tile_rows + row;
    return row * kTileM < rows_of(p, g);
  }

  // A tile row (m_idx as tile() gives it) to its group and its tile row within the group.
  IL_HOST_DEVICE static inline void locate(const Params& p, int32_t m_idx, int32_t& group, int32_t& row) {
    group = m_idx / p.tile_rows;
    row = m_idx - group * p.tile_rows;
  }
};

}  // namespace interlace
