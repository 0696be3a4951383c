#include "interlace/ops/moe/plan.h"

#include <algorithm>
#include <limits>

#include "interlace/base/error.h"

namespace interlace {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

uint64_t align_up(uint64_t bytes) { return (bytes + kMoeBufferAlign - 1) / kMoeBufferAlign * kMoeBufferAlign; }

// The largest row index or running sum the closed forms reach: kPerExpert, a run's unclipped end in
// the last expert's region; kPerRank, every source's tokens to min(k, L) of one rank's experts.
int64_t largest_row_sum(const MoeShape& s) {
  const int64_t per_rank = s.experts / s.world;
  if (s.capacity_kind == MoeCapacityKind::kPerExpert) return per_rank * s.capacity + s.world * s.tokens;
  return std::max<int64_t>(s.capacity, s.world * s.tokens * std::min<int64_t>(s.topk, per_rank));
}

}  // namespace

MoePlan make_moe_plan(const MoeShape& s) {
  IL_CHECK(s.world >= 1 && s.world <= kMoeMaxRanks, "moe: 1 to ", kMoeMaxRanks, " ranks, got ", s.world);
  IL_CHECK(s.experts >= 1 && s.experts <= kInt32Max, "moe: bad number of experts ", s.experts);
  IL_CHECK(s.experts % s.world == 0, "moe: ", s.experts, " experts do not divide among ", s.world,
           " ranks (experts must be a multiple of the world size)");
  IL_CHECK(s.topk >= 1 && s.topk <= kMoeMaxTopk, "moe: top-k must be 1 to ", kMoeMaxTopk, ", got ", s.topk);
  IL_CHECK(s.topk <= s.experts, "moe: top-", s.topk, " of only ", s.experts, " experts (k must be <= experts)");
  IL_CHECK(s.row_bytes > 0 && s.row_bytes % kMoeRowAlignBytes == 0, "moe: a token row is ", s.row_bytes,
           " bytes; it must be a positive multiple of ", kMoeRowAlignBytes, " (pad the hidden size)");
  IL_CHECK(s.row_bytes <= kInt32Max, "moe: a token row of ", s.row_bytes, " bytes is too long");
  IL_CHECK(s.tokens >= 0 && s.tokens <= kInt32Max, "moe: bad number of tokens per rank ", s.tokens);
  IL_CHECK(s.capacity_kind == MoeCapacityKind::kPerExpert || s.capacity_kind == MoeCapacityKind::kPerRank,
           "moe: unknown capacity kind ", static_cast<int>(s.capacity_kind));
  const char* per = s.capacity_kind == MoeCapacityKind::kPerExpert ? "per local expert" : "per rank";
  IL_CHECK(s.capacity >= 1 && s.capacity <= kInt32Max, "moe: capacity (receive rows ", per, ") must be 1 to ",
           kInt32Max, ", got ", s.capacity);
  // Under these bounds no product below overflows 64 bits (all factors < 2^31, W <= 72, k <= 256).
  const int64_t per_rank = s.experts / s.world;
  const int64_t recv_rows = s.capacity_kind == MoeCapacityKind::kPerExpert ? per_rank * s.capacity : s.capacity;
  IL_CHECK(recv_rows <= kInt32Max, "moe: ", per_rank, " local experts x capacity ", s.capacity, " = ", recv_rows,
           " receive rows, past 32-bit row indices; lower the capacity");
  IL_CHECK(s.tokens * s.topk <= kInt32Max, "moe: ", s.tokens, " tokens x top-", s.topk,
           " combine rows, past 32-bit row indices; split the call");
  const int64_t largest = largest_row_sum(s);
  IL_CHECK(largest <= kInt32Max, "moe: with ", s.world, " ranks x ", s.tokens, " tokens, top-", s.topk,
           " and capacity ", s.capacity, " ", per, ", row offsets reach ", largest,
           ", past 32-bit row indices; split the call or lower the capacity");
  const int64_t flags = s.world + 3 * s.experts;  // MoePlan's flag indices, the last filled_flag
  IL_CHECK(flags <= kMoeMaxFlags, "moe: ", s.experts, " experts over ", s.world, " ranks need ", flags,
           " flags, more than the ", kMoeMaxFlags, " that fit an op's ", kOpRegionBytes >> 10, " KiB flag region");

  MoePlan p;
  p.world = s.world;
  p.experts = static_cast<int32_t>(s.experts);
  p.experts_per_rank = static_cast<int32_t>(per_rank);
  p.topk = s.topk;
  p.tokens = static_cast<int32_t>(s.tokens);
  p.capacity = static_cast<int32_t>(s.capacity);
  p.capacity_kind = s.capacity_kind;
  p.recv_rows = static_cast<int32_t>(recv_rows);
  p.combine_rows = static_cast<int32_t>(s.tokens * s.topk);
  p.flags = static_cast<int32_t>(flags);
  p.row_bytes = s.row_bytes;
  const uint64_t row_bytes = static_cast<uint64_t>(s.row_bytes);
  p.recv_offset = 0;
  p.slots_offset = align_up(p.recv_offset + static_cast<uint64_t>(recv_rows) * row_bytes);
  p.counts_offset = align_up(p.slots_offset + static_cast<uint64_t>(recv_rows) * sizeof(MoeSlot));
  p.combine_offset = align_up(p.counts_offset + static_cast<uint64_t>(s.world) * s.experts * sizeof(int32_t));
  p.heap_bytes = align_up(p.combine_offset + static_cast<uint64_t>(p.combine_rows) * row_bytes);
  p.flag_bytes = static_cast<uint64_t>(flags) * sizeof(uint64_t);
  return p;
}

int64_t moe_no_drop_capacity(const MoeShape& s) {
  IL_CHECK(s.world >= 1 && s.experts >= s.world && s.experts % s.world == 0 && s.topk >= 1 && s.tokens >= 0,
           "moe: bad shape for a capacity (", s.world, " ranks, ", s.experts, " experts, top-", s.topk, ", ",
           s.tokens, " tokens)");
  const int64_t per_rank = s.experts / s.world;
  const int64_t rows = s.capacity_kind == MoeCapacityKind::kPerExpert
                           ? s.world * s.tokens
                           : s.world * s.tokens * std::min<int64_t>(s.topk, per_rank);
  return std::max<int64_t>(rows, 1);  // a capacity is at least 1
}

MoeReference moe_reference(const MoePlan& plan, const std::vector<std::vector<int32_t>>& topk_idx,
                           const std::vector<std::vector<float>>& topk_weights) {
  const int W = plan.world, E = plan.experts, L = plan.experts_per_rank, k = plan.topk;
  IL_CHECK(static_cast<int>(topk_idx.size()) == W, "moe_reference: routing for ", topk_idx.size(), " ranks, not ", W);
  IL_CHECK(topk_weights.empty() || topk_weights.size() == topk_idx.size(), "moe_reference: weights for ",
           topk_weights.size(), " ranks, not ", W);
  std::vector<int32_t> tokens(W);
  for (int s = 0; s < W; ++s) {
    IL_CHECK(topk_idx[s].size() % k == 0, "moe_reference: rank ", s, "'s topk_idx has ", topk_idx[s].size(),
             " entries, not a multiple of k = ", k);
    IL_CHECK(topk_idx[s].size() / k <= static_cast<size_t>(plan.tokens), "moe_reference: rank ", s, " has ",
             topk_idx[s].size() / k, " tokens, more than the plan's ", plan.tokens);
    IL_CHECK(topk_weights.empty() || topk_weights[s].size() == topk_idx[s].size(), "moe_reference: rank ", s,
             "'s weights do not match its topk_idx");
    tokens[s] = static_cast<int32_t>(topk_idx[s].size() / k);
    for (int32_t t = 0; t < tokens[s]; ++t) {
      for (int j = 0; j < k; ++j) {
        const int32_t e = topk_idx[s][t * k + j];
        IL_CHECK(e >= -1 && e < E, "moe_reference: rank ", s, " token ", t, " routes to expert ", e, " of ", E);
        for (int i = 0; i < j && e >= 0; ++i) {
          IL_CHECK(topk_idx[s][t * k + i] != e, "moe_reference: rank ", s, " token ", t, " lists expert ", e, " twice");
        }
      }
    }
  }

  MoeReference ref;
  ref.counts.assign(static_cast<size_t>(W) * E, 0);
  for (int s = 0; s < W; ++s) {
    for (int32_t e : topk_idx[s]) {
      if (e >= 0) ++ref.counts[static_cast<size_t>(s) * E + e];
    }
  }

  // Place every slot by walking each destination's experts, sources and tokens in order with a
  // cursor: row[s][t * k + j] is the slot's receive row, -1 when unused or dropped.
  std::vector<std::vector<int32_t>> row(W);
  for (int s = 0; s < W; ++s) row[s].assign(topk_idx[s].size(), -1);
  ref.runs.assign(static_cast<size_t>(W) * W * L, MoeRun{});
  ref.kept_rows.assign(E, 0);
  ref.dropped.assign(W, 0);
  for (int d = 0; d < W; ++d) {
    int64_t cursor = 0;  // kPerRank: runs across the rank's experts
    for (int l = 0; l < L; ++l) {
      const int32_t e = d * L + l;
      int64_t base = 0, end = plan.capacity;
      if (plan.capacity_kind == MoeCapacityKind::kPerExpert) {
        cursor = 0;
        base = static_cast<int64_t>(l) * plan.capacity;
        end = base + plan.capacity;
      }
      for (int s = 0; s < W; ++s) {
        MoeRun& run = ref.runs[(static_cast<size_t>(d) * W + s) * L + l];
        run.row = static_cast<int32_t>(base + cursor);
        for (int32_t t = 0; t < tokens[s]; ++t) {
          for (int j = 0; j < k; ++j) {
            if (topk_idx[s][t * k + j] != e) continue;
            const int64_t r = base + cursor++;
            ++run.rows;
            if (r < end) {
              row[s][t * k + j] = static_cast<int32_t>(r);
              ++run.kept;
              ++ref.kept_rows[e];
            } else {
              ++ref.dropped[d];
            }
          }
        }
      }
    }
    ref.overflow = ref.overflow || ref.dropped[d] > 0;
  }

  // Travels and slot metadata: per token, per distinct destination (ascending). On another rank the
  // primary is the kept slot of the lowest-numbered expert there; on the token's own rank every kept
  // slot is its own, in order of expert (so of row).
  ref.slots.assign(W, std::vector<MoeSlot>(plan.recv_rows));
  ref.home.resize(W);
  for (int s = 0; s < W; ++s) {
    ref.home[s].assign(topk_idx[s].size(), MoeHomeEntry{});
    for (int32_t t = 0; t < tokens[s]; ++t) {
      const int32_t* experts = &topk_idx[s][t * k];
      const auto kept_on = [&](int j, int d) {
        return experts[j] >= 0 && experts[j] / L == d && row[s][t * k + j] >= 0;
      };
      for (int d = 0; d < W; ++d) {
        std::vector<int> order;  // kept positions on d, by expert
        for (int j = 0; j < k; ++j) {
          if (kept_on(j, d)) order.push_back(j);
        }
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return experts[a] < experts[b]; });
        if (order.empty()) continue;  // no expert there, or every slot there dropped: nothing travels
        for (size_t i = 0; i < order.size(); ++i) {
          const int j = order[i];
          const int32_t primary = row[s][t * k + (d == s ? j : order[0])];
          if (d == s || i == 0) ref.travels.push_back(MoeTravel{s, t, d, primary});
          MoeSlot& slot = ref.slots[d][row[s][t * k + j]];
          slot.source_token = t;
          slot.source_rank = static_cast<int16_t>(s);
          slot.topk_pos = static_cast<int16_t>(j);
          slot.primary_row = primary;
          slot.weight = topk_weights.empty() ? 1.0f : topk_weights[s][t * k + j];
        }
      }
      for (int j = 0; j < k; ++j) {
        MoeHomeEntry& entry = ref.home[s][t * k + j];
        if (experts[j] < 0) continue;
        entry.expert = experts[j];
        entry.dest_rank = experts[j] / L;
        entry.row = row[s][t * k + j];
        entry.weight = topk_weights.empty() ? 1.0f : topk_weights[s][t * k + j];
      }
    }
  }
  return ref;
}

}  // namespace interlace
