// moe_dispatch_gemm over NVLink: moe_dispatch and the experts' first FFN matmul (a grouped GEMM over
// the local experts' receive rows) in one launch of the GEMM engine (DESIGN.md, "moe_dispatch_gemm").
//
// Phases 0-2 lay the dispatch out in Phases::begin, on every CTA of the grid, each CTA counting
// itself done with each (moe_detail::arrive); then the last copy_ctas CTAs move the rows (Phases::copy) while
// the others run grouped_gemm's tiles over the receive rows, each tile waiting only for its own
// expert (helper warp 1 of the producer warpgroup watches the experts' flags; the producer checks a
// count in shared memory):
//   0. number this rank's slots per expert (pos) and store the counts into every rank's table, as
//      moe_dispatch does; CTA 0 raises counts_flag(me) everywhere;
//   1. with every source's counts here, the plan's closed forms (run_row, run_kept, the experts'
//      first and kept rows, which the GEMM's tile walk reads); CTA 0 also scans this rank's counts
//      into slot_start. Barrier; CTA 0 reports drops;
//   2. a warp per token: its top-k entries' home rows and weights (for the combine), each kept slot's
//      MoeSlot stored at its rank, this rank's entries listed by expert in slot order (slot_list: the
//      entry where it is its token's primary slot on that rank, else -1); the chunk counters zeroed.
//      The copiers wait for every CTA's;
//   3. the copiers' tasks, in local-expert order l = 0, 1, ...: for each destination d, send the rows
//      of d's expert l's primary slots (a token's row lands once per rank, its other slots there
//      filled from it); then, for each source s, fill s's run of this rank's
//      expert l: each secondary row copied from its primary, which lies in a lower expert of the same
//      source (arrived_flag(s, l' <= l)). A task is cut in chunks of kMoeChunkRows rows dealt
//      round-robin over the copiers; the CTA that finishes a task's last chunk raises its flag:
//      arrived_flag(me, l) at d for a send, filled_flag(s, l) here for a fill (chunk counters in the
//      call's scratch: a count in the flag region could pass another plan's wait).
// Each copier takes its chunks in order of expert, and a fill only waits for sends of its own or a
// lower expert, which never wait: the earliest blocked chunk anywhere would wait only on sends whose
// CTAs are running, so the copiers never deadlock. The GEMM CTAs wait on the copiers; the copiers
// wait on the GEMM CTAs only for phase 2, which every CTA finishes in begin, before any tile. Every
// wait is bounded: a failed one returns, the GEMM's producer then loads what is there (the consumers
// never hang) and the call raises.
#pragma once

#include <cstdint>

#include "interlace/device/op_sequence.cuh"
#include "interlace/gemm/grouped_order.h"
#include "interlace/ops/moe/device.cuh"

namespace interlace {

// Rows per chunk of a copier task: 4 per warp of the engine's 12. Small enough that a run of 128
// rows (DeepSeek-like, two ranks) is three chunks, so that every copier has work.
constexpr int32_t kMoeChunkRows = 48;

// Loads in flight per lane of a copier's warp_copy, out of the GEMM kernel's 168 registers per thread
// (which a copier never gives up): a round of 8 KB per warp, a Mixtral-like row (8 KB) in one, a
// DeepSeek-like one (14 KB) in two. 32 spilled (tools/check_sass).
constexpr int kCopierDepth = 16;

// The phases' and the input wait's parameters (one struct, in both places of GemmParams).
template <class Order>
struct MoeDispatchGemmParams {
  MoeDispatchParams dispatch;  // as moe_dispatch's; pos, run_row, run_kept, dropped in the call's scratch
  int32_t* slot_start;         // [E] scratch: where expert e's entries start in slot_list
  int32_t* slot_list;          // [max_tokens x k] scratch: this rank's entries by expert, in pos order: the
                               // entry (token x k + j) where it is its token's primary on that rank, else -1
  uint32_t* chunks;            // [2][W][L] scratch: chunks done per task, sends (by destination) then fills
                               // (by source), zeroed in phase 2
  typename Order::Params order;
  bool wide;                   // topk_idx is int64 (else int32)
};

namespace moe_detail {

__device__ __forceinline__ MoeFlags& dispatch_flags(const device::NvlinkTransport& t) {
  return *op_flags<MoeFlags, OpId::kMoeDispatch>(t.my_pad());
}

// A GEMM CTA's local experts [0, ready) whose runs are whole here from every source: helper warp 1
// raises it expert by expert (Phases::helpers); the producer waits on it (DispatchInputWait) and keeps
// in `seen` how far it has looked. Both 0 from Phases::begin on.
struct ReadyExperts {
  int32_t ready;
  int32_t seen;
};
__device__ __forceinline__ ReadyExperts& ready_experts() {
  __shared__ ReadyExperts experts;
  return experts;
}

__device__ __forceinline__ int32_t expert_of_entry(const MoeDispatchParams& p, bool wide, int64_t i) {
  return wide ? expert_at<int64_t>(p, i) : expert_at<int32_t>(p, i);
}

// Warp 0 of CTA 0: slot_start[e] = this rank's slots for experts before e (its counts row, here
// since the counts flags).
__device__ __forceinline__ void scan_slot_starts(const MoeCommonParams& c, int32_t* slot_start) {
  const MoePlan& plan = c.plan;
  const int lane = threadIdx.x % 32;
  const int32_t* mine = reinterpret_cast<const int32_t*>(c.workspace_here + plan.counts_offset) +
                        static_cast<int64_t>(c.transport.local_rank) * plan.experts;
  int32_t carry = 0;
  for (int32_t base = 0; base < plan.experts; base += 32) {
    const int32_t e = base + lane;
    const int32_t count = e < plan.experts ? mine[e] : 0;
    int32_t sum = count;  // inclusive scan over the warp
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t up = __shfl_up_sync(~0u, sum, o);
      if (lane >= o) sum += up;
    }
    if (e < plan.experts) slot_start[e] = carry + sum - count;
    carry += __shfl_sync(~0u, sum, 31);
  }
}

// All threads of a CTA, after its share of a task: counts the chunk done in `counter`; the CTA that
// completes the task's `chunks` calls raise() (one thread), after every CTA's stores of the task are
// visible system-wide.
template <class Raise>
__device__ __forceinline__ void chunk_done(uint32_t* counter, int32_t chunks, Raise raise) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (atomicAdd(counter, 1u) == static_cast<uint32_t>(chunks - 1)) {
      __threadfence_system();
      raise();
    }
  }
}

// A task's chunks: one at least, so that an empty run's flag is raised too.
__device__ __forceinline__ int32_t chunks_of(int32_t rows) {
  return rows > kMoeChunkRows ? (rows + kMoeChunkRows - 1) / kMoeChunkRows : 1;
}

// Phase 2, one warp per token, top-k <= 32 (lane j: entry token x k + j): the entries' home rows and
// weights; each kept slot's MoeSlot at its rank; the entries in this rank's list by expert
// (slot_list, in slot order): the entry where it is its token's primary on that rank (the copiers
// send its row), else -1. Here on every CTA, with a token per warp, rather than in the copiers: there
// each slot cost a few dependent loads on one warp, and the few copier SMs fell behind on them.
// row/expert: the warp's shared scratch, a word per top-k entry (MoePlan::primary_of reads them).
__device__ __forceinline__ void lay_token_warp(const MoeDispatchParams& p, bool wide, const int32_t* slot_start,
                                               int32_t* slot_list, int32_t token, int32_t* row, int32_t* expert) {
  const int32_t k = p.c.plan.topk, j = static_cast<int32_t>(threadIdx.x % 32);
  const int64_t i = static_cast<int64_t>(token) * k + j;
  const int32_t e = j < k ? expert_of_entry(p, wide, i) : -1;
  if (j < k) lay_entry(p, MoeRuns{p.run_row, p.run_kept}, i, j, e, row, expert);
  __syncwarp();
  if (j < k && e >= 0) {
    // One row a rank, this one too: sending every slot here from x ran the DeepSeek-like layer 3%
    // slower at world size 1 (1 x H100, bench/results/NOTES.md, thirtieth session).
    const int32_t first = store_entry_slot(p, i, j, row, expert, /*direct_rank=*/-1);
    slot_list[slot_start[e] + p.pos[i]] = first == j ? static_cast<int32_t>(i) : -1;
  }
  __syncwarp();  // row and expert are rewritten for the warp's next token
}

// A chunk's row copies, gathered by the copier's threads in one round of loads (a row each) and
// then taken by its warps: source and destination byte addresses.
struct RowCopy {
  const char* from;
  char* to;
};
struct ChunkCopies {
  RowCopy rows[kMoeChunkRows];
  int32_t count;
};

// Every thread of a copier: the chunk's copies from gather(r, &copy) (true where row r needs one),
// for r in [begin, end), then copied by whole warps.
template <class Gather>
__device__ __forceinline__ void copy_chunk(ChunkCopies& chunk, int32_t begin, int32_t end, int64_t row_bytes,
                                          Gather gather) {
  if (threadIdx.x == 0) chunk.count = 0;
  __syncthreads();
  for (int32_t r = begin + static_cast<int32_t>(threadIdx.x); r < end; r += static_cast<int32_t>(blockDim.x)) {
    RowCopy copy;
    if (gather(r, &copy)) chunk.rows[atomicAdd(&chunk.count, 1)] = copy;
  }
  __syncthreads();
  const int32_t warps = static_cast<int32_t>(blockDim.x / 32);
  for (int32_t q = static_cast<int32_t>(threadIdx.x / 32); q < chunk.count; q += warps) {
    warp_copy<kCopierDepth>(chunk.rows[q].to, chunk.rows[q].from, row_bytes);
  }
}

}  // namespace moe_detail

template <class Order>
struct DispatchGemmPhases {
  using Params = MoeDispatchGemmParams<Order>;
  static constexpr bool kEndRegisters = false;

  // Every thread of every CTA: the op handshake, then phases 0-2 over the whole grid (the GEMM
  // cannot start before the layout, so its CTAs lay it out too). Shared scratch: the launch's dynamic
  // shared memory, which holds no pipeline yet (static arrays would come on top of the GEMM's
  // stages, past the SM's 227 KiB).
  __device__ static bool begin(const Params& p) {
    using namespace moe_detail;
    const MoeDispatchParams& d = p.dispatch;
    const MoeCommonParams& c = d.c;
    const device::NvlinkTransport& t = c.transport;
    if (!device::op_enter(t, c.wait, c.signature)) return false;
    MoeFlags& flags = dispatch_flags(t);
    const MoePlan& plan = c.plan;
    const int32_t me = t.local_rank, world = plan.world, L = plan.experts_per_rank;
    const int32_t cta = static_cast<int32_t>(blockIdx.x), ctas = static_cast<int32_t>(gridDim.x);
    __shared__ uint64_t n;
    __shared__ int failed;
    extern __shared__ __align__(16) int32_t phase_smem[];
    int32_t* warp_hits = phase_smem;
    if (threadIdx.x == 0) {
      n = op_number(t);
      failed = 0;
      ready_experts() = ReadyExperts{0, 0};
      if (cta == 0) d.dropped[0] = d.dropped[1] = 0;
    }
    __syncthreads();

    // 0: counts.
    for (int32_t e = cta; e < plan.experts; e += ctas) {
      const int32_t count = p.wide ? number_slots<int64_t>(d, e, warp_hits) : number_slots<int32_t>(d, e, warp_hits);
      if (threadIdx.x < world) {
        *reinterpret_cast<int32_t*>(t.heaps[threadIdx.x] + c.workspace + plan.count_offset(me, e)) = count;
      }
    }
    if (arrive(flags, n, 0)) raise_everywhere(c, flags, plan.counts_flag(me), 1, n);

    // 1: the layout.
    if (!await_flags(c, flags, plan.counts_flag(0), world, n, FlagId::kCounts, [](int32_t s) { return s; },
                     &failed)) {
      return false;
    }
    lay_out(d, cta, ctas);
    if (cta == 0 && threadIdx.x < 32) scan_slot_starts(c, p.slot_start);
    arrive(flags, n, 1);
    if (!await_all(flags, n, 1, c.wait, &failed)) return false;
    if (cta == 0 && threadIdx.x == 0) report_drops(d, n);

    // 2: per token, its entries' home rows and weights, MoeSlots and list places.
    const int32_t warp = static_cast<int32_t>(threadIdx.x / 32), warps = static_cast<int32_t>(blockDim.x / 32);
    int32_t(*warp_row)[32] = reinterpret_cast<int32_t(*)[32]>(phase_smem + kMoeWarps);
    int32_t(*warp_expert)[32] = warp_row + kMoeWarps;
    for (int32_t token = cta * warps + warp; token < c.tokens; token += ctas * warps) {
      lay_token_warp(d, p.wide, p.slot_start, p.slot_list, token, warp_row[warp], warp_expert[warp]);
    }
    for (int32_t i = cta * blockDim.x + threadIdx.x; i < 2 * world * L; i += ctas * blockDim.x) p.chunks[i] = 0;
    arrive(flags, n, 2);  // the copiers wait for it; the GEMM needs only the layout
    return true;
  }

  // The producer warpgroup's warp 1 (threads 0-31 of 96) of a GEMM CTA, during the GEMM: waits for
  // each local expert's filled flags from every source, in the order the copiers fill them, and
  // raises ready_experts().ready past it. In the producer warp itself these waits spilled its 40
  // registers. A failed wait has recorded why and returns: the experts still count as ready, so the
  // producer never hangs, and the call raises.
  __device__ static void helpers(const Params& p, int thread, int /*threads*/) {
    using namespace moe_detail;
    if (thread >= 32) return;
    const MoeCommonParams& c = p.dispatch.c;
    const uint64_t n = op_number(c.transport);
    MoeFlags& flags = dispatch_flags(c.transport);
    int32_t* ready = &ready_experts().ready;
    for (int32_t l = 0; l < c.plan.experts_per_rank; ++l) {
      for (int32_t s = thread; s < c.plan.world; s += 32) {
        device::wait_until<false>(&flags.plan[c.plan.filled_flag(s, l)], n, c.wait, FlagId::kFilled, s);
      }
      __syncwarp();
      if (thread == 0) {
        __threadfence_block();  // release: the waits above before the count (an atomic: racecheck
        atomicExch(ready, l + 1);  // takes plain shared stores and loads across warps for races)
      }
    }
  }

  // Every thread of copier `cta` of `ctas`: phase 3, once every CTA has done phase 2.
  __device__ static void copy(const Params& p, int cta, int ctas) {
    using namespace moe_detail;
    const MoeDispatchParams& d = p.dispatch;
    const MoeCommonParams& c = d.c;
    const device::NvlinkTransport& t = c.transport;
    MoeFlags& flags = dispatch_flags(t);
    const MoePlan& plan = c.plan;
    const int32_t me = t.local_rank, world = plan.world, L = plan.experts_per_rank;
    __shared__ uint64_t n;
    __shared__ int failed;
    extern __shared__ __align__(16) char copier_smem[];  // as begin's: no pipeline in a copier
    ChunkCopies& copies = *reinterpret_cast<ChunkCopies*>(copier_smem);
    if (threadIdx.x == 0) {
      n = op_number(t);
      failed = 0;
    }
    __syncthreads();
    if (!await_all(flags, n, 2, c.wait, &failed)) return;

    // 3: sends and fills, expert by expert.
    const int32_t* counts = reinterpret_cast<const int32_t*>(c.workspace_here + plan.counts_offset);
    char* recv = c.workspace_here + plan.recv_offset;
    const MoeSlot* slots = reinterpret_cast<const MoeSlot*>(c.workspace_here + plan.slots_offset);
    int32_t next = 0;  // the chunk's number in the order every copier walks
    for (int32_t l = 0; l < L; ++l) {
      for (int32_t i = 1; i <= world; ++i) {  // the next rank first, this rank last
        const int32_t to = (me + i) % world, e = plan.expert_of(to, l);
        const int32_t rows = d.run_kept[e], chunks = chunks_of(rows);
        const int32_t* listed = p.slot_list + p.slot_start[e];
        char* run = t.heaps[to] + c.workspace + plan.recv_row_offset(d.run_row[e]);
        for (int32_t chunk = 0; chunk < chunks; ++chunk, ++next) {
          if (next % ctas != cta) continue;
          // The primaries' rows (the MoeSlots went out in phase 2).
          copy_chunk(copies, chunk * kMoeChunkRows, min(rows, (chunk + 1) * kMoeChunkRows), plan.row_bytes,
                     [&](int32_t r, RowCopy* copy) {
                       const int32_t entry = listed[r];
                       *copy = {d.x + static_cast<int64_t>(entry / plan.topk) * plan.row_bytes,
                                run + static_cast<int64_t>(r) * plan.row_bytes};
                       return entry >= 0;
                     });
          chunk_done(&p.chunks[to * L + l], chunks,
                     [&] { t.signal(to, &flags.plan[plan.arrived_flag(me, l)], n); });
        }
      }
      const int32_t e = plan.expert_of(me, l);
      for (int32_t s = 0; s < world; ++s) {
        const int32_t first = plan.run_row(counts, s, e), rows = plan.run_kept(counts, s, e), chunks = chunks_of(rows);
        for (int32_t chunk = 0; chunk < chunks; ++chunk, ++next) {
          if (next % ctas != cta) continue;
          // The run's slots and primaries, and the primaries of its secondaries (lower experts of s).
          if (!await_flags(c, flags, plan.arrived_flag(s, 0), l + 1, n, FlagId::kArrived,
                           [s](int32_t) { return s; }, &failed)) {
            return;
          }
          // Each secondary row from its primary.
          copy_chunk(copies, first + chunk * kMoeChunkRows, first + min(rows, (chunk + 1) * kMoeChunkRows),
                     plan.row_bytes, [&](int32_t r, RowCopy* copy) {
                       const int32_t from = slots[r].primary_row;
                       *copy = {recv + static_cast<int64_t>(from) * plan.row_bytes,
                                recv + static_cast<int64_t>(r) * plan.row_bytes};
                       return from != r && from >= 0 && from < plan.recv_rows;
                     });
          chunk_done(&p.chunks[(world + s) * L + l], chunks,
                     [&] { device::store_release_gpu(&flags.plan[plan.filled_flag(s, l)], n); });
        }
      }
    }
  }

  // Every thread of every CTA, last.
  __device__ static void end(const Params& p) { device::op_end(p.dispatch.c.transport); }
};

// Before a tile's rows are loaded: its expert ready (the helper warp has seen every source's run of
// it whole), then a proxy fence so that TMA (the async proxy) sees what the copiers stored. Waiting
// for the whole expert rather than the sources of the tile's own rows costs little: the copiers go
// expert by expert for every source at once, and the tile walk takes experts in the same order.
template <class Order>
struct DispatchInputWait {
  using Params = MoeDispatchGemmParams<Order>;

  __device__ static bool wait(const Params& p, int m_idx, int /*n_idx*/) {
    using namespace moe_detail;
    int32_t group, row;
    Order::locate(p.order, m_idx, group, row);
    ReadyExperts& experts = ready_experts();
    if (group < experts.seen) return false;  // loaded from before, after a fence
    int32_t ready;
    do {
      ready = atomicAdd(&experts.ready, 0);
    } while (ready <= group);
    __threadfence_block();  // acquire: the helper's waits before the loads below
    __syncwarp();
    if (threadIdx.x % 32 == 0) experts.seen = ready;
    __syncwarp();
    asm volatile("fence.proxy.async.global;" ::: "memory");
    return false;
  }
};

}  // namespace interlace
