// Host and device plan of expert-parallel MoE dispatch and combine (issue 12), CPU-tested
// (tests/cc/moe_plan_test.cc). ops/moe/kernel.cuh executes it (moe_dispatch, moe_combine).
//
// W ranks, E experts (E % W == 0), L = E / W experts per rank: expert e lives on rank e / L as its
// local expert e % L. Every rank has up to T tokens, each routed to k distinct experts (topk_idx
// [T, k]; -1 marks an unused entry). A (token, expert) pair is a slot; its row is H bytes.
//
// - Counts. counts[s * E + e] is the number of source s's tokens routed to expert e. Every rank
//   stores its row of E counts into every rank's table, then raises that rank's counts flag: after
//   the exchange every rank holds the whole W x E table, so all ranks compute the same layout and
//   agree on whether anything overflowed. Nothing is sent back to the host.
// - Receive layout on rank d. Each local expert has a region of rows; within it, one contiguous run
//   per source rank, in source order, whose rows are that source's tokens for the expert in token
//   order. A run starts at the exclusive prefix over sources of the expert's counts (run_start). The
//   region is either `capacity` rows per local expert (kPerExpert: expert l at rows [l C, (l+1) C))
//   or `capacity` rows for the whole rank (kPerRank: experts packed in order, expert l starting at the
//   exclusive prefix of the local experts' totals). The host only sizes the buffers; the device
//   evaluates the IL_HOST_DEVICE formulas below on the exchanged counts.
// - Overflow. A slot whose row falls past its region's end is dropped: the excess of each expert is
//   the last sources' last tokens (kPerRank: the last experts'), the same on every rank and every run.
//   Nothing is written past a region; every rank sees the drop in the counts and reports it to its
//   host; the home rank's combine gives a dropped slot nothing (it is left out of the weighted sum).
// - Routing-aware dispatch. A token crosses to each distinct other rank among its experts once (a
//   token whose k experts are all on one other rank travels once): its row lands in its primary slot
//   on that rank, the kept slot of its lowest-numbered expert there; the slot metadata of each of its
//   other kept slots there names the primary row, from which the receiver fills them with a local
//   copy. In moe_dispatch, on the token's own rank every kept slot is its own primary, written
//   straight from the token's row: a local write either way, and a fill would first read the row
//   back (moe_dispatch_gemm's copiers keep one row a rank there too: measured faster). A (token,
//   rank) pair none of whose slots was kept does not travel.
// - Combine. Each kept slot's metadata (MoeSlot) names its home: source rank, source token, position
//   in the token's top-k, weight. The second GEMM's epilogue stores the slot's output row at home,
//   row token * k + j of the home rank's combine buffer; the home rank sums j = 0 .. k-1 in fp32 in
//   that order with its weights, skipping unused and dropped entries (it knows them from the counts):
//   deterministic.
//
// Everything a kernel evaluates is closed form over the plan (a few integers, a kernel parameter)
// and the exchanged counts: nothing is uploaded per shape or per routing, so a MoE layer can be
// captured in a CUDA graph. moe_reference() computes the same layout by walking the routing, and is
// what the GPU kernels will be tested against (its own-rank primary rows are moe_dispatch's;
// moe_dispatch_gemm's are primary_of's with direct_rank -1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "interlace/base/host_device.h"
#include "interlace/device/signal_pad.h"

namespace interlace {

constexpr int kMoeMaxRanks = kMaxLocalRanks;  // NVLink only, for now
constexpr int kMoeMaxTopk = 256;              // MoeSlot::topk_pos is 16 bits
constexpr int64_t kMoeRowAlignBytes = 16;     // rows move with 16-byte vector stores / TMA
constexpr uint64_t kMoeBufferAlign = 256;     // every buffer of the workspace starts 256-byte aligned
// Flags are 64-bit op numbers (values only grow: waits are ">=", nothing is reset); an op's region
// of the signal pad holds this many, after the grid barrier's two words (ops/moe/flags.h).
constexpr int64_t kMoeMaxFlags = static_cast<int64_t>(kOpRegionBytes / sizeof(uint64_t)) - 2;

enum class MoeCapacityKind : int32_t {
  kPerExpert = 0,  // capacity rows for each local expert
  kPerRank = 1,    // capacity rows for all of a rank's local experts together
};

// The metadata of one receive row (one kept slot), written by the sender beside the row.
struct MoeSlot {
  int32_t source_token = -1;  // the token's row on its home rank
  int16_t source_rank = -1;   // the home rank; -1 in moe_reference for a row nothing landed in
  int16_t topk_pos = -1;      // j: the slot is topk_idx[source_token][j] at home
  int32_t primary_row = -1;   // the receive row the token's data landed in (this row when primary)
  float weight = 0.0f;        // topk_weights[source_token][j] (the home rank applies it when summing)
};
static_assert(sizeof(MoeSlot) == 16, "MoeSlot is one 16-byte store");

// What the caller decides; make_moe_plan checks it.
struct MoeShape {
  int world = 1;
  int64_t experts = 1;
  int topk = 1;
  int64_t row_bytes = 0;  // H: bytes per token row (hidden x element size), a multiple of 16
  int64_t tokens = 0;     // T: most tokens any rank dispatches
  int64_t capacity = 0;   // receive rows per local expert (kPerExpert) or per rank (kPerRank)
  MoeCapacityKind capacity_kind = MoeCapacityKind::kPerExpert;
};

// One call's plan; the same on every rank (a kernel parameter, under 256 bytes).
struct MoePlan {
  int32_t world = 1;
  int32_t experts = 1;
  int32_t experts_per_rank = 1;  // L
  int32_t topk = 1;
  int32_t tokens = 0;
  int32_t capacity = 0;
  MoeCapacityKind capacity_kind = MoeCapacityKind::kPerExpert;
  int32_t recv_rows = 0;         // rows of each rank's receive buffer: L x capacity, or capacity
  int32_t combine_rows = 0;      // T x k: one per (token, top-k entry) at home
  int32_t flags = 0;             // flags in the op's region of the signal pad (below)
  int64_t row_bytes = 0;
  // The symmetric workspace, byte offsets from its start; the same on every rank.
  uint64_t recv_offset = 0;      // [recv_rows][row_bytes]: the experts' input rows
  uint64_t slots_offset = 0;     // [recv_rows] MoeSlot
  uint64_t counts_offset = 0;    // [world][experts] int32: the exchanged counts
  uint64_t combine_offset = 0;   // [combine_rows][row_bytes]: the experts' outputs, at home
  uint64_t heap_bytes = 0;       // the whole workspace
  uint64_t flag_bytes = 0;       // flags x 8

  // ---- Experts.
  IL_HOST_DEVICE int32_t rank_of_expert(int32_t e) const { return e / experts_per_rank; }
  IL_HOST_DEVICE int32_t local_expert(int32_t e) const { return e % experts_per_rank; }
  IL_HOST_DEVICE int32_t expert_of(int32_t d, int32_t l) const { return d * experts_per_rank + l; }

  // ---- The receive layout, from the exchanged counts ([world][experts], counts[s * experts + e]).
  // Every sum below is bounded by make_moe_plan's 32-bit check. A kernel evaluates them once per
  // call (a scan over W x L counts into shared memory); these formulas are their definition.
  IL_HOST_DEVICE int32_t count(const int32_t* counts, int32_t s, int32_t e) const { return counts[s * experts + e]; }
  // Slots routed to expert e from every source.
  IL_HOST_DEVICE int32_t expert_total(const int32_t* counts, int32_t e) const {
    int32_t total = 0;
    for (int32_t s = 0; s < world; ++s) total += count(counts, s, e);
    return total;
  }
  // Where source s's run starts within expert e's region: the exclusive prefix over sources.
  IL_HOST_DEVICE int32_t run_start(const int32_t* counts, int32_t s, int32_t e) const {
    int32_t start = 0;
    for (int32_t q = 0; q < s; ++q) start += count(counts, q, e);
    return start;
  }
  // Expert e's region on its rank: rows [region_start, region_end). Under kPerRank the start is the
  // exclusive prefix of the rank's earlier experts' totals, unclipped (it may lie past the end).
  IL_HOST_DEVICE int32_t region_start(const int32_t* counts, int32_t e) const {
    if (capacity_kind == MoeCapacityKind::kPerExpert) return local_expert(e) * capacity;
    int32_t start = 0;
    for (int32_t f = e - local_expert(e); f < e; ++f) start += expert_total(counts, f);
    return start;
  }
  IL_HOST_DEVICE int32_t region_end(int32_t e) const {
    return capacity_kind == MoeCapacityKind::kPerExpert ? (local_expert(e) + 1) * capacity : capacity;
  }
  // Rows expert e holds on its rank after drops: the grouped GEMM's M for it, starting at region_start.
  IL_HOST_DEVICE int32_t kept_rows(const int32_t* counts, int32_t e) const {
    const int32_t room = region_end(e) - region_start(counts, e);
    const int32_t total = expert_total(counts, e);
    return room <= 0 ? 0 : (total < room ? total : room);
  }
  // Source s's run for expert e: its first row (unclipped) and how many of its rows are kept.
  IL_HOST_DEVICE int32_t run_row(const int32_t* counts, int32_t s, int32_t e) const {
    return region_start(counts, e) + run_start(counts, s, e);
  }
  IL_HOST_DEVICE int32_t run_kept(const int32_t* counts, int32_t s, int32_t e) const {
    const int32_t room = region_end(e) - run_row(counts, s, e);
    const int32_t rows = count(counts, s, e);
    return room <= 0 ? 0 : (rows < room ? rows : room);
  }
  // The receive row of source s's pos-th token for expert e (pos counts s's earlier tokens routed to
  // e: a per-expert exclusive scan over its topk_idx), or -1 where the slot is dropped.
  IL_HOST_DEVICE int32_t slot_row(const int32_t* counts, int32_t s, int32_t e, int32_t pos) const {
    const int32_t row = run_row(counts, s, e) + pos;
    return row < region_end(e) ? row : -1;
  }
  // Slots rank d drops; whether any rank drops (every rank computes the same answer).
  IL_HOST_DEVICE int32_t dropped_at(const int32_t* counts, int32_t d) const {
    int32_t dropped = 0;
    for (int32_t l = 0; l < experts_per_rank; ++l) {
      const int32_t e = expert_of(d, l);
      dropped += expert_total(counts, e) - kept_rows(counts, e);
    }
    return dropped;
  }
  IL_HOST_DEVICE bool overflowed(const int32_t* counts) const {
    for (int32_t d = 0; d < world; ++d) {
      if (dropped_at(counts, d) > 0) return true;
    }
    return false;
  }

  // ---- The kernels' per-slot rules (ops/moe/kernel.cuh), here so that the CPU tests hold them to
  // moe_reference.
  // A slot numbered pos among its source's slots for its expert, in a run that starts at run_row
  // and keeps run_kept rows: its receive row, or -1 where it is dropped (slot_row, from the run).
  IL_HOST_DEVICE static int32_t kept_row(int32_t run_row, int32_t run_kept, int32_t pos) {
    return pos < run_kept ? run_row + pos : -1;
  }
  // Where expert e's kept rows start: region_start, but kPerRank's unclipped start of an expert left
  // without room is clipped to the region's end (its kept rows are 0).
  IL_HOST_DEVICE int32_t first_row(const int32_t* counts, int32_t e) const {
    const int32_t start = region_start(counts, e), end = region_end(e);
    return start < end ? start : end;
  }
  // Of a token's top-k entries (expert[q], -1 where unused; row[q], -1 where unused or dropped), the
  // position of kept entry j's primary: j itself where j's rank is direct_rank (moe_dispatch: the
  // token's own; moe_dispatch_gemm: -1, none), elsewhere the kept entry of the lowest-numbered
  // expert on j's rank (the lowest position among equal experts, should a routing repeat one).
  IL_HOST_DEVICE int32_t primary_of(const int32_t* expert, const int32_t* row, int32_t j, int32_t direct_rank) const {
    const int32_t d = rank_of_expert(expert[j]);
    if (d == direct_rank) return j;
    int32_t first = j;
    for (int32_t q = 0; q < topk; ++q) {
      if (row[q] < 0 || rank_of_expert(expert[q]) != d) continue;
      if (expert[q] < expert[first] || (expert[q] == expert[first] && q < first)) first = q;
    }
    return first;
  }

  // ---- The combine: slot (token t, top-k entry j) comes home to this row of the combine buffer.
  IL_HOST_DEVICE int32_t combine_row(int32_t t, int32_t j) const { return t * topk + j; }

  // ---- Byte offsets in the workspace.
  IL_HOST_DEVICE uint64_t recv_row_offset(int32_t row) const {
    return recv_offset + static_cast<uint64_t>(row) * static_cast<uint64_t>(row_bytes);
  }
  IL_HOST_DEVICE uint64_t slot_offset(int32_t row) const {
    return slots_offset + static_cast<uint64_t>(row) * sizeof(MoeSlot);
  }
  IL_HOST_DEVICE uint64_t count_offset(int32_t s, int32_t e) const {
    return counts_offset + (static_cast<uint64_t>(s) * experts + e) * sizeof(int32_t);
  }
  IL_HOST_DEVICE uint64_t combine_row_offset(int32_t t, int32_t j) const {
    return combine_offset + static_cast<uint64_t>(combine_row(t, j)) * static_cast<uint64_t>(row_bytes);
  }

  // ---- Flags (64-bit, op numbers) in the op's region of the signal pad, by index.
  // counts_flag(s): source s's counts row has landed here.
  IL_HOST_DEVICE int32_t counts_flag(int32_t s) const { return s; }
  // arrived_flag(s, l): source s's rows and metadata for local expert l have landed here. A sender
  // raises them in local-expert order, so a secondary slot's primary (in a lower expert) has landed
  // by the time its expert's flag is up.
  IL_HOST_DEVICE int32_t arrived_flag(int32_t s, int32_t l) const { return world + s * experts_per_rank + l; }
  // combined_flag(e), on a home rank: expert e's outputs for this rank's tokens have landed.
  IL_HOST_DEVICE int32_t combined_flag(int32_t e) const { return world + experts + e; }
  // filled_flag(s, l), moe_dispatch_gemm's (ops/moe/dispatch_gemm.cuh), local: source s's run of
  // local expert l is whole here, its secondary rows filled from their primaries (the GEMM may load it).
  IL_HOST_DEVICE int32_t filled_flag(int32_t s, int32_t l) const {
    return world + 2 * experts + s * experts_per_rank + l;
  }
  // Every word here is an op number: plans of other shapes index the same region differently, so a
  // word of one is a flag of another, and a plain count in it could pass another's wait (">= n").
};

static_assert(sizeof(MoePlan) <= 256, "MoePlan is a kernel parameter");

// Checks the shape (E % W, k <= E, H a multiple of 16, capacity >= 1, every row index and running
// sum within 32 bits, flags within an op region) and lays out the workspace.
MoePlan make_moe_plan(const MoeShape& shape);

// The smallest capacity with which no routing drops anything: every token of every rank to one
// expert (kPerExpert: W x T), or to min(k, L) experts of one rank (kPerRank).
int64_t moe_no_drop_capacity(const MoeShape& shape);

// ---- Host reference: the layout, by walking every rank's routing (independent of the closed forms).

// A row moe_dispatch's source writes: its token's row into primary_row on dest_rank. Once per other
// rank that keeps one of its slots (into its primary there), once per kept slot on its own rank.
struct MoeTravel {
  int32_t source_rank = 0;
  int32_t token = 0;
  int32_t dest_rank = 0;
  int32_t primary_row = 0;
};

// Source s's run for local expert l on rank d: first row (unclipped), its slots, those kept.
struct MoeRun {
  int32_t row = 0;
  int32_t rows = 0;
  int32_t kept = 0;
};

// One top-k entry of a token, at home: where its expert output comes from.
struct MoeHomeEntry {
  int32_t expert = -1;     // -1: an unused entry
  int32_t dest_rank = -1;  // the expert's rank
  int32_t row = -1;        // its receive row there; -1 when unused or dropped
  float weight = 0.0f;
};

struct MoeReference {
  std::vector<int32_t> counts;                  // [W][E]
  std::vector<MoeRun> runs;                     // [dest][source][local expert]
  std::vector<int32_t> kept_rows;               // [E]: the grouped GEMM's M per expert
  std::vector<std::vector<MoeSlot>> slots;      // [dest][recv_rows]; source_rank -1 where nothing lands
  std::vector<MoeTravel> travels;               // by source, token, destination, row
  std::vector<std::vector<MoeHomeEntry>> home;  // [source][token * k + j]
  std::vector<int64_t> dropped;                 // [dest]: slots dropped there
  bool overflow = false;

  const MoeRun& run(const MoePlan& plan, int d, int s, int l) const {
    return runs[(static_cast<size_t>(d) * plan.world + s) * plan.experts_per_rank + l];
  }
};

// topk_idx[s]: rank s's routing, row-major [T_s, k] with T_s <= plan.tokens, entries in [0, E) or -1,
// no expert twice in a row. topk_weights: empty (weights 1) or the same shapes.
MoeReference moe_reference(const MoePlan& plan, const std::vector<std::vector<int32_t>>& topk_idx,
                           const std::vector<std::vector<float>>& topk_weights = {});

}  // namespace interlace
