#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/tile_plan.h"
#include "tests/cc/error_of.h"

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

// The kernel's closed form against the list built band by band.
void expect_closed_form_matches(const TileGrid& grid, int band_m) {
  const std::vector<int32_t> reference = banded_tile_order(grid, band_m);
  const BandedOrder::Params params = BandedOrder::make(grid, band_m);
  ASSERT_EQ(static_cast<int>(reference.size()), grid.num_tiles());
  for (int32_t i = 0; i < grid.num_tiles(); ++i) {
    int32_t m_idx = -1, n_idx = -1;
    BandedOrder::tile(params, i, m_idx, n_idx);
    ASSERT_EQ(m_idx * grid.tiles_n + n_idx, reference[i])
        << "grid " << grid.tiles_m << " x " << grid.tiles_n << ", band " << band_m << ", position " << i;
    ASSERT_TRUE(m_idx >= 0 && m_idx < grid.tiles_m && n_idx >= 0 && n_idx < grid.tiles_n);
  }
}

TEST(GemmTilePlan, ClosedFormEqualsBandedOrderOnSmallGrids) {
  // Every band height from 1 to past the grid, so last bands of every length, and 1 x N and N x 1.
  for (int tiles_m = 1; tiles_m <= 24; ++tiles_m) {
    for (int tiles_n = 1; tiles_n <= 24; ++tiles_n) {
      for (int band = 1; band <= tiles_m + 2; ++band) expect_closed_form_matches(TileGrid{tiles_m, tiles_n}, band);
    }
  }
}

TEST(GemmTilePlan, ClosedFormEqualsBandedOrderOnLargeGrids) {
  for (auto [tiles_m, tiles_n, band] :
       {std::tuple{1, 4096, 8}, {4096, 1, 8}, {4096, 1, 1}, {1, 4096, 1}, {67, 57, 8}, {64, 56, 16}, {33, 1000, 16},
        {1000, 33, 7}, {255, 255, 256}, {257, 129, 1000000}, {1024, 1024, 8}}) {
    expect_closed_form_matches(TileGrid{tiles_m, tiles_n}, band);
  }
}

TEST(GemmTilePlan, BandedOrderParamsClampTheBand) {
  EXPECT_EQ(BandedOrder::make(TileGrid{5, 7}, 8).band_m, 5);
  EXPECT_EQ(BandedOrder::make(TileGrid{5, 7}, 3).band_m, 3);
  EXPECT_EQ(BandedOrder::make(TileGrid{0, 0}, 8).band_m, 1);  // an empty grid still divides by something
  EXPECT_THROW(BandedOrder::make(TileGrid{5, 7}, 0), Error);
  // A huge band on the largest grid: the band's tile count is the grid's, within 32 bits.
  const BandedOrder::Params p = BandedOrder::make(TileGrid{1 << 15, 1 << 15}, 1 << 30);
  int32_t m_idx, n_idx;
  BandedOrder::tile(p, (1 << 30) - 1, m_idx, n_idx);
  EXPECT_EQ(m_idx, (1 << 15) - 1);
  EXPECT_EQ(n_idx, (1 << 15) - 1);
}

TEST(GemmTilePlan, TileCountsStayWithin32BitWalks) {
  EXPECT_EQ(tile_grid(int64_t{1} << 22, int64_t{1} << 22, 128, 128).num_tiles(), 1 << 30);  // exactly the limit
  EXPECT_THROW(tile_grid((int64_t{1} << 22) + 1, int64_t{1} << 22, 128, 128), Error);
  EXPECT_THROW(tile_grid(int64_t{1} << 31, int64_t{1} << 31, 128, 256), Error);
  EXPECT_THROW(tile_grid(INT64_MAX, INT64_MAX, 128, 256), Error);  // no overflow on the way to the answer
  EXPECT_EQ(tile_grid(0, 1000, 128, 256).num_tiles(), 0);
  EXPECT_EQ(tile_grid(2147482624, 8, 256, 128).tiles_m, 8388604);  // kMaxGemmDim rows in 2-CTA clusters
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

TEST(GemmTilePlan, AutomaticScheduleIsPingpongUnlessHbmIsLean) {
  constexpr double kH100 = 3.35e12 / 132, kH200 = 4.8e12 / 132;
  for (double hbm : {kH200, 0.0}) {  // well fed, or not known
    for (int64_t m : {1, 2048, 8192, 32768}) {
      const GemmSchedule s = automatic_gemm_schedule(m, 28672, 8192, hbm);
      EXPECT_TRUE(s.pingpong) << m << " " << hbm;
      EXPECT_EQ(s.band_m, 8) << m << " " << hbm;
    }
  }
  // Lean: ping-pong in bands of 2 below 1e12 flop, cooperative in bands of 8 from there.
  for (auto [m, n, k] : {std::array<int64_t, 3>{1, 28672, 8192}, {8192, 14336, 4096}, {4096, 8192, 8192}}) {
    const GemmSchedule small = automatic_gemm_schedule(m, n, k, kH100);
    EXPECT_TRUE(small.pingpong) << m << "x" << n << "x" << k;
    EXPECT_EQ(small.band_m, 2) << m << "x" << n << "x" << k;
  }
  for (auto [m, n, k] : {std::array<int64_t, 3>{8192, 8192, 8192}, {4096, 28672, 8192}, {32768, 14336, 4096}}) {
    const GemmSchedule large = automatic_gemm_schedule(m, n, k, kH100);
    EXPECT_FALSE(large.pingpong) << m << "x" << n << "x" << k;
    EXPECT_EQ(large.band_m, 8) << m << "x" << n << "x" << k;
  }
}

TEST(GemmTilePlan, DecodeSizesSwapWhereNFillsTheSms) {
  EXPECT_EQ(decode_swap_tile_n(0, 8192, 132), 0);  // nothing to compute
  EXPECT_EQ(decode_swap_tile_n(1, 8192, 132), 64);
  EXPECT_EQ(decode_swap_tile_n(64, 28672, 132), 64);
  EXPECT_EQ(decode_swap_tile_n(65, 8192, 132), 128);   // 64 tiles of 128 x 128: half the SMs
  EXPECT_EQ(decode_swap_tile_n(128, 8448, 132), 128);  // 66 tiles: still half
  EXPECT_EQ(decode_swap_tile_n(128, 8576, 132), 0);    // 67 tiles
  EXPECT_EQ(decode_swap_tile_n(128, 14336, 132), 0);
  EXPECT_EQ(decode_swap_tile_n(129, 1024, 132), 0);
}

// check_gemm_args on views of made-up device addresses: the checks never dereference them.
TensorView view(uintptr_t address, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  TensorView v;
  v.data = reinterpret_cast<void*>(address);
  v.device = DLDevice{kDLCUDA, 0};
  v.dtype = DLDataType{kDLBfloat, 16, 1};
  v.shape = std::move(shape);
  v.strides = std::move(strides);
  return v;
}

constexpr uintptr_t kA = uintptr_t{1} << 40, kB = uintptr_t{2} << 40, kOut = uintptr_t{3} << 40;

#define EXPECT_REJECTS(needle, ...) \
  EXPECT_NE(error_of([&] { check_gemm_args(__VA_ARGS__, 0); }).find(needle), std::string::npos) << #__VA_ARGS__

TEST(GemmArgs, AcceptsAPlainProblem) {
  const GemmProblem p = check_gemm_args(view(kA, {64, 32}), view(kB, {32, 16}), view(kOut, {64, 16}), 0);
  EXPECT_EQ(p.m, 64);
  EXPECT_EQ(p.n, 16);
  EXPECT_EQ(p.k, 32);
  EXPECT_FALSE(p.b_k_major);
  EXPECT_EQ(p.ldb, 16);
  const GemmProblem t = check_gemm_args(view(kA, {64, 32}), view(kB, {32, 16}, {1, 32}), view(kOut, {64, 16}), 0);
  EXPECT_TRUE(t.b_k_major);
  EXPECT_EQ(t.ldb, 32);
}

TEST(GemmArgs, EmptyOperandsNeedNoLayoutButOutIsCheckedForEveryK) {
  // K = 0: a and b have no elements, so their strides (here neither row- nor column-major) do not
  // matter; out is written (zeros), so it gets the same checks as for any K.
  const GemmProblem p = check_gemm_args(view(kA + 2, {5, 0}, {3, 5}), view(kB + 2, {0, 16}, {7, 3}),
                                        view(kOut, {5, 16}), 0);
  EXPECT_EQ(p.k, 0);
  EXPECT_REJECTS("out's rows must be 16-byte aligned", view(kA, {5, 0}), view(kB, {0, 16}), view(kOut + 2, {5, 16}));
  EXPECT_REJECTS("out must be row-major", view(kA, {5, 0}), view(kB, {0, 16}), view(kOut, {5, 16}, {1, 5}));
  EXPECT_REJECTS("out's rows overlap", view(kA, {5, 0}), view(kB, {0, 16}), view(kOut, {5, 16}, {8, 1}));
  // M = 0: out and a are empty, b is read by nothing but still has elements, so it is checked.
  check_gemm_args(view(kA, {0, 8}, {3, 7}), view(kB, {8, 16}), view(kOut, {0, 16}, {1, 1}), 0);
  EXPECT_REJECTS("b's rows must be 16-byte aligned", view(kA, {0, 8}), view(kB + 2, {8, 16}), view(kOut, {0, 16}));
}

TEST(GemmArgs, DimensionsStayBelow32BitLimits) {
  const int64_t max = kMaxGemmDim;
  check_gemm_args(view(kA, {max, 8}), view(kB, {8, 8}), view(kOut, {max, 8}), 0);
  check_gemm_args(view(kA, {8, max}, {max + 8 - max % 8, 1}), view(kB, {max, 8}), view(kOut, {8, 8}), 0);
  EXPECT_REJECTS("at most 2^31 - 1024", view(kA, {max + 1, 8}), view(kB, {8, 8}), view(kOut, {max + 1, 8}));
  EXPECT_REJECTS("at most 2^31 - 1024", view(kA, {8, int64_t{1} << 31}), view(kB, {int64_t{1} << 31, 8}),
                 view(kOut, {8, 8}));
  EXPECT_REJECTS("at most 2^31 - 1024", view(kA, {8, 8}), view(kB, {8, int64_t{1} << 32}),
                 view(kOut, {8, int64_t{1} << 32}));
  // Even for K = 0, where nothing is multiplied: the limits do not depend on K.
  EXPECT_REJECTS("at most 2^31 - 1024", view(kA, {int64_t{1} << 31, 0}), view(kB, {0, 8}),
                 view(kOut, {int64_t{1} << 31, 8}));
}

TEST(GemmArgs, RowStridesFitTmaDescriptors) {
  const int64_t big = kMaxGemmRowStride;
  check_gemm_args(view(kA, {2, 8}, {big - 8, 1}), view(kB, {8, 8}), view(kOut, {2, 8}), 0);
  EXPECT_REJECTS("a's row stride", view(kA, {2, 8}, {big, 1}), view(kB, {8, 8}), view(kOut, {2, 8}));
  EXPECT_REJECTS("b's stride", view(kA, {2, 8}), view(kB, {8, 8}, {big, 1}), view(kOut, {2, 8}));
  EXPECT_REJECTS("b's stride", view(kA, {2, 8}), view(kB, {8, 8}, {1, big}), view(kOut, {2, 8}));
  EXPECT_REJECTS("out's row stride", view(kA, {2, 8}), view(kB, {8, 8}), view(kOut, {2, 8}, {big, 1}));
  // Strides that pass alone but whose rows run past the end of the address space.
  EXPECT_REJECTS("outside the address space", view(kA, {kMaxGemmDim, 8}, {big - 8, 1}), view(kB, {8, 8}),
                 view(kOut, {kMaxGemmDim, 8}));
}

TEST(GemmArgs, OutMayNotOverlapItsInputs) {
  // Views of one buffer of rows of 32 elements (64 bytes), away from kA, kB and kOut.
  const uintptr_t buf = uintptr_t{4} << 40;
  auto rows = [&](int64_t first, int64_t count) { return view(buf + first * 64, {count, 32}, {32, 1}); };
  EXPECT_REJECTS("out overlaps a", rows(0, 64), view(kB, {32, 32}), rows(0, 64));  // out is a
  EXPECT_REJECTS("out overlaps a", rows(0, 64), view(kB, {32, 32}), rows(63, 64));  // one shared row
  EXPECT_REJECTS("out overlaps b", view(kA, {64, 32}), rows(0, 32), rows(31, 64));
  // Byte ranges, not elements: interleaved column halves count as overlapping.
  EXPECT_REJECTS("out overlaps a", view(buf + 32, {64, 16}, {32, 1}), view(kB, {16, 16}),
                 view(buf, {64, 16}, {32, 1}));
  // b as weight.t() (column-major) overlapping out.
  EXPECT_REJECTS("out overlaps b", view(kA, {64, 32}), view(buf, {32, 32}, {1, 32}), rows(16, 64));
  // Adjacent is fine; so is an empty input at out's address.
  check_gemm_args(rows(0, 64), view(kB, {32, 32}), rows(64, 64), 0);
  check_gemm_args(rows(64, 64), view(kB, {32, 32}), rows(0, 64), 0);
  check_gemm_args(view(buf, {64, 0}), view(buf, {0, 32}), rows(0, 64), 0);
}

}  // namespace
}  // namespace interlace
