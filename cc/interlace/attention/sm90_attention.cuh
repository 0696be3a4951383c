// The Hopper attention forward (softmax(Q K^T * scale) V, with the log-sum-exp) that ring attention
// computes its blocks with: TMA and wgmma, warp-specialized, online softmax.
//
// One CTA per (query tile of 128 rows, head, batch). Roles:
//   Producer  (warpgroup 0, one thread): TMA loads of the CTA's Q tile (two 64-row halves, one per
//             consumer, each behind its own barrier) and of K and V tiles of 128 keys into a
//             double-buffered ring (two pipelines, so a consumer waits for V only when it needs it);
//   Consumers (warpgroups 1, 2): 64 query rows each. Per key tile j: S = Q K_j^T (wgmma, both
//             operands in shared memory), the online softmax on S in registers, then O += P V_j with P
//             from registers (the accumulator's layout is the A operand's, so no shuffle). The next
//             tile's S is issued before waiting for this tile's PV, so the tensor cores work on one
//             while the warpgroup runs the other's exponentials; and the two consumers take turns at
//             issuing (two named barriers), so that one's softmax runs under the other's matmuls.
// Key tiles are visited from the last to the first: the ones that need a mask (the ragged last tile,
// the causal diagonal) come first, and the rest run without one. Under the causal mask the grid
// starts at the last query tiles, which have the most keys to visit.
//
// Rows past the sequence are zeros from TMA and are masked (keys) or not stored (queries). A row
// with no visible key (none here; ring blocks will have them) gets O = 0 and lse = -inf.
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

template <class Element_, int kHeadDim_, bool kCausal_>
struct Config {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kCausal = kCausal_;
  static constexpr int kConsumers = 2;  // warpgroups of 64 query rows
  static constexpr int kTileQ = 64 * kConsumers;
  static constexpr int kTileK = 128;
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
  using SmemLayoutV = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<Element>{},
                                                   cute::Shape<HeadDim, TileK, cute::Int<kStages>>{}));
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
  };

  // Global tensors as TMA sees them: Q, K (rows, D, heads, batch) with D contiguous; V as (D, rows,
  // heads, batch), the transposed view its MN-major tiles are cut from.
  using GmemShapeRows = cute::Shape<int32_t, HeadDim, int32_t, int32_t>;
  using GmemStrideRows = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemShapeCols = cute::Shape<HeadDim, int32_t, int32_t, int32_t>;
  using GmemStrideCols = cute::Stride<cute::_1, int64_t, int64_t, int64_t>;
  static auto gmem_rows(const Element* p) {
    return cute::make_tensor(cute::make_gmem_ptr(p), GmemShapeRows{}, GmemStrideRows{});
  }
  static auto gmem_cols(const Element* p) {
    return cute::make_tensor(cute::make_gmem_ptr(p), GmemShapeCols{}, GmemStrideCols{});
  }
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, gmem_rows(nullptr),
                                            SmemLayoutQ{}(cute::_, cute::_, cute::_0{})));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, gmem_rows(nullptr),
                                            SmemLayoutK{}(cute::_, cute::_, cute::_0{})));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, gmem_cols(nullptr),
                                            SmemLayoutV{}(cute::_, cute::_, cute::_0{})));
};

template <class Config>
struct Params {
  typename Config::TmaQ tma_q;
  typename Config::TmaK tma_k;
  typename Config::TmaV tma_v;
  typename Config::Element* out;  // [B, S_q, Hq, D], contiguous
  float* lse;                     // [B, Hq, S_q], or null
  int32_t batch, seq_q, seq_k, heads_q, heads_kv;
  int32_t q_tiles;
  float scale_log2;  // softmax scale * log2(e): the exponentials are exp2
  float scale;
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

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1) sm90_attention_kernel(const __grid_constant__ Params<Config> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Element = typename Config::Element;
  using Pipeline = typename Config::Pipeline;
  using HeadDim = typename Config::HeadDim;
  using TileK = typename Config::TileK;
  constexpr int kTileQ = Config::kTileQ;
  constexpr int kTileK = Config::kTileK;
  constexpr bool kCausal = Config::kCausal;

  extern __shared__ __align__(1024) char smem[];
  auto& shared = *reinterpret_cast<typename Config::SharedStorage*>(smem);
  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warp_group = cutlass::canonical_warp_group_idx();

  const int q_tile = kCausal ? p.q_tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z;
  const int head_kv = head / (p.heads_q / p.heads_kv);
  const int q_end = min((q_tile + 1) * kTileQ, p.seq_q);  // past the CTA's last query row
  int k_tiles = (p.seq_k + kTileK - 1) / kTileK;
  if constexpr (kCausal) k_tiles = min(k_tiles, (q_end - 1) / kTileK + 1);

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
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Config::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Config::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Config::SmemLayoutV{});

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegisters>();
    if (warp_idx != 0 || !cute::elect_one_sync()) return;
    Tensor mQ = p.tma_q.get_tma_tensor(make_shape(p.seq_q, HeadDim{}, p.heads_q, p.batch));
    Tensor mK = p.tma_k.get_tma_tensor(make_shape(p.seq_k, HeadDim{}, p.heads_kv, p.batch));
    Tensor mV = p.tma_v.get_tma_tensor(make_shape(HeadDim{}, p.seq_k, p.heads_kv, p.batch));
    Tensor gQ = local_tile(mQ(_, _, head, batch), Shape<_64, HeadDim>{}, make_coord(_, 0));  // (64, D, halves)
    Tensor gK = local_tile(mK(_, _, head_kv, batch), Shape<TileK, HeadDim>{}, make_coord(_, 0));  // (keys, D, j)
    Tensor gV = local_tile(mV(_, _, head_kv, batch), Shape<HeadDim, TileK>{}, make_coord(0, _));  // (D, keys, j)
    auto [tQgQ, tQsQ] = tma_partition(p.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tKgK, tKsK] = tma_partition(p.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(p.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    for (int c = 0; c < Config::kConsumers; ++c) {
      auto& full = *reinterpret_cast<cutlass::arch::ClusterTransactionBarrier*>(&shared.q_full[c]);
      full.arrive_and_expect_tx(Config::kQHalfBytes);
      copy(p.tma_q.with(shared.q_full[c]), tQgQ(_, q_tile * Config::kConsumers + c), tQsQ(_, c));
    }
    auto state = cutlass::make_producer_start_state<Pipeline>();
    for (int j = k_tiles - 1; j >= 0; --j) {
      pipeline_k.producer_acquire(state);
      copy(p.tma_k.with(*pipeline_k.producer_get_barrier(state)), tKgK(_, j), tKsK(_, state.index()));
      pipeline_v.producer_acquire(state);
      copy(p.tma_v.with(*pipeline_v.producer_get_barrier(state)), tVgV(_, j), tVsV(_, state.index()));
      ++state;
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Config::kConsumerRegisters>();
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
  const int q_first = q_tile * kTileQ + consumer * 64;  // the warpgroup's first query row
  RowState rows;
  float rescale[2];
  clear(acc_o);

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
  // Keys past the sequence, and under the causal mask keys after the query, score -inf.
  auto mask = [&](int j) {
    const int key0 = j * kTileK + coords.col0;
    const bool ragged = (j + 1) * kTileK > p.seq_k;
    const bool diagonal = kCausal && (j + 1) * kTileK - 1 > q_first;
    if (!ragged && !diagonal) return;
    CUTLASS_PRAGMA_UNROLL
    for (int n = 0; n < kTileK / 8; ++n) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int query = q_first + coords.row0 + 8 * i;
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * n + e;
          if (key >= p.seq_k || (kCausal && key > query)) acc_s(4 * n + 2 * i + e) = -INFINITY;
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
  // one's softmax runs while the other's matmuls keep the tensor cores busy. Consumer 0 goes first;
  // each step ends by handing the turn over, except the very last one, so that no arrival is left
  // pending at exit.
  const int steps = k_tiles + 1;  // the first S, then (S, PV) per further tile, then the last PV
  int step = 0;
  auto take_turn = [&]() { named_barrier_sync(kTurnBarrier + consumer); };
  auto pass_turn = [&]() {
    if (++step < steps || consumer == 0) named_barrier_arrive(kTurnBarrier + (consumer ^ 1));
  };
  if (consumer == 1 && k_tiles > 0) named_barrier_arrive(kTurnBarrier);

  auto& q_full = *reinterpret_cast<cutlass::arch::ClusterTransactionBarrier*>(&shared.q_full[consumer]);
  q_full.wait(0);
  typename Pipeline::PipelineState k_state, v_state;
  if (k_tiles > 0) {
    // The first (last-indexed) tile: S, softmax, and P ready for its PV.
    pipeline_k.consumer_wait(k_state);
    take_turn();
    issue_qk(k_state.index());
    pass_turn();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);
    pipeline_k.consumer_release(k_state);
    ++k_state;
    mask(k_tiles - 1);
    online_softmax<kTileK>(acc_s, rows, p.scale_log2, rescale);
    to_p();
    for (int j = k_tiles - 2; j >= 0; --j) {
      // S of tile j and PV of tile j + 1 in flight together; O takes the rescale of tile j + 1's
      // softmax while S runs.
      pipeline_k.consumer_wait(k_state);
      take_turn();
      issue_qk(k_state.index());
      rescale_o();
      pipeline_v.consumer_wait(v_state);
      issue_pv(v_state.index());
      pass_turn();
      warpgroup_wait<1>();  // S done (wgmma batches complete in order)
      warpgroup_fence_operand(acc_s);
      pipeline_k.consumer_release(k_state);
      ++k_state;
      mask(j);
      online_softmax<kTileK>(acc_s, rows, p.scale_log2, rescale);
      warpgroup_wait<0>();  // PV done: P may be overwritten
      warpgroup_fence_operand(acc_o);
      pipeline_v.consumer_release(v_state);
      ++v_state;
      to_p();
    }
    rescale_o();
    pipeline_v.consumer_wait(v_state);
    take_turn();
    issue_pv(v_state.index());
    pass_turn();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
    pipeline_v.consumer_release(v_state);
  }

  // Epilogue: O / l in the input dtype, element pairs straight from registers; lse = max * scale + ln l.
  const int64_t row_stride = static_cast<int64_t>(p.heads_q) * Config::kHeadDim;
  Element* out = p.out + (static_cast<int64_t>(batch) * p.seq_q * p.heads_q + head) * Config::kHeadDim;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < 2; ++i) {
    float l = rows.sum[i];
    l += __shfl_xor_sync(0xffffffff, l, 1);
    l += __shfl_xor_sync(0xffffffff, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int query = q_first + coords.row0 + 8 * i;
    if (query >= p.seq_q) continue;
    Element* row = out + query * row_stride + coords.col0;
    CUTLASS_PRAGMA_UNROLL
    for (int n = 0; n < Config::kHeadDim / 8; ++n) {
      *reinterpret_cast<uint32_t*>(row + 8 * n) = pack<Element>(acc_o(4 * n + 2 * i) * inv, acc_o(4 * n + 2 * i + 1) * inv);
    }
    if (p.lse != nullptr && coords.col0 == 0) {
      p.lse[(static_cast<int64_t>(batch) * p.heads_q + head) * p.seq_q + query] =
          l > 0.f ? rows.max[i] * p.scale + __logf(l) : -INFINITY;
    }
  }
#elif defined(__CUDA_ARCH__)
  // Compiled for a GPU without sm_90a's wgmma and TMA: stop with an error rather than leave out unwritten.
  __trap();
#endif
}

}  // namespace interlace::attention_engine
