// gemm_rs and gemm_ar over NVLink: out = this rank's rows (gemm_rs) or all rows (gemm_ar) of the sum
// over ranks of a_r @ b_r, in one launch of the GEMM engine (DESIGN.md,
// "gemm_rs and gemm_ar").
//
// K is split across ranks, so every rank computes a partial of every output tile (plan.h). The
// engine runs as a plain GEMM over [M, K_r] @ [K_r, N] in GemmRsOrder (owner rank + 1's rows first,
// this rank's own last), with three hooks filled in:
//   Phases           the op handshake (device/op_sequence.cuh): peers run the same call, and their
//                    previous op no longer reads the staging this rank's epilogue stores into; made
//                    by the reducers first (begin), by a GEMM CTA's helper warp during its mainloop
//                    (helpers), which its epilogue waits for;
//   GemmRsEpilogue   instead of storing the tile to out, stores its fp32 partial into the staging
//                    tile for (tile, this rank) of every owner whose rows the tile touches (this rank
//                    included), then raises that staging tile's flag there to the call's op number;
//                    with sum_in_epilogue (blocks on the cluster-tile grid) a tile of this rank's own
//                    rows is instead summed right there, from the peers' staged partials and its
//                    registers, into out (gemm_ar: and into every peer's landing tile for it, whose
//                    reduced flag it then raises), and there are no reducers; on gemm_ar's one-shot
//                    path (decode) every rank pushes every tile's partial to its peers and then sums
//                    the tile itself, in the same order, so every rank gets the same bits;
//   Phases::end      gemm_ar with sum_in_epilogue: after its GEMM tiles, each CTA's consumer
//                    warpgroups copy its share of the other owners' landed tiles into out as their
//                    flags rise;
//   Phases::copy     the reducers: the last copy_ctas CTAs (the engine's SM budget) take this rank's
//                    tiles in the plan's reduce order, wait for every sender's flag of a tile, sum the
//                    world's partials in rank order in fp32 and round once into out;
//                    gemm_ar, throughput path: the owner also stores each reduced tile into every
//                    peer's landing tile for it and raises its reduced flag there; then the reducers
//                    copy every other owner's tiles from this rank's landing tiles into out as they
//                    land. gemm_ar, one-shot path with a given reduce_ctas: every rank receives
//                    every partial and sums all of out itself.
// Without sum_in_epilogue the GEMM CTAs never wait on anything but the handshake, so they always
// finish; with it they wait only in their own tiles (gemm_ar: and in end, for the owners' sums of
// those tiles), for partials that peers compute in earlier slots without waiting (GemmRsOrder), or
// (one-shot) at the same position of the same order, pushed before their own wait; both need every
// CTA of the grid resident at once (as ag_gemm's
// waits do; the launch sizes the grid to one CTA per SM). Every wait is bounded: a failed one (abort,
// timeout) has recorded why and returns, and the call raises afterwards.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/array.h"
#include "interlace/device/op_sequence.cuh"
#include "interlace/device/transport.cuh"
#include "interlace/gemm/hooks.cuh"
#include "interlace/ops/gemm_rs/flags.h"
#include "interlace/ops/gemm_rs/plan.h"

namespace interlace {

// What the epilogue and the reducers share. Both hooks hold a copy (the engine passes each its own
// parameters), which makes the kernel's parameters about 4 KiB: fine since CUDA 12.1 (32 KiB).
struct GemmRsShared {
  device::NvlinkTransport transport;
  device::WaitContext wait;
  uint64_t signature;    // the call's, for the op handshake
  GemmRsPlan plan;       // rows in CTA tile rows (128; 64 on the swapped path); tile_n is the kernel's tile width
  uint64_t staging;      // heap offset of the staging tiles, the same on every rank
  void* out;             // gemm_rs: this rank's rows, [rows of this rank, n]; gemm_ar: [M, n]; row stride ldo
  int64_t ldo;
  int64_t out_first_row; // the output row that out's row 0 holds: start[me] (gemm_rs), 0 (gemm_ar)
  uint64_t landing;      // gemm_ar: heap offset of the reduced tiles (landing_offset), the same on every rank
  int32_t n;
  int32_t reduce_tiles;  // tiles the reducers sum: plan.reduced_rows(me) * tiles_n; 0 when K = 0 or sum_in_epilogue
  int32_t landing_tiles; // gemm_ar: every output tile (tiles_m * tiles_n; 0 when K = 0); gemm_rs: 0
  // Every block on the cluster-tile grid (gemm_rs_sums_in_epilogue) and no reduce_ctas given: an
  // owner sums its own tiles in the epilogue that computed its partial, and there are no reducers.
  // Staging and landing tiles are then in the consumers' order (GemmRsEpilogue::fragment_index).
  int32_t sum_in_epilogue = 0;
  int32_t copiers = 0;   // the reducer CTAs, last in the grid (GemmParams::copy_ctas)
};

// gemm_ar's landing tiles: tile (m_idx, n_idx)'s reduced values, 128 x tile_n elements of the output
// type (row-major for the reducers, in the consumers' order with sum_in_epilogue), tile-major over
// the whole output.
IL_HOST_DEVICE inline uint64_t landing_offset(const GemmRsPlan& plan, int32_t m_idx, int32_t n_idx, int element_bytes) {
  return (static_cast<uint64_t>(m_idx) * plan.tiles_n + n_idx) * plan.rows.tile_m * plan.tile_n * element_bytes;
}

namespace gemm_rs_detail {

// kOp: kGemmRs or kGemmAr, whose region of the pad the flags live in.
template <OpId kOp>
__device__ __forceinline__ GemmRsFlags& flags(const device::NvlinkTransport& t) {
  static_assert(kOp == OpId::kGemmRs || kOp == OpId::kGemmAr, "gemm_rs's flags serve gemm_rs and gemm_ar");
  return *op_flags<GemmRsFlags, kOp>(t.my_pad());
}

// A GEMM CTA's op handshake, made by a helper warp while the mainloop runs (GemmRsPhases::helpers):
// its result, and a barrier the epilogue waits on before its first store.
struct Began {
  uint64_t barrier;
  int start;  // device::OpStart
};
__device__ __forceinline__ Began& began() {
  __shared__ Began b;
  return b;
}

// The handshake's result, once the helper warp has it: whether this CTA may store and wait (kRun).
// start is volatile on both sides: CUTLASS's arrive and wait are asm without a memory clobber, and
// a stopped call's stores hang on this read.
__device__ __forceinline__ int read_began() { return *reinterpret_cast<volatile int*>(&began().start); }
__device__ __forceinline__ bool wait_began() {
  cutlass::arch::ClusterBarrier::wait(&began().barrier, 0);
  return read_began() == device::kRun;
}

// This call's op number. Valid between the handshake and op_end (the counter moves only when the
// last CTA of the op is done).
__device__ __forceinline__ uint64_t op_number(const device::NvlinkTransport& t) {
  return *reinterpret_cast<const volatile uint64_t*>(&t.my_pad()->ops.completed) + 1;
}

// A reducer CTA is one per SM beside the GEMM, so its speed is the loads each thread keeps in flight:
// one float4 at a time gave about 10 GB/s per SM, and the reduction, not the GEMM, set gemm_rs's time
// (4x the GEMM alone, first GPU run). Each thread takes kUnroll groups of four columns per step and
// issues all their loads of one sender before adding any.
constexpr int kUnroll = 8;

__device__ __forceinline__ void add4(float4& sum, const float4& v) {
  sum.x += v.x;
  sum.y += v.y;
  sum.z += v.z;
  sum.w += v.w;
}

// Stores four sums (or the first `count` < 4 of them) at dst, rounded once to Element: 8 bytes when
// whole (dst is then 8-byte aligned), else element by element, with no array (local memory).
template <class Element>
__device__ __forceinline__ void store4(Element* dst, const float4& sum, int32_t count) {
  if (count >= 4) {
    cutlass::AlignedArray<Element, 4> v;
    v[0] = Element(sum.x);
    v[1] = Element(sum.y);
    v[2] = Element(sum.z);
    v[3] = Element(sum.w);
    *reinterpret_cast<cutlass::AlignedArray<Element, 4>*>(dst) = v;
  } else {
    dst[0] = Element(sum.x);
    if (count > 1) dst[1] = Element(sum.y);
    if (count > 2) dst[2] = Element(sum.z);
  }
}

// The whole CTA: this rank's rows of tile (m_idx, n_idx) = the world's staged partials summed in rank
// order, rounded once to Element, into out; with kAllReduce and plan.broadcast (gemm_ar's throughput
// path) the same values also into every peer's landing tile for it. gemm_ar's one-shot path
// (plan.every_rank_reduces): every rank sums every row of the tile itself. Four columns per thread
// and step; a row's last group of fewer than four columns (N not a multiple of 4) goes element by
// element.
template <class Element, bool kAllReduce>
__device__ __forceinline__ void reduce_tile(const GemmRsShared& p, int32_t m_idx, int32_t n_idx) {
  const GemmRsPlan& plan = p.plan;
  const RowBlocks& rows = plan.rows;
  const int32_t me = rows.rank;
  const int64_t tile_row0 = static_cast<int64_t>(m_idx) * rows.tile_m;
  const int64_t lo = plan.every_rank_reduces ? tile_row0 : max(tile_row0, rows.start[me]);
  const int64_t hi = min(tile_row0 + rows.tile_m, plan.every_rank_reduces ? rows.m() : rows.start[me + 1]);
  const int32_t col0 = n_idx * plan.tile_n;
  const int32_t cols = min(plan.tile_n, p.n - col0);
  const int32_t groups = (cols + 3) / 4;
  const float* staged = reinterpret_cast<const float*>(p.transport.heaps[me] + p.staging +
                                                       plan.staging_offset(me, 0, m_idx, n_idx));
  const uint64_t sender_stride = plan.tile_bytes / sizeof(float);  // a tile's senders lie one after another
  Element* out = static_cast<Element*>(p.out);
  const int64_t work = (hi - lo) * groups;
  const int64_t step = static_cast<int64_t>(blockDim.x);
  for (int64_t base = threadIdx.x; base < work; base += step * kUnroll) {
    int64_t at[kUnroll];  // within a tile; -1: past the work
    float4 sum[kUnroll];
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * step;
      at[u] = j < work ? (lo + j / groups - tile_row0) * plan.tile_n + (j % groups) * 4 : -1;
    }
    // sum_in_rank_order (ops/reduce/plan.h) on four columns at once: partial 0, then += partial 1,
    // 2, ... in fp32, so that the bits are those of the standalone reductions' sums. __ldcg: L2
    // only; peers wrote these over NVLink, the acquire on their flags made them visible, and nothing
    // should be served from this SM's L1.
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      if (at[u] >= 0) sum[u] = __ldcg(reinterpret_cast<const float4*>(staged + at[u]));
    }
    for (int32_t s = 1; s < rows.world; ++s) {
      float4 v[kUnroll];
      CUTE_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        if (at[u] >= 0) v[u] = __ldcg(reinterpret_cast<const float4*>(staged + at[u] + s * sender_stride));
      }
      CUTE_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        if (at[u] >= 0) add4(sum[u], v[u]);
      }
    }
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      if (at[u] < 0) continue;
      const int64_t row = tile_row0 + at[u] / plan.tile_n;
      const int32_t col = static_cast<int32_t>(at[u] % plan.tile_n);
      // out's rows start 16-byte aligned and col0 + col is a multiple of 4.
      store4(out + (row - p.out_first_row) * p.ldo + col0 + col, sum[u], cols - col);
      if (kAllReduce && plan.broadcast) {
        const uint64_t tile = p.landing + landing_offset(plan, m_idx, n_idx, sizeof(Element));
        for (int32_t k = 1; k < rows.world; ++k) {  // rank + 1 first, so that owners spread their stores
          const int32_t q = (me + k) % rows.world;
          store4(reinterpret_cast<Element*>(p.transport.heaps[q] + tile) + at[u], sum[u], cols - col);
        }
      }
    }
  }
}

// The whole CTA: out's rows of tile (m_idx, n_idx) from this rank's landing tile (gemm_ar: another
// owner's reduced values), 16 bytes at a time where whole, then element by element.
template <class Element>
__device__ __forceinline__ void copy_landed_tile(const GemmRsShared& p, int32_t m_idx, int32_t n_idx) {
  const GemmRsPlan& plan = p.plan;
  const int64_t tile_row0 = static_cast<int64_t>(m_idx) * plan.rows.tile_m;
  const int64_t rows = min(static_cast<int64_t>(plan.rows.tile_m), plan.rows.m() - tile_row0);
  const int32_t col0 = n_idx * plan.tile_n;
  const int32_t cols = min(plan.tile_n, p.n - col0);
  const int32_t groups = (cols + 7) / 8;  // 8 elements: 16 bytes
  const Element* tile = reinterpret_cast<const Element*>(p.transport.heaps[p.transport.local_rank] + p.landing +
                                                         landing_offset(plan, m_idx, n_idx, sizeof(Element)));
  Element* out = static_cast<Element*>(p.out);
  const int64_t work = rows * groups, step = static_cast<int64_t>(blockDim.x);
  for (int64_t base = threadIdx.x; base < work; base += step * kUnroll) {
    uint4 v[kUnroll];  // all loads first: see kUnroll
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * step;
      const int32_t col = static_cast<int32_t>(j % groups) * 8;
      if (j < work && col + 8 <= cols) {
        v[u] = __ldcg(reinterpret_cast<const uint4*>(tile + j / groups * plan.tile_n + col));
      }
    }
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * step;
      if (j >= work) continue;
      const int64_t row = j / groups;
      const int32_t col = static_cast<int32_t>(j % groups) * 8;
      Element* dst = out + (tile_row0 + row - p.out_first_row) * p.ldo + col0 + col;
      if (col + 8 <= cols) {
        *reinterpret_cast<uint4*>(dst) = v[u];
      } else {
        const Element* src = tile + row * plan.tile_n + col;
        for (int32_t e = 0; e < cols - col; ++e) dst[e] = src[e];
      }
    }
  }
}

}  // namespace gemm_rs_detail

// Consumers, with a finished 128 x kTileN tile in registers. A tile of other owners' rows: its fp32
// partial goes into the staging tile for (tile, this rank) of every owner of its rows (for the
// reducers whole: rows outside an owner's block, and rows past M and columns past N, whose values a
// shrunk TMA box leaves undefined, land there unused; with sum_in_epilogue only what `holds`: rows
// below M and columns below N); then,
// once every consumer thread of the tile has stored (a named barrier: one warpgroup in ping-pong,
// both in cooperative), one thread raises each owner's
// flag for (tile, this rank) with a system fence and a release store (NvlinkTransport::signal).
// Without sum_in_epilogue this rank's own rows go the same way, into its own staging, for the
// reducers. With it, a tile of this rank's own rows is summed right here: the peers' partials (which
// they computed early in their order, without waiting) plus the one in registers, in rank order,
// rounded once into out.
//
// With sum_in_epilogue, partials (and gemm_ar's sums in the landing tiles) travel in the consumers'
// own order (fragment_index): the thread that reads a value back, the owner's (or, for a landing
// tile, end's stand-in for it), holds the same position of the same tile. A warp's store is then
// 512 contiguous bytes, 367 GB/s each way over NVLink with both GPUs pushing, against 275 for the
// row-major fp32 column pairs and 155 for bf16 ones (tools/probes/peer_store_patterns.cu, 2 x
// H200). The reducers' path keeps row-major tiles, which they read without knowing the MMA layout.
//
// kTransposed (gemm_ar's swapped decode GEMM): the engine computes out^T = b^T a^T, so a tile's rows
// are out's columns and its columns out's rows (GemmRsShared::n is then M); partials travel as
// above, and only the sum's stores into out turn around.
template <class Element, OpId kOp, bool kTransposed = false>
struct GemmRsEpilogue {
  using Params = GemmRsShared;
  static_assert(!kTransposed || kOp == OpId::kGemmAr, "only gemm_ar's one-shot path computes out^T");

  // Whether value i of a thread's accumulators (and the three after it, with the same rows and
  // columns below any bound: rows r and r + 8, columns c and c + 1, c even) holds out's values: a
  // row below `rows` and a column below `cols` of the tile. Others are not sent (at decode sizes,
  // most of the tile): a shrunk TMA box leaves them undefined, and out never reads them.
  template <class Coords>
  __device__ __forceinline__ static bool holds(const Coords& tile_coords, int i, int rows, int cols) {
    return cute::get<0>(tile_coords(i)) < rows && cute::get<1>(tile_coords(i)) < cols;
  }

  // Where value i (of kVector consecutive ones) of consumer thread `thread` of kThreads lies in a tile
  // in the consumers' order, in vectors of kVector values.
  template <int kThreads, int kVector>
  __device__ __forceinline__ static int fragment_index(int i, int thread) {
    return i / kVector * kThreads + thread;
  }

  // accum is not const: with runs of K, the last run adds the earlier runs' partials into it.
  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int k_run, int m, int n) {
    using namespace cute;
    constexpr int kTileM = decltype(size<0>(TileShape{}))::value;
    constexpr int kTileN = decltype(size<1>(TileShape{}))::value;
    // The threads that share this tile: one warpgroup (ping-pong) or two (cooperative).
    constexpr int kThreads = decltype(size(TiledMma{}))::value;
    static_assert(kThreads == 128 || kThreads == 256, "a tile's consumers are one or two warpgroups");
    static_assert(decltype(size(Accumulators{}))::value % 2 == 0, "wgmma accumulators come in column pairs");
    const GemmRsPlan& plan = p.plan;
    const device::NvlinkTransport& t = p.transport;
    // A cluster partner's tile row past the problem: nothing to send (uniform over the tile's threads,
    // so none of them reaches the barrier below).
    if (static_cast<int64_t>(m_idx) * kTileM >= m) return;
    // Nothing leaves the registers before the handshake: a peer may still be in its previous op, and
    // a stopped or cancelled call stores nothing, out included.
    if (!gemm_rs_detail::wait_began()) return;
    const int32_t me = t.local_rank;
    Tensor coords = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{}));  // within the tile
    Tensor tile_coords = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    // Rows past M and columns past N are never read into out (with a shrunk TMA box they hold
    // anything): with sum_in_epilogue they are not sent (holds).
    const int rows_in_tile = m - m_idx * kTileM;
    const int cols_in_tile = n - n_idx * kTileN;
    if (plan.k_runs > 1) {
      if (k_run < plan.k_runs - 1) {  // an earlier run of K: to this rank's run tile, for the last run's CTA
        store_run<kThreads>(p, accum, tile_coords, thread_idx, m_idx, n_idx, k_run, rows_in_tile, cols_in_tile);
        return;
      }
      add_runs<kThreads>(p, accum, tile_coords, thread_idx, m_idx, n_idx, rows_in_tile, cols_in_tile);
    }
    // With sum_in_epilogue this rank sums the tile here when it owns it, or, on gemm_ar's one-shot
    // path, always (after pushing its partial to every peer, who sum it likewise).
    const bool sums_here = p.sum_in_epilogue && (plan.every_rank_reduces || plan.rows.first_owner(m_idx) == me);
    if (!sums_here || plan.every_rank_reduces) {
      push_partial<kTileN, kThreads>(p, accum, tile_coords, thread_idx, m_idx, n_idx, rows_in_tile, cols_in_tile,
                                     sums_here);
    }
    // One-shot: every rank computes the tiles in the same order, pushing before it waits, so the
    // partials it waits for are its peers' of the same position: no cycle, even past one wave.
    if (sums_here) sum_own_tile<kTileN, kThreads>(p, accum, tile_coords, thread_idx, m_idx, n_idx, m);
  }

  // This thread's accumulators that hold out's values (rows below `rows`, columns below `cols`) into
  // dst, in the consumers' order (fragment_index): 16 bytes a store, values i .. i + 3 being rows r
  // and r + 8 of two columns.
  template <int kThreads, class Accumulators, class Coords>
  __device__ __forceinline__ static void store_fragments(float4* dst, const Accumulators& accum,
                                                         const Coords& tile_coords, int thread_idx, int rows, int cols) {
    using namespace cute;
    CUTE_UNROLL
    for (int i = 0; i < size(accum); i += 4) {
      if (!holds(tile_coords, i, rows, cols)) continue;
      dst[fragment_index<kThreads, 4>(i, thread_idx)] = make_float4(accum(i), accum(i + 1), accum(i + 2), accum(i + 3));
    }
  }

  // The tile's partial into the staging of its receivers (with sums_here, not this rank's own,
  // which stays in registers), then their flags.
  template <int kTileN, int kThreads, class Accumulators, class Coords>
  __device__ __forceinline__ static void push_partial(const Params& p, const Accumulators& accum,
                                                      const Coords& tile_coords, int thread_idx, int m_idx, int n_idx,
                                                      int rows_in_tile, int cols_in_tile, bool sums_here) {
    using namespace cute;
    const GemmRsPlan& plan = p.plan;
    const device::NvlinkTransport& t = p.transport;
    const int32_t me = t.local_rank;
    // The receivers of this tile: the owners of its rows, or every rank (gemm_ar's one-shot path).
    const int32_t first = plan.every_rank_reduces ? 0 : plan.rows.first_owner(m_idx);
    const int32_t last = plan.every_rank_reduces ? plan.rows.world - 1 : plan.rows.last_owner(m_idx);
    for (int32_t q = first; q <= last; ++q) {
      if (!plan.receives(q, m_idx)) continue;  // an empty block between the tile's owners
      if (sums_here && q == me) continue;      // its own partial stays in registers
      float* staged = reinterpret_cast<float*>(t.heaps[q] + p.staging + plan.staging_offset(q, me, m_idx, n_idx));
      if (p.sum_in_epilogue) {  // the receiver sums it in its epilogue, in this order
        store_fragments<kThreads>(reinterpret_cast<float4*>(staged), accum, tile_coords, thread_idx, rows_in_tile,
                                  cols_in_tile);
        continue;
      }
      CUTE_UNROLL
      for (int i = 0; i < size(accum); i += 2) {  // values i and i+1 are columns c and c+1 of one row
        const int row = get<0>(tile_coords(i));
        const int col = get<1>(tile_coords(i));
        *reinterpret_cast<float2*>(staged + row * kTileN + col) = make_float2(accum(i), accum(i + 1));
      }
    }
    gemm_engine::tile_barrier<kThreads>();
    if (thread_idx != 0) return;
    const uint64_t number = gemm_rs_detail::op_number(t);
    GemmRsFlags& f = gemm_rs_detail::flags<kOp>(t);
    for (int32_t q = first; q <= last; ++q) {
      if (plan.receives(q, m_idx) && !(sums_here && q == me)) {
        t.signal(q, &f.flag[plan.partial_slot(q, me, m_idx, n_idx)], number);
      }
    }
  }

  // Run k_run (not the last) of K's partial of tile (m_idx, n_idx), in the consumers' order, into this
  // rank's run tile for it; then its flag, for the last run's CTA (add_runs), which is another CTA:
  // the walk gives a tile's runs consecutive positions, and there are more CTAs than runs.
  template <int kThreads, class Accumulators, class Coords>
  __device__ __forceinline__ static void store_run(const Params& p, const Accumulators& accum,
                                                   const Coords& tile_coords, int thread_idx, int m_idx, int n_idx,
                                                   int k_run, int rows_in_tile, int cols_in_tile) {
    using namespace cute;
    const device::NvlinkTransport& t = p.transport;
    float4* run = reinterpret_cast<float4*>(t.heaps[t.local_rank] + p.staging +
                                            p.plan.run_staging_offset(m_idx, n_idx, k_run));
    store_fragments<kThreads>(run, accum, tile_coords, thread_idx, rows_in_tile, cols_in_tile);
    gemm_engine::tile_barrier<kThreads>();
    if (thread_idx == 0) {  // a flag for this GPU's own CTAs: a GPU-scope fence is enough
      __threadfence();
      device::store_release_gpu(&gemm_rs_detail::flags<kOp>(t).flag[p.plan.run_flag(m_idx, n_idx, k_run)],
                                gemm_rs_detail::op_number(t));
    }
  }

  // The last run of tile (m_idx, n_idx): accum = this run + run 0 + run 1 + ..., in fp32 in that
  // order, once the earlier runs' flags rise (their CTAs wait only for their own handshake, and come
  // earlier in the grid, so they are dispatched before the one waiting for them). A failed wait (abort, timeout) has recorded why
  // and returns; the call raises.
  template <int kThreads, class Accumulators, class Coords>
  __device__ __forceinline__ static void add_runs(const Params& p, Accumulators& accum, const Coords& tile_coords,
                                                  int thread_idx, int m_idx, int n_idx, int rows_in_tile,
                                                  int cols_in_tile) {
    using namespace cute;
    const GemmRsPlan& plan = p.plan;
    const device::NvlinkTransport& t = p.transport;
    const int32_t earlier = plan.k_runs - 1;
    if (thread_idx < earlier) {
      const uint64_t* flag = &gemm_rs_detail::flags<kOp>(t).flag[plan.run_flag(m_idx, n_idx, thread_idx)];
      device::wait_until</*kFromPeer=*/false>(flag, gemm_rs_detail::op_number(t), p.wait, FlagId::kPartial,
                                              t.local_rank);
    }
    gemm_engine::tile_barrier<kThreads>();  // the waiters' acquires, then everyone's loads
    for (int32_t r = 0; r < earlier; ++r) {
      const float4* run = reinterpret_cast<const float4*>(t.heaps[t.local_rank] + p.staging +
                                                          plan.run_staging_offset(m_idx, n_idx, r));
      CUTE_UNROLL
      for (int i = 0; i < size(accum); i += 4) {
        if (!holds(tile_coords, i, rows_in_tile, cols_in_tile)) continue;
        const float4 v = __ldcg(run + fragment_index<kThreads, 4>(i, thread_idx));
        accum(i) += v.x;
        accum(i + 1) += v.y;
        accum(i + 2) += v.z;
        accum(i + 3) += v.w;
      }
    }
  }

  // out's rows of tile (m_idx, n_idx) (this rank's own, or any on gemm_ar's one-shot path) = the
  // world's partials in rank order (sum_in_rank_order, the reducers' bits), the peers' from this
  // rank's staging once their flags rise, its own from registers; gemm_ar's throughput path: the
  // sums also into every peer's landing tile, then its reduced flag there.
  // Loads in batches of kBatch vectors, all of a sender's issued before any add. A failed wait
  // (abort, timeout) has recorded why and returns: the sum then reads whatever is there, nothing
  // waits any longer, and the call raises.
  template <int kTileN, int kThreads, class Accumulators, class Coords>
  __device__ __forceinline__ static void sum_own_tile(const Params& p, const Accumulators& accum,
                                                      const Coords& tile_coords,
                                                      int thread_idx, int m_idx, int n_idx, int m) {
    using namespace cute;
    constexpr int kValues = decltype(size(Accumulators{}))::value;
    // float4s per batch: 32 values, whole 16-byte vectors of the bf16 landing tiles. Batches of 4
    // where a thread holds 128 accumulators were 1-2.5% slower for gemm_ar and even for gemm_rs.
    constexpr int kBatch = 8;
    static_assert(kValues % (4 * kBatch) == 0, "a thread's accumulators come in batches");
    const GemmRsPlan& plan = p.plan;
    const device::NvlinkTransport& t = p.transport;
    const int32_t me = t.local_rank, world = plan.rows.world;
    if (thread_idx < world && thread_idx != me) {
      const uint64_t number = gemm_rs_detail::op_number(t);
      t.wait(&gemm_rs_detail::flags<kOp>(t).flag[plan.partial_slot(me, thread_idx, m_idx, n_idx)], number, p.wait,
             FlagId::kPartial, thread_idx);
    }
    gemm_engine::tile_barrier<kThreads>();  // the waiters' acquires, then everyone's loads
    // fp32 partials only (GemmRsPartials::kFp32): partials in the input dtype would have to round
    // this rank's registers too, as its peers' partials were, to keep the reducers' bits.
    const float4* staged =
        reinterpret_cast<const float4*>(t.heaps[me] + p.staging + plan.staging_offset(me, 0, m_idx, n_idx));
    const uint64_t sender_stride = plan.tile_bytes / sizeof(float4);  // a tile's senders lie one after another
    const int64_t tile_row0 = static_cast<int64_t>(m_idx) * plan.rows.tile_m;
    // Rows past this rank's block are not out's (gemm_rs), nor rows past M (gemm_ar's one-shot path).
    const int64_t rows_here = (plan.every_rank_reduces ? m : plan.rows.start[me + 1]) - tile_row0;
    const bool broadcast = kOp == OpId::kGemmAr && !kTransposed && plan.broadcast;  // gemm_ar's throughput path
    const int32_t col0 = n_idx * kTileN;
    const int32_t cols_here = p.n - col0;
    // out^T's tile (kTransposed): value (row, col) is out[col0 + col, tile_row0 + row].
    Element* out = static_cast<Element*>(p.out) +
                   (kTransposed ? col0 * p.ldo + tile_row0 : (tile_row0 - p.out_first_row) * p.ldo + col0);
    const uint64_t landing = p.landing + landing_offset(plan, m_idx, n_idx, sizeof(Element));
    CUTE_UNROLL
    for (int b = 0; b < kValues; b += 4 * kBatch) {
      float4 sum[kBatch];
      for (int32_t s = 0; s < world; ++s) {
        float4 v[kBatch];
        CUTE_UNROLL
        for (int j = 0; j < kBatch; ++j) {
          const int i = b + 4 * j;
          // __ldcg: L2 only; the peer wrote these over NVLink and the acquire made them visible.
          // Values out does not hold were not sent (store): zeros stand in.
          v[j] = s == me ? make_float4(accum(i), accum(i + 1), accum(i + 2), accum(i + 3))
                 : holds(tile_coords, i, rows_here, cols_here)
                     ? __ldcg(staged + s * sender_stride + fragment_index<kThreads, 4>(i, thread_idx))
                     : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        CUTE_UNROLL
        for (int j = 0; j < kBatch; ++j) {
          sum[j] = s == 0 ? v[j]
                          : make_float4(sum[j].x + v[j].x, sum[j].y + v[j].y, sum[j].z + v[j].z, sum[j].w + v[j].w);
        }
      }
      CUTE_UNROLL
      for (int j = 0; j < 2 * kBatch; ++j) {  // pairs: values i and i + 1 are columns c and c + 1 of one row
        const int i = b + 2 * j;
        const int row = get<0>(tile_coords(i));
        const int col = get<1>(tile_coords(i));
        if (row >= rows_here || col >= cols_here) continue;
        const float4& v = sum[j / 2];
        cutlass::AlignedArray<Element, 2> pair;
        pair[0] = Element(j % 2 == 0 ? v.x : v.z);
        pair[1] = Element(j % 2 == 0 ? v.y : v.w);
        if constexpr (kTransposed) {  // the pair's two columns are two rows of out
          out[col * p.ldo + row] = pair[0];
          if (col + 1 < cols_here) out[(col + 1) * p.ldo + row] = pair[1];
          continue;
        }
        Element* dst = out + row * p.ldo + col;
        if (col + 1 < cols_here) {  // col is even and out's rows 16-byte aligned: a 4-byte pair
          *reinterpret_cast<cutlass::AlignedArray<Element, 2>*>(dst) = pair;
        } else {
          dst[0] = pair[0];
        }
      }
      if (broadcast) {  // every peer's landing tile, rank + 1 first to spread the owners' stores
        using Vector = cutlass::AlignedArray<Element, 8>;
        CUTE_UNROLL
        for (int j = 0; j < kBatch; j += 2) {
          Vector v;
          const float w[8] = {sum[j].x, sum[j].y, sum[j].z, sum[j].w, sum[j + 1].x, sum[j + 1].y, sum[j + 1].z, sum[j + 1].w};
          CUTE_UNROLL
          for (int e = 0; e < 8; ++e) v[e] = Element(w[e]);
          for (int32_t k = 1; k < world; ++k) {
            reinterpret_cast<Vector*>(t.heaps[(me + k) % world] + landing)[fragment_index<kThreads, 8>(b + 4 * j,
                                                                                                       thread_idx)] = v;
          }
        }
      }
    }
    if (broadcast) {
      gemm_engine::tile_barrier<kThreads>();  // every thread's stores issued; thread q raises peer q's flag after a fence
      if (thread_idx < world && thread_idx != me) {
        t.signal(thread_idx, &gemm_rs_detail::flags<kOp>(t).flag[plan.reduced_flag(m_idx, n_idx)],
                 gemm_rs_detail::op_number(t));
      }
    }
  }
};

// Element: the output's (cutlass::bfloat16_t or cutlass::half_t), for the reducers' rounding. kOp:
// kGemmRs, or kGemmAr (the reducers then also broadcast their tiles and gather the others'). Config:
// the GEMM's (sm90_config.cuh), whose MMA layout end's copy of landing tiles follows. kTransposed:
// the epilogue's (the one-shot path's swapped GEMM, which has no landing tiles).
template <class Element, OpId kOp, class Config, bool kTransposed = false>
struct GemmRsPhases {
  static constexpr bool kAllReduce = kOp == OpId::kGemmAr;
  static constexpr bool kCopiesLanded = kAllReduce && !kTransposed;  // landing tiles to copy into out, in end

  using Params = GemmRsShared;

  // The reducers, which wait on peers from their start, make the handshake first, as every CTA of
  // other ops does. A GEMM CTA starts its mainloop at once, which reads only this rank's inputs, and
  // makes it in a helper warp meanwhile (helpers): at decode sizes it was 2.4 of gemm_ar's 10.8 us
  // at K = 256 on one GPU, and more with peers to greet. The epilogue waits for it (wait_began).
  __device__ static bool is_copier(const Params& p) {
    return static_cast<int32_t>(blockIdx.x) >= static_cast<int32_t>(gridDim.x) - p.copiers;
  }
  __device__ static bool begin(const Params& p) {
    if (is_copier(p)) return device::op_enter(p.transport, p.wait, p.signature);
    if (threadIdx.x == 0) {
      cutlass::arch::ClusterBarrier::init(&gemm_rs_detail::began().barrier, 1);
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
    return true;
  }

  // gemm_ar's end copies landing tiles with 8 16-byte vectors in flight per thread: more than the
  // producer warpgroup's 40 registers hold.
  static constexpr bool kEndRegisters = kCopiesLanded;
  __device__ static void helpers(const Params& p, int thread, int /*threads*/) {
    if (thread >= 32) return;  // one warp
    const device::OpStart start = device::op_begin_warp(p.transport, p.wait, p.signature);
    if (thread == 0) {
      *reinterpret_cast<volatile int*>(&gemm_rs_detail::began().start) = start;
      cutlass::arch::ClusterBarrier::arrive(&gemm_rs_detail::began().barrier);  // release
    }
  }

  // The reducers, every thread of copier CTA `cta` of `ctas`: tiles cta, cta + ctas, ... of this
  // rank's reduce order. Thread s < world waits for sender s's flag of the tile; the sum starts once
  // all have landed. gemm_ar: each reduced tile then goes to every peer (reduce_tile) and, once all
  // its stores are issued, thread q raises peer q's reduced flag for it; after its own tiles, the CTA
  // copies its share of the other owners' tiles from the landing tiles into out as their flags rise.
  // The owners' reducers wait only for GEMM tiles, which never wait: no cycle.
  __device__ static void copy(const Params& p, int cta, int ctas) {
    using namespace gemm_rs_detail;
    const device::NvlinkTransport& t = p.transport;
    const GemmRsPlan& plan = p.plan;
    const int32_t me = t.local_rank;
    const int32_t world = plan.rows.world;
    const int32_t thread = static_cast<int32_t>(threadIdx.x);
    __shared__ int failed;  // only ever set, and the CTA stops at once: no reset between tiles
    if (threadIdx.x == 0) failed = 0;
    __syncthreads();
    const uint64_t number = op_number(t);
    GemmRsFlags& f = flags<kOp>(t);
    for (int32_t i = cta; i < p.reduce_tiles; i += ctas) {
      int32_t m_idx, n_idx;
      plan.reduce_tile(i, m_idx, n_idx);
      if (thread < world &&
          t.wait(&f.flag[plan.partial_slot(me, thread, m_idx, n_idx)], number, p.wait, FlagId::kPartial, thread) == 0) {
        failed = 1;
      }
      __syncthreads();
      if (failed) return;
      reduce_tile<Element, kAllReduce>(p, m_idx, n_idx);
      __syncthreads();  // every thread has read `failed` (and, gemm_ar, stored its share of the tile)
      if (kAllReduce && plan.broadcast && thread < world && thread != me) {
        t.signal(thread, &f.flag[plan.reduced_flag(m_idx, n_idx)], number);
      }
    }
    if constexpr (kAllReduce) {
      // Every other owner's tiles: position i of the output's tiles, row-major, skipping this rank's.
      for (int32_t i = cta; i < p.landing_tiles; i += ctas) {
        const int32_t m_idx = i / plan.tiles_n, n_idx = i % plan.tiles_n;
        if (plan.receives(me, m_idx)) continue;  // reduced here (uniform over the CTA)
        const int32_t owner = plan.rows.first_owner(m_idx);  // whole tile rows: the one owner
        if (thread == 0 &&
            t.wait(&f.flag[plan.reduced_flag(m_idx, n_idx)], number, p.wait, FlagId::kReduced, owner) == 0) {
          failed = 1;
        }
        __syncthreads();
        if (failed) return;
        copy_landed_tile<Element>(p, m_idx, n_idx);
        __syncthreads();
      }
    }
  }

  // gemm_ar with sums in the epilogue: once a CTA's GEMM tiles are done, its consumer warpgroups copy
  // its share of the other owners' tiles from this rank's landing tiles into out as their flags rise
  // (most have landed by then: the owners' sums come all along the GEMM, in rounds).
  // A GEMM CTA whose handshake stopped the op (kStop) leaves without op_end, as op_enter does.
  __device__ static void end(const Params& p) {
    if (!is_copier(p)) {
      // The engine's __syncthreads before end: the helper warp has stored the start.
      const int start = gemm_rs_detail::read_began();
      if (start == device::kStop) return;
      if constexpr (kCopiesLanded) {
        if (start == device::kRun && p.sum_in_epilogue && threadIdx.x >= gemm_engine::kProducerThreads) {
          copy_landed_fragments(p);
        }
      }
    }
    device::op_end(p.transport);
  }

  // The consumer warpgroups, grouped as in the epilogue (a tile's kThreads threads: both warpgroups
  // in cooperative, each its own in ping-pong): each group stands in for the epilogue that stored a
  // landing tile, reads it in the consumers' order (GemmRsEpilogue::fragment_index) and stores each
  // value where that thread's accumulator sits. Group g of CTA c takes tiles (c x groups + g) +
  // k x (CTAs x groups) of the output's, row-major, skipping this rank's.
  __device__ static void copy_landed_fragments(const Params& p) {
    using namespace cute;
    using namespace gemm_rs_detail;
    using Epilogue = GemmRsEpilogue<Element, kOp>;
    using TileShape = typename Config::TileShape;
    constexpr int kTileM = decltype(size<0>(TileShape{}))::value;
    constexpr int kTileN = decltype(size<1>(TileShape{}))::value;
    constexpr int kThreads = decltype(size(typename Config::TiledMma{}))::value;
    constexpr int kGroups = 2 * cutlass::NumThreadsPerWarpGroup / kThreads;
    using Vector = cutlass::AlignedArray<Element, 8>;
    const device::NvlinkTransport& t = p.transport;
    const GemmRsPlan& plan = p.plan;
    const int thread = static_cast<int>(threadIdx.x) % kThreads;  // the engine's mma_thread_idx
    const int group = (static_cast<int>(threadIdx.x) - gemm_engine::kProducerThreads) / kThreads;
    typename Config::TiledMma tiled_mma;
    Tensor coords = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{}));
    Tensor tile_coords = tiled_mma.get_thread_slice(thread).partition_C(coords);
    constexpr int kValues = decltype(size(tile_coords))::value;
    static_assert(kValues % 64 == 0, "landing tiles go in rounds of 8 16-byte vectors");
    __shared__ int failed[kGroups];  // only ever set, and the group stops at once
    if (thread == 0) failed[group] = 0;
    gemm_engine::tile_barrier<kThreads>();
    const uint64_t number = op_number(t);
    GemmRsFlags& f = flags<kOp>(t);
    Element* out = static_cast<Element*>(p.out);
    for (int32_t i = static_cast<int32_t>(blockIdx.x) * kGroups + group; i < p.landing_tiles;
         i += static_cast<int32_t>(gridDim.x) * kGroups) {
      const int32_t m_idx = i / plan.tiles_n, n_idx = i % plan.tiles_n;
      if (plan.receives(t.local_rank, m_idx)) continue;  // reduced here (uniform over the group)
      if (thread == 0 && t.wait(&f.flag[plan.reduced_flag(m_idx, n_idx)], number, p.wait, FlagId::kReduced,
                                plan.rows.first_owner(m_idx)) == 0) {
        failed[group] = 1;
      }
      gemm_engine::tile_barrier<kThreads>();  // thread 0's acquire, then everyone's loads
      if (failed[group]) return;
      const Vector* tile = reinterpret_cast<const Vector*>(t.heaps[t.local_rank] + p.landing +
                                                           landing_offset(plan, m_idx, n_idx, sizeof(Element)));
      const int64_t tile_row0 = static_cast<int64_t>(m_idx) * kTileM;
      const int64_t rows = plan.rows.m() - tile_row0;
      const int32_t col0 = n_idx * kTileN;
      const int32_t cols = p.n - col0;
      Element* dst0 = out + tile_row0 * p.ldo + col0;
      constexpr int kChunk = 64;  // values per round of loads: 8 vectors in flight
      CUTE_UNROLL
      for (int c = 0; c < kValues; c += kChunk) {
        Vector v[kChunk / 8];  // all loads first
        CUTE_UNROLL
        for (int j = 0; j < kChunk; j += 8) {
          *reinterpret_cast<uint4*>(&v[j / 8]) = __ldcg(
              reinterpret_cast<const uint4*>(tile + Epilogue::template fragment_index<kThreads, 8>(c + j, thread)));
        }
        CUTE_UNROLL
        for (int j = 0; j < kChunk; j += 2) {  // values c + j and c + j + 1: columns k and k + 1 of one row
          const int row = get<0>(tile_coords(c + j));
          const int col = get<1>(tile_coords(c + j));
          if (row >= rows || col >= cols) continue;
          Element* dst = dst0 + row * p.ldo + col;
          if (col + 1 < cols) {  // col is even and out's rows 16-byte aligned: a 4-byte pair
            cutlass::AlignedArray<Element, 2> pair;
            pair[0] = v[j / 8][j % 8];
            pair[1] = v[j / 8][j % 8 + 1];
            *reinterpret_cast<cutlass::AlignedArray<Element, 2>*>(dst) = pair;
          } else {
            dst[0] = v[j / 8][j % 8];
          }
        }
      }
      // Every thread has read failed[group] before thread 0 may set it for the next tile.
      gemm_engine::tile_barrier<kThreads>();
    }
  }
};

}  // namespace interlace
