// GroupedOrder (grouped_gemm's tile order) on the CPU: over all its positions, exactly the tiles the
// groups' row counts call for, each once, in the order the comment promises.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/gemm/grouped_order.h"

namespace interlace {
namespace {

// Every position of the order, as the engine walks it (tile row = cluster tile row x cluster_m + CTA
// in the cluster): the (group, tile row in group, column) tiles that hold rows of their group, each
// of which must come once; tile rows past the group's rows may run only beside one that has some.
std::set<std::tuple<int32_t, int32_t, int32_t>> tiles_of(const GroupedOrder::Params& p, int32_t groups) {
  std::set<std::tuple<int32_t, int32_t, int32_t>> tiles;
  for (int32_t i = 0; i < groups * p.tile_rows / p.cluster_m * p.tiles_n; ++i) {
    int32_t cluster_m_idx = -1, n_idx = -1;
    if (!GroupedOrder::tile(p, i, cluster_m_idx, n_idx)) continue;
    EXPECT_GE(n_idx, 0);
    EXPECT_LT(n_idx, p.tiles_n);
    for (int32_t cta = 0; cta < p.cluster_m; ++cta) {
      int32_t group = -1, row = -1;
      GroupedOrder::locate(p, cluster_m_idx * p.cluster_m + cta, group, row);
      EXPECT_GE(row, 0);
      EXPECT_LT(row, p.tile_rows);
      if (cta == 0) EXPECT_LT(row * GroupedOrder::kTileM, GroupedOrder::rows_of(p, group)) << "an empty cluster tile";
      if (row * GroupedOrder::kTileM >= GroupedOrder::rows_of(p, group)) continue;
      EXPECT_TRUE(tiles.emplace(group, row, n_idx).second) << "position " << i << " repeats a tile";
    }
  }
  return tiles;
}

TEST(GroupedOrder, ExactlyTheTilesOfEachGroupsRows) {
  std::mt19937 rng(7);
  for (int cluster_m : {1, 2}) {
    for (auto [groups, capacity, n] : {std::tuple{1, 1, 8}, {4, 100, 300}, {8, 129, 256}, {128, 512, 4096}, {3, 1000, 8}}) {
      std::vector<int32_t> rows(groups);
      for (auto& r : rows) r = static_cast<int32_t>(rng() % (2 * capacity + 1)) - capacity / 4;  // below 0, past C
      rows[0] = 0;
      const GroupedOrder::Params p = GroupedOrder::make(rows.data(), capacity, n, cluster_m);
      EXPECT_EQ(p.tile_rows % cluster_m, 0);
      EXPECT_GE(p.tile_rows * GroupedOrder::kTileM, capacity);
      std::set<std::tuple<int32_t, int32_t, int32_t>> expected;
      for (int32_t g = 0; g < groups; ++g) {
        const int32_t used = std::min(std::max(rows[g], 0), capacity);
        EXPECT_EQ(GroupedOrder::rows_of(p, g), used);
        for (int32_t row = 0; row * GroupedOrder::kTileM < used; ++row) {
          for (int32_t col = 0; col < p.tiles_n; ++col) expected.emplace(g, row, col);
        }
      }
      EXPECT_EQ(tiles_of(p, groups), expected) << groups << " groups of " << capacity << ", clusters of " << cluster_m;
    }
  }
}

TEST(GroupedOrder, AGroupsColumnsRunOneAfterAnother) {
  // 2 groups of 300 rows (3 tile rows), 2 columns: group 0's column 0 top to bottom, then its
  // column 1, then group 1's.
  const std::vector<int32_t> rows = {300, 300};
  const GroupedOrder::Params p = GroupedOrder::make(rows.data(), 300, 256, 1);
  std::vector<std::pair<int32_t, int32_t>> walk;
  for (int32_t i = 0; i < 12; ++i) {
    int32_t m_idx, n_idx;
    ASSERT_TRUE(GroupedOrder::tile(p, i, m_idx, n_idx));
    walk.emplace_back(m_idx, n_idx);
  }
  const std::vector<std::pair<int32_t, int32_t>> expected = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1}, {2, 1},
                                                            {3, 0}, {4, 0}, {5, 0}, {3, 1}, {4, 1}, {5, 1}};
  EXPECT_EQ(walk, expected);
}

}  // namespace
}  // namespace interlace
