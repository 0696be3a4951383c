// The places where a fused op changes the GEMM, and the plain GEMM's choices for them.
//
//   InputWait::wait(params, m_idx, n_idx)   producer, before loading a tile's A and B: e.g. wait for
//     -> bool                               the A rows that another GPU is still sending; true loads
//                                           A through GemmParams::mainloop_alt instead.
//   Epilogue::store(params, accum, ...)     consumers, with a finished tile in registers (with
//                                           GemmParams::k_runs, one run of K's partial: k_run): e.g.
//                                           store it into another GPU's memory, add it into a staging
//                                           buffer, raise a flag. An epilogue with kSharedBytes
//                                           gets that much shared memory as a last argument
//                                           (char*, 128-byte aligned; the Config's kEpilogueBytes):
//                                           e.g. to turn a tile around before storing it.
//   Phases::begin(params) -> bool          every thread of every CTA, first: e.g. the op handshake;
//                                           false stops the CTA (and its cluster)
//   Phases::helpers(params, i, count)      the producer warpgroup's idle warps (threads i of count),
//                                           during the GEMM: e.g. pushing this rank's inputs to peers
//   Phases::copy(params, cta, ctas)        every thread of the copier CTAs (GemmParams::copy_ctas of
//                                           them; cta counts from 0), instead of any tile: e.g. the
//                                           transfers, when idle warps push too slowly
//   Phases::end(params)                    every thread of every CTA, last, after a __syncthreads;
//                                           with Phases::kEndRegisters, on the launch's even share of
//                                           registers (168) instead of the producer's 40 (ptxas
//                                           allots code after the roles for the fewest of any path)
// The plain versions below compile to nothing (NoInputWait, NoPhases) and a predicated store
// (StoreTile). InputWait::wait must return even when what it waits for never comes (its wait is
// bounded and the group aborted): the consumers wait on the stages it loads.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/array.h"
#include "cutlass/numeric_conversion.h"

namespace interlace::gemm_engine {

// The producer warpgroup's threads: 0 .. kProducerThreads - 1 of every CTA; the consumer warpgroups'
// follow. Phases::end runs on both; without kEndRegisters the producer's keep only 40 registers.
constexpr int kProducerThreads = 128;

// An epilogue's staging area in shared memory (Epilogue::kSharedBytes), 0 without one.
template <class Epilogue, class = void>
struct EpilogueSharedBytes : std::integral_constant<int, 0> {};
template <class Epilogue>
struct EpilogueSharedBytes<Epilogue, std::void_t<decltype(Epilogue::kSharedBytes)>>
    : std::integral_constant<int, Epilogue::kSharedBytes> {};

struct NoPhases {
  struct Params {};
  static constexpr bool kEndRegisters = false;
  __device__ static bool begin(const Params&) { return true; }
  __device__ static void helpers(const Params&, int /*thread*/, int /*threads*/) {}
  __device__ static void copy(const Params&, int /*cta*/, int /*ctas*/) {}
  __device__ static void end(const Params&) {}
};

struct NoInputWait {
  struct Params {};
  __device__ static bool wait(const Params&, int /*m_idx*/, int /*n_idx*/) { return false; }
};

// The consumer threads of one tile meet (an epilogue's named barrier; kThreads: the tile's, 128 for
// ping-pong's warpgroup, 256 for cooperative's two). Named barriers 8 and 9 (CUTLASS's user ids 0
// and 1): the engine's pipelines and turn-taking use mbarriers only, and the copier CTAs, which use
// __syncthreads, run no epilogue. In ping-pong the warpgroups store different tiles, so each has its
// own id. Constant ids, so that ptxas reserves only these two.
template <int kThreads>
__device__ __forceinline__ void tile_barrier() {
  static_assert(kThreads == 128 || kThreads == 256, "a tile's consumers are one or two warpgroups");
  if (kThreads == 256 || threadIdx.x < 256) {
    cutlass::arch::NamedBarrier::sync(kThreads, 0);  // cooperative, or ping-pong's consumer 0 (threads 128-255)
  } else {
    cutlass::arch::NamedBarrier::sync(kThreads, 1);  // ping-pong's consumer 1 (threads 256-383)
  }
}

// Converts the fp32 accumulators to Element and writes them to out[M, N] (row stride ldc), pairs of
// adjacent columns at a time, skipping what lies past M or N.
template <class Element>
struct StoreTile {
  struct Params {
    Element* out;
    int64_t ldc;
  };

  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma, int thread_idx,
                               int m_idx, int n_idx, int /*k_run*/, int m, int n) {
    using namespace cute;
    const auto tile_mn = take<0, 2>(TileShape{});
    Tensor out = make_tensor(make_gmem_ptr(p.out), make_shape(m, n), make_stride(p.ldc, _1{}));
    Tensor coords = make_identity_tensor(make_shape(m, n));
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor tile_out = thread_mma.partition_C(local_tile(out, tile_mn, make_coord(m_idx, n_idx)));
    Tensor tile_coords = thread_mma.partition_C(local_tile(coords, tile_mn, make_coord(m_idx, n_idx)));
    static_assert(decltype(size(accum))::value % 2 == 0, "wgmma accumulators come in column pairs");
    using Pair = cutlass::AlignedArray<Element, 2>;
    CUTE_UNROLL
    for (int i = 0; i < size(accum); i += 2) {  // values i and i+1 are columns c and c+1 of one row
      const int row = get<0>(tile_coords(i));
      const int col = get<1>(tile_coords(i));
      if (row >= m) continue;
      if (col + 1 < n) {
        Pair pair;
        pair[0] = Element(accum(i));
        pair[1] = Element(accum(i + 1));
        *reinterpret_cast<Pair*>(&tile_out(i)) = pair;
      } else if (col < n) {
        tile_out(i) = Element(accum(i));
      }
    }
  }
};

// For a swapped problem (out^T = b^T a^T on the engine): out[M, N] from its tile, accumulator (r, c)
// being out[c, r]; one element at a time, skipping what lies past the swapped problem's m or n.
template <class Element>
struct StoreTransposedTile {
  struct Params {
    Element* out;
    int64_t ldc;
  };

  // m, n: the swapped problem's (out's N and M).
  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int /*k_run*/, int m, int n) {
    using namespace cute;
    Tensor coords = make_identity_tensor(make_shape(m, n));
    Tensor tile_coords =
        tiled_mma.get_thread_slice(thread_idx).partition_C(local_tile(coords, take<0, 2>(TileShape{}),
                                                                      make_coord(m_idx, n_idx)));
    CUTE_UNROLL
    for (int i = 0; i < size(accum); ++i) {
      const int row = get<0>(tile_coords(i));
      const int col = get<1>(tile_coords(i));
      if (row < m && col < n) p.out[col * p.ldc + row] = Element(accum(i));
    }
  }
};

}  // namespace interlace::gemm_engine
