// The grouped GEMMs' epilogues (grouped_order.h's orders): each tile into its group of out, for
// grouped_gemm and the fused ops that store locally (moe_dispatch_gemm).
#pragma once

#include <cstdint>
#include <type_traits>

#include "interlace/gemm/grouped_args.h"
#include "interlace/gemm/grouped_order.h"
#include "interlace/gemm/hooks.cuh"
#include "interlace/gemm/row_staging.cuh"
#include "interlace/gemm/sm90_config.cuh"

namespace interlace::gemm_engine {

// The swapped problem's tile turned around in shared memory (a tile's column is one of out's rows,
// its rows kTileM of that row's columns), so that out's rows go as 16-byte stores; from registers a
// warp would write 2 bytes to each of 4 rows at once. (One element and one home lookup at a time,
// moe_gemm_combine took 9268 us against 5070 unswapped: bench/results/NOTES.md, twenty-second session.)
template <class Element>
using SwappedStaging = RowStaging<Element, kSwappedGroupedRows, SwappedGroupedOrder::kTileM, /*kTransposed=*/true>;

// Where a grouped tile lies in its group's out: rows [row0, row0 + rows) and columns [col0, col0 +
// cols), clipped to the group's count and out's width; rows <= 0 where none of it is out's (a
// cluster partner's tile past a small group). m, n: the engine's problem.
struct GroupedTileSpan {
  int32_t group, row0, rows, col0, cols;
};

// GroupedOrder's tile: out's rows are the tile's.
template <class TileShape>
__device__ __forceinline__ GroupedTileSpan tile_span(const GroupedOrder::Params& order, int m_idx, int n_idx,
                                                     int /*m*/, int n) {
  constexpr int kTileM = decltype(cute::size<0>(TileShape{}))::value;
  constexpr int kTileN = decltype(cute::size<1>(TileShape{}))::value;
  GroupedTileSpan t;
  int32_t tile_row;
  GroupedOrder::locate(order, m_idx, t.group, tile_row);
  t.row0 = tile_row * kTileM;
  t.rows = min(GroupedOrder::rows_of(order, t.group) - t.row0, kTileM);
  t.col0 = n_idx * kTileN;
  t.cols = min(n - t.col0, kTileN);
  return t;
}

// SwappedGroupedOrder's tile: out's rows are the tile's columns, and m is out's width.
template <class TileShape>
__device__ __forceinline__ GroupedTileSpan tile_span(const SwappedGroupedOrder::Params& order, int m_idx, int n_idx,
                                                     int m, int /*n*/) {
  constexpr int kTileM = decltype(cute::size<0>(TileShape{}))::value;
  constexpr int kTileN = decltype(cute::size<1>(TileShape{}))::value;
  GroupedTileSpan t;
  int32_t weight_row;
  SwappedGroupedOrder::locate(order, m_idx, t.group, weight_row);
  t.row0 = n_idx * kTileN;
  t.rows = min(SwappedGroupedOrder::rows_of(order, t.group) - t.row0, kTileN);
  t.col0 = weight_row * kTileM;
  t.cols = min(m - t.col0, kTileM);
  return t;
}

// The staging area of a grouped tile's rows of out: 128 columns a pass, or the swapped tile turned around.
template <class Element, class Order>
using GroupedStaging =
    std::conditional_t<std::is_same_v<Order, SwappedGroupedOrder>, SwappedStaging<Element>, TileRowStaging<Element>>;
static_assert(GroupedOrder::kTileM == 128, "TileRowStaging holds 128-row tiles");

// The swapped problem's engine (grouped_gemm.cu's launch_swapped, and the fused ops that swap where
// it does): b[g] K-major as the engine's A, 128 of N down each ping-pong tile, a group's rows across
// kSwappedGroupedRows-wide ones, kSwappedGroupedClusterN of them one cluster along N; the epilogue's
// SwappedStaging carved out of the stages.
template <class Element>
using SwappedGroupedConfig =
    Sm90GemmConfig<Element, /*kBKMajor=*/true, kSwappedGroupedRows, /*kClusterM=*/1, /*kPingpong=*/true,
                   SwappedGroupedOrder::kTileM, kSwappedGroupedClusterN, SwappedStaging<Element>::kBytes>;

// A 128-row tile into its group: out[g] at g * group_stride, rows past the group's count left alone,
// by TileStore (StoreTile or StagedStoreTile; the latter takes the staging area, passed on).
template <class Element, class TileStore>
struct GroupedStore {
  struct Params {
    Element* out;
    int64_t ldc;
    int64_t group_stride;
    GroupedOrder::Params order;
  };
  static constexpr int kSharedBytes = EpilogueSharedBytes<TileStore>::value;

  template <class TileShape, class Accumulators, class TiledMma, class... Staging>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int k_run, int /*m*/, int n,
                                               Staging... staging) {
    int32_t group, row;
    GroupedOrder::locate(p.order, m_idx, group, row);
    const typename StoreTile<Element>::Params out{p.out + group * p.group_stride, p.ldc};
    TileStore::template store<TileShape>(out, accum, tiled_mma, thread_idx, row, n_idx, k_run,
                                         GroupedOrder::rows_of(p.order, group), n, staging...);
  }
};

// The unswapped problem's engine (grouped_gemm.cu's launch, and the fused ops' GroupedOrder tiles):
// ping-pong 128 x 128 tiles or cooperative 128 x 256 ones; Epilogue's staging area, if it has one,
// carved out of the stages.
template <int kTileN>
constexpr bool kGroupedPingpong = kTileN == 128;
template <class Element, bool kBKMajor, int kClusterM, int kTileN, class Epilogue>
using GroupedConfig = Sm90GemmConfig<Element, kBKMajor, kTileN, kClusterM, kGroupedPingpong<kTileN>,
                                     GroupedOrder::kTileM, /*kClusterN=*/1, EpilogueSharedBytes<Epilogue>::value>;

// grouped_gemm's store of those tiles into their groups: staged where they are cooperative (TileStore).
template <class Element, int kTileN>
using GroupedTileStore = GroupedStore<Element, TileStore<Element, kGroupedPingpong<kTileN>>>;

// The swapped problem's tile into its group, through SwappedStaging: out[g] at g * group_stride,
// rows past the group's count left alone.
template <class Element>
struct SwappedGroupedStore {
  struct Params {
    Element* out;
    int64_t ldc;
    int64_t group_stride;
    SwappedGroupedOrder::Params order;
  };
  static constexpr int kSharedBytes = SwappedStaging<Element>::kBytes;

  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int /*k_run*/, int m, int n,
                                               char* staging) {
    const GroupedTileSpan t = tile_span<TileShape>(p.order, m_idx, n_idx, m, n);
    if (t.rows <= 0) return;  // the whole warpgroup: nothing of this tile is out's
    Element* out = p.out + t.group * p.group_stride + t.row0 * p.ldc + t.col0;
    SwappedStaging<Element>::template store<TileShape>(staging, accum, tiled_mma, thread_idx, t.rows, t.cols,
                                                       [&](int row) { return out + row * p.ldc; });
  }
};

}  // namespace interlace::gemm_engine
