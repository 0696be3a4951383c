// What moe's kernels share (ops/moe/kernel.cuh, gemm_combine.cuh, dispatch_gemm.cuh): their parameters
// and the device functions of their phases. No kernels here: several launch files include it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "interlace/device/op_sequence.cuh"
#include "interlace/device/transport.cuh"
#include "interlace/ops/moe/flags.h"
#include "interlace/ops/moe/plan.h"

namespace interlace {

constexpr int kMoeThreads = 512;
constexpr int kMoeWarps = kMoeThreads / 32;
static_assert(kMoeThreads >= kMoeMaxTopk, "a thread per top-k entry of a token");
static_assert(kMoeThreads >= kMaxLocalRanks, "op_begin needs a thread per peer");

// moe_dispatch's numbering of its slots (ops/moe/kernel.cuh). With at most kMoeSmallExperts experts
// every CTA lays the runs out for itself in shared memory (the small layout), and the slots are
// numbered either by CTA 0 alone, up to kMoeOneCtaEntries top-k entries on the rank (a decode: no
// grid barrier at all; the Mixtral-like decode spent most of its time in three of them, 27 -> 21 us
// under graphs, bench/results/moe_small_layout_1xH100.log), or past that by every CTA, a chunk of
// the tokens each, with one grid barrier to learn where each chunk's slots start (CTA 0 alone took
// 86 of the 4096-token DeepSeek-like dispatch's 240 us, moe_world1_exit_1xH100.log). A chunk's counts
// fit number_slots_in's uint16 tally: at most kMoeChunkEntries entries.
constexpr int32_t kMoeOneCtaEntries = 1024;
constexpr int32_t kMoeChunkEntries = 65535;
constexpr int32_t kMoeSmallExperts = 1024;
constexpr int kMoeNumberBatch = 8;  // rounds of 32 entries a warp of number_slots_in loads at once

// The small layout's shared memory: the numbering's tally and each expert's first slot number while
// a CTA numbers slots, then every CTA's runs of every expert (run_row, run_kept), then phase 3's
// stage of the local experts' runs.
union MoeSmallShared {
  struct {
    uint16_t tally[kMoeWarps][kMoeSmallExperts];
    int32_t start[kMoeSmallExperts];
  } number;
  int32_t runs[2][kMoeSmallExperts];
};

// What both kernels share: where the handle's workspace is, its local arrays.
struct MoeCommonParams {
  device::NvlinkTransport transport;
  device::WaitContext wait;
  uint64_t signature;
  MoePlan plan;
  int32_t tokens;            // this rank's T (<= plan.tokens)
  uint64_t workspace;        // heap offset of the handle's workspace: the plan's offsets start there
  char* workspace_here;      // this rank's, as mapped here
  int32_t* home_row;         // [tokens][k]: the slot's receive row at its expert's rank; -1 unused or dropped
  float* home_weight;        // [tokens][k]
  int32_t* expert_start;     // [L]: a local expert's first receive row
  int32_t* expert_rows;      // [L]: its kept rows
};

struct MoeDispatchParams {
  MoeCommonParams c;
  const char* x;             // [tokens][row_bytes]
  const void* topk_idx;      // [tokens][k], the kernel's IdxT
  const float* topk_weights; // [tokens][k]
  // Scratch of this call only.
  int32_t* pos;              // [tokens][k]: the slot's number among this rank's slots for its expert
  int32_t* run_row;          // [E]: this rank's run's first receive row for expert e (unclipped)
  int32_t* run_kept;         // [E]: its kept rows
  int32_t* dropped;          // [2]: slots dropped on all ranks, on this rank (zeroed in phase 0)
  int32_t* chunk_counts;     // [E][gridDim.x]: slots of expert e in CTA b's chunk (numbering by chunks)
};

// This rank's run of each expert (first receive row, kept rows): the call's scratch, or a CTA's own
// copy in shared memory (the small layout).
struct MoeRuns {
  const int32_t* row;
  const int32_t* kept;
};

struct MoeCombineParams {
  MoeCommonParams c;
  const char* expert_out;    // [recv_rows][row_bytes]: the experts' outputs, in expert_x's layout
  char* out;                 // [tokens][row_bytes]
};

namespace moe_detail {

// Whether a kept row's slot names a home inside the plan: the dispatch wrote it, but nothing read
// from device memory addresses anything unchecked.
__device__ __forceinline__ bool valid_home(const MoePlan& plan, const MoeSlot& s) {
  return s.source_rank >= 0 && s.source_rank < plan.world && s.source_token >= 0 && s.source_token < plan.tokens &&
         s.topk_pos >= 0 && s.topk_pos < plan.topk;
}

// This call's op number: ops.completed only moves in op_end, once every CTA of the op is out.
__device__ __forceinline__ uint64_t op_number(const device::NvlinkTransport& t) {
  return *reinterpret_cast<volatile uint64_t*>(&t.my_pad()->ops.completed) + 1;
}

// All threads of a CTA, every CTA of the grid, at the end of `phase` of op n: counts this CTA done,
// once its stores (into peers too) are visible system-wide, and returns on every thread whether it
// was the grid's last. The last resets the count and raises f.release to n x kMoePhases + phase
// (what await_all waits for), ordered after every other CTA's stores, seen through their counts; it
// may also raise flags itself, so that no CTA waits for the others. One atomic a CTA and one word to
// poll: a word per CTA, which CTA 0 polled in turns, cost 4-5 us a barrier (phase probe, the
// twenty-sixth session). No CTA counts again before the reset: only after the release, or after what
// the last CTA raises next. A wait that fails (and so a call cut short, leaving a count behind)
// aborts the group for good.
__device__ __forceinline__ bool arrive(MoeFlags& f, uint64_t n, uint64_t phase) {
  const bool last = device::last_cta_to_arrive</*kSystem=*/true>(&f.arrived);
  if (last && threadIdx.x == 0) device::store_release_gpu(&f.release, n * kMoePhases + phase);  // after the reset
  return last;
}

// await_flags polls with the first warp only (await_all with one thread): every CTA waits at once,
// and a poller per thread of every CTA would take L2 bandwidth from the CTAs still copying.
constexpr int kMoePollers = 32;

// All threads: waits until every CTA of the grid has arrived at `phase` of op n. False if the wait
// failed (the group is aborted; the host raises).
__device__ __forceinline__ bool await_all(MoeFlags& f, uint64_t n, uint64_t phase, const device::WaitContext& ctx,
                                          int* failed) {
  if (threadIdx.x == 0 &&
      device::wait_until<false>(&f.release, n * kMoePhases + phase, ctx, FlagId::kBarrier, -1) == 0) {
    *failed = 1;
  }
  __syncthreads();
  return *failed == 0;
}

// All threads: waits until plan flags [first, first + count) reach n; flag i is raised by local
// rank peer_of(i).
template <class PeerOf>
__device__ __forceinline__ bool await_flags(const MoeCommonParams& c, MoeFlags& f, int32_t first, int32_t count,
                                            uint64_t n, FlagId id, PeerOf peer_of, int* failed) {
  for (int32_t i = threadIdx.x; threadIdx.x < kMoePollers && i < count; i += kMoePollers) {
    if (c.transport.wait(&f.plan[first + i], n, c.wait, id, peer_of(i)) == 0) *failed = 1;
  }
  __syncthreads();
  return *failed == 0;
}

// All threads of one CTA: raises plan flags [first, first + count) to n on every rank.
__device__ __forceinline__ void raise_everywhere(const MoeCommonParams& c, MoeFlags& f, int32_t first, int32_t count,
                                                 uint64_t n) {
  const int32_t world = c.plan.world;
  for (int32_t i = threadIdx.x; i < world * count; i += blockDim.x) {
    c.transport.signal(i / count, &f.plan[first + i % count], n);
  }
}

// `threads` threads (this one is `thread`): bytes (a multiple of 16) from src to every destination
// that for_each_dst names, in 16-byte vectors, in rounds of kDepth loads per thread before their
// stores. for_each_dst(store) calls store(dst) once per destination (uint4*): a vector is loaded
// once however many destinations take it, and stores do not wait, so a row into a few places costs
// about what one does. One load in flight per thread made a row wait a memory round trip per 512
// bytes, which set the whole dispatch's pace on moe_dispatch_gemm's few copier SMs; so does a row's
// tail taken a vector at a time, hence the last round's loads are predicated, not looped. The same
// trip count on every thread (a warp's for_each_dst may shuffle). kDepth is what the caller's
// registers allow: the moe kernels' 128 per thread hold 8 comfortably.
constexpr int kCopyDepth = 8;
template <int kDepth = kCopyDepth, class ForEachDst>
__device__ __forceinline__ void copy_to_each(int thread, int threads, const char* src, int64_t bytes,
                                             ForEachDst for_each_dst) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  const int64_t vectors = bytes / 16;
  for (int64_t round = 0; round < vectors; round += kDepth * threads) {
    uint4 held[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int64_t v = round + thread + u * threads;
      if (v < vectors) held[u] = s[v];
    }
    for_each_dst([&](uint4* d) {
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const int64_t v = round + thread + u * threads;
        if (v < vectors) d[v] = held[u];
      }
    });
  }
}

// One warp: bytes (a multiple of 16) from src to dst.
template <int kDepth = kCopyDepth>
__device__ __forceinline__ void warp_copy(char* dst, const char* src, int64_t bytes) {
  copy_to_each<kDepth>(static_cast<int>(threadIdx.x % 32), 32, src, bytes,
                       [dst](auto store) { store(reinterpret_cast<uint4*>(dst)); });
}

// Calls fn(row) for every kept receive row of this rank's local experts, one warp per row over the
// whole grid (all lanes call fn with the same row). Rows are dealt to warps in one sequence over all
// experts, not afresh per expert: with many experts of few rows each, starting every expert at warp
// 0 left the copies to the first CTA (a decode combine ran 50x slower). The lanes read 32 experts'
// runs at once and scan where each one's dealing starts: read an expert at a time, each read waited
// on the one before (256 local experts: 61 us of the DeepSeek-like decode dispatch's 95 on an H100,
// 70 of its combine's 92, phase_probe in bench/results/moe_combine_slices_1xH100.log). Where up to
// kMoeSmallExperts, all threads of the CTA first read every expert's run into `stage` (shared) at
// once: read 32 at a time, each read still waited on the scan before it (the DeepSeek-like decode, 256
// local experts: 6.9 us of its dispatch's phase 3 at world size 1, with no row left to copy). Every
// thread of the CTA calls it.
template <class Fn>
__device__ __forceinline__ void for_kept_rows(const MoeCommonParams& c, int32_t (&stage)[2][kMoeSmallExperts], Fn fn) {
  const int32_t warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int32_t warps = gridDim.x * (blockDim.x / 32);
  const int32_t lane = threadIdx.x % 32, L = c.plan.experts_per_rank;
  const int32_t* expert_start = c.expert_start;
  const int32_t* expert_rows = c.expert_rows;
  if (L <= kMoeSmallExperts) {  // the same on every thread
    for (int32_t l = threadIdx.x; l < L; l += blockDim.x) {
      stage[0][l] = expert_start[l];
      stage[1][l] = expert_rows[l];
    }
    __syncthreads();
    expert_start = stage[0];
    expert_rows = stage[1];
  }
  int32_t before = 0;  // kept rows of the experts before l0, mod warps: where expert l0's first row is dealt
  for (int32_t l0 = 0; l0 < L; l0 += 32) {
    const int32_t l = l0 + lane;
    const int32_t start = l < L ? expert_start[l] : 0;
    const int32_t rows = l < L ? max(expert_rows[l], 0) : 0;
    int32_t through = rows % warps;  // this lane's experts' rows and those of the lanes below, mod warps
    for (int32_t d = 1; d < 32; d *= 2) {
      const int32_t below = __shfl_up_sync(~0u, through, d);
      if (lane >= d) through = (through + below) % warps;
    }
    const int32_t first = (before + through - rows % warps + warps) % warps;  // where this lane's expert starts
    // The experts that deal this warp a row (a decode's few rows reach few warps), one at a time.
    for (uint32_t mine = __ballot_sync(~0u, (warp - first + warps) % warps < rows); mine != 0; mine &= mine - 1) {
      const int32_t q = __ffs(mine) - 1;
      const int32_t start_q = __shfl_sync(~0u, start, q), rows_q = __shfl_sync(~0u, rows, q);
      const int32_t first_q = __shfl_sync(~0u, first, q);
      for (int32_t i = (warp - first_q + warps) % warps; i < rows_q; i += warps) fn(start_q + i);
    }
    before = (before + __shfl_sync(~0u, through, 31)) % warps;
  }
}

template <class IdxT>
__device__ __forceinline__ int32_t expert_at(const MoeDispatchParams& p, int64_t i) {
  const IdxT e = static_cast<const IdxT*>(p.topk_idx)[i];
  return e >= 0 && e < p.c.plan.experts ? static_cast<int32_t>(e) : -1;
}

// Phase 0, all threads (whole warps): numbers this rank's slots for expert e in token order (pos; a
// token lists an expert at most once, so entry order is token order) and returns how many there are.
// warp_hits: shared, a word per warp.
template <class IdxT>
__device__ __forceinline__ int32_t number_slots(const MoeDispatchParams& p, int32_t e, int32_t* warp_hits) {
  const int64_t entries = static_cast<int64_t>(p.c.tokens) * p.c.plan.topk;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t running = 0;
  for (int64_t base = 0; base < entries; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool hit = i < entries && expert_at<IdxT>(p, i) == e;
    const uint32_t ballot = __ballot_sync(~0u, hit);
    if (lane == 0) warp_hits[warp] = __popc(ballot);
    __syncthreads();
    int32_t before = running, total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
      const int32_t hits = warp_hits[w];
      before += w < warp ? hits : 0;
      total += hits;
    }
    if (hit) p.pos[i] = before + __popc(ballot & ((1u << lane) - 1u));
    running += total;
    __syncthreads();  // warp_hits is rewritten in the next round
  }
  return running;
}

// Stores this rank's count of expert e into every rank's counts table.
__device__ __forceinline__ void store_count(const MoeCommonParams& c, int32_t e, int32_t count) {
  for (int32_t d = 0; d < c.plan.world; ++d) {
    *reinterpret_cast<int32_t*>(c.transport.heaps[d] + c.workspace + c.plan.count_offset(c.transport.local_rank, e)) =
        count;
  }
}

// The small layout's phase 0, all threads of a CTA: numbers this rank's slots among the top-k entries
// [lo, hi) in token order (pos). Each warp takes a run of consecutive entries, 32 at a time (the lanes
// of one expert take consecutive places, __match_any_sync), kMoeNumberBatch rounds' entries loaded
// together. A first pass counts the run's slots per expert in tally[warp], which then becomes where
// they start among the CTA's (the counts of the warps before); totals(start) gets the CTA's count of
// each expert in start[] and leaves there where the CTA's slots of each expert start among the
// rank's (false: a wait failed, so does this); a second pass numbers the slots from there, reading
// the entries again only where a warp's run is more than one batch (a decode's stay in registers;
// the DeepSeek-like decode dispatch is still about 1 us slower than with the old one-load numbering
// from shared memory, bench/results/moe_world1_exit_1xH100.log). (One warp over all of a decode's
// 1024 entries was a microsecond slower than the grid's layout, which scans every entry once per
// expert, 512 at a time with two block barriers each.)
template <class IdxT, class Totals>
__device__ __forceinline__ bool number_slots_in(const MoeDispatchParams& p, int32_t lo, int32_t hi,
                                                MoeSmallShared& s, Totals totals) {
  const int32_t E = p.c.plan.experts;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint16_t(&tally)[kMoeWarps][kMoeSmallExperts] = s.number.tally;
  for (int32_t i = threadIdx.x; i < kMoeWarps * E; i += blockDim.x) tally[i / E][i % E] = 0;
  __syncthreads();
  const int32_t rounds = ((hi - lo + 31) / 32 + kMoeWarps - 1) / kMoeWarps;
  const int32_t first = lo + warp * rounds * 32;  // this warp's run: entries [first, first + 32 x rounds)
  int32_t e[kMoeNumberBatch];
  for (int pass = 0; pass < 2; ++pass) {
    for (int32_t u0 = 0; u0 < rounds; u0 += kMoeNumberBatch) {
      if (pass == 0 || rounds > kMoeNumberBatch) {  // the same on every lane of the warp
#pragma unroll
        for (int b = 0; b < kMoeNumberBatch; ++b) {
          const int32_t i = first + (u0 + b) * 32 + lane;
          e[b] = u0 + b < rounds && i < hi ? expert_at<IdxT>(p, i) : -1;
        }
      }
#pragma unroll
      for (int b = 0; b < kMoeNumberBatch; ++b) {
        // Only rounds with entries (the same on every lane): a decode's warp has one or two, and
        // matching all eight cost the DeepSeek-like decode dispatch 0.5 us.
        if (u0 + b >= rounds || first + (u0 + b) * 32 >= hi) continue;
        const uint32_t same = __match_any_sync(~0u, e[b]);
        const int leader = __ffs(same) - 1;
        int32_t before = 0;
        if (lane == leader && e[b] >= 0) {
          before = tally[warp][e[b]];
          tally[warp][e[b]] = static_cast<uint16_t>(before + __popc(same));
        }
        before = __shfl_sync(~0u, before, leader);
        if (pass == 1 && e[b] >= 0) {
          p.pos[first + (u0 + b) * 32 + lane] = s.number.start[e[b]] + before + __popc(same & ((1u << lane) - 1u));
        }
        __syncwarp();  // tally[warp] is read by the next round's leaders
      }
    }
    __syncthreads();
    if (pass == 0) {
      for (int32_t x = threadIdx.x; x < E; x += blockDim.x) {
        int32_t all = 0;
        for (int w = 0; w < kMoeWarps; ++w) {
          const int32_t mine = tally[w][x];
          tally[w][x] = static_cast<uint16_t>(all);
          all += mine;
        }
        s.number.start[x] = all;
      }
      __syncthreads();
      if (!totals(s.number.start)) return false;  // ends with a __syncthreads
    }
  }
  return true;
}

// All threads of a CTA, numbering by chunks: for every expert e, the sum of chunk_counts[e][b] over
// the CTAs b < upto, passed to fn(e, sum) on one lane. A warp takes kExperts experts at once and its
// lanes the CTAs, so that each lane has their loads in flight together (an expert at a time waited a
// round trip each: 16 of them a warp with 256 experts).
template <class Fn>
__device__ __forceinline__ void sum_chunk_counts(const MoeDispatchParams& p, int32_t upto, Fn fn) {
  constexpr int kExperts = 8;
  const int32_t E = p.c.plan.experts;
  const int64_t ctas = gridDim.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int32_t e0 = warp * kExperts; e0 < E; e0 += kMoeWarps * kExperts) {
    int32_t sum[kExperts] = {};
    for (int32_t b = lane; b < upto; b += 32) {
#pragma unroll
      for (int u = 0; u < kExperts; ++u) {
        if (e0 + u < E) sum[u] += p.chunk_counts[(e0 + u) * ctas + b];
      }
    }
#pragma unroll
    for (int u = 0; u < kExperts; ++u) {
      const int32_t all = __reduce_add_sync(~0u, sum[u]);
      if (lane == 0 && e0 + u < E) fn(e0 + u, all);
    }
  }
}

// Phase 1, one thread, expert e, from the exchanged counts: this rank's run of e into run_row and
// run_kept; where `record`, also the slots e drops and, for a local expert, its first and kept rows.
__device__ __forceinline__ void lay_out_expert(const MoeDispatchParams& p, int32_t e, int32_t* run_row,
                                               int32_t* run_kept, bool record) {
  const MoePlan& plan = p.c.plan;
  const int32_t me = p.c.transport.local_rank;
  const int32_t* counts = reinterpret_cast<const int32_t*>(p.c.workspace_here + plan.counts_offset);
  run_row[e] = plan.run_row(counts, me, e);
  run_kept[e] = plan.run_kept(counts, me, e);
  if (!record) return;
  const int32_t kept = plan.kept_rows(counts, e);
  const int32_t lost = plan.expert_total(counts, e) - kept;
  if (lost > 0) atomicAdd(&p.dropped[0], lost);
  if (plan.rank_of_expert(e) == me) {
    const int32_t l = plan.local_expert(e);
    p.c.expert_start[l] = plan.first_row(counts, e);
    p.c.expert_rows[l] = kept;
    if (lost > 0) atomicAdd(&p.dropped[1], lost);
  }
}

// Phase 1, every thread of CTAs 0 .. ctas - 1: the layout of their share of the experts, in the
// call's scratch.
__device__ __forceinline__ void lay_out(const MoeDispatchParams& p, int32_t cta, int32_t ctas) {
  for (int32_t e = cta * blockDim.x + threadIdx.x; e < p.c.plan.experts; e += ctas * blockDim.x) {
    lay_out_expert(p, e, p.run_row, p.run_kept, /*record=*/true);
  }
}

// One thread, once every CTA has laid out: the drops to the host, which raises on them (group.check).
// Every rank sees the same counts, so every rank reports the same drop. (Volatile: other CTAs'
// atomics wrote the sums, in L2.)
__device__ __forceinline__ void report_drops(const MoeDispatchParams& p, uint64_t n) {
  const int32_t dropped_all = *reinterpret_cast<volatile int32_t*>(&p.dropped[0]);
  if (dropped_all == 0) return;
  volatile HostControl* host = p.c.wait.control;
  host->overflow_dropped = dropped_all;
  __threadfence_system();
  host->overflowed = n;
}

// Top-k entry i's receive row at its expert's rank (e: its expert, -1 for unused), or -1 where unused
// or dropped: the plan's kept_row with this rank's run of e and the entry's slot number.
__device__ __forceinline__ int32_t entry_row(const MoeDispatchParams& p, MoeRuns runs, int32_t e, int64_t i) {
  return e >= 0 ? MoePlan::kept_row(runs.row[e], runs.kept[e], p.pos[i]) : -1;
}

// One thread: entry i (token x k + j) of this rank's kept slot's MoeSlot into rank d's slot `row`, as
// one 16-byte store: source_token, source_rank | topk_pos << 16, primary_row, weight.
__device__ __forceinline__ void store_slot(const MoeDispatchParams& p, int32_t d, int32_t row, int64_t i,
                                           int32_t primary_row) {
  const device::NvlinkTransport& t = p.c.transport;
  const int32_t k = p.c.plan.topk;
  const uint4 slot = make_uint4(static_cast<uint32_t>(i / k),
                                static_cast<uint32_t>(t.local_rank & 0xffff) | static_cast<uint32_t>(i % k) << 16,
                                static_cast<uint32_t>(primary_row), __float_as_uint(p.topk_weights[i]));
  *reinterpret_cast<uint4*>(t.heaps[d] + p.c.workspace + p.c.plan.slot_offset(row)) = slot;
}

// Phase 2's first step for top-k entry i (token x k + j) of expert e (-1 unused), on the thread of
// position j: its receive row (-1 unused or dropped), recorded at home (for the combine) and in the
// token's shared row/expert words (for MoePlan::primary_of in the second step).
__device__ __forceinline__ int32_t lay_entry(const MoeDispatchParams& p, MoeRuns runs, int64_t i, int32_t j,
                                             int32_t e, int32_t* row, int32_t* expert) {
  const int32_t r = entry_row(p, runs, e, i);
  row[j] = r;
  expert[j] = e;
  p.c.home_row[i] = r;
  p.c.home_weight[i] = p.topk_weights[i];
  return r;
}

// Phase 2's second step, once the token's row/expert words are all written: where entry i (position
// j) is kept, its MoeSlot at its rank, and the position of its token's primary slot on that rank
// (MoePlan::primary_of with direct_rank); -1 where not kept. The caller writes the token's row into
// every primary.
__device__ __forceinline__ int32_t store_entry_slot(const MoeDispatchParams& p, int64_t i, int32_t j,
                                                    const int32_t* row, const int32_t* expert, int32_t direct_rank) {
  if (row[j] < 0) return -1;
  const int32_t first = p.c.plan.primary_of(expert, row, j, direct_rank);
  store_slot(p, p.c.plan.rank_of_expert(expert[j]), row[j], i, row[first]);
  return first;
}

// Phase 2, all threads of the CTA, for one token: metadata of its kept slots, its row into each of
// its primaries (once per other rank, into every kept slot here). row/expert/primary: shared, one
// entry per top-k position.
template <class IdxT>
__device__ __forceinline__ void send_token(const MoeDispatchParams& p, MoeRuns runs, int32_t token, int32_t* row,
                                           int32_t* expert, int32_t* primary) {
  const MoePlan& plan = p.c.plan;
  const device::NvlinkTransport& t = p.c.transport;
  const int32_t k = plan.topk, j = threadIdx.x;
  const int64_t i = static_cast<int64_t>(token) * k + j;
  if (j < k) lay_entry(p, runs, i, j, expert_at<IdxT>(p, i), row, expert);
  __syncthreads();
  if (j < k) primary[j] = store_entry_slot(p, i, j, row, expert, t.local_rank);
  __syncthreads();
  copy_to_each(static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x),
               p.x + static_cast<int64_t>(token) * plan.row_bytes, plan.row_bytes, [&](auto store) {
                 for (int32_t q = 0; q < k; ++q) {
                   if (primary[q] != q) continue;  // shared: the same on every thread
                   store(reinterpret_cast<uint4*>(t.heaps[plan.rank_of_expert(expert[q])] + p.c.workspace +
                                                  plan.recv_row_offset(row[q])));
                 }
               });
  __syncthreads();  // row, expert and primary are rewritten for the next token
}

// Phase 2 for top-k of at most 32, one warp per token, so that a CTA has a token per warp in flight
// (a CTA per token left 496 of 512 threads waiting on its few stores; Mixtral-like dispatch ran at
// NCCL's all_to_all speed). Lane j takes top-k entry j; row and expert: this warp's shared slots,
// for MoePlan::primary_of, the rule the CTA version and the CPU tests use.
template <class IdxT>
__device__ __forceinline__ void send_token_warp(const MoeDispatchParams& p, MoeRuns runs, int32_t token,
                                                int32_t* row, int32_t* expert) {
  const MoePlan& plan = p.c.plan;
  const device::NvlinkTransport& t = p.c.transport;
  const int32_t k = plan.topk, j = static_cast<int32_t>(threadIdx.x % 32);
  const int64_t i = static_cast<int64_t>(token) * k + j;
  const int32_t e = j < k ? expert_at<IdxT>(p, i) : -1;
  const int32_t r = j < k ? lay_entry(p, runs, i, j, e, row, expert) : -1;
  __syncwarp();
  const int32_t first = j < k ? store_entry_slot(p, i, j, row, expert, t.local_rank) : -1;
  // The lanes of the token's primaries hold where its row goes.
  const uint32_t primaries = __ballot_sync(~0u, first == j);
  uint4* const dst = first == j ? reinterpret_cast<uint4*>(t.heaps[plan.rank_of_expert(e)] + p.c.workspace +
                                                           plan.recv_row_offset(r))
                                : nullptr;
  copy_to_each(j, 32, p.x + static_cast<int64_t>(token) * plan.row_bytes, plan.row_bytes, [&](auto store) {
    for (uint32_t m = primaries; m != 0; m &= m - 1) {
      store(reinterpret_cast<uint4*>(__shfl_sync(~0u, reinterpret_cast<uintptr_t>(dst), __ffs(m) - 1)));
    }
  });
  __syncwarp();  // row and expert are rewritten for the warp's next token
}

// Phase 1 of the combine in slices of a token's row, a warp each, each a whole number of 32-vector
// blocks (a 16-byte vector a lane): as many slices to a row as it takes for the tokens to reach every
// warp. A decode's 128 tokens over 2112 warps, a warp per token, left 128 busy (the DeepSeek-like
// combine 149 us, 92 in slices of one block); 4096 Mixtral-like tokens in one-block slices read each
// token's top-k entries once a block from every warp (combine 113 -> 130 us): there a warp takes the
// whole row, as before.
struct RowSlices {
  int32_t per_row;  // slices of a token's row
  int32_t blocks;   // 32-vector blocks of a slice (the last of a row may have fewer)
};

__device__ __forceinline__ RowSlices row_slices(const MoePlan& plan, int32_t tokens, int64_t warps) {
  const int32_t row_blocks = static_cast<int32_t>((plan.row_bytes / 16 + 31) / 32);
  const int64_t wanted = tokens > 0 ? warps / tokens : 1;
  const int32_t per_row = static_cast<int32_t>(wanted < 1 ? 1 : wanted < row_blocks ? wanted : row_blocks);
  const int32_t blocks = (row_blocks + per_row - 1) / per_row;
  return {(row_blocks + blocks - 1) / blocks, blocks};
}

// acc[0 .. 8) += w x the 8 bf16 of y, in fp32: bf16 to fp32 is exact (the top 16 bits); the rounded
// product, then the rounded sum (no fused multiply-add: the combine's order is its promise).
__device__ __forceinline__ void add_weighted(float (&acc)[8], float w, uint4 y) {
  const uint32_t words[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    acc[2 * h] = __fadd_rn(acc[2 * h], __fmul_rn(w, __uint_as_float(words[h] << 16)));
    acc[2 * h + 1] = __fadd_rn(acc[2 * h + 1], __fmul_rn(w, __uint_as_float(words[h] & 0xffff0000u)));
  }
}

// acc rounded once to 8 bf16.
__device__ __forceinline__ uint4 pack_bf16(const float (&acc)[8]) {
  uint32_t packed[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    packed[h] = uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * h]))} |
                uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * h + 1]))} << 16;
  }
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// A whole row of a token, one warp (sum_slice where a slice is the row): per vector, the kept
// entries one after another. sum_slice's batched loads ran this case 6% slower (4096 Mixtral-like
// tokens: combine 113 against 120 us on an H100, bench/results/NOTES.md, twenty-seventh session).
__device__ __forceinline__ void sum_row(const MoeCombineParams& p, int32_t token) {
  const MoePlan& plan = p.c.plan;
  const int lane = threadIdx.x % 32;
  const int64_t vectors = plan.row_bytes / 16;
  const char* rows = p.c.workspace_here + plan.combine_offset;
  uint4* dst = reinterpret_cast<uint4*>(p.out + static_cast<int64_t>(token) * plan.row_bytes);
  for (int64_t v = lane; v < vectors; v += 32) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int32_t j = 0; j < plan.topk; ++j) {
      const int64_t i = static_cast<int64_t>(token) * plan.topk + j;
      if (p.c.home_row[i] < 0) continue;
      const float w = p.c.home_weight[i];
      add_weighted(acc, w, reinterpret_cast<const uint4*>(
                               rows + static_cast<int64_t>(plan.combine_row(token, j)) * plan.row_bytes)[v]);
    }
    dst[v] = pack_bf16(acc);
  }
}

// One warp, slice s of its token's row (s / per_row is the token): out's vectors there are the
// weighted sum of the token's kept slots' rows, in fp32 in top-k order, one rounding to bf16; zeros
// where none of its slots was kept. kDepth: kept rows loaded at once before they are summed (in
// order), so that the loads of a token's k rows overlap instead of following each other; the
// caller's registers set it. A slice that is the whole row goes to sum_row.
template <int kDepth>
__device__ __forceinline__ void sum_slice(const MoeCombineParams& p, int64_t s, RowSlices slices) {
  if (slices.per_row == 1) {
    sum_row(p, static_cast<int32_t>(s));
    return;
  }
  const MoePlan& plan = p.c.plan;
  const int lane = threadIdx.x % 32;
  const int32_t token = static_cast<int32_t>(s / slices.per_row);
  const int32_t vectors = static_cast<int32_t>(plan.row_bytes / 16);
  const char* rows = p.c.workspace_here + plan.combine_offset;
  uint4* dst = reinterpret_cast<uint4*>(p.out + static_cast<int64_t>(token) * plan.row_bytes);
  const int32_t first = static_cast<int32_t>(s % slices.per_row) * slices.blocks * 32;
  const int32_t last = min(first + slices.blocks * 32, vectors);
  for (int32_t v = first + lane; v - lane < last; v += 32) {  // the same trip count on every lane
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int32_t j0 = 0; j0 < plan.topk; j0 += 32) {
      // Lane q: entry j0 + q's weight, where its slot was kept.
      const int64_t i = static_cast<int64_t>(token) * plan.topk + j0 + lane;
      const bool kept = j0 + lane < plan.topk && p.c.home_row[i] >= 0;
      const float weight = kept ? p.c.home_weight[i] : 0.f;
      uint32_t todo = __ballot_sync(~0u, kept);
      while (todo != 0) {
        uint4 y[kDepth];
        float w[kDepth];
        int taken = 0;
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
          if (todo != 0) {  // the same on every lane
            const int q = __ffs(todo) - 1;
            todo &= todo - 1;
            w[u] = __shfl_sync(~0u, weight, q);
            y[u] = v < last ? reinterpret_cast<const uint4*>(
                                  rows + static_cast<int64_t>(plan.combine_row(token, j0 + q)) * plan.row_bytes)[v]
                            : make_uint4(0, 0, 0, 0);  // a lane past the slice sums zeros it never stores
            taken = u + 1;
          }
        }
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
          if (u < taken) add_weighted(acc, w[u], y[u]);
        }
      }
    }
    if (v < last) dst[v] = pack_bf16(acc);
  }
}

// The combine's sums, on warp `warp` of the grid's `warps`: its share of this rank's tokens, in
// slices of their rows (row_slices), kCopyDepth kept rows loaded at once.
__device__ __forceinline__ void sum_tokens(const MoeCombineParams& p, int64_t warp, int64_t warps) {
  const RowSlices slices = row_slices(p.c.plan, p.c.tokens, warps);
  const int64_t count = static_cast<int64_t>(p.c.tokens) * slices.per_row;
  for (int64_t i = warp; i < count; i += warps) sum_slice<kCopyDepth>(p, i, slices);
}

}  // namespace moe_detail

}  // namespace interlace
