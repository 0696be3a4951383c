// The persistent, warp-specialized Hopper GEMM every fused op drives: C[M, N] = A[M, K] @ B[K, N].
//
// One CTA per SM; clusters of kClusterM x kClusterN CTAs walk an order of cluster tiles (positions
// cluster_id, + num_clusters, ...; with GemmParams::k_runs, a position is one run of K of a tile),
// CTA r of a cluster taking tile row kClusterM * m + r % kClusterM and tile column
// kClusterN * n + r / kClusterM. The order is a policy
// (Order: Params and a __device__ position -> tile map, e.g. BandedOrder in tile_plan.h), computed
// as the walk goes, so that no per-shape data lives in device memory. Roles:
//   Producer  (warpgroup 0, one warp): per tile, InputWait::wait, then TMA loads of A (from
//             mainloop or, where the wait says so, mainloop_alt) and B k-slices
//             into a ring of shared-memory stages;
//   Helpers   (warpgroup 0, warps 1-3): Phases::helpers, e.g. a fused op's transfers to peers;
//   Copiers   (the last copy_ctas CTAs, whole clusters, every thread): Phases::copy instead of the
//             GEMM: the SM budget a fused op gives its transfers, where idle warps push too slowly;
//   Consumer0/Consumer1 (warpgroups 1, 2): wgmma on the stages into fp32 registers, then
//             Epilogue::store of the finished tile, in one loop whose schedule is a policy
//             (Config::Schedule, sm90_config.cuh). Cooperative: both share each tile (64 rows
//             each). Ping-pong: they take alternate tiles and turns, so that one warpgroup's
//             epilogue runs while the other's wgmma keeps the tensor cores busy.
// The producer runs ahead into the next tile while the consumers finish and store the current one.
// Phases::begin runs first in every CTA (a fused op's handshake with its peers) and may stop the
// launch; the CTAs of a cluster then all stop, since a CTA that exits alone would leave its partner
// waiting on multicasts and barriers. Phases::end runs last, once every role is done.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "interlace/gemm/hooks.cuh"
#include "interlace/gemm/sm90_config.cuh"

namespace interlace::gemm_engine {

template <class Config, class Order, class InputWait, class Epilogue, class Phases = NoPhases>
struct GemmParams {
  typename Config::Mainloop::Params mainloop;
  // The same problem with A elsewhere (e.g. this rank's own rows, read in place): the producer loads
  // a tile from it when InputWait::wait says so.
  typename Config::Mainloop::Params mainloop_alt;
  int32_t m, n, k;
  int32_t groups;                // independent problems of m rows (0 or 1: one), each its own A, B and C
  typename Order::Params order;  // over cluster tiles: (cluster tile row, tile column)
  int32_t num_tiles;             // positions of the walk: cluster tiles x k_runs
  // K in k_runs runs of ceil(k-tiles / k_runs) k-tiles (0 or 1: whole K; a run past K reads zeros;
  // only with an order without a Cursor): position i is run i % k_runs of the order's tile
  // i / k_runs, so that the runs of a tile go to consecutive CTAs at once, and the epilogue gets
  // partial sums to combine (split-K, where the tiles are too few for the SMs).
  int32_t k_runs;
  typename InputWait::Params input_wait;
  typename Epilogue::Params epilogue;
  typename Phases::Params phases;
  // The last copy_ctas CTAs of the grid (a multiple of the cluster size) run Phases::copy and no
  // tiles; the others walk the order. 0 for a plain GEMM.
  int32_t copy_ctas;
};

enum class WarpGroupRole { Producer = 0, Consumer0 = 1, Consumer1 = 2 };

// An order may keep a place per walk (a GroupedOrder: its positions depend on counts the GPU reads):
// its tile() then takes a Cursor, and count() says how many positions this launch has. A
// GroupedOrder also says which problem a tile row belongs to (locate).
template <class Order, class = void>
struct HasCursor : std::false_type {};
template <class Order>
struct HasCursor<Order, std::void_t<typename Order::Cursor>> : std::true_type {};
template <class Order, class = void>
struct HasGroups : std::false_type {};
template <class Order>
struct HasGroups<Order, std::void_t<decltype(&Order::locate)>> : std::true_type {};
// An order whose cluster tiles may hold tiles with nothing to compute (SwappedGroupedOrder: a
// cluster's second row tile past a small group's rows) says which (empty): their consumers release
// the stages the cluster's multicast still fills, with no math and no store.
template <class Order, class = void>
struct HasEmptyTiles : std::false_type {};
template <class Order>
struct HasEmptyTiles<Order, std::void_t<decltype(&Order::empty)>> : std::true_type {};

// An order whose clusters may also work apart (SwappedGroupedOrder, along N: a small group's weight
// tiles, one per CTA) gives each CTA's tile of a position (cta_tile) and says where a CTA loads its
// A alone rather than its share of a multicast (apart): load_apart below.
template <class Order, class = void>
struct HasApartTiles : std::false_type {};
template <class Order>
struct HasApartTiles<Order, std::void_t<decltype(&Order::apart)>> : std::true_type {};

template <class Order, bool = HasCursor<Order>::value>
struct WalkState {};
template <class Order>
struct WalkState<Order, true> {
  typename Order::Cursor cursor;
};

// The tile scheduler every role asks. The cluster takes positions cluster_id, + num_clusters, ... of
// the order (num_clusters: the clusters that compute, gemm_ctas / cluster size; a position is a tile,
// or with k_runs a run of K of tile position / k_runs); of those, a role that
// shares them with others (ping-pong consumers) takes every walkers-th, starting with the walker-th.
// A tile row past the problem (the second CTA of a cluster when the tile rows are odd) still runs
// the mainloop, since its cluster partner's B multicast lands in its shared memory; TMA reads zeros
// (or, with A's box shrunk, nothing) for it and the epilogue stores nothing. num_tiles bounds the
// positions; an order with a Cursor counts them itself (GroupedOrder: from the counts on the GPU).
template <class Order, int kClusterM, int kClusterN = 1>
struct TileWalk {
  static constexpr int kClusterSize = kClusterM * kClusterN;
  const typename Order::Params& order;  // in the kernel's parameter space
  int32_t num_tiles;
  int32_t k_runs;
  int32_t next;
  int32_t step;
  int32_t rank_in_cluster;
  WalkState<Order> state;

  __device__ TileWalk(const typename Order::Params& order_, int32_t num_tiles_, int32_t k_runs_, int32_t gemm_ctas,
                      int walker = 0, int walkers = 1, int32_t groups = 1)
      : order(order_), num_tiles(num_tiles_), k_runs(k_runs_ > 1 ? k_runs_ : 1),
        next(static_cast<int32_t>(blockIdx.x) / kClusterSize + walker * (gemm_ctas / kClusterSize)),
        step(walkers * (gemm_ctas / kClusterSize)), rank_in_cluster(blockIdx.x % kClusterSize) {
    if constexpr (HasCursor<Order>::value) num_tiles = min(num_tiles, Order::count(order, groups));
  }

  // The next tile of this walk and which run of K it covers (0 without k_runs).
  __device__ bool get(int* m_idx, int* n_idx, int* k_run) {
    if (next >= num_tiles) return false;
    const int32_t position = next / k_runs;
    *k_run = next - position * k_runs;
    int32_t cluster_m_idx, tile_n_idx;
    if constexpr (HasCursor<Order>::value) {
      Order::tile(order, position, state.cursor, cluster_m_idx, tile_n_idx);
    } else {
      Order::tile(order, position, cluster_m_idx, tile_n_idx);
    }
    next += step;
    if constexpr (HasApartTiles<Order>::value) {
      static_assert(kClusterM == 1, "clusters that work apart run along N");
      Order::cta_tile(order, cluster_m_idx, tile_n_idx, rank_in_cluster, *m_idx, *n_idx);
    } else {
      *m_idx = cluster_m_idx * kClusterM + rank_in_cluster % kClusterM;
      *n_idx = tile_n_idx * kClusterN + rank_in_cluster / kClusterM;
    }
    return true;
  }
};

// CUTLASS's Mainloop::load for a CTA of a cluster along N that works apart from its partners
// (HasApartTiles): A's TMA box is a 1 / kClusterN slice of the tile, which each CTA otherwise loads
// and multicasts to all; here the CTA loads every slice itself, multicast to itself only. The
// stages still go round in step with the partners' (their consumers release each other's stages),
// which holds since every CTA of a cluster loads the same number of k-tiles per position.
template <class Config, class LoadInputs, class BlockCoord, class KTileIterator>
__device__ __forceinline__ void load_apart(const typename Config::Mainloop::Params& mainloop,
                                           typename Config::Pipeline& pipeline, typename Config::PipelineState state,
                                           const LoadInputs& load_inputs, const BlockCoord& blk_coord,
                                           KTileIterator k_iter, int k_tiles,
                                           typename Config::Mainloop::TensorStorage& tensors) {
  using namespace cute;
  using Mainloop = typename Config::Mainloop;
  static_assert(Config::kClusterM == 1 && Config::kClusterN > 1, "a cluster along N");
  if (!cute::elect_one_sync()) return;
  Tensor sA = make_tensor(make_smem_ptr(tensors.smem_A.data()), typename Mainloop::SmemLayoutA{});  // (M, K, stage)
  Tensor sB = make_tensor(make_smem_ptr(tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});  // (N, K, stage)
  auto [m, n, k, l] = blk_coord;
  Tensor gA = get<0>(load_inputs)(_, _, m, _, l);  // (M, K, k)
  Tensor gB = get<1>(load_inputs)(_, _, n, _, l);  // (N, K, k)
  auto tma_b = mainloop.tma_load_b.get_slice(0);   // B is not multicast: one slice
  Tensor tBgB = tma_b.partition_S(gB);
  Tensor tBsB = tma_b.partition_D(sB);
  const uint16_t self = static_cast<uint16_t>(1u << cute::block_rank_in_cluster());
  CUTLASS_PRAGMA_NO_UNROLL
  for (; k_tiles > 0; --k_tiles) {
    pipeline.producer_acquire(state);
    auto* barrier = pipeline.producer_get_barrier(state);
    const int stage = state.index();
    CUTE_UNROLL
    for (int slice = 0; slice < Config::kClusterN; ++slice) {
      auto tma_a = mainloop.tma_load_a.get_slice(slice);
      copy(mainloop.tma_load_a.with(*barrier, self), tma_a.partition_S(gA)(_, _, _, *k_iter),
           tma_a.partition_D(sA)(_, _, _, stage));
    }
    copy(mainloop.tma_load_b.with(*barrier, 0), tBgB(_, _, _, *k_iter), tBsB(_, _, _, stage));
    ++k_iter;
    ++state;
  }
}

template <class Config, class Order, class InputWait, class Params, class LoadInputs>
__device__ __forceinline__ void run_producer(const Params& params, typename Config::Pipeline& pipeline,
                                             LoadInputs& load_inputs, typename Config::SharedStorage& shared,
                                             int k_tiles) {
  using namespace cute;
  typename Config::Mainloop mainloop;
  auto state = cutlass::make_producer_start_state<typename Config::Pipeline>();
  auto k_shape = shape<3>(get<0>(load_inputs));
  TileWalk<Order, Config::kClusterM, Config::kClusterN> walk(params.order, params.num_tiles, params.k_runs,
                                                             gridDim.x - params.copy_ctas, 0, 1, params.groups);
  int m_idx, n_idx, k_run;
  while (walk.get(&m_idx, &n_idx, &k_run)) {
    const bool alt = InputWait::wait(params.input_wait, m_idx, n_idx);
    int32_t group = 0, m_in_group = m_idx;
    if constexpr (HasGroups<Order>::value) Order::locate(params.order, m_idx, group, m_in_group);
    auto k_iter = make_coord_iterator(idx2crd(k_run * k_tiles, k_shape), k_shape);
    if constexpr (HasApartTiles<Order>::value && Config::kClusterN > 1) {
      if (Order::apart(params.order, m_idx)) {
        load_apart<Config>(alt ? params.mainloop_alt : params.mainloop, pipeline, state, load_inputs,
                           make_coord(m_in_group, n_idx, _, group), k_iter, k_tiles, shared.mainloop.tensors);
        state.advance(k_tiles);
        continue;
      }
    }
    mainloop.load(alt ? params.mainloop_alt : params.mainloop, pipeline, state, load_inputs,
                  make_coord(m_in_group, n_idx, _, group), k_iter, k_tiles,
                  static_cast<int>(threadIdx.x % 32), cute::block_rank_in_cluster(), shared.mainloop.tensors);
    state.advance(k_tiles);
  }
  mainloop.load_tail(pipeline, state);
}

// Both consumer warpgroups, under either schedule (Config::Schedule): the producer fills stages in
// the order of the CTA's walk, so a warpgroup that takes every kWalkers-th tile starts past the
// stages of the walkers before it and skips the others' stages after each of its tiles.
template <class Config, class Order, class Epilogue, class Params>
__device__ __forceinline__ void run_consumer(const Params& params, typename Config::Pipeline& pipeline,
                                             typename Config::SharedStorage& shared,
                                             typename Config::MathOrder& math_order, int k_tiles, int group) {
  using namespace cute;
  using Schedule = typename Config::Schedule;
  static_assert(EpilogueSharedBytes<Epilogue>::value == Config::kEpilogueBytes,
                "the Config carves out the epilogue's staging area (kEpilogueBytes), no more, no less");
  typename Config::Mainloop mainloop;
  typename Config::TiledMma tiled_mma;
  typename Config::PipelineState state;
  const int mma_thread_idx = threadIdx.x % Schedule::kStageConsumers;
  const int walker = Schedule::walker(group);
  TileWalk<Order, Config::kClusterM, Config::kClusterN> walk(params.order, params.num_tiles, params.k_runs,
                                                             gridDim.x - params.copy_ctas, walker,
                                                             Schedule::kWalkers, params.groups);
  state.advance(walker * k_tiles);
  int m_idx, n_idx, k_run;
  while (walk.get(&m_idx, &n_idx, &k_run)) {
    if constexpr (HasEmptyTiles<Order>::value) {
      if (Order::empty(params.order, m_idx, n_idx)) {
        if constexpr (Schedule::kTakeTurns) math_order.wait();
        auto read = state;
        for (int k = 0; k < k_tiles; ++k, ++read) {
          pipeline.consumer_wait(read);
          pipeline.consumer_release(read);
        }
        if constexpr (Schedule::kTakeTurns) {
          math_order.arrive();
          math_order.wait();  // the epilogue's turn, which stores nothing
          math_order.arrive();
        }
        state.advance(Schedule::kWalkers * k_tiles);
        continue;
      }
    }
    auto accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Config::TileShape{}));
    if constexpr (Schedule::kTakeTurns) math_order.wait();  // my turn at the mainloop
    mainloop.mma(pipeline, state, accum, k_tiles, mma_thread_idx, shared.mainloop.tensors, params.mainloop);
    if constexpr (Schedule::kTakeTurns) math_order.arrive();
    mainloop.mma_tail(pipeline, state, k_tiles);
    state.advance(Schedule::kWalkers * k_tiles);
    if constexpr (Schedule::kTakeTurns) math_order.wait();  // my turn at the epilogue
    if constexpr (Config::kEpilogueBytes > 0) {
      Epilogue::template store<typename Config::TileShape>(params.epilogue, accum, tiled_mma, mma_thread_idx, m_idx,
                                                           n_idx, k_run, params.m, params.n, shared.epilogue);
    } else {
      Epilogue::template store<typename Config::TileShape>(params.epilogue, accum, tiled_mma, mma_thread_idx, m_idx,
                                                           n_idx, k_run, params.m, params.n);
    }
    if constexpr (Schedule::kTakeTurns) math_order.arrive();
  }
}

// Whether every CTA of this cluster wants to run (each says so in `mine`), after a cluster barrier;
// on "no" a second barrier keeps each CTA's shared memory alive until its partners have read it.
template <int kClusterSize>
__device__ __forceinline__ bool whole_cluster_runs(int* mine, bool run) {
  if constexpr (kClusterSize == 1) {
    return run;
  } else {
    if (threadIdx.x == 0) *mine = run ? 1 : 0;
    cute::cluster_arrive();  // release: the vote is visible to the cluster once the barrier completes
    cute::cluster_wait();
    bool all = true;
    for (int r = 0; r < kClusterSize; ++r) {
      uint32_t theirs;
      const uint32_t addr = cute::cast_smem_ptr_to_uint(mine);
      asm volatile(
          "{ .reg .b32 remote;\n"
          "  mapa.shared::cluster.u32 remote, %1, %2;\n"
          "  ld.shared::cluster.u32 %0, [remote]; }\n"
          : "=r"(theirs)
          : "r"(addr), "r"(r)
          : "memory");
      all = all && theirs != 0;
    }
    if (!all) {
      cute::cluster_arrive();
      cute::cluster_wait();
    }
    return all;
  }
}

template <class Config, class Order, class InputWait, class Epilogue, class Phases = NoPhases>
__global__ void __launch_bounds__(Config::kThreads, 1)
    sm90_gemm_kernel(const __grid_constant__ GemmParams<Config, Order, InputWait, Epilogue, Phases> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Pipeline = typename Config::Pipeline;
  if constexpr (!std::is_same_v<Phases, NoPhases>) {
    __shared__ int runs;
    if (!whole_cluster_runs<Config::kClusterSize>(&runs, Phases::begin(params.phases))) return;
    const int32_t gemm_ctas = static_cast<int32_t>(gridDim.x) - params.copy_ctas;
    if (static_cast<int32_t>(blockIdx.x) >= gemm_ctas) {  // a copier: no pipeline, no tiles
      Phases::copy(params.phases, static_cast<int>(blockIdx.x) - gemm_ctas, params.copy_ctas);
      __syncthreads();
      Phases::end(params.phases);
      // Not out before the cluster's partners (copiers too: copy_ctas is whole clusters) have read
      // this CTA's vote in whole_cluster_runs; a copier with no work could otherwise exit first.
      if constexpr (Config::kClusterSize > 1) {
        cute::cluster_arrive();
        cute::cluster_wait();
      }
      return;
    }
  }
  extern __shared__ __align__(128) char smem[];
  auto& shared = *reinterpret_cast<typename Config::SharedStorage*>(smem);
  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const auto role = static_cast<WarpGroupRole>(cutlass::canonical_warp_group_idx());
  const bool is_loader = role == WarpGroupRole::Producer && warp_idx == 0;
  if (warp_idx == 0 && cute::elect_one_sync()) Config::Mainloop::prefetch_tma_descriptors(params.mainloop);

  typename Pipeline::Params pipeline_params;
  pipeline_params.role = role == WarpGroupRole::Producer
                             ? (is_loader ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::NonParticipant)
                             : Pipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x % cutlass::NumThreadsPerWarpGroup == 0;
  pipeline_params.num_consumers = Config::kConsumerThreads;
  pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
  // The launched cluster's shape, not the mainloop's (sm90_config.cuh, PipelineClusterShape).
  Pipeline pipeline(shared.mainloop.pipeline, pipeline_params, typename Config::PipelineClusterShape{});
  const int consumer_group = static_cast<int>(role) - static_cast<int>(WarpGroupRole::Consumer0);
  typename Config::MathOrder::Params order_params;
  order_params.group_id = consumer_group < 0 ? 0 : consumer_group;
  order_params.group_size = cutlass::NumThreadsPerWarpGroup;
  typename Config::MathOrder math_order(shared.math_order, order_params);
  // Barriers initialised, in every CTA of the cluster, before anyone uses them.
  if constexpr (Config::kClusterSize > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  const auto problem = make_shape(params.m, params.n, params.k, params.groups > 1 ? params.groups : 1);
  // k-tiles per tile: one run's (the last run may reach past K, where TMA reads zeros).
  const int k_runs = params.k_runs > 1 ? params.k_runs : 1;
  const int k_tiles = ((params.k + Config::kTileK - 1) / Config::kTileK + k_runs - 1) / k_runs;
  if (role == WarpGroupRole::Producer) {
    cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegisters>();
    if (is_loader) {
      typename Config::Mainloop mainloop;
      auto load_inputs = mainloop.load_init(problem, params.mainloop);
      run_producer<Config, Order, InputWait>(params, pipeline, load_inputs, shared, k_tiles);
    } else {
      Phases::helpers(params.phases, static_cast<int>(threadIdx.x) - 32, cutlass::NumThreadsPerWarpGroup - 32);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Config::kConsumerRegisters>();
    run_consumer<Config, Order, Epilogue>(params, pipeline, shared, math_order, k_tiles, consumer_group);
  }
  if constexpr (!std::is_same_v<Phases, NoPhases>) {
    __syncthreads();  // also the sync PTX asks for between a warpgroup's setmaxnreg instructions
    // Registers back to the even split where end needs them (hooks.cuh): the consumers give theirs
    // back; the producer's alloc waits until they have. Opt-in, since it costs the others a spill.
    if constexpr (Phases::kEndRegisters) {
      if (role == WarpGroupRole::Producer) {
        cutlass::arch::warpgroup_reg_alloc<Config::kEvenRegisters>();
      } else {
        cutlass::arch::warpgroup_reg_dealloc<Config::kEvenRegisters>();
      }
    }
    Phases::end(params.phases);
  }
#elif defined(__CUDA_ARCH__)
  // Compiled for a GPU without sm_90a's wgmma, TMA and register reallocation: an empty kernel would
  // "succeed" and leave out unwritten, so stop the launch with an error instead.
  __trap();
#endif
}

}  // namespace interlace::gemm_engine
