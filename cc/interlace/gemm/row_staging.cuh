// A finished tile turned into rows of out in shared memory, then stored as 16-byte chunks: for
// epilogues whose rows go to scattered places (a row per slot, each to its home rank) or whose tile is
// out transposed (the swapped problem), where the fragments' own stores would be 2 or 4 bytes wide.
#pragma once

#include <type_traits>

#include "cute/tensor.hpp"
#include "interlace/gemm/hooks.cuh"

namespace interlace::gemm_engine {

// kRows x kCols of out a pass, row r at row_of(r) (an Element* to the tile's first column of that
// row, 16-byte aligned, or null for a row not stored). kTransposed: accumulator (i, j) is element i
// of out's row j (the swapped problem: kRows is the tile's width, kCols its height); otherwise
// element j of row i, and a tile wider than kCols goes in passes of kCols columns, so that
// a 128 x 256 tile needs no more than a 128 x 128 one (kBytes: 34 KB in bf16 keeps the cooperative
// tile's 4 stages; the whole tile would leave 3).
template <class Element, int kRows, int kCols, bool kTransposed>
struct RowStaging {
  static constexpr int kChunk = 16 / sizeof(Element);  // elements of one 16-byte store
  // A warp's fragment stores reach 8 rows (4 when transposed, two apart) at once: 16 bytes more a row
  // puts them in different banks, and a thread's addresses stay a base plus constants.
  static constexpr int kRowStride = kCols + kChunk;
  static constexpr int kBytes = kRowStride * kRows * sizeof(Element);

  // Every consumer thread of the tile. Stores its first `rows` rows of out, their first `cols`
  // columns. The first barrier keeps this tile's writes from the previous tile's reads: cooperative
  // warpgroups may be a tile apart (ping-pong ones take turns at the epilogue anyway).
  template <class TileShape, class Accumulators, class TiledMma, class RowOf>
  __device__ __forceinline__ static void store(char* staging, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int rows, int cols, RowOf&& row_of) {
    using namespace cute;
    constexpr int kTileM = decltype(size<0>(TileShape{}))::value;
    constexpr int kTileN = decltype(size<1>(TileShape{}))::value;
    constexpr int kThreads = decltype(size(TiledMma{}))::value;
    constexpr int kOutRows = kTransposed ? kTileN : kTileM;
    constexpr int kOutCols = kTransposed ? kTileM : kTileN;
    static_assert(kOutRows == kRows && kOutCols % kCols == 0 && (!kTransposed || kOutCols == kCols),
                  "the tile is the area's rows, and its columns the area's or whole passes of them");
    constexpr int kChunks = kCols / kChunk;  // of a row
    static_assert(kCols % kChunk == 0 && kThreads % kChunks == 0, "whole rows a sweep");
    static_assert(kTransposed || decltype(size(Accumulators{}))::value % 2 == 0, "wgmma accumulators come in column pairs");
    Element* tile = reinterpret_cast<Element*>(staging);
    Tensor tile_coords =
        tiled_mma.get_thread_slice(thread_idx).partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    const int chunk_col = thread_idx % kChunks * kChunk;
    CUTE_UNROLL
    for (int pass = 0; pass < kOutCols / kCols; ++pass) {
      const int col0 = pass * kCols;
      tile_barrier<kThreads>();  // every thread is done reading the area
      if constexpr (kTransposed) {
        CUTE_UNROLL
        for (int i = 0; i < size(accum); ++i) {
          tile[get<1>(tile_coords(i)) * kRowStride + get<0>(tile_coords(i))] = Element(accum(i));
        }
      } else {
        using Pair = cutlass::AlignedArray<Element, 2>;
        CUTE_UNROLL
        for (int i = 0; i < size(accum); i += 2) {  // values i and i+1 are columns c and c+1 of one row
          const int col = get<1>(tile_coords(i)) - col0;
          if (col < 0 || col >= kCols) continue;
          Pair pair;
          pair[0] = Element(accum(i));
          pair[1] = Element(accum(i + 1));
          *reinterpret_cast<Pair*>(tile + get<0>(tile_coords(i)) * kRowStride + col) = pair;
        }
      }
      tile_barrier<kThreads>();  // the area is whole
      const int col = col0 + chunk_col;
      if (col >= cols) continue;
      const bool whole = col + kChunk <= cols;
      for (int row = thread_idx / kChunks; row < rows; row += kThreads / kChunks) {
        Element* to = row_of(row);
        if (to == nullptr) continue;
        const Element* from = tile + row * kRowStride + chunk_col;
        if (whole) {
          *reinterpret_cast<uint4*>(to + col) = *reinterpret_cast<const uint4*>(from);
        } else {
          for (int e = 0; e < cols - col; ++e) to[col + e] = from[e];
        }
      }
    }
  }
};

// The staging area of a 128-row tile's rows of out, 128 columns a pass: StagedStoreTile's, and the
// unswapped grouped tiles' (GroupedStaging).
template <class Element>
using TileRowStaging = RowStaging<Element, 128, 128, /*kTransposed=*/false>;

// StoreTile's job through RowStaging: out[M, N] (row stride ldc) from a 128-row tile, as 16-byte
// stores, skipping what lies past M or N.
template <class Element>
struct StagedStoreTile {
  using Params = typename StoreTile<Element>::Params;
  using Staging = TileRowStaging<Element>;
  static constexpr int kSharedBytes = Staging::kBytes;

  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int /*k_run*/, int m, int n,
                                               char* staging) {
    constexpr int kTileM = decltype(cute::size<0>(TileShape{}))::value;
    constexpr int kTileN = decltype(cute::size<1>(TileShape{}))::value;
    const int row0 = m_idx * kTileM, col0 = n_idx * kTileN;
    if (row0 >= m) return;  // the whole tile (a grouped cluster partner's past its group's rows)
    Element* out = p.out + static_cast<int64_t>(row0) * p.ldc + col0;
    Staging::template store<TileShape>(staging, accum, tiled_mma, thread_idx, min(m - row0, kTileM),
                                       min(n - col0, kTileN), [&](int row) { return out + row * p.ldc; });
  }
};

// A 128-row tile's store into out[M, N]: through shared memory where nothing overlaps it (the
// cooperative tile, whose consumers all wait for it: 9-15% of grouped_gemm's time at Mixtral- and
// DeepSeek-like shapes on an H100), from registers where the other warpgroup's wgmmas run beside it
// (ping-pong, whose 128 x 128 tiles would lose a stage to the area: 3-9% at M 8192 there).
template <class Element, bool kPingpong>
using TileStore = std::conditional_t<kPingpong, StoreTile<Element>, StagedStoreTile<Element>>;

}  // namespace interlace::gemm_engine
