// GroupedOrder (grouped_gemm's tile order) on the CPU, walked as the engine's TileWalk walks it: CTA
// c of S takes positions c, c + S, ... below count(), each walk with its own Cursor. Together the walks
// give exactly the tiles the groups' row counts call for, each once, and every walk gets its share.
// Also the automatic tile settings (resolved_grouped_gemm_tuning), which decide the order's tile width.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "error_of.h"
#include "gtest/gtest.h"
#include "interlace/gemm/grouped_args.h"
#include "interlace/gemm/grouped_order.h"

namespace interlace {
namespace {

using Tile = std::tuple<int32_t, int32_t, int32_t>;  // (group, tile row in the group, column)

// The engine's tile rows of one walk's cluster tiles, as (group, row, column), and how many cluster
// tiles the walk took.
std::vector<Tile> walk(const GroupedOrder::Params& p, int32_t groups, int32_t first, int32_t step, int32_t* taken) {
  std::vector<Tile> tiles;
  GroupedOrder::Cursor at;
  *taken = 0;
  for (int32_t i = first; i < GroupedOrder::count(p, groups); i += step, ++*taken) {
    int32_t cluster_m_idx = -1, n_idx = -1;
    GroupedOrder::tile(p, i, at, cluster_m_idx, n_idx);
    EXPECT_GE(n_idx, 0);
    EXPECT_LT(n_idx, p.tiles_n);
    for (int32_t cta = 0; cta < p.cluster_m; ++cta) {
      int32_t group = -1, row = -1;
      GroupedOrder::locate(p, cluster_m_idx * p.cluster_m + cta, group, row);
      EXPECT_GE(row, 0);
      EXPECT_LT(row, p.tile_rows);
      const int32_t used = GroupedOrder::rows_of(p, group);
      if (cta == 0) {
        EXPECT_LT(row * GroupedOrder::kTileM, used) << "a cluster tile without rows, position " << i;
      }
      if (row * GroupedOrder::kTileM < used) tiles.emplace_back(group, row, n_idx);
    }
  }
  return tiles;
}

// One walk over all of an order's positions, in order: each one's (tile row, column) as tile() gives it.
template <class Order>
std::vector<std::pair<int32_t, int32_t>> walk_all(const typename Order::Params& p, int32_t groups) {
  std::vector<std::pair<int32_t, int32_t>> walked;
  typename Order::Cursor at;
  for (int32_t i = 0; i < Order::count(p, groups); ++i) {
    int32_t m_idx, n_idx;
    Order::tile(p, i, at, m_idx, n_idx);
    walked.emplace_back(m_idx, n_idx);
  }
  return walked;
}

TEST(GroupedOrder, TheWalksTogetherTakeEachTileOfEachGroupsRowsOnce) {
  std::mt19937 rng(7);
  for (auto [cluster_m, tile_n] : {std::pair{1, 128}, {2, 128}, {1, 256}, {2, 256}}) {
    for (auto [groups, capacity, n] : {std::tuple{1, 1, 8}, {4, 100, 300}, {8, 129, 256}, {128, 512, 4096},
                                       {3, 1000, 8}, {64, 1536, 2048}}) {
      std::vector<int32_t> rows(groups);
      for (auto& r : rows) r = static_cast<int32_t>(rng() % (2 * capacity + 1)) - capacity / 4;  // below 0, past C
      rows[0] = 0;
      const GroupedOrder::Params p = GroupedOrder::make(rows.data(), capacity, n, cluster_m, tile_n);
      std::set<Tile> expected;
      for (int32_t g = 0; g < groups; ++g) {
        const int32_t used = std::min(std::max(rows[g], 0), capacity);
        EXPECT_EQ(GroupedOrder::rows_of(p, g), used);
        for (int32_t row = 0; row * GroupedOrder::kTileM < used; ++row) {
          for (int32_t col = 0; col < p.tiles_n; ++col) expected.emplace(g, row, col);
        }
      }
      for (int32_t step : {1, 7, 66}) {
        std::set<Tile> seen;
        int32_t fewest = INT32_MAX, most = 0;
        for (int32_t first = 0; first < step; ++first) {
          int32_t taken = 0;
          for (const Tile& t : walk(p, groups, first, step, &taken)) {
            EXPECT_TRUE(seen.insert(t).second) << "a tile taken twice";
          }
          fewest = std::min(fewest, taken);
          most = std::max(most, taken);
        }
        EXPECT_EQ(seen, expected) << groups << " groups of " << capacity << ", clusters of " << cluster_m;
        EXPECT_LE(most - fewest, 1) << "walks of " << step << " get unequal shares";
      }
    }
  }
}

TEST(GroupedOrder, SparseGroupsStillSpreadOverEveryWalk) {
  // 64 groups of capacity 1536 using 200 rows each: 2 tile rows of 12, 16 columns. Positions over all
  // of C would leave most of 66 two-CTA clusters without a tile; dense positions give each 15 or 16.
  const std::vector<int32_t> rows(64, 200);
  const GroupedOrder::Params p = GroupedOrder::make(rows.data(), 1536, 2048, 2, 128);
  EXPECT_EQ(GroupedOrder::count(p, 64), 64 * 1 * 16);
  for (int32_t first = 0; first < 66; ++first) {
    int32_t taken = 0;
    walk(p, 64, first, 66, &taken);
    EXPECT_GE(taken, 15);
    EXPECT_LE(taken, 16);
  }
}

TEST(GroupedOrder, AGroupsColumnsRunOneAfterAnother) {
  // 2 groups of 300 rows (3 tile rows), 2 columns: group 0's column 0 top to bottom, then its
  // column 1, then group 1's; group 1 uses 130 rows, so 2 of its tile rows.
  const std::vector<int32_t> rows = {300, 130};
  const GroupedOrder::Params p = GroupedOrder::make(rows.data(), 300, 256, 1, 128);
  ASSERT_EQ(GroupedOrder::count(p, 2), 10);
  const std::vector<std::pair<int32_t, int32_t>> walked = walk_all<GroupedOrder>(p, 2);
  const std::vector<std::pair<int32_t, int32_t>> expected = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1},
                                                             {2, 1}, {3, 0}, {4, 0}, {3, 1}, {4, 1}};
  EXPECT_EQ(walked, expected);
}

// SwappedGroupedOrder, walked as TileWalk walks it: every (group, weight-tile row, row tile) the counts
// call for, once, in equal shares, with clusters of 1 and 2 row tiles (cta_tile: CTA r of a cluster
// tile n takes row tile cluster_n * n + r, or apart, where a group's rows fit one row tile, a weight-
// tile row of its own; a cluster tile's first CTA always has rows); a weight-tile row's cluster tiles
// next to each other (they read the same tile of b[g]).
TEST(SwappedGroupedOrder, TheWalksTogetherTakeEachTileOnceInEqualShares) {
  std::mt19937 rng(11);
  for (int32_t cluster_n : {1, 2}) {
    for (auto [groups, capacity, n, tile_rows] : {std::tuple{1, 1, 8, 160}, {4, 300, 300, 160}, {128, 320, 4096, 160},
                                                  {8, 500, 136, 160}, {3, 1000, 2048, 256}}) {
      std::vector<int32_t> rows(groups);
      for (auto& r : rows) r = static_cast<int32_t>(rng() % (2 * capacity + 1)) - capacity / 4;  // below 0, past C
      rows[0] = 0;
      const SwappedGroupedOrder::Params p = SwappedGroupedOrder::make(rows.data(), capacity, n, tile_rows, cluster_n);
      EXPECT_EQ(p.tiles_m, (n + 127) / 128);
      std::set<Tile> expected;  // (group, weight-tile row, row tile)
      int32_t clusters = 0;
      for (int32_t g = 0; g < groups; ++g) {
        const int32_t used = std::min(std::max(rows[g], 0), capacity);
        EXPECT_EQ(SwappedGroupedOrder::rows_of(p, g), used);
        const int32_t row_tiles = (used + tile_rows - 1) / tile_rows;
        const bool apart = cluster_n > 1 && row_tiles == 1;  // nothing to share: a weight tile per CTA
        clusters += apart ? (p.tiles_m + cluster_n - 1) / cluster_n : (row_tiles + cluster_n - 1) / cluster_n * p.tiles_m;
        for (int32_t w = 0; w < p.tiles_m; ++w) {
          for (int32_t r = 0; r < row_tiles; ++r) expected.emplace(g, w, r);
        }
      }
      ASSERT_EQ(SwappedGroupedOrder::count(p, groups), clusters);
      for (int32_t step : {1, 7, 66}) {
        std::set<Tile> seen;
        int32_t fewest = INT32_MAX, most = 0;
        for (int32_t first = 0; first < step; ++first) {
          SwappedGroupedOrder::Cursor at;
          int32_t taken = 0;
          for (int32_t i = first; i < SwappedGroupedOrder::count(p, groups); i += step, ++taken) {
            int32_t m_idx = -1, cluster_idx = -1;
            SwappedGroupedOrder::tile(p, i, at, m_idx, cluster_idx);
            for (int32_t cta = 0; cta < cluster_n; ++cta) {
              int32_t m = -1, row_tile = -1, group = -1, row = -1;
              SwappedGroupedOrder::cta_tile(p, m_idx, cluster_idx, cta, m, row_tile);
              SwappedGroupedOrder::locate(p, m, group, row);
              ASSERT_GE(row, 0);
              ASSERT_LT(row, p.tiles_m);
              // A cluster's CTAs load alike: all apart or all sharing the multicast.
              EXPECT_EQ(SwappedGroupedOrder::apart(p, m), SwappedGroupedOrder::apart(p, m_idx)) << "position " << i;
              const bool has_rows = row_tile * tile_rows < SwappedGroupedOrder::rows_of(p, group);
              EXPECT_EQ(SwappedGroupedOrder::empty(p, m, row_tile), !has_rows) << "position " << i;
              if (cta == 0) {
                EXPECT_TRUE(has_rows) << "a cluster tile without rows, position " << i;
              }
              if (has_rows) {
                EXPECT_TRUE(seen.emplace(group, row, row_tile).second) << "a tile taken twice";
              }
            }
          }
          fewest = std::min(fewest, taken);
          most = std::max(most, taken);
        }
        EXPECT_EQ(seen, expected) << groups << " groups of " << capacity << ", clusters of " << cluster_n;
        EXPECT_LE(most - fewest, 1) << "walks of " << step << " get unequal shares";
      }
    }
  }
  // A weight-tile row's cluster tiles next to each other: 1 group of 500 rows in 160-row tiles (4 of
  // them, 2 clusters of 2), 2 weight-tile rows.
  const std::vector<int32_t> rows = {500};
  const SwappedGroupedOrder::Params p = SwappedGroupedOrder::make(rows.data(), 500, 256, 160, 2);
  const std::vector<std::pair<int32_t, int32_t>> walked = walk_all<SwappedGroupedOrder>(p, 1);
  const std::vector<std::pair<int32_t, int32_t>> expected = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  EXPECT_EQ(walked, expected);

  // Apart: 100 rows fit one row tile, so the pair takes weight-tile rows 0 and 1, then 2 and (past
  // the 3 tile rows) an empty row tile.
  const std::vector<int32_t> small = {100};
  const SwappedGroupedOrder::Params q = SwappedGroupedOrder::make(small.data(), 320, 384, 160, 2);
  std::vector<std::pair<int32_t, int32_t>> ctas;
  for (auto [m_idx, n_idx] : walk_all<SwappedGroupedOrder>(q, 1)) {
    EXPECT_EQ(n_idx, SwappedGroupedOrder::kApart);
    for (int32_t r = 0; r < 2; ++r) {
      int32_t m, n;
      SwappedGroupedOrder::cta_tile(q, m_idx, n_idx, r, m, n);
      ctas.emplace_back(m, n);
    }
  }
  const std::vector<std::pair<int32_t, int32_t>> apart = {{0, 0}, {1, 0}, {2, 0}, {2, 1}};
  EXPECT_EQ(ctas, apart);
  EXPECT_TRUE(SwappedGroupedOrder::empty(q, 2, 1));
  // The odd last run's two CTAs share tile row 2, so they read it as a pair does, once.
  EXPECT_TRUE(SwappedGroupedOrder::apart(q, 0));
  EXPECT_TRUE(SwappedGroupedOrder::apart(q, 1));
  EXPECT_FALSE(SwappedGroupedOrder::apart(q, 2));
}

// Where grouped_gemm swaps: automatically for K-major b with 128 < C <= 320 and no setting given;
// swap = 1 wherever it can (else an error), -1 never.
TEST(GroupedGemmTuning, TheSwappedProblemWhereTwoOfItsTilesCoverC) {
  auto rows = [](int cluster_m, int tile_n, int swap, bool k_major, int64_t capacity) {
    return swapped_tile_rows(GroupedGemmTuning{cluster_m, tile_n, swap}, k_major, capacity);
  };
  EXPECT_EQ(rows(0, 0, 0, true, 320), 160);
  EXPECT_EQ(rows(0, 0, 0, true, 256), 160);
  EXPECT_EQ(rows(0, 0, 0, true, 151), 160);  // the moe bench's DeepSeek-like layer on one rank
  EXPECT_EQ(rows(0, 0, 0, true, 129), 160);
  EXPECT_EQ(rows(0, 0, 0, true, 128), 0);    // one 128-row tile reads b[g] once already
  EXPECT_EQ(rows(0, 0, 0, true, 16), 0);     // decode: slower swapped
  EXPECT_EQ(rows(0, 0, 0, true, 321), 0);
  EXPECT_EQ(rows(0, 0, 0, false, 320), 0);  // b N-contiguous
  EXPECT_EQ(rows(2, 0, 0, true, 320), 0);   // a setting given: the unswapped problem
  EXPECT_EQ(rows(0, 256, 0, true, 320), 0);
  EXPECT_EQ(rows(0, 0, -1, true, 320), 0);
  EXPECT_EQ(rows(0, 0, 1, true, 1), 160);
  EXPECT_EQ(rows(0, 0, 1, true, 4096), 160);  // any C, in as many row tiles as it takes
  EXPECT_NE(error_of([&] { rows(0, 0, 1, false, 100); }).find("grouped_gemm: the swapped problem takes b K-major"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rows(0, 128, 1, true, 100); }).find("cluster_m and tile_n must stay 0 (got 0 and 128)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rows(0, 0, 2, true, 100); }).find("swap must be 0 (automatic), 1 or -1 (never), got 2"),
            std::string::npos);
}

// The automatic tiles: 128 x 256 without pairs where a group has at most three tile rows (C <= 384),
// pairs of 128 x 128 elsewhere, or on a GPU lean on HBM pairs of 128 x 256; a setting given is kept,
// and an automatic cluster_m follows tile_n.
constexpr double kH100 = 3.35e12 / 132, kH200 = 4.8e12 / 132;
TEST(GroupedGemmTuning, AutomaticSettingsFollowTheCapacity) {
  auto resolved = [](int cluster_m, int tile_n, int64_t capacity, double hbm = kH200) {
    const GroupedGemmTuning t = resolved_grouped_gemm_tuning(GroupedGemmTuning{cluster_m, tile_n}, capacity, hbm);
    return std::pair{t.cluster_m, t.tile_n};
  };
  for (double hbm : {kH200, 0.0}) {  // well fed, or not known
    EXPECT_EQ(resolved(0, 0, 385, hbm), (std::pair{2, 128})) << hbm;
  }
  EXPECT_EQ(resolved(0, 0, 385, kH100), (std::pair{2, 256}));  // lean: pairs of wide tiles
  EXPECT_EQ(resolved(0, 0, 4096, kH100), (std::pair{2, 256}));
  EXPECT_EQ(resolved(0, 0, 384, kH100), (std::pair{1, 256}));  // at most three tile rows: as elsewhere
  EXPECT_EQ(resolved(0, 128, 4096, kH100), (std::pair{2, 128}));  // a setting given: the rule as elsewhere
  EXPECT_EQ(resolved(1, 0, 4096, kH100), (std::pair{1, 128}));
  EXPECT_EQ(resolved(0, 0, 16), (std::pair{1, 256}));
  EXPECT_EQ(resolved(0, 0, 384), (std::pair{1, 256}));
  EXPECT_EQ(resolved(0, 0, 385), (std::pair{2, 128}));
  EXPECT_EQ(resolved(0, 128, 300), (std::pair{2, 128}));  // 128-wide tiles keep their pairs past C = 128
  EXPECT_EQ(resolved(0, 128, 128), (std::pair{1, 128}));  // one tile row: a pair's second CTA has none
  EXPECT_EQ(resolved(2, 0, 100), (std::pair{2, 256}));
  EXPECT_EQ(resolved(0, 256, 4096), (std::pair{1, 256}));
  EXPECT_NE(error_of([&] { resolved(3, 0, 64); }).find("grouped_gemm: cluster_m must be 0 (automatic), 1 or 2, got 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              resolved_grouped_gemm_tuning(GroupedGemmTuning{0, 64}, 64, kH200, "moe_gemm_combine");
            }).find("moe_gemm_combine: tile_n must be 0 (automatic), 128 or 256, got 64"),
            std::string::npos);
}

}  // namespace
}  // namespace interlace
