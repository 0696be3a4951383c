#include "interlace/ops/ag_gemm/plan.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "error_of.h"
#include "gtest/gtest.h"
#include "interlace/base/error.h"

namespace interlace {
namespace {

// Checks the order's promises for one layout: every tile row exactly once; slots never go back;
// a tile row's slot is the latest arrival among the non-empty shards it touches; this rank's own
// rows come first and need no wait.
void check_order(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m) {
  SCOPED_TRACE(::testing::Message() << "rank " << rank << ", tile_m " << tile_m);
  const AgGemmRows rows = make_ag_gemm_rows(rows_per_rank, rank, tile_m);
  const std::vector<int32_t> order = ag_gemm_tile_row_order(rows);
  ASSERT_EQ(static_cast<int64_t>(order.size()), rows.tiles_m());
  ASSERT_EQ(std::set<int32_t>(order.begin(), order.end()).size(), order.size());
  int32_t previous_slot = 0;
  for (int32_t t : order) {
    const int32_t slot = rows.slot_of(t);
    EXPECT_GE(slot, previous_slot);
    previous_slot = slot;
    // Brute force: the shards whose rows intersect the tile row.
    int32_t latest = 0;
    const int64_t lo = static_cast<int64_t>(t) * tile_m, hi = std::min<int64_t>(lo + tile_m, rows.m());
    for (int q = 0; q < rows.world; ++q) {
      const bool holds_rows = rows.start[q + 1] > rows.start[q];
      if (holds_rows && rows.start[q] < hi && rows.start[q + 1] > lo) latest = std::max(latest, rows.arrival(q));
    }
    EXPECT_EQ(slot, latest) << "tile row " << t;
  }
  // Tile rows lying wholly in this rank's shard come first, with slot 0.
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t lo = static_cast<int64_t>(order[i]) * tile_m;
    const int64_t hi = std::min<int64_t>(lo + tile_m, rows.m());
    if (lo >= rows.start[rank] && hi <= rows.start[rank + 1]) {
      EXPECT_EQ(rows.slot_of(order[i]), 0);
    }
  }
}

TEST(AgGemmPlan, EvenShards) {
  for (int rank = 0; rank < 4; ++rank) check_order({4096, 4096, 4096, 4096}, rank, 128);
  const AgGemmRows rows = make_ag_gemm_rows({256, 256, 256}, 1, 128);
  EXPECT_EQ(ag_gemm_tile_row_order(rows), (std::vector<int32_t>{2, 3, 0, 1, 4, 5}));  // own, then rank 0, then 2
}

TEST(AgGemmPlan, UnevenTinyAndEmptyShards) {
  const std::vector<std::vector<int64_t>> layouts = {
      {1, 300, 0, 129}, {0, 0, 5, 0}, {127, 1, 128, 129}, {1000, 1}, {1, 1, 1, 1, 1, 1, 1, 1}, {5000}, {0, 0}};
  for (const auto& layout : layouts) {
    for (int rank = 0; rank < static_cast<int>(layout.size()); ++rank) {
      for (int tile_m : {128, 64, 1}) check_order(layout, rank, tile_m);
    }
  }
}

TEST(AgGemmPlan, RandomLayouts) {
  std::mt19937 random(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int world = 1 + static_cast<int>(random() % 9);
    std::vector<int64_t> layout(world);
    for (auto& r : layout) r = random() % 4 == 0 ? 0 : static_cast<int64_t>(random() % 700);
    check_order(layout, static_cast<int>(random() % world), 128);
  }
}

// The kernel's closed-form order visits every tile once, slot by slot as the host reference does,
// and in bands within a slot.
void check_kernel_order(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m, int tiles_n, int band_m) {
  SCOPED_TRACE(::testing::Message() << "rank " << rank << ", tiles_n " << tiles_n << ", band_m " << band_m);
  const AgGemmRows rows = make_ag_gemm_rows(rows_per_rank, rank, tile_m);
  const AgGemmOrder::Params p = AgGemmOrder::make(rows, tiles_n, band_m);
  const std::vector<int32_t> reference = ag_gemm_tile_row_order(rows);
  const int32_t num_tiles = rows.tiles_m() * tiles_n;
  ASSERT_EQ(p.first_position[kAgGemmMaxRanks], num_tiles);
  std::set<std::pair<int32_t, int32_t>> seen;
  std::vector<int32_t> row_order;  // tile rows by first visit
  for (int32_t i = 0; i < num_tiles; ++i) {
    int32_t m = -1, n = -1;
    AgGemmOrder::tile(p, i, m, n);
    ASSERT_TRUE(m >= 0 && m < rows.tiles_m() && n >= 0 && n < tiles_n) << "position " << i;
    ASSERT_TRUE(seen.insert({m, n}).second) << "tile " << m << ", " << n << " twice";
    if (std::find(row_order.begin(), row_order.end(), m) == row_order.end()) row_order.push_back(m);
  }
  // Slot by slot, like the reference (rows within a slot may come in any order of bands).
  ASSERT_EQ(row_order.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_EQ(rows.slot_of(row_order[i]), rows.slot_of(reference[i]));
}

TEST(AgGemmPlan, KernelOrderMatchesTheReference) {
  const std::vector<std::vector<int64_t>> layouts = {
      {4096, 4096}, {1, 300, 0, 129}, {0, 0, 5, 0}, {127, 1, 128, 129}, {1000, 1}, {5000}, {0, 0}, {3, 3, 3}};
  for (const auto& layout : layouts) {
    for (int rank = 0; rank < static_cast<int>(layout.size()); ++rank) {
      for (int tiles_n : {1, 3, 56}) {
        for (int band_m : {1, 4, 16}) check_kernel_order(layout, rank, 256, tiles_n, band_m);
      }
    }
  }
  std::mt19937 random(5);
  for (int trial = 0; trial < 100; ++trial) {
    const int world = 1 + static_cast<int>(random() % 8);
    std::vector<int64_t> layout(world);
    for (auto& r : layout) r = random() % 4 == 0 ? 0 : static_cast<int64_t>(random() % 2000);
    check_kernel_order(layout, static_cast<int>(random() % world), 128 * (1 + random() % 2),
                       1 + static_cast<int>(random() % 20), 1 + static_cast<int>(random() % 16));
  }
}

TEST(AgGemmPlan, ChunkRows) {
  constexpr AgGemmTransfer kSm = AgGemmTransfer::kCopyCtas;
  const AgGemmRows rows = make_ag_gemm_rows({4096, 4096}, 0);
  EXPECT_EQ(ag_gemm_chunk_rows(rows, 16384, kSm, 132, 0), 16);        // 256 KiB
  EXPECT_EQ(ag_gemm_chunk_rows(rows, 16384, kSm, 500, 0), 5);         // 2 per CTA where 256 KiB would leave CTAs idle
  EXPECT_EQ(ag_gemm_chunk_rows(rows, 16, kSm, 132, 0), 16);            // tiny rows: 2 per CTA
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({1 << 20, 1}, 1), 16, kSm, 1, 0), 16384);  // 256 KiB
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({1 << 22, 1}, 1), 1 << 16, kSm, 132, 0), 4096);  // at most 1024 chunks
  EXPECT_EQ(ag_gemm_chunk_rows(rows, 16384, kSm, 132, 7), 7);
  EXPECT_THROW(ag_gemm_chunk_rows(make_ag_gemm_rows({1 << 22, 1}, 1), 16, kSm, 132, 7), Error);
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({0, 0}, 1), 16, kSm, 132, 0), 1);
  // A request past the largest shard is one chunk per shard (a huge one must not overflow chunk counts).
  EXPECT_EQ(ag_gemm_chunk_rows(rows, 16384, kSm, 132, int64_t{1} << 62), 4096);
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({0, 0}, 1), 16, kSm, 132, 1000), 1);
}

TEST(AgGemmPlan, CopyEngineChunks) {
  constexpr AgGemmTransfer kCe = AgGemmTransfer::kCopyEngine;
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({4096, 4096}, 0), 16384, kCe, 132, 0), 256);  // 4 MiB
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({16384, 16384}, 0), 16384, kCe, 132, 0), 512);  // at most 32
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({100, 3}, 0), 16384, kCe, 132, 0), 100);  // one chunk
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({0, 0}, 0), 16384, kCe, 132, 0), 1);
  EXPECT_EQ(ag_gemm_chunk_rows(make_ag_gemm_rows({4096, 4096}, 0), 16384, kCe, 132, 64), 64);
}

TEST(AgGemmPlan, BandM) {
  // Cluster tile rows of 256: shards of 8, 16 and 32 tile rows, and uneven ones (the largest counts).
  EXPECT_EQ(ag_gemm_band_m(make_ag_gemm_rows({2048, 2048}, 0, 256), 8, 0), 4);
  EXPECT_EQ(ag_gemm_band_m(make_ag_gemm_rows({4096, 4096}, 1, 256), 8, 0), 8);
  EXPECT_EQ(ag_gemm_band_m(make_ag_gemm_rows({8192, 8192}, 0, 256), 8, 0), 8);
  EXPECT_EQ(ag_gemm_band_m(make_ag_gemm_rows({8192, 8192}, 0, 256), 16, 0), 16);
  EXPECT_EQ(ag_gemm_band_m(make_ag_gemm_rows({1, 2049}, 0, 256), 8, 0), 4);  // 9 tile rows
  EXPECT_EQ(ag_gemm_band_m(make_ag_gemm_rows({1, 0}, 0, 256), 8, 0), 2);     // never below 2
  EXPECT_EQ(ag_gemm_band_m(make_ag_gemm_rows({2048, 2048}, 0, 256), 8, 3), 3);  // requested wins
  EXPECT_THROW(ag_gemm_band_m(make_ag_gemm_rows({2048, 2048}, 0, 256), 8, -1), Error);
}

TEST(AgGemmPlan, Transfer) {
  EXPECT_EQ(ag_gemm_transfer(AgGemmTransfer::kAuto), AgGemmTransfer::kCopyEngine);
  EXPECT_EQ(ag_gemm_transfer(AgGemmTransfer::kCopyCtas), AgGemmTransfer::kCopyCtas);
}

TEST(AgGemmPlan, TransferNames) {
  EXPECT_EQ(ag_gemm_transfer_named("auto"), AgGemmTransfer::kAuto);
  EXPECT_EQ(ag_gemm_transfer_named("copy_engine"), AgGemmTransfer::kCopyEngine);
  EXPECT_EQ(ag_gemm_transfer_named("ctas"), AgGemmTransfer::kCopyCtas);
  EXPECT_NE(error_of([] { ag_gemm_transfer_named("warps"); }), "");
  EXPECT_NE(error_of([] { ag_gemm_transfer_named("nvlink"); }).find("'copy_engine'"), std::string::npos);
}

TEST(AgGemmPlan, CopyCtas) {
  EXPECT_EQ(ag_gemm_copy_ctas(132, 2, 0), kAgGemmCopyCtas);
  EXPECT_EQ(ag_gemm_copy_ctas(132, 2, 16), 16);
  EXPECT_EQ(ag_gemm_copy_ctas(132, 2, 130), 130);  // one cluster still computes
  EXPECT_THROW(ag_gemm_copy_ctas(132, 2, 132), Error);
  EXPECT_THROW(ag_gemm_copy_ctas(132, 2, 3), Error);
  EXPECT_THROW(ag_gemm_copy_ctas(132, 2, -2), Error);
  EXPECT_EQ(ag_gemm_copy_ctas(6, 2, 0), 4);  // a small GPU keeps a cluster for the GEMM
}

TEST(AgGemmPlan, BadLayoutsRaise) {
  EXPECT_THROW(make_ag_gemm_rows({}, 0), Error);
  EXPECT_THROW(make_ag_gemm_rows({4, -1}, 0), Error);
  EXPECT_THROW(make_ag_gemm_rows({4, 4}, 2), Error);
  EXPECT_THROW(make_ag_gemm_rows(std::vector<int64_t>(kAgGemmMaxRanks + 1, 1), 0), Error);
  EXPECT_THROW(make_ag_gemm_rows({int64_t{1} << 30, int64_t{1} << 30}, 0), Error);
  // Sums that would overflow 64 bits are refused as they grow, not after.
  EXPECT_THROW(make_ag_gemm_rows({INT64_MAX, INT64_MAX, 1}, 0), Error);
  EXPECT_NO_THROW(make_ag_gemm_rows({(int64_t{1} << 31) - 2, 1}, 0));
}

}  // namespace
}  // namespace interlace
