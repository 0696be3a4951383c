#include <algorithm>
#include <set>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/gemm/tile_plan.h"

namespace interlace {
namespace {

TEST(GemmTilePlan, BandedOrderVisitsEveryTileOnce) {
  for (auto [m, n, band] : {std::tuple{1, 1, 8}, {129, 257, 8}, {8192, 7168, 8}, {1000, 8, 3}, {300, 5000, 16}}) {
    TileGrid grid = tile_grid(m, n, 128, 256);
    auto order = banded_tile_order(grid, band);
    ASSERT_EQ(static_cast<int>(order.size()), grid.num_tiles());
    std::set<int32_t> seen(order.begin(), order.end());
    EXPECT_EQ(static_cast<int>(seen.size()), grid.num_tiles());
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), grid.num_tiles() - 1);
  }
}

TEST(GemmTilePlan, BandsRunColumnByColumn) {
  TileGrid grid = tile_grid(3 * 128, 2 * 256, 128, 256);  // 3 x 2 tiles
  EXPECT_EQ(banded_tile_order(grid, 2), (std::vector<int32_t>{0, 2, 1, 3, 4, 5}));
  EXPECT_THROW(banded_tile_order(grid, 0), Error);
}

TEST(GemmTilePlan, NarrowTilesOnlyWhereWideOnesFillTheLastWavePoorly) {
  EXPECT_EQ(choose_tile_n(512, 4096, 132), 128);    // 64 wide tiles: half the GPU idle
  EXPECT_EQ(choose_tile_n(2048, 7168, 132), 128);   // 448 wide tiles: 3.4 waves
  EXPECT_EQ(choose_tile_n(4096, 4096, 132), 256);   // 512 wide tiles: 3.9 waves
  EXPECT_EQ(choose_tile_n(8192, 8192, 132), 256);
  EXPECT_EQ(choose_tile_n(512, 4096, 132, 2), 128);  // the same with 2-CTA clusters
  EXPECT_EQ(choose_tile_n(2048, 7168, 132, 2), 128);
  EXPECT_EQ(choose_tile_n(4096, 4096, 132, 2), 256);
}

}  // namespace
}  // namespace interlace
