// moe_dispatch and moe_combine over NVLink, unfused: the kernels that execute ops/moe/plan.h.
//
// Each kernel's CTAs work in phases. At the end of one, every CTA counts itself done (arrive: one
// atomic); the last raises MoeFlags::release (op number x kMoePhases + phase), which the CTAs that
// need every CTA's writes wait for ("grid barrier"), and where the ranks wait instead, also raises
// their flag itself ("the last CTA raises"). All CTAs must be resident at once: the launch uses at most one per SM.
// Flags across ranks are raised to the op number (the same on every rank: ops run in one sequence),
// so nothing is reset and a captured graph replays correctly.
//
// moe_dispatch, per call:
//   0. every CTA numbers this rank's slots of its experts (e = b, b + G, ...) in token order (pos)
//      and stores the expert's count into every rank's counts table; the last CTA raises
//      counts_flag(me) on every rank;
//   1. with every source's counts here, each thread evaluates the plan's closed forms for some
//      experts: this rank's run (first row, kept rows) at the expert's rank, and for local experts
//      their start and kept rows (the grouped GEMM's M); drops are summed. Grid barrier. CTA 0
//      reports a drop to the host (HostControl::overflowed) and in the plan's overflow words;
//   2. each CTA its chunk of the tokens (a run of about tokens / G), a warp per token (top-k <= 32
//      and more tokens than CTAs; else a CTA per token): its kept
//      slots' rows and primaries (MoePlan::primary_of: on another rank the kept slot of the
//      lowest-numbered expert there, here every kept slot); every kept slot's MoeSlot to its
//      destination, then the token's row into every primary, each vector loaded once. The last
//      CTA raises arrived_flag(me, l) on every rank for every l;
//   3. with every source's rows here, warps fill each secondary slot's row from its primary (a
//      local copy: another rank's token crossed NVLink once). With one rank there are no
//      secondaries: the kernel ends after 2, without the arrival.
// The small layout (at most kMoeSmallExperts experts, and chunks of at most kMoeChunkEntries top-k
// entries: a chunk is larger only past about 8.6 million entries on 132 SMs): in 1, every CTA lays
// out every expert for itself, into shared memory (CTA 0 alone also records the drops and the local
// experts' rows), with no grid barrier. In 0, up to kMoeOneCtaEntries top-k entries here (a
// decode), CTA 0 numbers every slot (number_slots_in) and raises counts_flag(me) itself: no grid
// barrier at all; past that each CTA numbers its own chunk's slots, from where the chunks before it
// leave off (one grid barrier: the last CTA to count its chunk sums the counts and raises
// counts_flag(me)).
// moe_combine, per call:
//   0. warp per kept receive row: the expert's output row to its home rank's combine buffer, row
//      token x k + j. The last CTA raises combined_flag(e) on every rank for its experts;
//   1. with every expert's outputs here, a warp per slice of a token's row (row_slices: whole rows
//      where the tokens outnumber the warps): out = the sum over j = 0 .. k - 1 of kept slots of
//      weight x row, in fp32 in that order (no fused multiply-add), rounded once to bf16.
// Bad routing entries (outside [-1, E)) are taken for unused: no index from the device's data
// reaches an address unchecked.
#pragma once

#include "interlace/ops/moe/device.cuh"

namespace interlace {

// IdxT: int32_t or int64_t, topk_idx's type.
template <class IdxT>
__global__ void __launch_bounds__(kMoeThreads, 1) moe_dispatch_kernel(const __grid_constant__ MoeDispatchParams p) {
  using namespace moe_detail;
  const MoeCommonParams& c = p.c;
  const device::NvlinkTransport& t = c.transport;
  if (!device::op_enter(t, c.wait, c.signature)) return;
  MoeFlags& flags = *op_flags<MoeFlags, OpId::kMoeDispatch>(t.my_pad());
  const MoePlan& plan = c.plan;
  const int32_t me = t.local_rank, L = plan.experts_per_rank;
  __shared__ uint64_t n;
  __shared__ int failed;
  __shared__ int32_t warp_hits[kMoeWarps];
  __shared__ int32_t row[kMoeMaxTopk], expert[kMoeMaxTopk], primary[kMoeMaxTopk];
  __shared__ int32_t warp_row[kMoeWarps][32], warp_expert[kMoeWarps][32];
  __shared__ MoeSmallShared small_shared;
  int32_t(&small_runs)[2][kMoeSmallExperts] = small_shared.runs;
  // This CTA's chunk of the tokens, [lo, hi): numbered here when numbering by chunks, sent in phase 2.
  // (int32: T x k rows fit the handle, so T is far below 2^31 - CTAs; int64 kept per_cta live, 9 more registers.)
  const int32_t per_cta = (c.tokens + static_cast<int32_t>(gridDim.x) - 1) / static_cast<int32_t>(gridDim.x);
  const int32_t lo = min(c.tokens, static_cast<int32_t>(blockIdx.x) * per_cta), hi = min(c.tokens, lo + per_cta);
  const int64_t entries = static_cast<int64_t>(c.tokens) * plan.topk;
  const bool small = plan.experts <= kMoeSmallExperts &&
                     (entries <= kMoeOneCtaEntries || static_cast<int64_t>(per_cta) * plan.topk <= kMoeChunkEntries);
  const bool one_cta = small && entries <= kMoeOneCtaEntries;
  if (threadIdx.x == 0) {
    n = op_number(t);
    failed = 0;
    if (blockIdx.x == 0) p.dropped[0] = p.dropped[1] = 0;
  }
  __syncthreads();

  // 0: counts.
  if (one_cta) {
    if (blockIdx.x == 0) {
      number_slots_in<IdxT>(p, 0, static_cast<int32_t>(entries), small_shared, [&](int32_t* start) {
        for (int32_t e = threadIdx.x; e < plan.experts; e += blockDim.x) {
          store_count(c, e, start[e]);
          start[e] = 0;
        }
        __syncthreads();  // every count before the flag
        return true;
      });
      raise_everywhere(c, flags, plan.counts_flag(me), 1, n);
    }
  } else if (small) {
    // By chunks: each CTA's counts into chunk_counts; the last to arrive sums them into the counts
    // and raises the flag; each CTA's slots of e start after those of the CTAs before it.
    const bool numbered = number_slots_in<IdxT>(p, lo * plan.topk, hi * plan.topk, small_shared, [&](int32_t* start) {
      for (int32_t e = threadIdx.x; e < plan.experts; e += blockDim.x) {
        p.chunk_counts[static_cast<int64_t>(e) * gridDim.x + blockIdx.x] = start[e];
      }
      if (arrive(flags, n, 0)) {
        sum_chunk_counts(p, gridDim.x, [&](int32_t e, int32_t count) { store_count(c, e, count); });
        __syncthreads();  // every count before the flag
        raise_everywhere(c, flags, plan.counts_flag(me), 1, n);
      }
      if (!await_all(flags, n, 0, c.wait, &failed)) return false;
      if (lo < hi) {  // the same on every thread; an empty chunk numbers nothing
        sum_chunk_counts(p, blockIdx.x, [&](int32_t e, int32_t before) { start[e] = before; });
      }
      __syncthreads();
      return true;
    });
    if (!numbered) return;
  } else {
    for (int32_t e = blockIdx.x; e < plan.experts; e += gridDim.x) {
      const int32_t count = number_slots<IdxT>(p, e, warp_hits);
      if (threadIdx.x < plan.world) {
        *reinterpret_cast<int32_t*>(t.heaps[threadIdx.x] + c.workspace + plan.count_offset(me, e)) = count;
      }
    }
    if (arrive(flags, n, 0)) raise_everywhere(c, flags, plan.counts_flag(me), 1, n);
  }

  // 1: the layout. Waiting for this rank's own counts flag also waits for the numbering of the slots
  // that other CTAs send (every CTA's of its experts', or CTA 0's of all; by chunks, each CTA sends
  // only the slots it numbered).
  if (!await_flags(c, flags, plan.counts_flag(0), plan.world, n, FlagId::kCounts, [](int32_t s) { return s; },
                   &failed)) {
    return;
  }
  MoeRuns runs{p.run_row, p.run_kept};
  if (small) {
    for (int32_t e = threadIdx.x; e < plan.experts; e += blockDim.x) {
      lay_out_expert(p, e, small_runs[0], small_runs[1], /*record=*/blockIdx.x == 0);
    }
    __syncthreads();
    runs = MoeRuns{small_runs[0], small_runs[1]};
  } else {
    lay_out(p, blockIdx.x, gridDim.x);
    arrive(flags, n, 1);
    if (!await_all(flags, n, 1, c.wait, &failed)) return;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) report_drops(p, n);

  // 2: tokens out.
  // A warp per token once there are more tokens than CTAs (Mixtral-like, 4096 tokens: 168 -> 150 us);
  // with fewer (decode, 128 tokens) a CTA per token spreads them wider (77 -> 84 us with warps).
  // Each CTA its own chunk: numbered by chunks, a slot's number is only sure to be written for the CTA
  // that numbered it.
  if (plan.topk <= 32 && c.tokens > static_cast<int32_t>(gridDim.x)) {
    const int32_t w = static_cast<int32_t>(threadIdx.x / 32);
    for (int32_t token = lo + w; token < hi; token += kMoeWarps) {
      send_token_warp<IdxT>(p, runs, token, warp_row[w], warp_expert[w]);
    }
  } else {
    for (int32_t token = lo; token < hi; ++token) send_token<IdxT>(p, runs, token, row, expert, primary);
  }
  // With one rank, phase 2 wrote every kept slot here as its own primary: there is no secondary to
  // fill and nothing to wait for, and the kernel's end orders the rows before the stream's next work
  // (at world size 1 the arrival, its wait and phase 3's walk were 11 of the Mixtral-like dispatch's
  // 63 us in the phase probe, 1 x H100).
  if (plan.world == 1) {
    device::op_end(t);
    return;
  }
  if (arrive(flags, n, 2)) raise_everywhere(c, flags, plan.arrived_flag(me, 0), L, n);

  // 3: secondary slots from their primaries, once every source's rows are here. In the small layout
  // this rank's own arrived flags, raised after every CTA has counted itself done with phase 2, are
  // also what orders CTA 0's expert_start / expert_rows (phase 1) before for_kept_rows reads them.
  if (!await_flags(c, flags, plan.arrived_flag(0, 0), plan.world * L, n, FlagId::kArrived,
                   [L](int32_t i) { return i / L; }, &failed)) {
    return;
  }
  char* recv = c.workspace_here + plan.recv_offset;
  const MoeSlot* slots = reinterpret_cast<const MoeSlot*>(c.workspace_here + plan.slots_offset);
  for_kept_rows(c, small_runs, [&](int32_t r) {  // after await_flags' __syncthreads: phase 2 is done with it
    const int32_t from = slots[r].primary_row;
    if (from != r && from >= 0 && from < plan.recv_rows) {
      warp_copy(recv + static_cast<int64_t>(r) * plan.row_bytes, recv + static_cast<int64_t>(from) * plan.row_bytes,
                plan.row_bytes);
    }
  });
  device::op_end(t);
}

__global__ void __launch_bounds__(kMoeThreads, 1) moe_combine_kernel(const __grid_constant__ MoeCombineParams p) {
  using namespace moe_detail;
  const MoeCommonParams& c = p.c;
  const device::NvlinkTransport& t = c.transport;
  if (!device::op_enter(t, c.wait, c.signature)) return;
  MoeFlags& flags = *op_flags<MoeFlags, OpId::kMoeCombine>(t.my_pad());
  const MoePlan& plan = c.plan;
  const int32_t me = t.local_rank, L = plan.experts_per_rank;
  __shared__ uint64_t n;
  __shared__ int failed;
  __shared__ int32_t stage[2][kMoeSmallExperts];
  if (threadIdx.x == 0) {
    n = op_number(t);
    failed = 0;
  }
  __syncthreads();

  // 0: every kept row's output to its home.
  const MoeSlot* slots = reinterpret_cast<const MoeSlot*>(c.workspace_here + plan.slots_offset);
  for_kept_rows(c, stage, [&](int32_t r) {
    const MoeSlot s = slots[r];
    if (!valid_home(plan, s)) return;  // never for a kept row: the dispatch wrote its metadata
    warp_copy(t.heaps[s.source_rank] + c.workspace + plan.combine_row_offset(s.source_token, s.topk_pos),
              p.expert_out + static_cast<int64_t>(r) * plan.row_bytes, plan.row_bytes);
  });
  if (arrive(flags, n, 0)) raise_everywhere(c, flags, plan.combined_flag(plan.expert_of(me, 0)), L, n);

  // 1: the sums at home, once every expert's outputs are here.
  if (!await_flags(c, flags, plan.combined_flag(0), plan.experts, n, FlagId::kCombined,
                   [L](int32_t e) { return e / L; }, &failed)) {
    return;
  }
  sum_tokens(p, static_cast<int64_t>(blockIdx.x) * kMoeWarps + threadIdx.x / 32,
             static_cast<int64_t>(gridDim.x) * kMoeWarps);
  device::op_end(t);
}

}  // namespace interlace
