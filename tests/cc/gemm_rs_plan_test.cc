#include "interlace/ops/gemm_rs/plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "tests/cc/error_of.h"

namespace interlace {
namespace {

// Layouts (rows per rank) the tests run everywhere: even, uneven, empty blocks, single rows, one rank.
const std::vector<std::vector<int64_t>> kLayouts = {
    {4096, 4096},    {1024, 1024, 1024, 1024}, {1, 300, 0, 129}, {0, 0, 5, 0}, {127, 1, 128, 129},
    {1000, 1},       {1, 1, 1, 1, 1, 1, 1, 1}, {5000},           {0, 0},       {1},
    {0, 1},          {256, 0, 0, 256, 3},      {3, 3, 3},        {128, 128, 128}};

std::vector<std::vector<int64_t>> random_layouts(uint32_t seed, int count, int max_world, int max_rows) {
  std::mt19937 random(seed);
  std::vector<std::vector<int64_t>> layouts;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> layout(1 + random() % max_world);
    for (auto& rows : layout) rows = random() % 4 == 0 ? 0 : static_cast<int64_t>(random() % max_rows);
    layouts.push_back(layout);
  }
  return layouts;
}

// ---- Owners ------------------------------------------------------------------------------

// owner_of_row and the other row-block queries: tests/cc/row_blocks_test.cc.

TEST(GemmRsRows, BadLayoutsRaise) {
  EXPECT_THROW(make_gemm_rs_rows({}, 0), Error);
  EXPECT_THROW(make_gemm_rs_rows({4, -1}, 0), Error);
  EXPECT_THROW(make_gemm_rs_rows({4, 4}, 2), Error);
  EXPECT_THROW(make_gemm_rs_rows({4, 4}, -1), Error);
  EXPECT_THROW(make_gemm_rs_rows({4, 4}, 0, 0), Error);
  EXPECT_THROW(make_gemm_rs_rows(std::vector<int64_t>(kGemmRsMaxRanks + 1, 1), 0), Error);
  EXPECT_NO_THROW(make_gemm_rs_rows(std::vector<int64_t>(kGemmRsMaxRanks, 1), kGemmRsMaxRanks - 1));
  EXPECT_THROW(make_gemm_rs_rows({int64_t{1} << 30, int64_t{1} << 30}, 0), Error);
  EXPECT_THROW(make_gemm_rs_rows({int64_t{1} << 40, 1}, 0), Error);
}

TEST(GemmRsRows, GemmArOwnersAreWholeBalancedTileRows) {
  for (int64_t m : {0, 1, 127, 128, 129, 1000, 4096, 8192 + 5, 100000}) {
    for (int world : {1, 2, 3, 8, 72}) {
      SCOPED_TRACE(::testing::Message() << "m " << m << ", world " << world);
      const std::vector<int64_t> layout = gemm_ar_rows_per_rank(m, world);
      ASSERT_EQ(static_cast<int>(layout.size()), world);
      EXPECT_EQ(std::accumulate(layout.begin(), layout.end(), int64_t{0}), m);
      const GemmRsRows rows = make_gemm_rs_rows(layout, 0);
      int32_t fewest = std::numeric_limits<int32_t>::max(), most = 0;
      for (int q = 0; q < world; ++q) {
        EXPECT_TRUE(rows.start[q] % 128 == 0 || rows.start[q] == m) << "rank " << q;
        // Every rank's share of whole tiles (the last tile row counts whole) differs by at most one.
        const int32_t tiles = static_cast<int32_t>((rows.start[q + 1] + 127) / 128 - (rows.start[q] + 127) / 128);
        fewest = std::min(fewest, tiles);
        most = std::max(most, tiles);
      }
      EXPECT_LE(most - fewest, 1);
    }
  }
  EXPECT_THROW(gemm_ar_rows_per_rank(-1, 2), Error);
  EXPECT_THROW(gemm_ar_rows_per_rank(8, 0), Error);
  EXPECT_THROW(gemm_ar_rows_per_rank(8, kGemmRsMaxRanks + 1), Error);
}

// ---- Tile order --------------------------------------------------------------------------

// The order's promises for one layout and rank: every tile row once; slots never go back; a tile
// row's slot is the earliest send position among the non-empty owners it touches (so no owner gets
// it after its block's turn); tile rows wholly within this rank's block come last.
void check_order(const std::vector<int64_t>& layout, int rank, int tile_m) {
  SCOPED_TRACE(::testing::Message() << "world " << layout.size() << ", rank " << rank << ", tile_m " << tile_m);
  const GemmRsRows rows = make_gemm_rs_rows(layout, rank, tile_m);
  const std::vector<int32_t> order = gemm_rs_tile_row_order(rows);
  ASSERT_EQ(static_cast<int32_t>(order.size()), rows.tiles_m());
  ASSERT_EQ(std::set<int32_t>(order.begin(), order.end()).size(), order.size());
  int32_t previous = 0;
  for (int32_t t : order) {
    const int32_t slot = rows.send_slot(t);
    EXPECT_GE(slot, previous);
    previous = slot;
    const int64_t lo = int64_t{t} * tile_m, hi = std::min<int64_t>(lo + tile_m, rows.m());
    int32_t earliest = rows.world;
    for (int q = 0; q < rows.world; ++q) {
      if (layout[q] > 0 && rows.start[q] < hi && rows.start[q + 1] > lo) {
        earliest = std::min(earliest, (q - rank - 1 + rows.world) % rows.world);
      }
    }
    EXPECT_EQ(slot, earliest) << "tile row " << t;
    if (lo >= rows.start[rank] && hi <= rows.start[rank + 1]) {
      EXPECT_EQ(slot, rows.world - 1) << "own tile row " << t;
    }
  }
  EXPECT_EQ(rows.send_position(rank), rows.world - 1);
  if (rows.world > 1) {
    EXPECT_EQ(rows.send_position((rank + 1) % rows.world), 0);
  }
}

TEST(GemmRsOrder, OwnBlockLastPeersFromRankPlusOne) {
  for (const auto& layout : kLayouts) {
    for (int rank = 0; rank < static_cast<int>(layout.size()); ++rank) {
      for (int tile_m : {256, 128, 64, 1}) check_order(layout, rank, tile_m);
    }
  }
  for (const auto& layout : random_layouts(11, 300, 9, 900)) check_order(layout, 0, 128);
  // Three even blocks of two tile rows: rank 1 computes rank 2's block, then rank 0's, then its own.
  EXPECT_EQ(gemm_rs_tile_row_order(make_gemm_rs_rows({256, 256, 256}, 1, 128)),
            (std::vector<int32_t>{4, 5, 0, 1, 2, 3}));
  // A tile row spanning ranks 0 and 1 goes in the earlier of their slots on every rank.
  const GemmRsRows rows = make_gemm_rs_rows({100, 100, 100}, 2, 128);  // tile rows {0, 1}, {1, 2}
  EXPECT_EQ(rows.send_slot(0), 0);  // ranks 0 and 1: rank 2 sends to 0 first
  EXPECT_EQ(rows.send_slot(1), 1);  // ranks 1 and 2: rank 1's slot, before its own
}

// With even blocks, at every slot the ranks send to different owners: slot j of rank s feeds owner
// s + 1 + j, a permutation, so no owner's link carries two streams at once.
TEST(GemmRsOrder, RanksSendToDifferentOwnersAtOnce) {
  for (int world : {1, 2, 3, 4, 8, 72}) {
    const std::vector<int64_t> layout(world, 512);
    std::vector<std::set<int32_t>> owners(world);  // [slot]: the owners ranks send to in it
    for (int rank = 0; rank < world; ++rank) {
      const GemmRsRows rows = make_gemm_rs_rows(layout, rank, 128);
      std::vector<std::set<int32_t>> in_slot(world);
      for (int32_t t : gemm_rs_tile_row_order(rows)) in_slot[rows.send_slot(t)].insert(rows.first_owner(t));
      for (int32_t slot = 0; slot < world; ++slot) {
        ASSERT_EQ(in_slot[slot].size(), 1u) << "rank " << rank << ", slot " << slot;
        owners[slot].insert(*in_slot[slot].begin());
      }
    }
    for (int32_t slot = 0; slot < world; ++slot) EXPECT_EQ(static_cast<int>(owners[slot].size()), world) << slot;
  }
}

// The kernel's closed form visits every tile once, slot by slot as the host reference, in bands of
// band_m tile rows within a slot.
void check_kernel_order(const std::vector<int64_t>& layout, int rank, int tile_m, int tiles_n, int band_m) {
  SCOPED_TRACE(::testing::Message() << "world " << layout.size() << ", rank " << rank << ", tiles_n " << tiles_n
                                    << ", band_m " << band_m);
  const GemmRsRows rows = make_gemm_rs_rows(layout, rank, tile_m);
  const GemmRsOrder::Params p = GemmRsOrder::make(rows, tiles_n, band_m);
  const std::vector<int32_t> reference = gemm_rs_tile_row_order(rows);
  const int32_t num_tiles = rows.tiles_m() * tiles_n;
  ASSERT_EQ(p.first_position[kGemmRsMaxRanks], num_tiles);
  std::set<std::pair<int32_t, int32_t>> seen;
  std::vector<int32_t> row_order;  // tile rows by first visit
  int32_t previous_slot = 0;
  for (int32_t i = 0; i < num_tiles; ++i) {
    int32_t m = -1, n = -1;
    GemmRsOrder::tile(p, i, m, n);
    ASSERT_TRUE(m >= 0 && m < rows.tiles_m() && n >= 0 && n < tiles_n) << "position " << i;
    ASSERT_TRUE(seen.insert({m, n}).second) << "tile " << m << ", " << n << " twice";
    EXPECT_GE(rows.send_slot(m), previous_slot);
    previous_slot = rows.send_slot(m);
    if (std::find(row_order.begin(), row_order.end(), m) == row_order.end()) row_order.push_back(m);
    // Bands: the tile rows in flight at one time lie within band_m of each other.
    const int32_t slot_first_row = p.first_row[rows.send_slot(m)];
    const int32_t band = (m - slot_first_row) / band_m;
    if (i > 0) {
      int32_t pm = -1, pn = -1;
      GemmRsOrder::tile(p, i - 1, pm, pn);
      if (rows.send_slot(pm) == rows.send_slot(m) && (pm - slot_first_row) / band_m == band) {
        EXPECT_TRUE(pn == n ? pm + 1 == m : pn + 1 == n) << "position " << i;  // down a column, then the next
      }
    }
  }
  ASSERT_EQ(row_order.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_EQ(rows.send_slot(row_order[i]), rows.send_slot(reference[i]));
}

TEST(GemmRsOrder, KernelOrderMatchesTheReference) {
  for (const auto& layout : kLayouts) {
    for (int rank = 0; rank < static_cast<int>(layout.size()); ++rank) {
      for (int tiles_n : {1, 3, 56}) {
        for (int band_m : {1, 4, 16}) check_kernel_order(layout, rank, kGemmRsClusterTileM, tiles_n, band_m);
      }
    }
  }
  std::mt19937 random(5);
  for (const auto& layout : random_layouts(7, 150, 9, 2000)) {
    check_kernel_order(layout, static_cast<int>(random() % layout.size()), 128 * (1 + random() % 2),
                       1 + static_cast<int>(random() % 20), 1 + static_cast<int>(random() % 16));
  }
  EXPECT_THROW(GemmRsOrder::make(make_gemm_rs_rows({4}, 0), 3, 0), Error);
  EXPECT_THROW(GemmRsOrder::make(make_gemm_rs_rows({4}, 0), -1, 1), Error);
}

// Rounds: every tile once; the walk the kernel takes (SlotOrder over make_rounds' slots) is the
// reference's; and every peer pushes a tile row at a position no later than the one where its owner
// waits for it (the same band sits in the same slot range on every rank, so tile positions compare
// as the tile rows' indices do).
TEST(GemmRsOrder, RoundsPushEveryTileNoLaterThanItsOwnerWaits) {
  std::vector<std::vector<int64_t>> layouts = {{4096, 4096}, {2048, 2048, 2048, 2048}, {256, 1024, 0, 512},
                                               {768, 256}, {300, 0}, {1}};
  for (const auto& layout : random_layouts(9, 60, 8, 12)) {
    std::vector<int64_t> on_grid(layout.size());
    for (size_t q = 0; q < layout.size(); ++q) on_grid[q] = layout[q] * kGemmRsClusterTileM;
    layouts.push_back(on_grid);
  }
  for (const auto& layout : layouts) {
    const int world = static_cast<int>(layout.size());
    for (int round_m : {1, 2, 3, 8}) {
      SCOPED_TRACE(::testing::Message() << "world " << world << ", round_m " << round_m << ", M "
                                        << std::accumulate(layout.begin(), layout.end(), int64_t{0}));
      std::vector<std::vector<int32_t>> orders(world);
      for (int rank = 0; rank < world; ++rank) {
        const GemmRsRows rows = make_gemm_rs_rows(layout, rank, kGemmRsClusterTileM);
        orders[rank] = gemm_rs_round_tile_row_order(rows, round_m);
        std::vector<int32_t> sorted = orders[rank];
        std::sort(sorted.begin(), sorted.end());
        std::vector<int32_t> all(rows.tiles_m());
        std::iota(all.begin(), all.end(), 0);
        ASSERT_EQ(sorted, all) << "rank " << rank;
        if (round_m < gemm_rs_min_round_m(rows)) continue;
        for (int tiles_n : {1, 5}) {  // the kernel's walk, tile by tile, visits rows in the reference order
          const GemmRsOrder::Params p = GemmRsOrder::make_rounds(rows, tiles_n, 4, round_m);
          std::vector<int32_t> walked;
          for (int32_t i = 0; i < rows.tiles_m() * tiles_n; ++i) {
            int32_t m = -1, n = -1;
            GemmRsOrder::tile(p, i, m, n);
            if (std::find(walked.begin(), walked.end(), m) == walked.end()) walked.push_back(m);
          }
          EXPECT_EQ(walked, orders[rank]) << "rank " << rank << ", tiles_n " << tiles_n;
        }
      }
      const GemmRsRows rows0 = make_gemm_rs_rows(layout, 0, kGemmRsClusterTileM);
      for (int32_t t = 0; t < rows0.tiles_m(); ++t) {
        const int owner = rows0.first_owner(t);
        const auto at = [&](int rank) {
          return std::find(orders[rank].begin(), orders[rank].end(), t) - orders[rank].begin();
        };
        for (int peer = 0; peer < world; ++peer) {
          EXPECT_LE(at(peer), at(owner)) << "tile row " << t << ": rank " << peer << " pushes it after its owner "
                                         << owner << " waits";
        }
      }
    }
  }
  // One slot per band: more than SlotOrder holds raises, naming the smallest round_m that fits.
  const GemmRsRows many = make_gemm_rs_rows({256 * 100, 256 * 100}, 0, kGemmRsClusterTileM);
  EXPECT_THROW(GemmRsOrder::make_rounds(many, 4, 4, 1), Error);
  EXPECT_NO_THROW(GemmRsOrder::make_rounds(many, 4, 4, gemm_rs_min_round_m(many)));
  EXPECT_THROW(GemmRsOrder::make_rounds(make_gemm_rs_rows({100, 100}, 0, kGemmRsClusterTileM), 4, 4, 1), Error);
}

// ---- Flags and staging -------------------------------------------------------------------

struct Variant {
  GemmRsKind kind;
  GemmRsPath path;
};
const Variant kVariants[] = {{GemmRsKind::kReduceScatter, GemmRsPath::kThroughput},
                             {GemmRsKind::kReduceScatter, GemmRsPath::kOneShot},
                             {GemmRsKind::kAllReduce, GemmRsPath::kThroughput},
                             {GemmRsKind::kAllReduce, GemmRsPath::kOneShot}};

// On every receiver: one flag and one staging tile per (tile it sums, sender), all distinct, within
// the region and the staging buffer; gemm_rs receivers are exactly the owners a tile row touches.
// Every rank's plan agrees (symmetric offsets), and the reducer walks each of its tiles once.
void check_layout(std::vector<int64_t> layout, int64_t n, int tile_n, Variant v, GemmRsPartials partials) {
  const bool ar = v.kind == GemmRsKind::kAllReduce;
  if (ar) layout = gemm_ar_rows_per_rank(std::accumulate(layout.begin(), layout.end(), int64_t{0}), layout.size());
  SCOPED_TRACE(::testing::Message() << "world " << layout.size() << ", n " << n << ", tile_n " << tile_n << ", "
                                    << (ar ? "gemm_ar" : "gemm_rs") << (v.path == GemmRsPath::kOneShot ? " one-shot" : ""));
  const int world = static_cast<int>(layout.size());
  std::vector<GemmRsPlan> plans;
  for (int q = 0; q < world; ++q) {
    plans.push_back(make_gemm_rs_plan(make_gemm_rs_rows(layout, q), n, tile_n, v.kind, v.path, partials));
  }
  const GemmRsPlan& p0 = plans[0];
  const GemmRsRows& rows = p0.rows;
  ASSERT_LE(p0.flags, kGemmRsMaxFlags);
  EXPECT_EQ(p0.tile_bytes, uint64_t{128} * tile_n * (partials == GemmRsPartials::kFp32 ? 4 : 2));
  EXPECT_EQ(p0.staging_bytes, static_cast<uint64_t>(p0.partial_flags) * p0.tile_bytes);
  for (const GemmRsPlan& p : plans) {
    EXPECT_EQ(p.staging_bytes, p0.staging_bytes);
    EXPECT_EQ(p.flags, p0.flags);
  }
  for (int q = 0; q < world; ++q) {
    std::set<int32_t> slots;
    std::vector<std::pair<uint64_t, uint64_t>> tiles;  // staging [begin, end)
    for (int32_t m = 0; m < rows.tiles_m(); ++m) {
      const int64_t lo = int64_t{m} * 128, hi = lo + 128;
      const bool owner_touched = layout[q] > 0 && rows.start[q] < hi && rows.start[q + 1] > lo;
      const bool expected = (ar && v.path == GemmRsPath::kOneShot) || owner_touched;
      for (int s = 0; s < world; ++s) {
        // The sender decides with its own plan; it must agree with the receiver's.
        ASSERT_EQ(plans[s].receives(q, m), expected) << "rank " << q << ", tile row " << m;
        ASSERT_EQ(plans[q].receives(q, m), expected);
        if (!expected) continue;
        for (int32_t nn = 0; nn < p0.tiles_n; ++nn) {
          const int32_t slot = plans[s].partial_slot(q, s, m, nn);
          ASSERT_EQ(slot, plans[q].partial_slot(q, s, m, nn));
          ASSERT_TRUE(slot >= 0 && slot < p0.partial_flags) << "slot " << slot;
          ASSERT_TRUE(slots.insert(slot).second) << "slot " << slot << " twice";
          const uint64_t begin = plans[s].staging_offset(q, s, m, nn);
          tiles.push_back({begin, begin + p0.tile_bytes});
        }
      }
    }
    std::sort(tiles.begin(), tiles.end());
    for (size_t i = 0; i < tiles.size(); ++i) {
      EXPECT_LE(tiles[i].second, p0.staging_bytes);
      if (i > 0) {
        EXPECT_LE(tiles[i - 1].second, tiles[i].first) << "staging tiles overlap";
      }
    }
    // The reducer's walk: every tile this rank sums, once.
    std::set<std::pair<int32_t, int32_t>> walked;
    const GemmRsPlan& p = plans[q];
    for (int32_t i = 0; i < p.reduced_rows(q) * p.tiles_n; ++i) {
      int32_t m = -1, nn = -1;
      p.reduce_tile(i, m, nn);
      ASSERT_TRUE(p.receives(q, m) && nn >= 0 && nn < p.tiles_n) << "position " << i;
      ASSERT_TRUE(walked.insert({m, nn}).second);
    }
    EXPECT_EQ(static_cast<int64_t>(walked.size()), int64_t{p.reduced_rows(q)} * p.tiles_n);
  }
  // gemm_ar throughput: one flag per reduced tile, after the partials' flags.
  EXPECT_EQ(p0.broadcast, ar && v.path == GemmRsPath::kThroughput);
  if (p0.broadcast) {
    std::set<int32_t> flags;
    for (int32_t m = 0; m < rows.tiles_m(); ++m) {
      for (int32_t nn = 0; nn < p0.tiles_n; ++nn) {
        const int32_t flag = p0.reduced_flag(m, nn);
        EXPECT_TRUE(flag >= p0.partial_flags && flag < p0.flags);
        EXPECT_TRUE(flags.insert(flag).second);
      }
    }
  } else {
    EXPECT_EQ(p0.flags, p0.partial_flags);
  }
}

TEST(GemmRsPlan, FlagsAndStagingAreDistinctAndInBounds) {
  for (const auto& layout : kLayouts) {
    for (const Variant& v : kVariants) {
      for (auto [n, tile_n] : {std::pair<int64_t, int>{1, 128}, {300, 128}, {1024, 256}, {0, 128}}) {
        check_layout(layout, n, tile_n, v, GemmRsPartials::kFp32);
        check_layout(layout, n, tile_n, v, GemmRsPartials::kInputDtype);
      }
    }
  }
  std::mt19937 random(17);
  for (const auto& layout : random_layouts(23, 100, 9, 1500)) {
    check_layout(layout, 1 + random() % 1000, 128, kVariants[random() % 4], GemmRsPartials::kFp32);
  }
}

TEST(GemmRsPlan, StagingIsPerSenderAndTile) {
  // Two ranks of 256 rows, 2 tile columns of 128: each rank sums 2 x 2 tiles from 2 senders.
  const GemmRsPlan p = make_gemm_rs_plan(make_gemm_rs_rows({256, 256}, 1), 256, 128, GemmRsKind::kReduceScatter,
                                         GemmRsPath::kThroughput, GemmRsPartials::kFp32);
  EXPECT_EQ(p.tile_bytes, 128u * 128 * 4);
  EXPECT_EQ(p.partial_flags, 8);
  EXPECT_EQ(p.staging_bytes, 8 * p.tile_bytes);
  EXPECT_EQ(p.partial_slot(1, 0, 2, 0), 0);  // rank 1's first tile row is 2; tile-major, sender-minor
  EXPECT_EQ(p.partial_slot(1, 1, 2, 0), 1);
  EXPECT_EQ(p.partial_slot(1, 0, 2, 1), 2);
  EXPECT_EQ(p.partial_slot(1, 1, 3, 1), 7);
  EXPECT_EQ(p.staging_offset(1, 1, 3, 1), 7 * p.tile_bytes);
  // Input-dtype partials halve staging (and traffic).
  const GemmRsPlan half = make_gemm_rs_plan(make_gemm_rs_rows({256, 256}, 1), 256, 128, GemmRsKind::kReduceScatter,
                                            GemmRsPath::kThroughput, GemmRsPartials::kInputDtype);
  EXPECT_EQ(half.staging_bytes * 2, p.staging_bytes);
}

TEST(GemmRsPlan, RunsOfKHaveTheirOwnFlagsAndStaging) {
  // gemm_ar one-shot on two ranks, 100 rows (one tile row), 4 tile columns, runs of 3: every rank
  // receives 2 senders' partials of 4 tiles, and holds the 2 earlier runs of each of its 4 tiles.
  const GemmRsRows rows = make_gemm_rs_rows(gemm_ar_rows_per_rank(100, 2, kGemmRsClusterTileM), 1);
  const GemmRsPlan p = make_gemm_rs_plan(rows, 512, 128, GemmRsKind::kAllReduce, GemmRsPath::kOneShot,
                                         GemmRsPartials::kFp32, 16, 3);
  EXPECT_EQ(p.partial_flags, 8);
  EXPECT_EQ(p.flags, 8 + 4 * 2);
  EXPECT_EQ(p.staging_bytes, 16 * p.tile_bytes);
  std::set<int32_t> flags;
  std::set<uint64_t> tiles;
  for (int32_t n = 0; n < 4; ++n) {
    for (int32_t r = 0; r < 2; ++r) {
      const int32_t f = p.run_flag(0, n, r);
      EXPECT_GE(f, p.partial_flags);
      EXPECT_LT(f, p.flags);
      flags.insert(f);
      const uint64_t at = p.run_staging_offset(0, n, r);
      EXPECT_GE(at, p.partial_flags * p.tile_bytes);
      EXPECT_LE(at + p.tile_bytes, p.staging_bytes);
      tiles.insert(at);
    }
  }
  EXPECT_EQ(flags.size(), 8u);
  EXPECT_EQ(tiles.size(), 8u);
  // Runs are the one-shot gemm_ar's only.
  EXPECT_THROW(make_gemm_rs_plan(rows, 512, 128, GemmRsKind::kAllReduce, GemmRsPath::kThroughput,
                                 GemmRsPartials::kFp32, 16, 2),
               Error);
  EXPECT_THROW(make_gemm_rs_plan(make_gemm_rs_rows({64, 64}, 0), 512, 128, GemmRsKind::kReduceScatter,
                                 GemmRsPath::kOneShot, GemmRsPartials::kFp32, 16, 2),
               Error);
  EXPECT_THROW(make_gemm_rs_plan(rows, 512, 128, GemmRsKind::kAllReduce, GemmRsPath::kOneShot,
                                 GemmRsPartials::kFp32, 16, 0),
               Error);
}

TEST(GemmArKRuns, RunsFillTheCtasOnlyWhereTilesAreFew) {
  EXPECT_EQ(gemm_ar_k_runs(64, 132), 2);  // 1 x 4096 @ 4096 x 8192 in 128 x 128 tiles
  EXPECT_EQ(gemm_ar_k_runs(33, 132), 4);
  EXPECT_EQ(gemm_ar_k_runs(1, 132), 4);  // at most 4
  EXPECT_EQ(gemm_ar_k_runs(66, 132), 2);
  EXPECT_EQ(gemm_ar_k_runs(67, 132), 1);  // the tiles fill half the CTAs already
  EXPECT_EQ(gemm_ar_k_runs(0, 132), 1);
  for (int64_t tiles = 1; tiles < 300; ++tiles) {
    const int runs = gemm_ar_k_runs(tiles, 132);
    EXPECT_GE(runs, 1);
    EXPECT_LE(tiles * runs, std::max<int64_t>(tiles, 132));  // one wave
  }
  EXPECT_THROW(gemm_ar_k_runs(-1, 132), Error);
  EXPECT_THROW(gemm_ar_k_runs(4, 0), Error);
}

TEST(GemmRsPlan, TooManyFlagsRaise) {
  // Two ranks: 512 tile rows each x 128 tile columns x 2 senders = 131072 flags, exactly a region.
  const std::vector<int64_t> layout = {512 * 128, 512 * 128};
  const GemmRsPlan full = make_gemm_rs_plan(make_gemm_rs_rows(layout, 0), 128 * 128, 128, GemmRsKind::kReduceScatter,
                                            GemmRsPath::kThroughput, GemmRsPartials::kFp32);
  EXPECT_EQ(full.flags, kGemmRsMaxFlags);
  const std::string message = error_of([] {
    make_gemm_rs_plan(make_gemm_rs_rows({512 * 128, 512 * 128}, 0), 128 * 128 + 1, 128, GemmRsKind::kReduceScatter,
                      GemmRsPath::kThroughput, GemmRsPartials::kFp32);
  });
  EXPECT_NE(message.find("flag region"), std::string::npos) << message;
  EXPECT_NE(message.find("tile_n=256"), std::string::npos) << message;
  // Wider tiles halve the flags.
  EXPECT_NO_THROW(make_gemm_rs_plan(make_gemm_rs_rows(layout, 0), 128 * 128 + 1, 256, GemmRsKind::kReduceScatter,
                                    GemmRsPath::kThroughput, GemmRsPartials::kFp32));
  // gemm_ar throughput also needs a flag per reduced tile; one-shot needs world per tile of the output.
  EXPECT_THROW(make_gemm_rs_plan(make_gemm_rs_rows(layout, 0), 128 * 128, 128, GemmRsKind::kAllReduce,
                                 GemmRsPath::kThroughput, GemmRsPartials::kFp32),
               Error);
  EXPECT_THROW(make_gemm_rs_plan(make_gemm_rs_rows(layout, 0), 128 * 128, 128, GemmRsKind::kAllReduce,
                                 GemmRsPath::kOneShot, GemmRsPartials::kFp32),
               Error);
  // 72 ranks of 8 tile rows x 224 tile columns fit (129024 flags).
  EXPECT_NO_THROW(make_gemm_rs_plan(make_gemm_rs_rows(std::vector<int64_t>(72, 1024), 0), 28672, 128,
                                    GemmRsKind::kReduceScatter, GemmRsPath::kThroughput, GemmRsPartials::kFp32));
}

TEST(GemmRsPlan, BadPlansRaise) {
  const GemmRsRows rows = make_gemm_rs_rows({256, 256}, 0);
  const auto plan = [&](int64_t n, int tile_n, GemmRsKind kind, GemmRsPath path, int band = 16) {
    return make_gemm_rs_plan(rows, n, tile_n, kind, path, GemmRsPartials::kFp32, band);
  };
  EXPECT_THROW(plan(-1, 128, GemmRsKind::kReduceScatter, GemmRsPath::kThroughput), Error);
  EXPECT_THROW(plan(128, 0, GemmRsKind::kReduceScatter, GemmRsPath::kThroughput), Error);
  EXPECT_THROW(plan(128, 128, GemmRsKind::kReduceScatter, GemmRsPath::kAuto), Error);
  EXPECT_THROW(plan(128, 128, GemmRsKind::kReduceScatter, GemmRsPath::kThroughput, 0), Error);
  EXPECT_THROW(plan(int64_t{1} << 40, 128, GemmRsKind::kReduceScatter, GemmRsPath::kThroughput), Error);
  // gemm_ar's owners must own whole tile rows (one sender per reduced tile).
  EXPECT_THROW(make_gemm_rs_plan(make_gemm_rs_rows({100, 156}, 0), 128, 128, GemmRsKind::kAllReduce,
                                 GemmRsPath::kThroughput, GemmRsPartials::kFp32),
               Error);
  EXPECT_NO_THROW(make_gemm_rs_plan(make_gemm_rs_rows({100, 156}, 0), 128, 128, GemmRsKind::kAllReduce,
                                    GemmRsPath::kOneShot, GemmRsPartials::kFp32));
}

// ---- Numerics: the whole exchange simulated on the host -----------------------------------

// Partials of a wide range of magnitudes, so that the order of a sum changes its bits.
std::vector<std::vector<float>> random_partials(int world, int64_t elements, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::vector<std::vector<float>> partials(world, std::vector<float>(elements));
  for (auto& partial : partials) {
    for (float& x : partial) x = std::ldexp(mantissa(random), static_cast<int>(random() % 41) - 20);
  }
  return partials;
}

// Every rank's out (NaN where it holds nothing) after: every sender walks its GemmRsOrder, pushing
// each finished tile into the staging of every rank that receives it and raising its flag (senders
// interleaved at random, as they race on the GPU); every receiver then walks its reduce order,
// checks the world's flags, and sums its rows in rank order; gemm_ar throughput's owners then push
// the reduced tiles to every rank. Flags raised twice fail the test.
std::vector<std::vector<float>> simulate(const std::vector<int64_t>& layout, int64_t n, int tile_n, Variant v,
                                         const std::vector<std::vector<float>>& partials, uint32_t seed) {
  const int world = static_cast<int>(layout.size());
  const int64_t m = std::accumulate(layout.begin(), layout.end(), int64_t{0});
  constexpr uint64_t kOp = 7;  // this call's op number
  std::vector<GemmRsPlan> plans;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> work(world);  // each sender's CTA tiles, in order
  for (int q = 0; q < world; ++q) {
    plans.push_back(make_gemm_rs_plan(make_gemm_rs_rows(layout, q), n, tile_n, v.kind, v.path, GemmRsPartials::kFp32));
    const GemmRsRows cluster_rows = make_gemm_rs_rows(layout, q, kGemmRsClusterTileM);
    const GemmRsOrder::Params order = GemmRsOrder::make(cluster_rows, plans[q].tiles_n, 3);
    for (int32_t i = 0; i < cluster_rows.tiles_m() * plans[q].tiles_n; ++i) {
      int32_t cm = 0, cn = 0;
      GemmRsOrder::tile(order, i, cm, cn);
      for (int32_t half = 0; half < 2; ++half) {  // the cluster's two CTA tiles
        if (2 * cm + half < plans[q].rows.tiles_m()) work[q].push_back({2 * cm + half, cn});
      }
    }
  }
  const GemmRsPlan& p0 = plans[0];
  std::vector<std::vector<float>> staging(world, std::vector<float>(p0.staging_bytes / 4, NAN));
  std::vector<std::vector<uint64_t>> flags(world, std::vector<uint64_t>(p0.flags, 0));
  std::vector<size_t> next(world, 0);
  std::mt19937 random(seed);
  for (size_t left = static_cast<size_t>(p0.rows.tiles_m()) * p0.tiles_n * world; left > 0; --left) {
    int s = static_cast<int>(random() % world);
    while (next[s] == work[s].size()) s = (s + 1) % world;
    const auto [tm, tn] = work[s][next[s]++];
    for (int q = 0; q < world; ++q) {
      if (!plans[s].receives(q, tm)) continue;
      float* tile = staging[q].data() + plans[s].staging_offset(q, s, tm, tn) / 4;
      for (int64_t r = int64_t{tm} * 128; r < std::min<int64_t>(m, (tm + 1) * int64_t{128}); ++r) {
        for (int64_t c = int64_t{tn} * tile_n; c < std::min<int64_t>(n, (tn + 1) * int64_t{tile_n}); ++c) {
          tile[(r - int64_t{tm} * 128) * tile_n + (c - int64_t{tn} * tile_n)] = partials[s][r * n + c];
        }
      }
      uint64_t& flag = flags[q][plans[s].partial_slot(q, s, tm, tn)];
      EXPECT_EQ(flag, 0u) << "a flag raised twice";
      flag = kOp;
    }
  }
  std::vector<std::vector<float>> out(world, std::vector<float>(m * n, NAN));
  for (int q = 0; q < world; ++q) {
    const GemmRsPlan& p = plans[q];
    for (int32_t i = 0; i < p.reduced_rows(q) * p.tiles_n; ++i) {
      int32_t tm = 0, tn = 0;
      p.reduce_tile(i, tm, tn);
      for (int s = 0; s < world; ++s) EXPECT_EQ(flags[q][p.partial_slot(q, s, tm, tn)], kOp) << "a partial missing";
      const int64_t lo = p.every_rank_reduces ? 0 : p.rows.start[q];
      const int64_t hi = p.every_rank_reduces ? m : p.rows.start[q + 1];
      for (int64_t r = std::max<int64_t>(lo, int64_t{tm} * 128); r < std::min<int64_t>(hi, (tm + 1) * int64_t{128}); ++r) {
        for (int64_t c = int64_t{tn} * tile_n; c < std::min<int64_t>(n, (tn + 1) * int64_t{tile_n}); ++c) {
          const int64_t at = (r - int64_t{tm} * 128) * tile_n + (c - int64_t{tn} * tile_n);
          EXPECT_TRUE(std::isnan(out[q][r * n + c])) << "an element summed twice";
          out[q][r * n + c] = sum_in_rank_order(
              world, [&](int32_t s) { return staging[q][p.staging_offset(q, s, tm, tn) / 4 + at]; });
        }
      }
    }
  }
  if (p0.broadcast) {
    for (int q = 0; q < world; ++q) {  // owner q pushes its reduced rows to every other rank
      for (int p = 0; p < world; ++p) {
        if (p == q) continue;
        for (int64_t r = p0.rows.start[q]; r < p0.rows.start[q + 1]; ++r) {
          std::copy(out[q].begin() + r * n, out[q].begin() + (r + 1) * n, out[p].begin() + r * n);
        }
        for (int32_t tm = p0.rows.first_tile_row(q); tm < p0.rows.first_tile_row(q) + p0.rows.tile_rows_of(q); ++tm) {
          for (int32_t tn = 0; tn < p0.tiles_n; ++tn) {
            uint64_t& flag = flags[p][p0.reduced_flag(tm, tn)];
            EXPECT_EQ(flag, 0u) << "a reduced tile's flag raised twice";
            flag = kOp;
          }
        }
      }
    }
  }
  return out;
}

bool same_bits(const float* a, const float* b, size_t count) { return std::memcmp(a, b, count * sizeof(float)) == 0; }

// gemm_rs: each owner's rows are, bit for bit, the rank-order fp32 sum, however the partials raced.
// gemm_ar: every rank holds all of it, the same bits on every rank and on both paths.
void check_numerics(std::vector<int64_t> layout, int64_t n, int tile_n, uint32_t seed) {
  const int world = static_cast<int>(layout.size());
  const int64_t m = std::accumulate(layout.begin(), layout.end(), int64_t{0});
  SCOPED_TRACE(::testing::Message() << "world " << world << ", m " << m << ", n " << n << ", seed " << seed);
  const std::vector<std::vector<float>> partials = random_partials(world, m * n, seed);
  std::vector<float> expected(m * n);
  for (int64_t e = 0; e < m * n; ++e) {
    expected[e] = sum_in_rank_order(world, [&](int32_t s) { return partials[s][e]; });
  }
  const Variant rs = kVariants[0];
  for (uint32_t race : {1u, 2u, 3u}) {
    const auto out = simulate(layout, n, tile_n, rs, partials, seed * 7 + race);
    for (int q = 0; q < world; ++q) {
      const int64_t begin = std::accumulate(layout.begin(), layout.begin() + q, int64_t{0});
      EXPECT_TRUE(same_bits(out[q].data() + begin * n, expected.data() + begin * n, layout[q] * n)) << "rank " << q;
    }
  }
  const std::vector<int64_t> ar_layout = gemm_ar_rows_per_rank(m, world);
  for (GemmRsPath path : {GemmRsPath::kThroughput, GemmRsPath::kOneShot}) {
    for (uint32_t race : {1u, 2u}) {
      const auto out = simulate(ar_layout, n, tile_n, {GemmRsKind::kAllReduce, path}, partials, seed * 5 + race);
      for (int q = 0; q < world; ++q) EXPECT_TRUE(same_bits(out[q].data(), expected.data(), m * n)) << "rank " << q;
    }
  }
}

TEST(GemmRsNumerics, RankOrderSumsAreBitwiseDeterministic) {
  check_numerics({300, 0, 129, 1}, 200, 128, 1);
  check_numerics({256, 256}, 130, 256, 2);
  check_numerics({1}, 3, 128, 3);
  check_numerics({0, 1}, 129, 128, 4);
  check_numerics({5, 5, 5, 5, 5}, 64, 128, 5);
  uint32_t seed = 10;
  for (const auto& layout : random_layouts(31, 12, 6, 400)) {
    check_numerics(layout, 1 + seed % 300, 128, seed);  // (seed++ in the same call was unsequenced)
    ++seed;
  }
}

// Why a fixed order: fp32 addition is not associative, so summing in arrival order would change
// bits from run to run and from rank to rank.
TEST(GemmRsNumerics, ArrivalOrderWouldChangeTheBits) {
  const float partials[] = {1e8f, 1.0f, -1e8f};
  EXPECT_EQ(sum_in_rank_order(3, [&](int32_t s) { return partials[s]; }), 0.0f);  // (1e8 + 1) rounds to 1e8
  const int32_t arrival[] = {0, 2, 1};
  EXPECT_EQ(sum_in_rank_order(3, [&](int32_t s) { return partials[arrival[s]]; }), 1.0f);
  // -0 stays -0: the sum starts from partial 0, not from +0.
  EXPECT_TRUE(std::signbit(sum_in_rank_order(2, [](int32_t) { return -0.0f; })));
}

// ---- Path --------------------------------------------------------------------------------

TEST(GemmRsPath, DecodeIsOneShotLargeIsThroughput) {
  const auto path = [](int64_t m, int64_t n, int world, GemmRsKind kind, GemmRsPartials partials = GemmRsPartials::kFp32,
                       GemmRsPathRule rule = {}) {
    return choose_gemm_rs_path(m, n, 8192, world, kind, partials, 132, 128, rule);
  };
  // The decode shapes on 2 GPUs (K = N = 8192): one wave of 64 cluster tiles.
  for (int64_t m : {1, 16, 64, 128, 256}) {
    EXPECT_EQ(path(m, 8192, 2, GemmRsKind::kAllReduce), GemmRsPath::kOneShot) << m;
    EXPECT_EQ(path(m, 8192, 2, GemmRsKind::kReduceScatter), GemmRsPath::kOneShot) << m;
  }
  EXPECT_EQ(path(257, 8192, 2, GemmRsKind::kAllReduce), GemmRsPath::kThroughput);
  EXPECT_EQ(path(8192, 8192, 2, GemmRsKind::kReduceScatter), GemmRsPath::kThroughput);
  // More tiles than one wave: the throughput path overlaps.
  EXPECT_EQ(path(64, 28672, 2, GemmRsKind::kReduceScatter), GemmRsPath::kThroughput);
  // gemm_ar's one-shot push grows with the world: 7 x 256 x 8192 fp32 is past the placeholder cap,
  // input-dtype partials halve it, and 1 row is small.
  EXPECT_EQ(path(256, 8192, 8, GemmRsKind::kAllReduce), GemmRsPath::kThroughput);
  EXPECT_EQ(path(256, 8192, 8, GemmRsKind::kReduceScatter), GemmRsPath::kOneShot);
  EXPECT_EQ(path(64, 8192, 8, GemmRsKind::kAllReduce, GemmRsPartials::kInputDtype), GemmRsPath::kOneShot);
  EXPECT_EQ(path(1, 8192, 72, GemmRsKind::kAllReduce), GemmRsPath::kOneShot);
  EXPECT_EQ(path(0, 0, 2, GemmRsKind::kAllReduce), GemmRsPath::kOneShot);
  // A forced path wins; the rule's numbers are parameters.
  GemmRsPathRule forced;
  forced.path = GemmRsPath::kThroughput;
  EXPECT_EQ(path(1, 8192, 2, GemmRsKind::kAllReduce, GemmRsPartials::kFp32, forced), GemmRsPath::kThroughput);
  GemmRsPathRule small;
  small.one_shot_max_m = 16;
  EXPECT_EQ(path(17, 8192, 2, GemmRsKind::kAllReduce, GemmRsPartials::kFp32, small), GemmRsPath::kThroughput);
}

TEST(GemmRsPath, BadArgumentsRaise) {
  const auto choose = [](int64_t m, int64_t n, int64_t k, int world, int num_sms, int tile_n) {
    return choose_gemm_rs_path(m, n, k, world, GemmRsKind::kReduceScatter, GemmRsPartials::kFp32, num_sms, tile_n);
  };
  EXPECT_THROW(choose(-1, 8, 8, 2, 132, 128), Error);
  EXPECT_THROW(choose(8, -1, 8, 2, 132, 128), Error);
  EXPECT_THROW(choose(8, 8, -1, 2, 132, 128), Error);
  EXPECT_THROW(choose(8, 8, 8, 0, 132, 128), Error);
  EXPECT_THROW(choose(8, 8, 8, kGemmRsMaxRanks + 1, 132, 128), Error);
  EXPECT_THROW(choose(8, 8, 8, 2, 1, 128), Error);
  EXPECT_THROW(choose(8, 8, 8, 2, 132, 0), Error);
}

}  // namespace
}  // namespace interlace

namespace interlace {
namespace {

// Where owners sum in the epilogue, a rank waits only in tile rows wholly its own, and computes them
// after every tile row it pushes to others: the peers it waits for never wait first, so no cycle.
TEST(GemmRsPlan, EpilogueSumsWaitOnlyAfterEveryPush) {
  std::vector<std::vector<int64_t>> layouts = {{4096, 4096}, {256, 512, 0, 768}, {512, 512, 512, 100}, {0, 256},
                                               {256, 0}, {256, 256, 256, 256, 256, 256, 256, 1}, {300, 0},
                                               {512, 300, 0, 0}};
  for (const auto& layout : random_layouts(7, 40, 8, 8)) {
    std::vector<int64_t> on_grid(layout.size());
    for (size_t q = 0; q < layout.size(); ++q) on_grid[q] = layout[q] * kGemmRsClusterTileM;
    layouts.push_back(on_grid);
  }
  for (const auto& layout : layouts) {
    for (int rank = 0; rank < static_cast<int>(layout.size()); ++rank) {
      ASSERT_TRUE(gemm_rs_sums_in_epilogue(make_gemm_rs_rows(layout, rank, kGemmRsTileM)));
      const GemmRsRows cluster = make_gemm_rs_rows(layout, rank, kGemmRsClusterTileM);
      bool waited = false;
      for (int32_t t : gemm_rs_tile_row_order(cluster)) {
        ASSERT_EQ(cluster.first_owner(t), cluster.last_owner(t)) << "tile row " << t << " has two owners";
        const bool own = cluster.first_owner(t) == rank;
        EXPECT_TRUE(own || !waited) << "rank " << rank << " pushes tile row " << t << " after waiting";
        waited = waited || own;
      }
    }
  }
  EXPECT_FALSE(gemm_rs_sums_in_epilogue(make_gemm_rs_rows({100, 100}, 0, kGemmRsTileM)));
  EXPECT_FALSE(gemm_rs_sums_in_epilogue(make_gemm_rs_rows({384, 384}, 1, kGemmRsTileM)));  // off the cluster grid
  EXPECT_TRUE(gemm_rs_sums_in_epilogue(make_gemm_rs_rows({77}, 0, kGemmRsTileM)));          // one rank: nothing to wait for
}

TEST(GemmRsReduceCtas, DefaultFitsAndRequestsAreChecked) {
  EXPECT_EQ(gemm_rs_reduce_ctas(132, 2, 0), kGemmRsReduceCtas);
  EXPECT_EQ(gemm_rs_reduce_ctas(6, 2, 0), 4);  // a small GPU keeps one computing cluster
  EXPECT_EQ(gemm_rs_reduce_ctas(132, 2, 2), 2);
  EXPECT_EQ(gemm_rs_reduce_ctas(132, 2, 130), 130);
  EXPECT_THROW(gemm_rs_reduce_ctas(132, 2, 3), Error);    // not whole clusters
  EXPECT_THROW(gemm_rs_reduce_ctas(132, 2, 132), Error);  // nothing left to compute
  EXPECT_THROW(gemm_rs_reduce_ctas(132, 2, -2), Error);
  EXPECT_THROW(gemm_rs_reduce_ctas(3, 2, 0), Error);      // no room for a reducer beside a cluster
}

}  // namespace
}  // namespace interlace
