// The grouped GEMMs' epilogues (grouped_order.h's orders): each tile into its group of out, for
// grouped_gemm and the fused ops that store locally (moe_dispatch_gemm).
#pragma once

#include <cstdint>

#include "interlace/gemm/grouped_args.h"
#include "interlace/gemm/grouped_order.h"
#include "interlace/gemm/hooks.cuh"
#include "interlace/gemm/sm90_config.cuh"

namespace interlace::gemm_engine {

// The swapped problem's engine (grouped_gemm.cu's launch_swapped, and the fused ops that swap where
// it does): b[g] K-major as the engine's A, 128 of N down each ping-pong tile, a group's rows across
// kSwappedGroupedRows-wide ones, kSwappedGroupedClusterN of them one cluster along N.
template <class Element>
using SwappedGroupedConfig = Sm90GemmConfig<Element, /*kBKMajor=*/true, kSwappedGroupedRows, /*kClusterM=*/1,
                                            /*kPingpong=*/true, SwappedGroupedOrder::kTileM, kSwappedGroupedClusterN>;

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

// The swapped problem's tile into its group: out[g] at g * group_stride, transposed (the tile's rows
// are out's columns), columns past the group's count left alone.
template <class Element>
struct SwappedGroupedStore {
  struct Params {
    Element* out;
    int64_t ldc;
    int64_t group_stride;
    SwappedGroupedOrder::Params order;
  };

  // m: N (the swapped problem's rows).
  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int k_run, int m, int /*n*/) {
    int32_t group, row;
    SwappedGroupedOrder::locate(p.order, m_idx, group, row);
    const typename StoreTransposedTile<Element>::Params out{p.out + group * p.group_stride, p.ldc};
    StoreTransposedTile<Element>::template store<TileShape>(
        out, accum, tiled_mma, thread_idx, row, n_idx, k_run, m, SwappedGroupedOrder::rows_of(p.order, group));
  }
};

}  // namespace interlace::gemm_engine
