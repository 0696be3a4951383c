// The persistent, warp-specialized Hopper GEMM every fused op drives: C[M, N] = A[M, K] @ B[K, N].
//
// One CTA per SM; clusters of kClusterM CTAs walk the host's order of cluster tiles (entries
// cluster_id, + num_clusters, ...), CTA r of a cluster taking tile row kClusterM * m + r. Roles:
//   Producer  (warpgroup 0, one warp): per tile, InputWait::wait, then TMA loads of A and B k-slices
//             into a ring of shared-memory stages;
//   Consumer0/Consumer1 (warpgroups 1, 2): wgmma on the stages into fp32 registers, then
//             Epilogue::store of the finished tile. Cooperative: both share each tile (64 rows
//             each). Ping-pong: they take alternate tiles and turns, so that one warpgroup's
//             epilogue runs while the other's wgmma keeps the tensor cores busy.
// The producer runs ahead into the next tile while the consumers finish and store the current one.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "interlace/gemm/hooks.cuh"
#include "interlace/gemm/sm90_config.cuh"

namespace interlace::gemm_engine {

template <class Config, class InputWait, class Epilogue>
struct GemmParams {
  typename Config::Mainloop::Params mainloop;
  int32_t m, n, k;
  const int32_t* tile_order;  // device array over cluster tiles: entry = cluster_m_idx * tiles_n + n_idx
  int32_t num_tiles;          // cluster tiles
  int32_t tiles_n;
  typename InputWait::Params input_wait;
  typename Epilogue::Params epilogue;
};

enum class WarpGroupRole { Producer = 0, Consumer0 = 1, Consumer1 = 2 };

// The tile scheduler every role asks: the same walk over the host's order for every warpgroup.
// A tile row past the problem (the second CTA of a cluster when the tile rows are odd) still runs the
// mainloop, since its cluster partner's B multicast lands in its shared memory; TMA reads zeros for it
// and the epilogue stores nothing.
template <int kClusterM>
struct TileWalk {
  const int32_t* order;
  int32_t num_tiles;
  int32_t tiles_n;
  int32_t next;
  int32_t step;
  int32_t rank_in_cluster;

  __device__ TileWalk(const int32_t* order_, int32_t num_tiles_, int32_t tiles_n_)
      : order(order_), num_tiles(num_tiles_), tiles_n(tiles_n_), next(blockIdx.x / kClusterM),
        step(gridDim.x / kClusterM), rank_in_cluster(blockIdx.x % kClusterM) {}

  __device__ void skip() { next += step; }

  __device__ bool get(int* m_idx, int* n_idx) {
    if (next >= num_tiles) return false;
    const int32_t tile = order[next];
    next += step;
    *m_idx = (tile / tiles_n) * kClusterM + rank_in_cluster;
    *n_idx = tile % tiles_n;
    return true;
  }
};

template <class Config, class InputWait, class Epilogue, class Params, class LoadInputs>
__device__ __forceinline__ void run_producer(const Params& params, typename Config::Pipeline& pipeline, LoadInputs& load_inputs,
                             typename Config::SharedStorage& shared, int k_tiles) {
  using namespace cute;
  typename Config::Mainloop mainloop;
  auto state = cutlass::make_producer_start_state<typename Config::Pipeline>();
  auto k_shape = shape<3>(get<0>(load_inputs));
  TileWalk<Config::kClusterM> walk(params.tile_order, params.num_tiles, params.tiles_n);
  int m_idx, n_idx;
  while (walk.get(&m_idx, &n_idx)) {
    InputWait::wait(params.input_wait, m_idx, n_idx);
    auto k_iter = make_coord_iterator(idx2crd(0, k_shape), k_shape);
    mainloop.load(params.mainloop, pipeline, state, load_inputs, make_coord(m_idx, n_idx, _, 0), k_iter, k_tiles,
                  static_cast<int>(threadIdx.x % 32), cute::block_rank_in_cluster(), shared.mainloop.tensors);
    state.advance(k_tiles);
  }
  mainloop.load_tail(pipeline, state);
}

// Ping-pong: consumer warpgroup g takes tiles g, g + 2, ... of the CTA's walk; its pipeline state
// skips the other warpgroup's stages.
template <class Config, class InputWait, class Epilogue, class Params>
__device__ __forceinline__ void run_pingpong_consumer(const Params& params, typename Config::Pipeline& pipeline,
                                                      typename Config::SharedStorage& shared,
                                                      typename Config::MathOrder& order, int k_tiles, int group) {
  using namespace cute;
  typename Config::Mainloop mainloop;
  typename Config::TiledMma tiled_mma;
  typename Config::PipelineState state;
  const int mma_thread_idx = threadIdx.x % cutlass::NumThreadsPerWarpGroup;
  TileWalk<Config::kClusterM> walk(params.tile_order, params.num_tiles, params.tiles_n);
  if (group == 1) {
    walk.skip();
    state.advance(k_tiles);
  }
  int m_idx, n_idx;
  while (walk.get(&m_idx, &n_idx)) {
    auto accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Config::TileShape{}));
    order.wait();  // my turn at the mainloop
    mainloop.mma(pipeline, state, accum, k_tiles, mma_thread_idx, shared.mainloop.tensors, params.mainloop);
    order.arrive();
    mainloop.mma_tail(pipeline, state, k_tiles);
    state.advance(2 * k_tiles);
    order.wait();  // my turn at the epilogue
    Epilogue::template store<typename Config::TileShape>(params.epilogue, accum, tiled_mma, mma_thread_idx, m_idx,
                                                         n_idx, params.m, params.n);
    order.arrive();
    walk.skip();
  }
}

template <class Config, class InputWait, class Epilogue, class Params>
__device__ __forceinline__ void run_consumers(const Params& params, typename Config::Pipeline& pipeline,
                              typename Config::SharedStorage& shared, int k_tiles) {
  using namespace cute;
  typename Config::Mainloop mainloop;
  typename Config::TiledMma tiled_mma;
  typename Config::PipelineState state;
  const int mma_thread_idx = threadIdx.x % Config::kConsumerThreads;
  TileWalk<Config::kClusterM> walk(params.tile_order, params.num_tiles, params.tiles_n);
  int m_idx, n_idx;
  while (walk.get(&m_idx, &n_idx)) {
    auto accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Config::TileShape{}));
    mainloop.mma(pipeline, state, accum, k_tiles, mma_thread_idx, shared.mainloop.tensors, params.mainloop);
    mainloop.mma_tail(pipeline, state, k_tiles);
    state.advance(k_tiles);
    Epilogue::template store<typename Config::TileShape>(params.epilogue, accum, tiled_mma, mma_thread_idx, m_idx,
                                                         n_idx, params.m, params.n);
  }
}

template <class Config, class InputWait, class Epilogue>
__global__ void __launch_bounds__(Config::kThreads, 1)
    sm90_gemm_kernel(const __grid_constant__ GemmParams<Config, InputWait, Epilogue> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Pipeline = typename Config::Pipeline;
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
  Pipeline pipeline(shared.mainloop.pipeline, pipeline_params, typename Config::ClusterShape{});
  const int consumer_group = static_cast<int>(role) - static_cast<int>(WarpGroupRole::Consumer0);
  typename Config::MathOrder::Params order_params;
  order_params.group_id = consumer_group < 0 ? 0 : consumer_group;
  order_params.group_size = cutlass::NumThreadsPerWarpGroup;
  typename Config::MathOrder math_order(shared.math_order, order_params);
  // Barriers initialised, in every CTA of the cluster, before anyone uses them.
  if constexpr (Config::kClusterM > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  const auto problem = make_shape(params.m, params.n, params.k, 1);
  const int k_tiles = (params.k + Config::kTileK - 1) / Config::kTileK;
  if (role == WarpGroupRole::Producer) {
    cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegisters>();
    if (is_loader) {
      typename Config::Mainloop mainloop;
      auto load_inputs = mainloop.load_init(problem, params.mainloop);
      run_producer<Config, InputWait, Epilogue>(params, pipeline, load_inputs, shared, k_tiles);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Config::kConsumerRegisters>();
    if constexpr (Config::kPingpong) {
      run_pingpong_consumer<Config, InputWait, Epilogue>(params, pipeline, shared, math_order, k_tiles,
                                                         consumer_group);
    } else {
      run_consumers<Config, InputWait, Epilogue>(params, pipeline, shared, k_tiles);
    }
  }
#endif
}

}  // namespace interlace::gemm_engine
