// The grouped GEMMs' epilogues (grouped_order.h's orders): each tile into its group of out, for
// grouped_gemm and the fused ops that store locally (moe_dispatch_gemm).
#pragma once

#include <cstdint>

#include "interlace/gemm/grouped_args.h"
#include "interlace/gemm/grouped_order.h"
#include "interlace/gemm/hooks.cuh"
#include "interlace/gemm/sm90_config.cuh"

namespace interlace::gemm_engine {

// The swapped problem's tile turned around in shared memory, so that out's rows go as 16-byte stores.
// Accumulator (r, c) is element r of row c of out (a tile's column is one of out's rows, its rows
// kTileM of that row's columns), so a warp's fragment stores would write 2 bytes to each of 4 rows
// at once. Instead the tile's warpgroup writes it to `staging` row by row of out (a 256-byte row per
// tile column, padded by 16 bytes so that neither the writes nor the reads conflict), meets, then
// each 16 threads store one row's 128 columns. (From registers, one element
// and one home lookup at a time, moe_gemm_combine took 9268 us against 5070 unswapped:
// bench/results/NOTES.md, twenty-second session.)
template <class Element>
struct TransposedStaging {
  static constexpr int kChunk = 16 / sizeof(Element);  // elements of one 16-byte store
  // A warp's fragment values reach 4 rows two apart, 8 columns each: 16 bytes more a row puts them 32
  // banks apart (a multiple of 8 words), and a thread's addresses stay a base plus constants.
  static constexpr int kRowStride = SwappedGroupedOrder::kTileM + kChunk;
  static constexpr int kBytes = kRowStride * kSwappedGroupedRows * sizeof(Element);

  // Every thread of the tile's warpgroup. Stores the tile's first `rows` rows of out (its columns),
  // their first `cols` columns: row r at row_of(r), an Element* to the tile's first column of it,
  // or null for a row not stored. Those pointers are 16-byte aligned (out's rows are).
  template <class TileShape, class Accumulators, class TiledMma, class RowOf>
  __device__ __forceinline__ static void store(char* staging, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int rows, int cols, RowOf&& row_of) {
    using namespace cute;
    constexpr int kTileM = decltype(size<0>(TileShape{}))::value;
    constexpr int kTileN = decltype(size<1>(TileShape{}))::value;
    constexpr int kThreads = decltype(size(TiledMma{}))::value;
    static_assert(kThreads == 128, "one warpgroup a tile (ping-pong), which has the staging area to itself");
    static_assert(kTileM + kChunk == kRowStride && kTileN * kRowStride * sizeof(Element) <= kBytes,
                  "the tile fits the staging area");
    constexpr int kChunks = kTileM / kChunk;  // of a row
    static_assert(kThreads % kChunks == 0, "whole rows a pass");
    Element* tile = reinterpret_cast<Element*>(staging);
    Tensor coords = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{}));
    Tensor tile_coords = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    CUTE_UNROLL
    for (int i = 0; i < size(accum); ++i) {
      tile[get<1>(tile_coords(i)) * kRowStride + get<0>(tile_coords(i))] = Element(accum(i));
    }
    tile_barrier<kThreads>();
    const int col = thread_idx % kChunks * kChunk;
    if (col >= cols) return;
    const bool whole = col + kChunk <= cols;
    for (int row = thread_idx / kChunks; row < rows; row += kThreads / kChunks) {
      Element* to = row_of(row);
      if (to == nullptr) continue;
      const Element* from = tile + row * kRowStride + col;
      if (whole) {
        *reinterpret_cast<uint4*>(to + col) = *reinterpret_cast<const uint4*>(from);
      } else {
        for (int e = 0; e < cols - col; ++e) to[col + e] = from[e];
      }
    }
  }
};

// The swapped problem's engine (grouped_gemm.cu's launch_swapped, and the fused ops that swap where
// it does): b[g] K-major as the engine's A, 128 of N down each ping-pong tile, a group's rows across
// kSwappedGroupedRows-wide ones, kSwappedGroupedClusterN of them one cluster along N; the epilogue's
// TransposedStaging carved out of the stages.
template <class Element>
using SwappedGroupedConfig =
    Sm90GemmConfig<Element, /*kBKMajor=*/true, kSwappedGroupedRows, /*kClusterM=*/1, /*kPingpong=*/true,
                   SwappedGroupedOrder::kTileM, kSwappedGroupedClusterN, TransposedStaging<Element>::kBytes>;

// StoreTile into the tile's group: out[g] at g * group_stride, rows past the group's count left alone.
template <class Element>
struct GroupedStore {
  struct Params {
    Element* out;
    int64_t ldc;
    int64_t group_stride;
    GroupedOrder::Params order;
  };

  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int k_run, int /*m*/, int n) {
    int32_t group, row;
    GroupedOrder::locate(p.order, m_idx, group, row);
    const typename StoreTile<Element>::Params out{p.out + group * p.group_stride, p.ldc};
    StoreTile<Element>::template store<TileShape>(out, accum, tiled_mma, thread_idx, row, n_idx, k_run,
                                                  GroupedOrder::rows_of(p.order, group), n);
  }
};

// The swapped problem's tile into its group, through TransposedStaging: out[g] at g * group_stride,
// rows past the group's count left alone.
template <class Element>
struct SwappedGroupedStore {
  struct Params {
    Element* out;
    int64_t ldc;
    int64_t group_stride;
    SwappedGroupedOrder::Params order;
  };
  static constexpr int kSharedBytes = TransposedStaging<Element>::kBytes;

  // m: N (the swapped problem's rows).
  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int /*k_run*/, int m,
                                               int /*n*/, char* staging) {
    constexpr int kTileM = decltype(cute::size<0>(TileShape{}))::value;
    constexpr int kTileN = decltype(cute::size<1>(TileShape{}))::value;
    int32_t group, weight_row;
    SwappedGroupedOrder::locate(p.order, m_idx, group, weight_row);
    const int32_t row0 = n_idx * kTileN;
    const int32_t rows = SwappedGroupedOrder::rows_of(p.order, group) - row0;
    if (rows <= 0) return;  // the whole warpgroup: nothing of this tile is out's
    const int32_t col0 = weight_row * kTileM;
    Element* out = p.out + group * p.group_stride + row0 * p.ldc + col0;
    TransposedStaging<Element>::template store<TileShape>(
        staging, accum, tiled_mma, thread_idx, min(rows, kTileN), min(m - col0, kTileM),
        [&](int row) { return out + row * p.ldc; });
  }
};

}  // namespace interlace::gemm_engine
