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

GroupedOrder::Params params_of(const std::vector<int32_t>& rows, int32_t capacity, int32_t tiles_n) {
  GroupedOrder::Params p;
  p.rows = rows.data();
  p.capacity = capacity;
  p.tile_rows = (capacity + GroupedOrder::kTileM - 1) / GroupedOrder::kTileM;
  p.tiles_n = tiles_n;
  return p;
}

// Every position of the order: the set of (group, tile row in group, column) it marks as tiles.
std::set<std::tuple<int32_t, int32_t, int32_t>> tiles_of(const GroupedOrder::Params& p, int32_t groups) {
  std::set<std::tuple<int32_t, int32_t, int32_t>> tiles;
  for (int32_t i = 0; i < groups * p.tile_rows * p.tiles_n; ++i) {
    int32_t m_idx = -1, n_idx = -1, group = -1, row = -1;
    const bool is_tile = GroupedOrder::tile(p, i, m_idx, n_idx);
    GroupedOrder::locate(p, m_idx, group, row);
    EXPECT_GE(row, 0);
    EXPECT_LT(row, p.tile_rows);
    EXPECT_GE(n_idx, 0);
    EXPECT_LT(n_idx, p.tiles_n);
    if (is_tile) EXPECT_TRUE(tiles.emplace(group, row, n_idx).second) << "position " << i << " repeats a tile";
  }
  return tiles;
}

TEST(GroupedOrder, ExactlyTheTilesOfEachGroupsRows) {
  std::mt19937 rng(7);
  for (auto [groups, capacity, tiles_n] : {std::tuple{1, 1, 1}, {4, 100, 3}, {8, 129, 2}, {128, 512, 32}, {3, 1000, 1}}) {
    std::vector<int32_t> rows(groups);
    for (auto& r : rows) r = static_cast<int32_t>(rng() % (2 * capacity + 1)) - capacity / 4;  // below 0, past C
    rows[0] = 0;
    const GroupedOrder::Params p = params_of(rows, capacity, tiles_n);
    std::set<std::tuple<int32_t, int32_t, int32_t>> expected;
    for (int32_t g = 0; g < groups; ++g) {
      const int32_t used = std::min(std::max(rows[g], 0), capacity);
      EXPECT_EQ(GroupedOrder::rows_of(p, g), used);
      for (int32_t row = 0; row * GroupedOrder::kTileM < used; ++row) {
        for (int32_t n = 0; n < tiles_n; ++n) expected.emplace(g, row, n);
      }
    }
    EXPECT_EQ(tiles_of(p, groups), expected) << groups << " groups of " << capacity;
  }
}

TEST(GroupedOrder, AGroupsColumnsRunOneAfterAnother) {
  // 2 groups of 300 rows (3 tile rows), 2 columns: group 0's column 0 top to bottom, then its
  // column 1, then group 1's.
  const std::vector<int32_t> rows = {300, 300};
  const GroupedOrder::Params p = params_of(rows, 300, 2);
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
