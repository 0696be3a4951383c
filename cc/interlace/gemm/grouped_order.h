// The tile order of a grouped GEMM (grouped_gemm.h): G problems of C rows each, group g using only its
// first rows[g] rows, a count the GPU reads when the kernel runs (a mixture of experts' token counts,
// never synced to the host). Positions run densely over the tiles the counts call for, group by
// group; within a group column by column and down the used cluster tile rows of each column, so the
// CTAs running at one time share a column of b[g] (an expert's weights, the large operand when C is
// small) and read it from memory once. Dense, so that every CTA gets its share of the tiles however
// few rows the groups use (with positions over all of C, tiles sat at multiples of the rows per group
// and most CTAs got none). Which group a position lies in takes a walk over the counts: each walk
// keeps a Cursor, which only moves forward since a walk's positions only grow.
#pragma once

#include <cstdint>

#include "interlace/base/host_device.h"

namespace interlace {

// What both grouped orders share: the counts, and the walk over groups of positions.
namespace grouped_walk {

// Group g's rows, at most C (a count past capacity is the caller's overflow, reported elsewhere).
IL_HOST_DEVICE inline int32_t rows_of(const int32_t* rows, int32_t capacity, int32_t g) {
  const int32_t r = rows[g];
  return r < 0 ? 0 : r < capacity ? r : capacity;
}

// Where a walk is: group `group`, whose first position is `first`.
struct Cursor {
  int32_t group = 0;
  int32_t first = 0;
};

// Group g holds units(g) x per_unit positions. The positions of groups 0 .. groups - 1:
template <class Units>
IL_HOST_DEVICE inline int32_t count(int32_t groups, int32_t per_unit, Units units) {
  int32_t n = 0;
  for (int32_t g = 0; g < groups; ++g) n += units(g) * per_unit;
  return n;
}

// Moves the cursor forward to the group holding position i (below the count, and at least the last
// i this cursor saw) and returns that group's units.
template <class Units>
IL_HOST_DEVICE inline int32_t seek(Cursor& at, int32_t i, int32_t per_unit, Units units) {
  int32_t used = units(at.group);
  while (i >= at.first + used * per_unit) {
    at.first += used * per_unit;
    used = units(++at.group);
  }
  return used;
}

}  // namespace grouped_walk

struct GroupedOrder {
  struct Params {
    const int32_t* rows = nullptr;  // [G] on the GPU: the rows each group uses (clamped to capacity)
    int32_t capacity = 0;           // C
    int32_t cluster_m = 1;          // tile rows per cluster tile (the engine's kClusterM)
    int32_t tile_rows = 0;          // tile rows per group: ceil(C / kTileM), rounded up to cluster_m
    int32_t tiles_n = 0;
  };

  static constexpr int32_t kTileM = 128;  // the engine's tile height (tile_n: its width, 128 or 256)

  static Params make(const int32_t* rows, int64_t capacity, int64_t n, int cluster_m, int tile_n) {
    Params p;
    p.rows = rows;
    p.capacity = static_cast<int32_t>(capacity);
    p.cluster_m = cluster_m;
    const int64_t cluster_rows = (capacity + kTileM * cluster_m - 1) / (kTileM * cluster_m);
    p.tile_rows = static_cast<int32_t>(cluster_rows * cluster_m);
    p.tiles_n = static_cast<int32_t>((n + tile_n - 1) / tile_n);
    return p;
  }

  IL_HOST_DEVICE static inline int32_t rows_of(const Params& p, int32_t g) {
    return grouped_walk::rows_of(p.rows, p.capacity, g);
  }

  // Cluster tile rows group g uses (those that hold any of its rows).
  IL_HOST_DEVICE static inline int32_t used_cluster_rows(const Params& p, int32_t g) {
    const int32_t cluster_rows = p.cluster_m * kTileM;
    return (rows_of(p, g) + cluster_rows - 1) / cluster_rows;
  }

  // The positions of this launch: every used cluster tile of every group.
  IL_HOST_DEVICE static inline int32_t count(const Params& p, int32_t groups) {
    return grouped_walk::count(groups, p.tiles_n, [&](int32_t g) { return used_cluster_rows(p, g); });
  }

  using Cursor = grouped_walk::Cursor;

  // Position i (i < count, and at least the last i this cursor saw) to its cluster tile: m_idx counts
  // cluster tile rows across groups, so that the engine's tile row m_idx * cluster_m + (CTA in
  // cluster) is g * tile_rows + (tile row in the group). A cluster's later tile rows may lie past the
  // group's rows: TMA reads zeros there, and the store skips them.
  IL_HOST_DEVICE static inline void tile(const Params& p, int32_t i, Cursor& at, int32_t& m_idx, int32_t& n_idx) {
    const int32_t used =
        grouped_walk::seek(at, i, p.tiles_n, [&](int32_t g) { return used_cluster_rows(p, g); });
    const int32_t in_group = i - at.first;
    n_idx = in_group / used;
    m_idx = at.group * (p.tile_rows / p.cluster_m) + (in_group - n_idx * used);
  }

  // A tile row (the engine's: cluster tile row x cluster_m + CTA in cluster) to its group and its
  // tile row within the group.
  IL_HOST_DEVICE static inline void locate(const Params& p, int32_t m_idx, int32_t& group, int32_t& row) {
    group = m_idx / p.tile_rows;
    row = m_idx - group * p.tile_rows;
  }
};

// The swapped grouped GEMM's tile order (grouped_gemm.cu: out[g]^T = b[g]^T a[g]^T, so that b[g]'s N
// runs down the tiles' 128 rows and a group's rows across their tile_rows-wide side). Each tile of
// b[g] is needed by every row tile of the group; CTAs that are not one cluster each read it from HBM
// (L2 does not share it between them; bench/results/NOTES.md, fifteenth session), so cluster_n row
// tiles side by side form a cluster tile and share it through multicast: at C <= 320, two 160-wide
// row tiles, one cluster, one read. A group whose rows fit one row tile has nothing for a partner to
// share, so there the cluster's CTAs work apart: CTA r takes weight-tile row cluster_n * q + r of it,
// each loading its own b (apart). Positions run densely over the groups with any rows, and within a
// group over its weight-tile rows, each with the group's cluster tiles side by side (or, apart, over
// its runs of cluster_n weight-tile rows). tile() gives a position's cluster tile, cta_tile() each
// CTA's tile of it: the engine's tile row m_idx is g * tiles_m + (weight-tile row), its column n_idx
// the row tile within the group.
struct SwappedGroupedOrder {
  struct Params {
    const int32_t* rows = nullptr;  // [G] on the GPU: the rows each group uses (clamped to capacity)
    int32_t capacity = 0;           // C
    int32_t tile_rows = 0;          // a group's rows per tile: the tiles' width
    int32_t tiles_m = 0;            // weight-tile rows per group: ceil(N / kTileM)
    int32_t cluster_n = 1;          // row tiles per cluster tile (the engine's kClusterN): 1 or 2
  };

  static constexpr int32_t kTileM = 128;  // the engine's tile height, over N
  static constexpr int32_t kApart = -1;   // tile()'s n_idx for a position whose CTAs work apart

  static Params make(const int32_t* rows, int64_t capacity, int64_t n, int tile_rows, int cluster_n) {
    Params p;
    p.rows = rows;
    p.capacity = static_cast<int32_t>(capacity);
    p.tile_rows = tile_rows;
    p.tiles_m = static_cast<int32_t>((n + kTileM - 1) / kTileM);
    p.cluster_n = cluster_n;
    return p;
  }

  IL_HOST_DEVICE static inline int32_t rows_of(const Params& p, int32_t g) {
    return grouped_walk::rows_of(p.rows, p.capacity, g);
  }

  // Whether group g's CTAs work apart: clusters of several row tiles and rows that fit one.
  IL_HOST_DEVICE static inline bool apart_group(const Params& p, int32_t g) {
    return p.cluster_n > 1 && rows_of(p, g) <= p.tile_rows;
  }

  // Cluster tiles group g uses side by side (those that hold any of its rows): one where C <=
  // tile_rows x cluster_n and the group has any rows.
  IL_HOST_DEVICE static inline int32_t used_cluster_tiles(const Params& p, int32_t g) {
    const int32_t cluster_rows = p.tile_rows * p.cluster_n;
    return (rows_of(p, g) + cluster_rows - 1) / cluster_rows;
  }

  // Group g's positions: per weight-tile row its cluster tiles, or apart its runs of weight-tile rows.
  IL_HOST_DEVICE static inline int32_t positions(const Params& p, int32_t g) {
    if (rows_of(p, g) == 0) return 0;
    return apart_group(p, g) ? (p.tiles_m + p.cluster_n - 1) / p.cluster_n : p.tiles_m * used_cluster_tiles(p, g);
  }

  IL_HOST_DEVICE static inline int32_t count(const Params& p, int32_t groups) {
    return grouped_walk::count(groups, 1, [&](int32_t g) { return positions(p, g); });
  }

  using Cursor = grouped_walk::Cursor;

  // Position i (i < count, and at least the last i this cursor saw) to its tile row and cluster tile;
  // apart, to the run's first tile row and kApart.
  IL_HOST_DEVICE static inline void tile(const Params& p, int32_t i, Cursor& at, int32_t& m_idx, int32_t& n_idx) {
    grouped_walk::seek(at, i, 1, [&](int32_t g) { return positions(p, g); });
    const int32_t in_group = i - at.first;
    if (apart_group(p, at.group)) {
      m_idx = at.group * p.tiles_m + in_group * p.cluster_n;
      n_idx = kApart;
      return;
    }
    const int32_t used = used_cluster_tiles(p, at.group);
    const int32_t weight_row = in_group / used;
    m_idx = at.group * p.tiles_m + weight_row;
    n_idx = in_group - weight_row * used;
  }

  // CTA `rank` of a cluster's tile of the cluster tile (m_idx, n_idx) tile() gave: row tile
  // cluster_n * n_idx + rank of tile row m_idx; apart, row tile 0 of tile row m_idx + rank, or, past
  // the group's tile rows (an odd run's last), row tile 1 of m_idx, which is empty.
  IL_HOST_DEVICE static inline void cta_tile(const Params& p, int32_t m_idx, int32_t n_idx, int32_t rank,
                                             int32_t& m, int32_t& n) {
    if (n_idx != kApart) {
      m = m_idx;
      n = n_idx * p.cluster_n + rank;
    } else if (m_idx % p.tiles_m + rank < p.tiles_m) {
      m = m_idx + rank;
      n = 0;
    } else {
      m = m_idx;
      n = 1;
    }
  }

  // Whether the CTA of tile row m_idx loads its b alone (its cluster works apart) rather than a
  // 1 / cluster_n share of it, multicast. An odd last run (one tile row, tiles_m odd) is shared as a
  // pair's: both CTAs have that row (cta_tile), so reading it once is right.
  IL_HOST_DEVICE static inline bool apart(const Params& p, int32_t m_idx) {
    const int32_t row = m_idx % p.tiles_m;
    return apart_group(p, m_idx / p.tiles_m) && row - row % p.cluster_n + p.cluster_n <= p.tiles_m;
  }

  // Whether the engine's tile (m_idx, n_idx: a row tile) holds none of its group's rows: a row tile
  // past them, in a cluster's tile or apart. The engine skips its math.
  IL_HOST_DEVICE static inline bool empty(const Params& p, int32_t m_idx, int32_t n_idx) {
    return n_idx * p.tile_rows >= rows_of(p, m_idx / p.tiles_m);
  }

  // An engine tile row to its group and its weight-tile row within the group.
  IL_HOST_DEVICE static inline void locate(const Params& p, int32_t m_idx, int32_t& group, int32_t& row) {
    group = m_idx / p.tiles_m;
    row = m_idx - group * p.tiles_m;
  }
};

}  // namespace interlace
