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
    int32_t cluster_m = 1;          // tile rows per cluster tile (the engine's kClusterM)
    int32_t tile_rows = 0;          // tile rows per group: ceil(C / kTileM), rounded up to cluster_m
    int32_t tiles_n = 0;
  };

  static constexpr int32_t kTileM = 128;
  static constexpr int32_t kTileN = 128;

  static Params make(const int32_t* rows, int64_t capacity, int64_t n, int cluster_m) {
    Params p;
    p.rows = rows;
    p.capacity = static_cast<int32_t>(capacity);
    p.cluster_m = cluster_m;
    const int64_t cluster_rows = (capacity + kTileM * cluster_m - 1) / (kTileM * cluster_m);
    p.tile_rows = static_cast<int32_t>(cluster_rows * cluster_m);
    p.tiles_n = static_cast<int32_t>((n + kTileN - 1) / kTileN);
    return p;
  }

  // Group g's rows, at most C (a count past capacity is the caller's overflow, reported elsewhere).
  IL_HOST_DEVICE static inline int32_t rows_of(const Params& p, int32_t g) {
    const int32_t r = p.rows[g];
    return r < 0 ? 0 : r < p.capacity ? r : p.capacity;
  }

  // Position i (of G x tile_rows / cluster_m x tiles_n) to its cluster tile: m_idx counts cluster
  // tile rows across groups, so that the engine's tile row m_idx * cluster_m + (CTA in cluster) is
  // g * tile_rows + (tile row in the group). False where the cluster tile's first row lies past the
  // group's rows: nothing to compute there. (A cluster's later tile rows may still lie past them: TMA
  // reads zeros there, and the store skips them.)
  IL_HOST_DEVICE static inline bool tile(const Params& p, int32_t i, int32_t& m_idx, int32_t& n_idx) {
    const int32_t cluster_rows = p.tile_rows / p.cluster_m;
    const int32_t group_tiles = cluster_rows * p.tiles_n;
    const int32_t g = i / group_tiles;
    const int32_t in_group = i - g * group_tiles;
    n_idx = in_group / cluster_rows;
    const int32_t row = in_group - n_idx * cluster_rows;
    m_idx = g * cluster_rows + row;
    return row * p.cluster_m * kTileM < rows_of(p, g);
  }

  // A tile row (the engine's: cluster tile row x cluster_m + CTA in cluster) to its group and its
  // tile row within the group.
  IL_HOST_DEVICE static inline void locate(const Params& p, int32_t m_idx, int32_t& group, int32_t& row) {
    group = m_idx / p.tile_rows;
    row = m_idx - group * p.tile_rows;
  }
};

}  // namespace interlace
