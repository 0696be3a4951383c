// The Hopper attention forward (softmax(Q K^T * scale) V, with the log-sum-exp) that ring attention
// computes its blocks with: TMA and wgmma, warp-specialized, online softmax.
//
// attention_tiles runs a CTA's query tiles (128 rows of one head each), one after another as a Source
// hands them out (the plain kernel's: one; ring attention's: a work queue), each against the key
// segments a Schedule names, in order: contiguous key rows of the CTA's own K/V or of a receive slot
// (ring attention's blocks from other ranks), each full or on the causal diagonal. The plain kernel
// (sm90_attention_kernel) has one segment: all keys. Roles:
//   Producer  (warpgroup 0, one thread): takes the tiles; TMA loads of each one's Q (two 64-row
//             halves, one per consumer, each behind its own barrier) and of K and V tiles of kTileK
//             keys into a double-buffered ring (two pipelines, so a consumer waits for V only when it
//             needs it), which runs on from one query tile to the next;
//   Waiter    (warpgroup 0, warp 1, one thread; only for a Schedule whose keys arrive while the
//             kernel runs, kWaits: ring attention's): waits for each key tile's keys and tells the
//             producer through keys_ready[stage] (wait_for_keys);
//   Consumers (warpgroups 1, 2): 64 query rows each. Per key tile j: S = Q K_j^T (wgmma, both
//             operands in shared memory), the online softmax on S in registers, then O += P V_j with P
//             from registers (the accumulator's layout is the A operand's, so no shuffle). The next
//             tile's S is issued before waiting for this tile's PV, so the tensor cores work on one
//             while the warpgroup runs the other's exponentials; and the two consumers take turns at
//             issuing (two named barriers), so that one's softmax runs under the other's matmuls.
// Within a segment key tiles are visited from the last to the first: the ones that need a mask (the
// ragged last tile, the causal diagonal) come first, and the rest run without one. Under the causal
// mask the plain kernel's grid starts at the last query tiles, which have the most keys to visit.
//
// Rows past a segment or past the tile's queries are TMA's zeros or other rows, which must hold finite
// values (0 x NaN in P V is NaN): keys are masked to -inf, queries not stored. A row with no visible
// key gets O = 0 and lse = -inf.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/pipeline/pipeline.hpp"

namespace interlace::attention_engine {

// A tile of queries: rows [row0, row0 + min(valid, 128)) of one (batch, head); offset0 is row0's
// offset within its part of the sequence (ring attention's zigzag half `part`; 0 for the plain
// kernel), which the causal mask compares key offsets against. valid == 0: no tile (a Source's end).
struct QueryTile {
  int32_t batch, head, row0, valid, offset0, part;
};

// kTileK_: keys per tile. 192 at D = 128 gives each softmax and turn more matmul to hide under than
// 128 (without the mask 0.91 -> 1.00x of cuDNN at S = 8192; with it, where the diagonal then spans up
// to two masked tiles, 6-8% faster: bench/results/NOTES.md); two stages of K and V still fit in
// shared memory, with 3 KB to spare. Ring attention takes the same tiles.
template <class Element_, int kHeadDim_, int kTileK_ = 128>
struct Config {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumers = 2;  // warpgroups of 64 query rows
  static constexpr int kTileQ = 64 * kConsumers;
  static constexpr int kTileK = kTileK_;
  static_assert(kTileK % 16 == 0 && kTileK <= 256, "a key tile is the QK wgmma's N and the PV wgmma's K");
  static constexpr int kStages = 2;
  static constexpr int kThreads = cutlass::NumThreadsPerWarpGroup * (1 + kConsumers);
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  using HeadDim = cute::Int<kHeadDim>;
  using TileK = cute::Int<kTileK>;
  // Per consumer: S[64, kTileK] = Q[64, D] K[kTileK, D]^T, both K-major in shared memory.
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, TileK, HeadDim>>()));
  // O[64, D] += P[64, kTileK] V[kTileK, D]: P from registers, V in shared memory with D contiguous
  // (the B operand, (N = D, K = keys), is MN-major).
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, HeadDim, TileK>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>()));
  using SmemLayoutQ = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                                   cute::Shape<cute::_64, HeadDim, cute::Int<kConsumers>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                                   cute::Shape<TileK, HeadDim, cute::Int<kStages>>{}));
  // V's atoms (64 of D by 8 keys) go along the keys first, so that the keys of a 64-wide D stripe are
  // evenly spaced and TMA loads a stripe in one box; atoms along D first cut it into boxes of 8 keys
  // (48 loads per 192-key tile, each a producer instruction stream of its own).
  using SmemLayoutV = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<Element>{},
                                                   cute::Shape<HeadDim, TileK, cute::Int<kStages>>{},
                                                   cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  static constexpr uint32_t kQHalfBytes = 64 * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVTileBytes = kTileK * kHeadDim * sizeof(Element);

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    cutlass::arch::ClusterTransactionBarrier::ValueType q_full[kConsumers];
    cutlass::arch::ClusterBarrier::ValueType q_empty;  // both consumers are done with the tile's Q
    QueryTile work;  // the tile q_full announces: from the producer to the consumers
    // A schedule that waits (kWaits): the waiter warp's word to the producer that stage s's keys
    // may be loaded (attention_tiles).
    cutlass::arch::ClusterBarrier::ValueType keys_ready[kStages];
    // The waiter's walk (wait_for_keys), kept here rather than in its 24 registers, which the
    // bounded wait needs; and its barriers' shared addresses, which the CTA's first thread sets
    // before the roles part (a register holding them into the waiter's loop was spilled).
    alignas(16) char waiter_walk[128];
    uint32_t waiter_work_full, waiter_work_empty, waiter_empty, waiter_ready;
    // A persistent Source's next tile, from the producer to the waiter as soon as the producer takes
    // it: the waiter then walks its keys while the consumers finish the tile before, so that its
    // first key tile loads beside its Q rather than after Q lands.
    QueryTile waiter_work;
    cutlass::arch::ClusterBarrier::ValueType work_full, work_empty;
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "more shared memory than an SM gives a CTA");

  // Global tensors as TMA sees them: Q and K as (rows, D, heads, batch, slots) with D contiguous; V
  // as (D, rows, heads, batch, slots), the transposed view its MN-major tiles are cut from. Slots:
  // ring attention's receive buffer holds a block per step; the inputs are one slot.
  using GmemShapeRows = cute::Shape<int32_t, HeadDim, int32_t, int32_t, int32_t>;
  using GmemStrideRows = cute::Stride<int64_t, cute::_1, int64_t, int64_t, int64_t>;
  using GmemShapeCols = cute::Shape<HeadDim, int32_t, int32_t, int32_t, int32_t>;
  using GmemStrideCols = cute::Stride<cute::_1, int64_t, int64_t, int64_t, int64_t>;
  using TmaQ = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, cute::make_tensor(cute::make_gmem_ptr<const Element>(nullptr), GmemShapeRows{}, GmemStrideRows{}),
      SmemLayoutQ{}(cute::_, cute::_, cute::_0{})));
  using TmaK = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, cute::make_tensor(cute::make_gmem_ptr<const Element>(nullptr), GmemShapeRows{}, GmemStrideRows{}),
      SmemLayoutK{}(cute::_, cute::_, cute::_0{})));
  using TmaV = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, cute::make_tensor(cute::make_gmem_ptr<const Element>(nullptr), GmemShapeCols{}, GmemStrideCols{}),
      SmemLayoutV{}(cute::_, cute::_, cute::_0{})));

  // Descriptors over a dense [batch, rows, heads, D] tensor, or `slots` of them slot_stride elements
  // apart (0: back to back).
  static TmaQ tma_q(const Element* p, int64_t batch, int64_t rows, int64_t heads) {
    return cute::make_tma_copy(cute::SM90_TMA_LOAD{}, rows_view(p, batch, rows, heads, 1, 0),
                               SmemLayoutQ{}(cute::_, cute::_, cute::_0{}));
  }
  static TmaK tma_k(const Element* p, int64_t batch, int64_t rows, int64_t heads, int64_t slots, int64_t slot_stride = 0) {
    return cute::make_tma_copy(cute::SM90_TMA_LOAD{}, rows_view(p, batch, rows, heads, slots, slot_stride),
                               SmemLayoutK{}(cute::_, cute::_, cute::_0{}));
  }
  static TmaV tma_v(const Element* p, int64_t batch, int64_t rows, int64_t heads, int64_t slots, int64_t slot_stride = 0) {
    using namespace cute;
    const int64_t tensor = batch * rows * heads * kHeadDim;
    auto view = make_tensor(make_gmem_ptr(p), GmemShapeCols(HeadDim{}, as_dim(rows), as_dim(heads), as_dim(batch), as_dim(slots)),
                            GmemStrideCols(_1{}, heads * kHeadDim, int64_t{kHeadDim}, rows * heads * kHeadDim,
                                           slot_stride > 0 ? slot_stride : tensor));
    return make_tma_copy(SM90_TMA_LOAD{}, view, SmemLayoutV{}(_, _, _0{}));
  }
  // TMA needs every dimension positive; an empty one is never read.
  static int32_t as_dim(int64_t n) { return static_cast<int32_t>(n > 0 ? n : 1); }
  static auto rows_view(const Element* p, int64_t batch, int64_t rows, int64_t heads, int64_t slots, int64_t slot_stride) {
    using namespace cute;
    const int64_t tensor = batch * rows * heads * kHeadDim;
    return make_tensor(make_gmem_ptr(p), GmemShapeRows(as_dim(rows), HeadDim{}, as_dim(heads), as_dim(batch), as_dim(slots)),
                       GmemStrideRows(heads * kHeadDim, _1{}, int64_t{kHeadDim}, rows * heads * kHeadDim,
                                      slot_stride > 0 ? slot_stride : tensor));
  }
};

// What every CTA needs, whatever its schedule. K and V come from the inputs (tma_k, tma_v: one
// slot of rows_k rows) or from ring attention's receive slots (tma_k_recv, tma_v_recv: slots of
// rows_recv rows; the plain kernel points them at the inputs).
template <class Config>
struct Params {
  typename Config::TmaQ tma_q;
  typename Config::TmaK tma_k, tma_k_recv;
  typename Config::TmaV tma_v, tma_v_recv;
  typename Config::Element* out;  // [B, rows_q, Hq, D], contiguous
  float* lse;                     // [B, Hq, rows_q], or null
  int32_t batch, rows_q, rows_k, rows_recv, slots, heads_q, heads_kv;
  float scale_log2;  // softmax scale * log2(e): the exponentials are exp2
  float scale;
};

// Contiguous key rows [row0, row0 + rows) of the inputs (slot < 0) or of receive slot `slot`. On the
// causal diagonal (the keys' offsets and the queries' within the same stretch of the sequence), key
// offset k is visible to query offset q iff k <= q. step: which ring step the keys belong to.
struct KeySegment {
  int32_t slot, row0, rows, diagonal, step;
};

// The plain kernel's schedule: every key of the inputs, the causal diagonal when asked.
struct DenseSchedule {
  static constexpr bool kWaits = false;  // its keys are there from the start: no waiter warp, no wait_keys
  int32_t rows_k;
  int32_t causal;
  __device__ int segments() const { return 1; }
  __device__ KeySegment segment(int, const QueryTile&) const { return KeySegment{-1, 0, rows_k, causal, 0}; }
};

// A Source of one tile, the CTA's, known to every thread (kOneTile), so that attention_tiles compiles
// to a single pass with no hand-over: the loop around the mainloop cost the plain kernel 2-7% under
// the causal mask and at D = 64 (bench/results/NOTES.md, fourteenth session).
template <class Schedule>
struct OneTile {
  static constexpr bool kOneTile = true;
  QueryTile tile;
  Schedule keys;
  __device__ QueryTile next() const { return tile; }
  __device__ Schedule schedule(const QueryTile&) const { return keys; }
};

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to the 16-bit type, as one register (the lower address first).
template <class Element>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(v);
  }
}

// Named barriers 0 .. kTurnBarrier - 1 are left to __syncthreads and CUTLASS; the consumers' turns
// use kTurnBarrier and kTurnBarrier + 1, each between the two consumer warpgroups (256 threads).
constexpr int kTurnBarrier = 8;
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(2 * cutlass::NumThreadsPerWarpGroup) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(2 * cutlass::NumThreadsPerWarpGroup) : "memory");
}

// A consumer thread's view of a 64 x N wgmma accumulator: value (e, i, n) of its fragment, flat index
// e + 2 i + 4 n, holds row warp * 16 + i * 8 + lane / 4 and column n * 8 + 2 (lane % 4) + e.
struct AccCoords {
  int row0;  // the row of i = 0, within the warpgroup's 64
  int col0;  // the column of n = 0, e = 0
  __device__ explicit AccCoords(int thread) : row0((thread / 32) * 16 + (thread % 32) / 4), col0(2 * (thread % 4)) {}
};

// The softmax state of the two rows a thread holds (i = 0, 1). Row maxima are of the raw scores, in
// the scores' units; sums are this thread's share, summed over the quad of threads that share a row
// at the end.
struct RowState {
  float max[2] = {-INFINITY, -INFINITY};
  float sum[2] = {0.f, 0.f};
};

// Turns the scores in `s` into unnormalised probabilities in place, updates `state`, and returns in
// `rescale` what the rows' earlier output must be multiplied by.
template <int kN, class Tensor>
__device__ __forceinline__ void online_softmax(Tensor& s, RowState& state, float scale_log2, float (&rescale)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float m = state.max[i];
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) m = fmaxf(m, fmaxf(s(4 * n + 2 * i), s(4 * n + 2 * i + 1)));
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
    // Every key masked so far: keep the shift at 0 so that exp2(-inf - 0) = 0 and no inf - inf.
    const float shift = m == -INFINITY ? 0.f : m * scale_log2;
    rescale[i] = exp2_approx(state.max[i] * scale_log2 - shift);
    state.max[i] = m;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2_approx(fmaf(s(4 * n + 2 * i + e), scale_log2, -shift));
        s(4 * n + 2 * i + e) = p;
        sum += p;
      }
    }
    state.sum[i] = state.sum[i] * rescale[i] + sum;
  }
}


// The key tiles a CTA visits in a segment: all of them, or on the diagonal those that start at or
// before its last query.
template <int kTileQ, int kTileK>
__device__ __forceinline__ int key_tiles(const KeySegment& seg, const QueryTile& tile) {
  int n = (seg.rows + kTileK - 1) / kTileK;
  if (seg.diagonal) n = min(n, (tile.offset0 + min(tile.valid, kTileQ) - 1) / kTileK + 1);
  return max(n, 0);
}

// Walks a CTA's key tiles in the order every role visits them: segments in order, tiles from last
// to first within each.
template <class Config, class Schedule>
struct TileCursor {
  Schedule& schedule;
  const QueryTile& tile;
  int g = -1, j = 0;
  KeySegment seg{};
  __device__ TileCursor(Schedule& s, const QueryTile& t) : schedule(s), tile(t) {}
  __device__ bool advance() {
    if (j > 0) {
      --j;
      return true;
    }
    while (++g < schedule.segments()) {
      seg = schedule.segment(g, tile);
      const int n = key_tiles<Config::kTileQ, Config::kTileK>(seg, tile);
      if (n > 0) {
        j = n - 1;
        return true;
      }
    }
    return false;
  }
};

// An mbarrier's wait and arrival by its 32-bit shared address, for the waiter below: it keeps its
// barriers' addresses in shared memory, since a register holding the CTA's shared base across its
// loop was spilled (ptxas keeps it from the kernel's start, past setmaxnreg).
// The wait suspends the thread (up to the time hint, 10 ms, as CUTLASS's) rather than spinning: the
// waiter shares its SM sub-partition with consumer warps.
__device__ __forceinline__ void mbarrier_wait(uint32_t barrier, uint32_t parity) {
  constexpr uint32_t kSuspendNs = 10000000;
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "wait_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n\t"
      "@!done bra wait_%=;\n}" ::"r"(barrier),
      "r"(parity), "r"(kSuspendNs)
      : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(barrier) : "memory");
}

// The waiter warp of a schedule that waits (one thread; attention_tiles): for each key tile the producer
// will load, in the same order, waits for the keys (Schedule::wait_keys, over the whole box TMA
// reads), then until the producer's stage is free (the K pipeline's empty barrier, at the producer's
// phase), then raises keys_ready[stage]. It learns each tile from the producer as soon as it is taken
// (shared.waiter_work behind work_full; only a queue's tiles wait, never a OneTile Source's), so its
// walk reaches the tile's first keys while the consumers finish the last. It runs on the
// producer warpgroup's registers (24 beside 192-key tiles), most of which the bounded wait inside
// wait_keys takes: so the walk lives in shared memory, and the schedule, which only refers to
// kernel parameters, is made afresh from it at each key tile rather than kept.
template <class Config, class Source>
__device__ __forceinline__ void wait_for_keys(const Params<Config>& p, Source& source,
                                              typename Config::SharedStorage& shared) {
  using Pipeline = typename Config::Pipeline;
  using Schedule = decltype(source.schedule(QueryTile{}));
  static_assert(!Source::kOneTile, "the waiter learns its tiles from the producer's hand-off");
  constexpr int kTileK = Config::kTileK;
  constexpr uint32_t kBarrierBytes = 8;  // an mbarrier; a stage's barriers are consecutive
  static_assert(sizeof(shared.keys_ready[0]) == kBarrierBytes &&
                    sizeof(shared.pipeline_k.empty_barrier_[0]) == kBarrierBytes,
                "the waiter steps through its barrier arrays kBarrierBytes at a time");
  struct Walk {
    QueryTile tile;
    KeySegment seg;
    int g, j;
    int seen;  // Schedule::wait_keys' memory of what it last saw land
    int n;     // the tiles taken so far
    typename Pipeline::PipelineState stage;  // the producer's: the stage its next key tile fills
  };
  static_assert(sizeof(Walk) <= sizeof(shared.waiter_walk), "the waiter's walk outgrew its shared memory");
  Walk& w = *reinterpret_cast<Walk*>(shared.waiter_walk);
  w.stage = cutlass::make_producer_start_state<Pipeline>();
  for (w.n = 0;; ++w.n) {
    mbarrier_wait(shared.waiter_work_full, w.n & 1);
    w.tile = shared.waiter_work;
    mbarrier_arrive(shared.waiter_work_empty);
    if (w.tile.valid == 0) return;
    w.g = -1;
    w.j = 0;
    w.seen = -1;
    for (;;) {
      Schedule schedule = source.schedule(w.tile);
      TileCursor<Config, Schedule> cur(schedule, w.tile);
      cur.g = w.g;
      cur.j = w.j;
      cur.seg = w.seg;
      if (!cur.advance()) break;
      w.g = cur.g;
      w.j = cur.j;
      w.seg = cur.seg;
      // The keys first, while the consumers still work on the stage; then, once they free it, the
      // word to the producer (a stage's keys_ready may only run one phase ahead of its loads).
      const int lo = w.seg.row0 + w.j * kTileK;
      w.seen = schedule.wait_keys(w.seg, w.tile.batch, w.tile.head / (p.heads_q / p.heads_kv), lo, lo + kTileK, w.seen);
      mbarrier_wait(shared.waiter_empty + kBarrierBytes * w.stage.index(), w.stage.phase());
      mbarrier_arrive(shared.waiter_ready + kBarrierBytes * w.stage.index());
      ++w.stage;
    }
  }
}

// A CTA's query tiles, one after another as its Source hands them out, each against the keys of the
// Source's schedule for it; every thread of the CTA calls it, and all return. A Source has
//   QueryTile next()                    the producer thread's: the CTA's next tile; valid == 0: none left
//   Schedule schedule(const QueryTile&) the tile's keys (any thread)
//   kOneTile                            true: next() is the CTA's only tile, the same in every thread
// The producer takes tile n + 1 while the consumers still work on tile n, prefetches its Q to L2 and
// loads it as soon as both consumers are done with tile n's (q_empty), so that a tile's start hides
// under the last one's end. The tile itself travels to the consumers through shared memory, behind
// q_full (and to the waiter, below, at once, behind work_full).
// A schedule that waits for its keys (kWaits: ring attention's, on flags other GPUs raise) does so in
// a second warp of the producer warpgroup, the waiter: it walks the same key tiles as the producer,
// waits for each (and for the producer's stage to be free, so that it never runs a round ahead),
// then arrives on keys_ready[stage], which the producer waits on before loading the stage. Neither
// warp then holds both the walk's TMA state and a bounded wait's, so both fit the producer's
// registers. The split must fit what the launch gave the CTA, or the consumers' setmaxnreg.inc
// waits forever for registers nobody frees.
template <class Config, class Source, int kProducerRegisters = Config::kProducerRegisters,
          int kConsumerRegisters = Config::kConsumerRegisters>
__device__ __forceinline__ void attention_tiles(const Params<Config>& p, Source& source,
                                                typename Config::SharedStorage& shared) {
  using namespace cute;
  using Element = typename Config::Element;
  using Pipeline = typename Config::Pipeline;
  using Schedule = decltype(source.schedule(QueryTile{}));
  using HeadDim = typename Config::HeadDim;
  using TileK = typename Config::TileK;
  constexpr int kTileK = Config::kTileK;
  constexpr int kLaunchRegisters = 65536 / Config::kThreads / 8 * 8;  // per thread, at one CTA per SM
  static_assert(cutlass::NumThreadsPerWarpGroup * (kProducerRegisters + Config::kConsumers * kConsumerRegisters) <=
                    kLaunchRegisters * Config::kThreads,
                "the register split exceeds the launch's: setmaxnreg.inc would never return");
  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warp_group = cutlass::canonical_warp_group_idx();

  typename Pipeline::Params pipeline_params;
  pipeline_params.role = warp_group == 0 ? (warp_idx == 0 ? Pipeline::ThreadCategory::Producer
                                                          : Pipeline::ThreadCategory::NonParticipant)
                                         : Pipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x % cutlass::NumThreadsPerWarpGroup == 0;
  pipeline_params.num_consumers = Config::kConsumers * cutlass::NumThreadsPerWarpGroup;
  pipeline_params.transaction_bytes = Config::kKVTileBytes;
  Pipeline pipeline_k(shared.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  Pipeline pipeline_v(shared.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  if (threadIdx.x == 0) {
    for (int c = 0; c < Config::kConsumers; ++c) cutlass::arch::ClusterTransactionBarrier::init(&shared.q_full[c], 1);
    cutlass::arch::ClusterBarrier::init(&shared.q_empty, Config::kConsumers * cutlass::NumThreadsPerWarpGroup);
    for (int s = 0; s < Config::kStages; ++s) cutlass::arch::ClusterBarrier::init(&shared.keys_ready[s], 1);
    if constexpr (Schedule::kWaits) {
      cutlass::arch::ClusterBarrier::init(&shared.work_full, 1);
      cutlass::arch::ClusterBarrier::init(&shared.work_empty, 1);
      shared.waiter_work_full = cute::cast_smem_ptr_to_uint(&shared.work_full);
      shared.waiter_work_empty = cute::cast_smem_ptr_to_uint(&shared.work_empty);
      shared.waiter_empty = cute::cast_smem_ptr_to_uint(&shared.pipeline_k.empty_barrier_[0]);
      shared.waiter_ready = cute::cast_smem_ptr_to_uint(&shared.keys_ready[0]);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Config::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Config::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Config::SmemLayoutV{});

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if constexpr (Schedule::kWaits) {
      if (warp_idx == 1) {
        if (cute::elect_one_sync()) wait_for_keys<Config>(p, source, shared);
        return;
      }
    }
    if (warp_idx != 0 || !cute::elect_one_sync()) return;
    auto state = cutlass::make_producer_start_state<Pipeline>();
    // Q's two 64-row halves of a tile, as TMA reads them and where they land.
    auto q_halves = [&](const QueryTile& t) {
      Tensor mQ = p.tma_q.get_tma_tensor(make_shape(p.rows_q, HeadDim{}, p.heads_q, p.batch, 1));
      Tensor gQ = local_tile(domain_offset(make_coord(t.row0, 0), mQ(_, _, t.head, t.batch, 0)),
                             Shape<_64, HeadDim>{}, make_coord(_, 0));  // (64, D, halves)
      return tma_partition(p.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    };
    for (int n = 0;; ++n) {
      const QueryTile tile = source.next();
      if constexpr (!Source::kOneTile) {
        // The tile is known some key tiles before the consumers free Q: the waiter learns it now,
        // and Q heads for L2, so that Q and the first keys load together, and from L2, once Q is free.
        if constexpr (Schedule::kWaits) {
          // Hardly ever waits: the waiter read tile n - 1 before it raised keys_ready for its keys,
          // which this thread has waited on (and with no keys, it had only tile n - 2's walk to end).
          if (n > 0) cutlass::arch::ClusterBarrier::wait(&shared.work_empty, (n - 1) & 1);
          asm volatile("" ::: "memory");
          shared.waiter_work = tile;
          asm volatile("" ::: "memory");
          cutlass::arch::ClusterBarrier::arrive(&shared.work_full);
        }
        if (n > 0 && tile.valid != 0) {  // the first tile's Q loads at once
          auto halves = q_halves(tile);
          for (int c = 0; c < Config::kConsumers; ++c) prefetch(p.tma_q, get<0>(halves)(_, c));
        }
        // Both consumers are done with tile n - 1's Q, and have read it from shared memory.
        if (n > 0) cutlass::arch::ClusterBarrier::wait(&shared.q_empty, (n - 1) & 1);
        asm volatile("" ::: "memory");  // the wait (asm without a memory clobber) before the store
        shared.work = tile;
        asm volatile("" ::: "memory");  // the store above before the arrivals below (which release it)
        if (tile.valid == 0) {
          for (int c = 0; c < Config::kConsumers; ++c) cutlass::arch::ClusterBarrier::arrive(&shared.q_full[c]);
          return;
        }
      }
      // Query heads per K/V head, worked out here rather than before the roles part: a value kept
      // across the producer's setmaxnreg.dec to 24 registers would be spilled.
      const int head_kv = tile.head / (p.heads_q / p.heads_kv);
      auto [tQgQ, tQsQ] = q_halves(tile);
      for (int c = 0; c < Config::kConsumers; ++c) {
        auto& full = *reinterpret_cast<cutlass::arch::ClusterTransactionBarrier*>(&shared.q_full[c]);
        full.arrive_and_expect_tx(Config::kQHalfBytes);
        copy(p.tma_q.with(shared.q_full[c]), tQgQ(_, c), tQsQ(_, c));
      }
      Schedule schedule = source.schedule(tile);
      // K and V tiles of one segment, from the inputs or a receive slot.
      // Leaves `cur` at the next segment's first tile; `more` false at the end.
      auto load_segment = [&](const auto& tma_k, const auto& tma_v, int rows, int slots, int slot,
                              TileCursor<Config, Schedule>& cur, bool& more) {
        Tensor mK = tma_k.get_tma_tensor(make_shape(rows, HeadDim{}, p.heads_kv, p.batch, slots));
        Tensor mV = tma_v.get_tma_tensor(make_shape(HeadDim{}, rows, p.heads_kv, p.batch, slots));
        Tensor gK = local_tile(domain_offset(make_coord(cur.seg.row0, 0), mK(_, _, head_kv, tile.batch, slot)),
                               Shape<TileK, HeadDim>{}, make_coord(_, 0));  // (keys, D, j)
        Tensor gV = local_tile(domain_offset(make_coord(0, cur.seg.row0), mV(_, _, head_kv, tile.batch, slot)),
                               Shape<HeadDim, TileK>{}, make_coord(0, _));  // (D, keys, j)
        auto [tKgK, tKsK] = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        auto [tVgV, tVsV] = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
        const int g = cur.g;
        do {
          if constexpr (Schedule::kWaits) {
            // The waiter saw the keys land; TMA (the async proxy) must see what they wrote.
            cutlass::arch::ClusterBarrier::wait(&shared.keys_ready[state.index()], state.phase() ^ 1);
            asm volatile("fence.proxy.async.global;" ::: "memory");
          }
          pipeline_k.producer_acquire(state);
          copy(tma_k.with(*pipeline_k.producer_get_barrier(state)), tKgK(_, cur.j), tKsK(_, state.index()));
          pipeline_v.producer_acquire(state);
          copy(tma_v.with(*pipeline_v.producer_get_barrier(state)), tVgV(_, cur.j), tVsV(_, state.index()));
          ++state;
        } while ((more = cur.advance()) && cur.g == g);
      };
      TileCursor<Config, Schedule> cur(schedule, tile);
      bool more = cur.advance();
      while (more) {
        if (cur.seg.slot < 0) {
          load_segment(p.tma_k, p.tma_v, p.rows_k, 1, 0, cur, more);
        } else {
          load_segment(p.tma_k_recv, p.tma_v_recv, p.rows_recv, p.slots, cur.seg.slot, cur, more);
        }
      }
      if constexpr (Source::kOneTile) return;
    }
  }

  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  const int consumer = warp_group - 1;
  const int thread = threadIdx.x % cutlass::NumThreadsPerWarpGroup;
  typename Config::TiledMmaQK mma_qk;
  typename Config::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(thread);
  auto thr_pv = mma_pv.get_thread_slice(thread);
  Tensor tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ(_, _, consumer)));  // (MMA, 1, D / 16)
  Tensor tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK));                  // (MMA, 1, D / 16, stage)
  Tensor tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV));                  // (MMA, 1, keys / 16, stage)
  Tensor acc_s = partition_fragment_C(mma_qk, Shape<_64, TileK>{});
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<_64, HeadDim>{});
  // P as the PV wgmma's A operand: for 16-bit types its register fragment ((2, 2, 2), 1, keys / 16)
  // holds, in order, the accumulator's values (e, i, n = 2 k + h) (see AccCoords): a plain copy.
  Tensor tOrP = make_tensor<Element>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kTileK / 16>>>{});
  static_assert(decltype(size(tOrP))::value == decltype(size(acc_s))::value);
  static_assert(decltype(size(acc_s))::value == kTileK / 2 && decltype(size(acc_o))::value == Config::kHeadDim / 2);

  const AccCoords coords(thread);
  int q_first = 0;  // the warpgroup's first query of the current tile, as an offset
  float rescale[2];

  auto issue_qk = [&](int stage) {
    warpgroup_fence_operand(acc_s);
    warpgroup_arrive();
    mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
    CUTLASS_PRAGMA_UNROLL
    for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
      cute::gemm(mma_qk, tSrQ(_, _, kb), tSrK(_, _, kb, stage), acc_s);
      mma_qk.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };
  auto issue_pv = [&](int stage) {
    warpgroup_fence_operand(acc_o);
    warpgroup_fence_operand(tOrP);
    warpgroup_arrive();
    mma_pv.accumulate_ = GMMA::ScaleOut::One;
    CUTLASS_PRAGMA_UNROLL
    for (int kb = 0; kb < size<2>(tOrP); ++kb) cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb, stage), acc_o);
    warpgroup_commit_batch();
  };
  // Keys past the segment, and on the diagonal keys after the query, score -inf.
  auto mask = [&](const KeySegment& seg, int j) {
    const bool ragged = (j + 1) * kTileK > seg.rows;
    const bool diagonal = seg.diagonal && (j + 1) * kTileK - 1 > q_first;
    if (!ragged && !diagonal) return;
    const int key0 = j * kTileK + coords.col0;
    CUTLASS_PRAGMA_UNROLL
    for (int n = 0; n < kTileK / 8; ++n) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int query = q_first + coords.row0 + 8 * i;
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * n + e;
          if (key >= seg.rows || (seg.diagonal && key > query)) acc_s(4 * n + 2 * i + e) = -INFINITY;
        }
      }
    }
  };
  auto to_p = [&]() {
    Tensor pairs = recast<uint32_t>(tOrP);
    CUTLASS_PRAGMA_UNROLL
    for (int x = 0; x < size(pairs); ++x) pairs(x) = pack<Element>(acc_s(2 * x), acc_s(2 * x + 1));
  };
  auto rescale_o = [&]() {
    warpgroup_fence_operand(acc_o);
    CUTLASS_PRAGMA_UNROLL
    for (int x = 0; x < size(acc_o); ++x) acc_o(x) *= rescale[(x / 2) % 2];
  };

  // The consumers take turns at issuing their wgmmas (named barriers kTurnBarrier + consumer), so that
  // one's softmax runs while the other's matmuls keep the tensor cores busy. Consumer 0 goes first in
  // every tile; every issuing step hands the turn over, except consumer 1's last, so that no arrival
  // is left pending at a tile's end.
  auto take_turn = [&]() { named_barrier_sync(kTurnBarrier + consumer); };
  auto pass_turn = [&](bool last) {
    if (!last || consumer == 0) named_barrier_arrive(kTurnBarrier + (consumer ^ 1));
  };

  typename Pipeline::PipelineState k_state, v_state;  // both run on across tiles, as the producer's
  for (int n = 0;; ++n) {
    cutlass::arch::ClusterTransactionBarrier::wait(&shared.q_full[consumer], n & 1);
    asm volatile("" ::: "memory");  // read the tile after the wait that acquires it
    const QueryTile tile = Source::kOneTile ? source.next() : shared.work;
    if (tile.valid == 0) return;
    Schedule schedule = source.schedule(tile);
    q_first = tile.offset0 + consumer * 64;
    RowState rows;
    clear(acc_o);
    TileCursor<Config, Schedule> cur(schedule, tile);
    if (cur.advance()) {
      if (consumer == 1) named_barrier_arrive(kTurnBarrier);
      // The first tile: S, softmax, and P ready for its PV.
      pipeline_k.consumer_wait(k_state);
      take_turn();
      issue_qk(k_state.index());
      pass_turn(false);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      pipeline_k.consumer_release(k_state);
      ++k_state;
      mask(cur.seg, cur.j);
      online_softmax<kTileK>(acc_s, rows, p.scale_log2, rescale);
      to_p();
      while (cur.advance()) {
        // S of this tile and PV of the previous one in flight together; O takes the rescale of the
        // previous tile's softmax while S runs.
        pipeline_k.consumer_wait(k_state);
        take_turn();
        issue_qk(k_state.index());
        rescale_o();
        pipeline_v.consumer_wait(v_state);
        issue_pv(v_state.index());
        pass_turn(false);
        warpgroup_wait<1>();  // S done (wgmma batches complete in order)
        warpgroup_fence_operand(acc_s);
        pipeline_k.consumer_release(k_state);
        ++k_state;
        mask(cur.seg, cur.j);
        online_softmax<kTileK>(acc_s, rows, p.scale_log2, rescale);
        warpgroup_wait<0>();  // PV done: P may be overwritten
        warpgroup_fence_operand(acc_o);
        pipeline_v.consumer_release(v_state);
        ++v_state;
        to_p();
      }
      if constexpr (!Source::kOneTile) {
        cutlass::arch::ClusterBarrier::arrive(&shared.q_empty);  // every S of the tile is done: Q is free
      }
      rescale_o();
      pipeline_v.consumer_wait(v_state);
      take_turn();
      issue_pv(v_state.index());
      pass_turn(true);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      pipeline_v.consumer_release(v_state);
      ++v_state;  // the next tile's first V is the next stage (a CTA of one tile never needed this)
    } else if constexpr (!Source::kOneTile) {
      asm volatile("" ::: "memory");  // the tile read before the arrival that frees it
      cutlass::arch::ClusterBarrier::arrive(&shared.q_empty);
    }

    // Epilogue: O / l in the input dtype, element pairs straight from registers; lse = max * scale + ln l.
    const int valid = min(tile.valid, Config::kTileQ);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 2; ++i) {
      float l = rows.sum[i];
      l += __shfl_xor_sync(0xffffffff, l, 1);
      l += __shfl_xor_sync(0xffffffff, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int r = consumer * 64 + coords.row0 + 8 * i;  // within the tile
      if (r >= valid) continue;
      const int64_t row = tile.row0 + r;
      Element* out = p.out + ((static_cast<int64_t>(tile.batch) * p.rows_q + row) * p.heads_q + tile.head) * Config::kHeadDim +
                     coords.col0;
      CUTLASS_PRAGMA_UNROLL
      for (int n = 0; n < Config::kHeadDim / 8; ++n) {
        *reinterpret_cast<uint32_t*>(out + 8 * n) = pack<Element>(acc_o(4 * n + 2 * i) * inv, acc_o(4 * n + 2 * i + 1) * inv);
      }
      if (p.lse != nullptr && coords.col0 == 0) {
        p.lse[(static_cast<int64_t>(tile.batch) * p.heads_q + tile.head) * p.rows_q + row] =
            l > 0.f ? rows.max[i] * p.scale + __logf(l) : -INFINITY;
      }
    }
    if constexpr (Source::kOneTile) return;
  }
}

// The plain kernel: a CTA per (query tile, head, batch); under the causal mask the last query tiles,
// which see the most keys, start first.
template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1) sm90_attention_kernel(const __grid_constant__ Params<Config> p,
                                                                             int32_t causal) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem[];
  auto& shared = *reinterpret_cast<typename Config::SharedStorage*>(smem);
  const int q_tile = causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int row0 = q_tile * Config::kTileQ;
  OneTile<DenseSchedule> source{
      QueryTile{static_cast<int32_t>(blockIdx.z), static_cast<int32_t>(blockIdx.y), row0, p.rows_q - row0, row0, 0},
      DenseSchedule{p.rows_k, causal}};
  attention_tiles<Config>(p, source, shared);
#elif defined(__CUDA_ARCH__)
  // Compiled for a GPU without sm_90a's wgmma and TMA: stop with an error rather than leave out unwritten.
  __trap();
#endif
}

}  // namespace interlace::attention_engine
