#include "interlace/ops/row_blocks.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"

namespace interlace {
namespace {

// owner_of_row, the owners of a tile row and the tile rows of an owner, against brute force.
void check_blocks(const std::vector<int64_t>& layout, int tile_m) {
  SCOPED_TRACE(::testing::Message() << "world " << layout.size() << ", tile_m " << tile_m);
  const RowBlocks rows = make_row_blocks(layout, 0, tile_m, "test");
  std::vector<int32_t> owner;  // of every row
  for (int q = 0; q < rows.world; ++q) {
    EXPECT_EQ(rows.rows_of(q), layout[q]);
    owner.insert(owner.end(), layout[q], q);
  }
  ASSERT_EQ(static_cast<int64_t>(owner.size()), rows.m());
  EXPECT_EQ(rows.tiles_m(), (rows.m() + tile_m - 1) / tile_m);
  for (int64_t row = 0; row < rows.m(); ++row) ASSERT_EQ(rows.owner_of_row(row), owner[row]) << "row " << row;
  for (int32_t t = 0; t < rows.tiles_m(); ++t) {
    const int64_t lo = int64_t{t} * tile_m, hi = std::min<int64_t>(lo + tile_m, rows.m());
    EXPECT_EQ(rows.first_owner(t), owner[lo]);
    EXPECT_EQ(rows.last_owner(t), owner[hi - 1]);
  }
  for (int q = 0; q < rows.world; ++q) {
    std::vector<int32_t> touching;
    for (int32_t t = 0; t < rows.tiles_m(); ++t) {
      const int64_t lo = int64_t{t} * tile_m, hi = lo + tile_m;
      if (layout[q] > 0 && rows.start[q] < hi && rows.start[q + 1] > lo) touching.push_back(t);
    }
    ASSERT_EQ(rows.tile_rows_of(q), static_cast<int32_t>(touching.size())) << "rank " << q;
    for (size_t i = 0; i < touching.size(); ++i) EXPECT_EQ(rows.first_tile_row(q) + static_cast<int32_t>(i), touching[i]);
  }
}

TEST(RowBlocks, QueriesMatchBruteForce) {
  // Even, uneven, empty blocks, single rows, one rank.
  const std::vector<std::vector<int64_t>> layouts = {
      {4096, 4096},    {1024, 1024, 1024, 1024}, {1, 300, 0, 129}, {0, 0, 5, 0}, {127, 1, 128, 129},
      {1000, 1},       {1, 1, 1, 1, 1, 1, 1, 1}, {5000},           {0, 0},       {1},
      {0, 1},          {256, 0, 0, 256, 3},      {3, 3, 3},        {128, 128, 128}};
  for (const auto& layout : layouts) {
    for (int tile_m : {128, 256, 64, 1}) check_blocks(layout, tile_m);
  }
  std::mt19937 random(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> layout(1 + random() % 9);
    for (auto& r : layout) r = random() % 4 == 0 ? 0 : static_cast<int64_t>(random() % 700);
    check_blocks(layout, 128);
  }
}

TEST(RowBlocks, OwnerOfRowSkipsEmptyBlocks) {
  const RowBlocks rows = make_row_blocks({3, 0, 0, 2}, 0, 128, "test");
  EXPECT_EQ(rows.owner_of_row(0), 0);
  EXPECT_EQ(rows.owner_of_row(2), 0);
  EXPECT_EQ(rows.owner_of_row(3), 3);
  EXPECT_EQ(rows.owner_of_row(4), 3);
  EXPECT_EQ(rows.first_owner(0), 0);
  EXPECT_EQ(rows.last_owner(0), 3);
  EXPECT_EQ(rows.tile_rows_of(1), 0);
}

TEST(RowBlocks, BadLayoutsRaiseNamingTheOp) {
  EXPECT_THROW(make_row_blocks({}, 0, 128, "test"), Error);
  EXPECT_THROW(make_row_blocks({4, -1}, 0, 128, "test"), Error);
  EXPECT_THROW(make_row_blocks({4, 4}, 2, 128, "test"), Error);
  EXPECT_THROW(make_row_blocks({4, 4}, 0, 0, "test"), Error);
  EXPECT_THROW(make_row_blocks(std::vector<int64_t>(kRowBlocksMaxRanks + 1, 1), 0, 128, "test"), Error);
  EXPECT_NO_THROW(make_row_blocks(std::vector<int64_t>(kRowBlocksMaxRanks, 1), kRowBlocksMaxRanks - 1, 128, "test"));
  // Under 2^31 rows in all; sums that would overflow 64 bits are refused as they grow.
  EXPECT_THROW(make_row_blocks({int64_t{1} << 30, int64_t{1} << 30}, 0, 128, "test"), Error);
  EXPECT_THROW(make_row_blocks({INT64_MAX, INT64_MAX, 1}, 0, 128, "test"), Error);
  EXPECT_NO_THROW(make_row_blocks({(int64_t{1} << 31) - 2, 1}, 0, 128, "test"));
  try {
    make_row_blocks({4, -1}, 0, 128, "some_op");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("some_op"), std::string::npos) << e.what();
  }
}

// Walks a SlotOrder: every tile once, slot by slot in the given slot of each tile row, and within a
// band of a slot, down a column and then the next.
void check_walk(const SlotOrder::Params& p, const std::vector<int32_t>& slot_of_row, int32_t band_m) {
  const int32_t tiles_m = static_cast<int32_t>(slot_of_row.size());
  const int32_t num_tiles = tiles_m * p.tiles_n;
  ASSERT_EQ(p.first_position[kRowBlocksMaxRanks], num_tiles);
  std::set<std::pair<int32_t, int32_t>> seen;
  int32_t previous_slot = 0, pm = -1, pn = -1;
  for (int32_t i = 0; i < num_tiles; ++i) {
    int32_t m = -1, n = -1;
    SlotOrder::tile(p, i, m, n);
    ASSERT_TRUE(m >= 0 && m < tiles_m && n >= 0 && n < p.tiles_n) << "position " << i;
    ASSERT_TRUE(seen.insert({m, n}).second) << "tile " << m << ", " << n << " twice";
    const int32_t slot = slot_of_row[m];
    EXPECT_GE(slot, previous_slot);
    if (i > 0 && slot == previous_slot &&
        (pm - p.first_row[slot]) / band_m == (m - p.first_row[slot]) / band_m) {
      EXPECT_TRUE(pn == n ? pm + 1 == m : pn + 1 == n) << "position " << i;
    }
    previous_slot = slot;
    pm = m;
    pn = n;
  }
}

TEST(SlotOrder, FromASlotFunction) {
  // Tile rows 0-1 in slot 2, 2-6 in slot 0, slot 1 empty, 7 in slot 3.
  const std::vector<int32_t> slot_of_row = {2, 2, 0, 0, 0, 0, 0, 3};
  for (int32_t tiles_n : {1, 3, 56}) {
    for (int32_t band_m : {1, 2, 4, 16}) {
      SCOPED_TRACE(::testing::Message() << "tiles_n " << tiles_n << ", band_m " << band_m);
      const SlotOrder::Params p = SlotOrder::make(
          8, 4, [&](int32_t t) { return slot_of_row[t]; }, tiles_n, band_m, "test");
      EXPECT_EQ(p.slots, 4);
      EXPECT_EQ(p.first_row[0], 2);
      EXPECT_EQ(p.first_row[2], 0);
      EXPECT_EQ(p.first_row[3], 7);
      EXPECT_EQ(p.first_position[1], 5 * tiles_n);
      EXPECT_EQ(p.first_position[2], 5 * tiles_n);
      check_walk(p, slot_of_row, band_m);
    }
  }
  // No tile rows at all: an empty walk.
  const SlotOrder::Params none = SlotOrder::make(0, 2, [](int32_t) { return 0; }, 5, 1, "test");
  EXPECT_EQ(none.first_position[kRowBlocksMaxRanks], 0);
}

TEST(SlotOrder, FromSlotRangesAsFromTheFunction) {
  const int32_t first_row[] = {2, 0, 0, 7};
  const int32_t rows[] = {5, 0, 2, 1};
  const SlotOrder::Params a = SlotOrder::make(4, first_row, rows, 3, 2, "test");
  const std::vector<int32_t> slot_of_row = {2, 2, 0, 0, 0, 0, 0, 3};
  const SlotOrder::Params b = SlotOrder::make(
      8, 4, [&](int32_t t) { return slot_of_row[t]; }, 3, 2, "test");
  for (int s = 0; s <= kRowBlocksMaxRanks; ++s) EXPECT_EQ(a.first_position[s], b.first_position[s]) << s;
  for (int s = 0; s < 4; ++s) {
    if (rows[s] > 0) {
      EXPECT_EQ(a.first_row[s], b.first_row[s]) << s;
    }
  }
  check_walk(a, slot_of_row, 2);
}

TEST(SlotOrder, BadOrdersRaise) {
  const auto slot = [](int32_t t) { return t % 2; };  // slots not contiguous
  EXPECT_THROW(SlotOrder::make(4, 2, slot, 3, 1, "test"), Error);
  EXPECT_THROW(SlotOrder::make(4, 1, [](int32_t) { return 1; }, 3, 1, "test"), Error);  // slot out of range
  EXPECT_THROW(SlotOrder::make(4, 1, [](int32_t) { return 0; }, 3, 0, "test"), Error);  // band_m
  EXPECT_THROW(SlotOrder::make(4, 1, [](int32_t) { return 0; }, -1, 1, "test"), Error);  // tiles_n
  EXPECT_THROW(SlotOrder::make(4, kRowBlocksMaxRanks + 1, [](int32_t) { return 0; }, 3, 1, "test"), Error);
  EXPECT_THROW(SlotOrder::make(1 << 16, 1, [](int32_t) { return 0; }, 1 << 15, 1, "test"), Error);  // > 2^30 tiles
}

}  // namespace
}  // namespace interlace
