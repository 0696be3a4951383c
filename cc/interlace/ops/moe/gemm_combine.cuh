// moe_gemm_combine over NVLink: the experts' second FFN matmul (a grouped GEMM over the local
// experts' kept rows) fused with moe_combine, in one launch of the GEMM engine (DESIGN.md,
// "moe_gemm_combine").
//
// The engine runs as grouped_gemm in GroupedOrder over the capacity-padded receive layout
// (kPerExpert: local expert l's rows are [l C, l C + kept rows)), or on the swapped problem in
// SwappedGroupedOrder where grouped_gemm would swap (a tile's columns are then the rows to send),
// with three hooks filled in:
//   Phases::begin      the op handshake: peers run the same call, and their previous op no longer
//                      reads the combine rows this rank's epilogue stores into;
//   CombineEpilogue    instead of storing a finished tile locally, sends each of its rows home: row
//                      r of expert l is slot (l C + r), whose MoeSlot names the home rank, token and
//                      top-k position j; the tile's row goes, through shared memory as 16-byte
//                      stores, into row token x k + j of that rank's combine rows (moe_combine's
//                      phase 0, done by the GEMM's own epilogue, so it overlaps the next tiles' math);
//   Phases::end        once every CTA of this rank has stored its tiles, the last to count itself
//                      done raises this rank's "sent" flag on every rank; then every CTA waits for every
//                      rank's, and sums its share of this rank's tokens: moe_combine's phase 1, bit
//                      for bit (sum_slice).
// Every CTA waits on the others in Phases::end, so all must be resident: the launch takes at most
// the clusters that fit at once. Every wait is bounded; a failed one returns and the call raises.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "interlace/gemm/grouped_order.h"
#include "interlace/gemm/grouped_store.cuh"
#include "interlace/gemm/hooks.cuh"
#include "interlace/ops/moe/device.cuh"

namespace interlace {

template <class Order>  // GroupedOrder, or SwappedGroupedOrder
struct MoeGemmCombineParams {
  MoeCombineParams combine;  // expert_out is unused: the rows go home from the epilogue
  const MoeSlot* slots;      // this rank's, [recv_rows]
  typename Order::Params order;
};

namespace moe_detail {

// Rank q's "every row it computed has been stored home" flag in the combine's region: the word of
// its first expert's combined flag, which the unfused combine raises too (with its own op numbers,
// so the two never confuse each other).
__device__ __forceinline__ int32_t sent_flag(const MoePlan& plan, int32_t q) {
  return plan.combined_flag(plan.expert_of(q, 0));
}

// Where slot s's combine row lives on its home rank, or null for a slot no expert kept.
__device__ __forceinline__ char* home_row(const MoeCommonParams& c, const MoeSlot& s) {
  if (!valid_home(c.plan, s)) return nullptr;
  return c.transport.heaps[s.source_rank] + c.workspace + c.plan.combine_row_offset(s.source_token, s.topk_pos);
}

}  // namespace moe_detail

// Consumers, with a finished tile of local expert `group` in registers: each of its rows of out (a
// slot: the tile's rows, or the swapped problem's columns) goes through shared memory to its home
// rank's combine row as 16-byte stores, one slot lookup each. Slot s of expert l at receive row l C
// + s names the home rank, token and top-k position j: row token x k + j there. Slots past the
// expert's kept rows (stale act rows up to C, TMA's zeros past it) and columns past H are not stored.
template <class Element, class Order>  // GroupedOrder, or SwappedGroupedOrder
struct CombineEpilogue {
  using Params = MoeGemmCombineParams<Order>;
  using Staging = gemm_engine::GroupedStaging<Element, Order>;
  static constexpr int kSharedBytes = Staging::kBytes;

  template <class TileShape, class Accumulators, class TiledMma>
  __device__ __forceinline__ static void store(const Params& p, const Accumulators& accum, const TiledMma& tiled_mma,
                                               int thread_idx, int m_idx, int n_idx, int /*k_run*/, int m, int n,
                                               char* staging) {
    const gemm_engine::GroupedTileSpan t = gemm_engine::tile_span<TileShape>(p.order, m_idx, n_idx, m, n);
    if (t.rows <= 0) return;  // the whole tile's consumers: nothing of it is sent
    const MoeCommonParams& c = p.combine.c;
    const MoeSlot* slots = p.slots + static_cast<int64_t>(t.group) * c.plan.capacity + t.row0;
    Staging::template store<TileShape>(staging, accum, tiled_mma, thread_idx, t.rows, t.cols, [&](int slot) {
      char* home = moe_detail::home_row(c, slots[slot]);
      return home == nullptr ? nullptr : reinterpret_cast<Element*>(home) + t.col0;
    });
  }
};

template <class Order>
struct CombinePhases {
  using Params = MoeGemmCombineParams<Order>;
  static constexpr bool kEndRegisters = true;  // end's sums: 168 registers, not the producer's 40

  __device__ static bool begin(const Params& p) {
    return device::op_enter(p.combine.c.transport, p.combine.c.wait, p.combine.c.signature);
  }
  __device__ static void helpers(const Params&, int /*thread*/, int /*threads*/) {}
  __device__ static void copy(const Params&, int /*cta*/, int /*ctas*/) {}

  // Every thread of every CTA, after its tiles (the engine's __syncthreads before this).
  __device__ static void end(const Params& p) {
    using namespace moe_detail;
    const MoeCommonParams& c = p.combine.c;
    const device::NvlinkTransport& t = c.transport;
    const MoePlan& plan = c.plan;
    MoeFlags& flags = *op_flags<MoeFlags, OpId::kMoeCombine>(t.my_pad());
    __shared__ uint64_t n;
    __shared__ int failed;
    if (threadIdx.x == 0) {
      n = op_number(t);
      failed = 0;
    }
    __syncthreads();
    // Every CTA's stores home are visible everywhere before the last raises the sent flags.
    if (arrive(flags, n, 0) && threadIdx.x < plan.world) {
      t.signal(threadIdx.x, &flags.plan[sent_flag(plan, t.local_rank)], n);
    }
    if (threadIdx.x < plan.world &&
        t.wait(&flags.plan[sent_flag(plan, threadIdx.x)], n, c.wait, FlagId::kCombined, threadIdx.x) == 0) {
      failed = 1;
    }
    __syncthreads();
    if (failed) return;
    // Every warp sums, on the launch's even share of 168 registers (kEndRegisters): in the producer
    // warpgroup's 40 the slice loop spilled.
    const int64_t warps_per_cta = blockDim.x / 32;
    sum_tokens(p.combine, blockIdx.x * warps_per_cta + threadIdx.x / 32, gridDim.x * warps_per_cta);
    device::op_end(t);
  }
};

}  // namespace interlace
