#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/gemm/args.h"
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

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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
