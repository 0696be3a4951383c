#include "interlace/ops/moe/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "tests/cc/error_of.h"

namespace interlace {
namespace {

using Routing = std::vector<std::vector<int32_t>>;  // [rank][token * k + j]

MoeShape shape_of(int world, int64_t experts, int topk, int64_t tokens, int64_t capacity,
                  MoeCapacityKind kind = MoeCapacityKind::kPerExpert, int64_t row_bytes = 32) {
  MoeShape s;
  s.world = world;
  s.experts = experts;
  s.topk = topk;
  s.row_bytes = row_bytes;
  s.tokens = tokens;
  s.capacity = capacity;
  s.capacity_kind = kind;
  return s;
}

// Everything the GPU kernels will be held to, checked on one routing: the reference against the
// closed forms, and the reference against itself (dispatch and combine are inverse maps).
void check_invariants(const MoePlan& p, const Routing& topk, const MoeReference& ref) {
  const int W = p.world, E = p.experts, L = p.experts_per_rank, k = p.topk;
  const int32_t* counts = ref.counts.data();

  // Counts: one per valid top-k entry.
  int64_t slots = 0;
  for (int s = 0; s < W; ++s) {
    int64_t valid = 0, counted = 0;
    for (int32_t e : topk[s]) valid += e >= 0;
    for (int e = 0; e < E; ++e) counted += p.count(counts, s, e);
    ASSERT_EQ(counted, valid) << "source " << s;
    slots += valid;
  }

  // The closed forms reproduce the reference's runs, kept rows and drops.
  int64_t kept_total = 0, dropped_total = 0;
  for (int d = 0; d < W; ++d) {
    for (int l = 0; l < L; ++l) {
      const int e = p.expert_of(d, l);
      ASSERT_EQ(p.rank_of_expert(e), d);
      ASSERT_EQ(p.local_expert(e), l);
      ASSERT_EQ(p.kept_rows(counts, e), ref.kept_rows[e]) << "expert " << e;
      for (int s = 0; s < W; ++s) {
        const MoeRun& run = ref.run(p, d, s, l);
        ASSERT_EQ(run.row, p.run_row(counts, s, e)) << "run (" << s << ", " << e << ")";
        ASSERT_EQ(run.rows, p.count(counts, s, e));
        ASSERT_EQ(run.kept, p.run_kept(counts, s, e));
      }
      kept_total += ref.kept_rows[e];
    }
    ASSERT_EQ(ref.dropped[d], p.dropped_at(counts, d)) << "rank " << d;
    dropped_total += ref.dropped[d];
  }
  ASSERT_EQ(kept_total + dropped_total, slots);
  ASSERT_EQ(ref.overflow, p.overflowed(counts));
  ASSERT_EQ(ref.overflow, dropped_total > 0);

  // Runs lie in their expert's region, inside the receive buffer, never overlapping; an expert's
  // kept rows are one block from region_start (the grouped GEMM's rows), and exactly the rows with
  // metadata.
  for (int d = 0; d < W; ++d) {
    std::vector<int> owner(p.recv_rows, -1);  // which expert's run wrote each row
    for (int l = 0; l < L; ++l) {
      const int e = p.expert_of(d, l);
      const int32_t start = p.region_start(counts, e), end = p.region_end(e);
      ASSERT_LE(end, p.recv_rows);
      for (int s = 0; s < W; ++s) {
        const MoeRun& run = ref.run(p, d, s, l);
        for (int32_t r = run.row; r < run.row + run.kept; ++r) {
          ASSERT_TRUE(r >= start && r < end) << "rank " << d << " expert " << e << " row " << r;
          ASSERT_EQ(owner[r], -1) << "rank " << d << " row " << r << " written twice";
          owner[r] = e;
        }
      }
      for (int32_t r = start; r < start + ref.kept_rows[e]; ++r) ASSERT_EQ(owner[r], e) << "hole at row " << r;
    }
    for (int32_t r = 0; r < p.recv_rows; ++r) ASSERT_EQ(owner[r] >= 0, ref.slots[d][r].source_rank >= 0) << r;
  }

  // slot_row, with pos from a per-expert scan over each source's tokens, is the reference's row.
  for (int s = 0; s < W; ++s) {
    std::vector<int32_t> pos(E, 0);
    for (size_t i = 0; i < topk[s].size(); ++i) {
      const int32_t e = topk[s][i];
      const MoeHomeEntry& home = ref.home[s][i];
      if (e < 0) {
        ASSERT_EQ(home.expert, -1);
        ASSERT_EQ(home.row, -1);
        continue;
      }
      ASSERT_EQ(home.expert, e);
      ASSERT_EQ(home.dest_rank, p.rank_of_expert(e));
      ASSERT_EQ(home.row, p.slot_row(counts, s, e, pos[e]++)) << "source " << s << " entry " << i;
    }
  }

  // Combine inverts dispatch: every kept slot points home to the entry that points back at it.
  for (int d = 0; d < W; ++d) {
    for (int32_t r = 0; r < p.recv_rows; ++r) {
      const MoeSlot& slot = ref.slots[d][r];
      if (slot.source_rank < 0) continue;
      ASSERT_LT(slot.source_rank, W);
      ASSERT_LT(static_cast<size_t>(slot.source_token) * k + slot.topk_pos, topk[slot.source_rank].size());
      const MoeHomeEntry& home = ref.home[slot.source_rank][p.combine_row(slot.source_token, slot.topk_pos)];
      ASSERT_EQ(home.dest_rank, d);
      ASSERT_EQ(home.row, r);
      ASSERT_EQ(home.weight, slot.weight);
      // The primary: the slot itself on the token's own rank; elsewhere the same token's slot on
      // this rank, its own primary, of the lowest kept expert.
      if (slot.source_rank == d) {
        ASSERT_EQ(slot.primary_row, r);
        continue;
      }
      const MoeSlot& primary = ref.slots[d][slot.primary_row];
      ASSERT_EQ(primary.source_rank, slot.source_rank);
      ASSERT_EQ(primary.source_token, slot.source_token);
      ASSERT_EQ(primary.primary_row, slot.primary_row);
      const int32_t* experts = &topk[slot.source_rank][static_cast<size_t>(slot.source_token) * k];
      ASSERT_LE(experts[primary.topk_pos], experts[slot.topk_pos]);
    }
  }
  for (int s = 0; s < W; ++s) {
    for (size_t i = 0; i < ref.home[s].size(); ++i) {
      const MoeHomeEntry& home = ref.home[s][i];
      if (home.row < 0) continue;
      const MoeSlot& slot = ref.slots[home.dest_rank][home.row];
      ASSERT_EQ(slot.source_rank, s);
      ASSERT_EQ(static_cast<size_t>(p.combine_row(slot.source_token, slot.topk_pos)), i);
    }
  }

  // Travel: each (token, other rank) pair at most once, exactly when one of its slots there is kept
  // (without drops: exactly when one of its experts is there), to the primary's row; on the token's
  // own rank once per kept slot, to that slot's row. In order of source, token, rank, row.
  std::map<std::tuple<int, int, int>, int> travelled;
  for (size_t i = 0; i < ref.travels.size(); ++i) {
    const MoeTravel& t = ref.travels[i];
    if (i > 0) {
      const MoeTravel& prev = ref.travels[i - 1];
      ASSERT_LT(std::make_tuple(prev.source_rank, prev.token, prev.dest_rank, prev.primary_row),
                std::make_tuple(t.source_rank, t.token, t.dest_rank, t.primary_row));
    }
    ++travelled[{t.source_rank, t.token, t.dest_rank}];
    const MoeSlot& slot = ref.slots[t.dest_rank][t.primary_row];
    ASSERT_EQ(slot.source_rank, t.source_rank);
    ASSERT_EQ(slot.source_token, t.token);
    ASSERT_EQ(slot.primary_row, t.primary_row);
  }
  int64_t writes = 0;
  for (int s = 0; s < W; ++s) {
    for (size_t t = 0; t < topk[s].size() / k; ++t) {
      for (int d = 0; d < W; ++d) {
        int routed = 0, kept = 0;
        for (int j = 0; j < k; ++j) {
          const int32_t e = topk[s][t * k + j];
          if (e < 0 || p.rank_of_expert(e) != d) continue;
          ++routed;
          kept += ref.home[s][t * k + j].row >= 0;
        }
        const int want = d == s ? kept : std::min(kept, 1);
        writes += d == s ? routed : std::min(routed, 1);
        const auto it = travelled.find({s, static_cast<int>(t), d});
        ASSERT_EQ(it == travelled.end() ? 0 : it->second, want) << "source " << s << " token " << t << " rank " << d;
        if (!ref.overflow) {
          ASSERT_EQ(kept, routed);
        }
      }
    }
  }
  if (!ref.overflow) {
    ASSERT_EQ(static_cast<int64_t>(ref.travels.size()), writes);
  }
}

// ---- Hand-worked: W = 2, E = 4 (experts 0, 1 on rank 0; 2, 3 on rank 1), k = 2, T = 3.
//   rank 0: t0 {0, 1}, t1 {2, 0}, t2 {3, 2}      counts s0: [2, 1, 2, 1]
//   rank 1: t0 {1, 2}, t1 {0, 3}, t2 {2, 1}      counts s1: [1, 2, 2, 1]
const Routing kHandRouting = {{0, 1, 2, 0, 3, 2}, {1, 2, 0, 3, 2, 1}};
const std::vector<std::vector<float>> kHandWeights = {{0.5f, 0.25f, 1, 2, 3, 4}, {5, 6, 7, 8, 9, 10}};

void expect_home(const MoeReference& ref, int s, const std::vector<int>& rows) {
  ASSERT_EQ(ref.home[s].size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(ref.home[s][i].row, rows[i]) << "source " << s << " entry " << i;
}

void expect_travels(const MoeReference& ref, const std::vector<std::vector<int>>& expected) {
  ASSERT_EQ(ref.travels.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const MoeTravel& t = ref.travels[i];
    EXPECT_EQ((std::vector<int>{t.source_rank, t.token, t.dest_rank, t.primary_row}), expected[i]) << "travel " << i;
  }
}

TEST(MoePlan, HandWorkedPerExpertWithOverflow) {
  // Capacity 3 per expert: rank 0 holds e0 in rows [0, 3), e1 in [3, 6); rank 1 e2 in [0, 3), e3 in
  // [3, 6). Expert 2 gets 4 slots: s0 t1, s0 t2, s1 t0, then s1 t2 at row 3, past its region: dropped.
  const MoePlan p = make_moe_plan(shape_of(2, 4, 2, 3, 3));
  EXPECT_EQ(p.experts_per_rank, 2);
  EXPECT_EQ(p.recv_rows, 6);
  const MoeReference ref = moe_reference(p, kHandRouting, kHandWeights);
  EXPECT_EQ(ref.counts, (std::vector<int32_t>{2, 1, 2, 1, 1, 2, 2, 1}));
  // home rows, per (token, j):  s0: t0 e0 -> 0, e1 -> 3; t1 e2 -> 0, e0 -> 1; t2 e3 -> 3, e2 -> 1
  //                             s1: t0 e1 -> 4, e2 -> 2; t1 e0 -> 2, e3 -> 4; t2 e2 dropped, e1 -> 5
  expect_home(ref, 0, {0, 3, 0, 1, 3, 1});
  expect_home(ref, 1, {4, 2, 2, 4, -1, 5});
  EXPECT_EQ(ref.run(p, 1, 1, 0).row, 2);  // s1's run for e2 on rank 1: rows 2, 3; only row 2 kept
  EXPECT_EQ(ref.run(p, 1, 1, 0).rows, 2);
  EXPECT_EQ(ref.run(p, 1, 1, 0).kept, 1);
  EXPECT_EQ(ref.kept_rows, (std::vector<int32_t>{3, 3, 3, 2}));
  EXPECT_EQ(ref.dropped, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(ref.overflow);
  // s0 t0's experts both live on its own rank 0: its row goes straight into both slots, rows 0 and 3.
  // s0 t2 goes to rank 1 once, landing in e2's row 1 (its lower expert), e3's row 3 copying it. s1
  // t2's only slot on rank 1 was dropped, so nothing goes there.
  expect_travels(ref, {{0, 0, 0, 0}, {0, 0, 0, 3}, {0, 1, 0, 1}, {0, 1, 1, 0}, {0, 2, 1, 1}, {1, 0, 0, 4},
                       {1, 0, 1, 2}, {1, 1, 0, 2}, {1, 1, 1, 4}, {1, 2, 0, 5}});
  const MoeSlot& own = ref.slots[0][3];
  EXPECT_EQ(own.source_rank, 0);
  EXPECT_EQ(own.source_token, 0);
  EXPECT_EQ(own.topk_pos, 1);
  EXPECT_EQ(own.primary_row, 3);
  EXPECT_EQ(own.weight, 0.25f);
  const MoeSlot& secondary = ref.slots[1][3];  // s0 t2's e3 slot
  EXPECT_EQ(secondary.source_rank, 0);
  EXPECT_EQ(secondary.source_token, 2);
  EXPECT_EQ(secondary.primary_row, 1);
  EXPECT_EQ(secondary.weight, 3.0f);
  EXPECT_EQ(ref.home[1][5].dest_rank, 0);
  EXPECT_EQ(ref.home[1][5].expert, 1);
  EXPECT_EQ(ref.home[1][5].weight, 10.0f);
  // The closed forms, by hand.
  const int32_t* c = ref.counts.data();
  EXPECT_EQ(p.run_start(c, 1, 2), 2);
  EXPECT_EQ(p.region_start(c, 3), 3);
  EXPECT_EQ(p.slot_row(c, 1, 2, 1), -1);
  EXPECT_EQ(p.slot_row(c, 1, 3, 0), 4);
  EXPECT_EQ(p.combine_row(2, 1), 5);
  check_invariants(p, kHandRouting, ref);
}

TEST(MoePlan, HandWorkedPerExpertNoOverflow) {
  const MoePlan p = make_moe_plan(shape_of(2, 4, 2, 3, 4));  // regions of 4 rows: e1, e3 start at row 4
  const MoeReference ref = moe_reference(p, kHandRouting);
  expect_home(ref, 0, {0, 4, 0, 1, 4, 1});
  expect_home(ref, 1, {5, 2, 2, 5, 3, 6});
  EXPECT_FALSE(ref.overflow);
  EXPECT_EQ(ref.travels.size(), 11u);  // every (token, other rank) pair once, s0 t0 into both its slots
  EXPECT_EQ(ref.slots[0][0].weight, 1.0f);  // no weights given: 1
  check_invariants(p, kHandRouting, ref);
}

TEST(MoePlan, HandWorkedPerRank) {
  // Capacity 5 per rank. Rank 0: e0 rows 0..2, e1 from row 3: s0 t0 -> 3, s1 t0 -> 4, s1 t2 -> 5
  // dropped. Rank 1: e2 rows 0..3, e3 from row 4: s0 t2 -> 4, s1 t1 -> 5 dropped.
  const MoePlan p = make_moe_plan(shape_of(2, 4, 2, 3, 5, MoeCapacityKind::kPerRank));
  EXPECT_EQ(p.recv_rows, 5);
  const MoeReference ref = moe_reference(p, kHandRouting);
  expect_home(ref, 0, {0, 3, 0, 1, 4, 1});
  expect_home(ref, 1, {4, 2, 2, -1, 3, -1});
  EXPECT_EQ(ref.kept_rows, (std::vector<int32_t>{3, 2, 4, 1}));
  EXPECT_EQ(ref.dropped, (std::vector<int64_t>{1, 1}));
  const int32_t* c = ref.counts.data();
  EXPECT_EQ(p.region_start(c, 1), 3);
  EXPECT_EQ(p.region_start(c, 3), 4);
  EXPECT_EQ(p.region_end(3), 5);
  // s1 t1 and s1 t2 each lost their only slot on one rank: those two pairs do not travel.
  expect_travels(ref, {{0, 0, 0, 0}, {0, 0, 0, 3}, {0, 1, 0, 1}, {0, 1, 1, 0}, {0, 2, 1, 1}, {1, 0, 0, 4},
                       {1, 0, 1, 2}, {1, 1, 0, 2}, {1, 2, 1, 3}});
  check_invariants(p, kHandRouting, ref);
}

TEST(MoePlan, PrimaryIsTheLowestKeptExpert) {
  // W = 2, E = 4 (e2, e3 on rank 1), capacity 1 per expert; rank 0: t0 {2, unused}, t1 {3, 2}. t1's e2
  // slot comes second in e2's region and is dropped, so t1 lands in its e3 slot (row 1), the lowest
  // expert it kept on rank 1.
  const MoePlan p = make_moe_plan(shape_of(2, 4, 2, 2, 1));
  const Routing routing = {{2, -1, 3, 2}, {}};
  const MoeReference ref = moe_reference(p, routing);
  expect_home(ref, 0, {0, -1, 1, -1});
  expect_travels(ref, {{0, 0, 1, 0}, {0, 1, 1, 1}});
  EXPECT_EQ(ref.slots[1][1].primary_row, 1);
  EXPECT_EQ(ref.slots[1][1].topk_pos, 0);
  EXPECT_EQ(ref.home[0][1].expert, -1);  // the unused entry
  check_invariants(p, routing, ref);
}

void check_kernel_rules(const MoePlan& p, const Routing& topk, const MoeReference& ref);

TEST(MoePlan, OwnRankSlotsAreTheirOwnPrimaries) {
  // W = 2, E = 4 (e0, e1 on rank 0), k 2, capacity 2 per expert; both ranks' t0 picks {1, 0}. Rank 0's
  // token is written into both its slots (e0 row 0, e1 row 2): no fill reads it back. Rank 1's
  // crosses once, into its e0 slot (row 1); its e1 slot (row 3) names that row.
  const MoePlan p = make_moe_plan(shape_of(2, 4, 2, 1, 2));
  const Routing routing = {{1, 0}, {1, 0}};
  const MoeReference ref = moe_reference(p, routing);
  expect_home(ref, 0, {2, 0});
  expect_home(ref, 1, {3, 1});
  expect_travels(ref, {{0, 0, 0, 0}, {0, 0, 0, 2}, {1, 0, 0, 1}});
  EXPECT_EQ(ref.slots[0][0].primary_row, 0);
  EXPECT_EQ(ref.slots[0][2].primary_row, 2);
  EXPECT_EQ(ref.slots[0][1].primary_row, 1);
  EXPECT_EQ(ref.slots[0][3].primary_row, 1);
  EXPECT_EQ(ref.slots[0][3].source_rank, 1);
  check_invariants(p, routing, ref);
  check_kernel_rules(p, routing, ref);
}

TEST(MoePlan, WorkspaceAndFlags) {
  // W 2, E 4, k 2, H 32, T 3, capacity 3 per expert: 6 receive rows (192 B), their metadata at 256
  // (96 B), counts at 512 (2 x 4 int32), combine rows at 768 (6 x 32 B), 1024 in all.
  const MoePlan p = make_moe_plan(shape_of(2, 4, 2, 3, 3));
  EXPECT_EQ(p.slots_offset, 256u);
  EXPECT_EQ(p.counts_offset, 512u);
  EXPECT_EQ(p.combine_offset, 768u);
  EXPECT_EQ(p.heap_bytes, 1024u);
  EXPECT_EQ(p.recv_row_offset(5), 160u);
  EXPECT_EQ(p.slot_offset(2), 256u + 32u);
  EXPECT_EQ(p.count_offset(1, 2), 512u + 24u);
  EXPECT_EQ(p.combine_row_offset(2, 1), 768u + 5 * 32u);
  // Flags: 2 counts, 2 x 2 arrivals, 4 combines, moe_dispatch_gemm's 2 x 2 filled: distinct, dense.
  EXPECT_EQ(p.flags, 14);
  EXPECT_EQ(p.flag_bytes, 112u);
  std::set<int32_t> flags;
  for (int s = 0; s < 2; ++s) flags.insert(p.counts_flag(s));
  for (int s = 0; s < 2; ++s) {
    for (int l = 0; l < 2; ++l) {
      flags.insert(p.arrived_flag(s, l));
      flags.insert(p.filled_flag(s, l));
    }
  }
  for (int e = 0; e < 4; ++e) flags.insert(p.combined_flag(e));
  EXPECT_EQ(flags.size(), 14u);
  EXPECT_EQ(*flags.begin(), 0);
  EXPECT_EQ(*flags.rbegin(), 13);

  // DeepSeek-V3-like on 2 ranks: 4096 tokens, hidden 7168 bf16, 256 experts, top-8, 512 rows per
  // expert: 128 x 512 receive rows of 14 KiB (896 MiB), combine 4096 x 8 rows (448 MiB).
  const MoePlan big = make_moe_plan(shape_of(2, 256, 8, 4096, 512, MoeCapacityKind::kPerExpert, 7168 * 2));
  EXPECT_EQ(big.recv_rows, 128 * 512);
  EXPECT_EQ(big.slots_offset, uint64_t{128} * 512 * 14336);
  EXPECT_EQ(big.combine_rows, 4096 * 8);
  EXPECT_EQ(big.heap_bytes, big.combine_offset + uint64_t{4096} * 8 * 14336);
  EXPECT_EQ(big.flag_bytes, (2u + 3u * 256u) * 8u);
  EXPECT_EQ(moe_no_drop_capacity(shape_of(2, 256, 8, 4096, 1)), 8192);
  EXPECT_EQ(moe_no_drop_capacity(shape_of(2, 256, 8, 4096, 1, MoeCapacityKind::kPerRank)), 8192 * 8);
  EXPECT_EQ(moe_no_drop_capacity(shape_of(4, 8, 8, 10, 1, MoeCapacityKind::kPerRank)), 4 * 10 * 2);
  EXPECT_EQ(moe_no_drop_capacity(shape_of(4, 8, 8, 0, 1)), 1);
}

// ---- The edge cases.

TEST(MoePlan, ExpertWithNoTokensAndRankWithNone) {
  // W 2, E 4, k 1: only experts 0 and 2 are used; rank 1 sends nothing to expert 0 and rank 0 has
  // no tokens at all.
  const MoePlan p = make_moe_plan(shape_of(2, 4, 1, 4, 4));
  const Routing routing = {{}, {2, 2, 2, 2}};
  const MoeReference ref = moe_reference(p, routing);
  EXPECT_EQ(ref.counts, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 4, 0}));
  EXPECT_EQ(ref.kept_rows, (std::vector<int32_t>{0, 0, 4, 0}));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(ref.run(p, 0, s, 0).rows, 0);
    EXPECT_EQ(ref.run(p, 0, s, 1).kept, 0);
    EXPECT_EQ(ref.run(p, 1, s, 1).rows, 0);
  }
  EXPECT_EQ(ref.run(p, 1, 1, 0).row, 0);
  for (const MoeSlot& slot : ref.slots[0]) EXPECT_EQ(slot.source_rank, -1);  // rank 0 receives nothing
  EXPECT_EQ(ref.travels.size(), 4u);
  EXPECT_FALSE(ref.overflow);
  check_invariants(p, routing, ref);
}

TEST(MoePlan, EveryTokenToOneRank) {
  // W 4, E 8, k 2, T 5: every token of every rank picks experts 4 and 5 (rank 2's). Capacity W x T
  // per expert is exactly enough; one less drops the last source's last token from each expert, so
  // that token does not travel at all.
  const int T = 5;
  Routing routing(4);
  for (int s = 0; s < 4; ++s) {
    for (int t = 0; t < T; ++t) {
      routing[s].push_back(t % 2 ? 4 : 5);
      routing[s].push_back(t % 2 ? 5 : 4);
    }
  }
  const MoeShape fits = shape_of(4, 8, 2, T, 4 * T);
  EXPECT_EQ(moe_no_drop_capacity(fits), 4 * T);
  MoeReference ref = moe_reference(make_moe_plan(fits), routing);
  EXPECT_FALSE(ref.overflow);
  EXPECT_EQ(ref.travels.size(), 5u * T);  // the other ranks' tokens once, though each has 2 slots there
  for (const MoeTravel& t : ref.travels) EXPECT_EQ(t.dest_rank, 2);
  for (int d : {0, 1, 3}) {
    for (const MoeSlot& slot : ref.slots[d]) EXPECT_EQ(slot.source_rank, -1);
  }
  check_invariants(make_moe_plan(fits), routing, ref);

  const MoePlan tight = make_moe_plan(shape_of(4, 8, 2, T, 4 * T - 1));
  ref = moe_reference(tight, routing);
  EXPECT_TRUE(ref.overflow);
  EXPECT_EQ(ref.dropped, (std::vector<int64_t>{0, 0, 2, 0}));
  EXPECT_EQ(ref.home[3][(T - 1) * 2].row, -1);
  EXPECT_EQ(ref.home[3][(T - 1) * 2 + 1].row, -1);
  EXPECT_EQ(ref.travels.size(), 5u * T - 1);
  check_invariants(tight, routing, ref);

  // Per rank: the rank needs W x T x 2 rows.
  const MoeShape per_rank = shape_of(4, 8, 2, T, 1, MoeCapacityKind::kPerRank);
  const MoePlan fits_rank = make_moe_plan(shape_of(4, 8, 2, T, moe_no_drop_capacity(per_rank), MoeCapacityKind::kPerRank));
  ref = moe_reference(fits_rank, routing);
  EXPECT_FALSE(ref.overflow);
  EXPECT_EQ(ref.kept_rows[4] + ref.kept_rows[5], 4 * T * 2);
  check_invariants(fits_rank, routing, ref);
}

TEST(MoePlan, TokenWhoseExpertsAllLiveOnOneRank) {
  // W 2, E 16 (8 per rank), k 8: rank 0's token 0 picks all of rank 1's experts, in a scrambled
  // order. It travels once, landing in expert 8's slot; the other 7 slots name that row. Its token 1
  // picks all of rank 0's own experts: written into each of their slots (expert e's first, row 2e).
  const MoePlan p = make_moe_plan(shape_of(2, 16, 8, 2, 2));
  const Routing routing = {{13, 8, 15, 9, 12, 10, 14, 11, 0, 1, 2, 3, 4, 5, 6, 7}, {}};
  const MoeReference ref = moe_reference(p, routing);
  expect_travels(ref, {{0, 0, 1, 0}, {0, 1, 0, 0}, {0, 1, 0, 2}, {0, 1, 0, 4}, {0, 1, 0, 6}, {0, 1, 0, 8},
                       {0, 1, 0, 10}, {0, 1, 0, 12}, {0, 1, 0, 14}});
  int secondaries = 0;
  for (int32_t r = 0; r < p.recv_rows; ++r) {
    const MoeSlot& slot = ref.slots[1][r];
    if (slot.source_rank < 0) continue;
    EXPECT_EQ(slot.source_token, 0);
    EXPECT_EQ(slot.primary_row, 0);
    secondaries += r != 0;
  }
  EXPECT_EQ(secondaries, 7);
  EXPECT_EQ(ref.slots[1][0].topk_pos, 1);  // expert 8 is top-k entry 1
  check_invariants(p, routing, ref);
}

// ---- Random routings.

enum class Pattern { kUniform, kSkewed, kOneRankPerToken, kMasked };

Routing random_routing(std::mt19937& rng, int world, int experts, int topk, int tokens, Pattern pattern) {
  const int per_rank = experts / world;
  std::vector<double> zipf(experts);
  for (int e = 0; e < experts; ++e) zipf[e] = 1.0 / std::pow(e + 1.0, 1.2);
  Routing routing(world);
  for (int s = 0; s < world; ++s) {
    const int count = std::uniform_int_distribution<int>(0, tokens)(rng);
    for (int t = 0; t < count; ++t) {
      std::vector<int32_t> chosen;
      if (pattern == Pattern::kOneRankPerToken && topk <= per_rank) {
        // All k experts on one rank.
        const int d = std::uniform_int_distribution<int>(0, world - 1)(rng);
        std::vector<int32_t> local(per_rank);
        for (int l = 0; l < per_rank; ++l) local[l] = d * per_rank + l;
        std::shuffle(local.begin(), local.end(), rng);
        chosen.assign(local.begin(), local.begin() + topk);
      } else {
        std::vector<double> weight(experts, 1.0);
        if (pattern == Pattern::kSkewed) weight = zipf;
        while (static_cast<int>(chosen.size()) < topk) {
          const int32_t e = std::discrete_distribution<int>(weight.begin(), weight.end())(rng);
          weight[e] = 0;  // without replacement
          chosen.push_back(e);
        }
      }
      if (pattern == Pattern::kMasked) {
        for (int32_t& e : chosen) {
          if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) e = -1;
        }
      }
      routing[s].insert(routing[s].end(), chosen.begin(), chosen.end());
    }
  }
  return routing;
}

// What moe_dispatch's kernel computes per slot, from the counts alone (pos: a token's number among
// its source's tokens for the expert; MoePlan::kept_row, primary_of, first_row), equals the walked
// reference: every slot's row, every kept slot's primary, and each local expert's rows being exactly
// [first_row, first_row + kept_rows) (the receiver's and the combine's walk over kept rows).
void check_kernel_rules(const MoePlan& p, const Routing& topk, const MoeReference& ref) {
  const int32_t k = p.topk;
  for (int s = 0; s < p.world; ++s) {
    std::vector<int32_t> seen(p.experts, 0);  // pos: this source's slots so far, per expert
    const int32_t tokens = static_cast<int32_t>(topk[s].size()) / k;
    for (int32_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> expert(k), row(k);
      for (int32_t j = 0; j < k; ++j) {
        const int32_t e = topk[s][t * k + j];
        expert[j] = e;
        row[j] = e < 0 ? -1
                       : MoePlan::kept_row(p.run_row(ref.counts.data(), s, e), p.run_kept(ref.counts.data(), s, e),
                                           seen[e]++);
        ASSERT_EQ(row[j], ref.home[s][t * k + j].row) << "source " << s << " token " << t << " entry " << j;
      }
      for (int32_t j = 0; j < k; ++j) {
        if (row[j] < 0) continue;
        const int32_t first = p.primary_of(expert.data(), row.data(), j, s);
        const MoeSlot& slot = ref.slots[p.rank_of_expert(expert[j])][row[j]];
        ASSERT_EQ(row[first], slot.primary_row) << "source " << s << " token " << t << " entry " << j;
        // moe_dispatch_gemm's rule (no rank's slots written each): on every rank, the same as on
        // another rank, the kept entry of the lowest expert there.
        const int32_t once = p.primary_of(expert.data(), row.data(), j, -1);
        if (p.rank_of_expert(expert[j]) != s) {
          ASSERT_EQ(once, first);
        }
        ASSERT_GE(row[once], 0);
        ASSERT_EQ(p.rank_of_expert(expert[once]), p.rank_of_expert(expert[j]));
        for (int32_t q = 0; q < k; ++q) {
          if (row[q] >= 0 && p.rank_of_expert(expert[q]) == p.rank_of_expert(expert[j])) {
            ASSERT_LE(expert[once], expert[q]);
          }
        }
      }
    }
  }
  for (int32_t e = 0; e < p.experts; ++e) {
    const int32_t d = p.rank_of_expert(e), first = p.first_row(ref.counts.data(), e);
    const int32_t kept = p.kept_rows(ref.counts.data(), e);
    ASSERT_EQ(kept, ref.kept_rows[e]);
    ASSERT_GE(first, 0);
    ASSERT_LE(first + kept, p.recv_rows);
    int32_t inside = 0;
    for (int32_t r = 0; r < p.recv_rows; ++r) {
      const MoeSlot& slot = ref.slots[d][r];
      if (slot.source_rank < 0) continue;
      const int32_t expert = topk[slot.source_rank][slot.source_token * k + slot.topk_pos];
      if (expert != e) continue;
      ASSERT_TRUE(r >= first && r < first + kept) << "expert " << e << " row " << r;
      ++inside;
    }
    ASSERT_EQ(inside, kept) << "expert " << e;
  }
}

TEST(MoePlan, RandomRoutingsKeepEveryInvariant) {
  int cases = 0, overflowed = 0;
  for (int world : {1, 2, 4, 8}) {
    for (int experts : {8, 256}) {
      for (int topk : {1, 2, 8}) {
        for (uint32_t seed = 0; seed < 20; ++seed) {
          std::mt19937 rng(seed * 7919 + world * 131 + experts * 17 + topk);
          const int tokens = experts == 256 ? 32 : 48;
          const Pattern pattern = static_cast<Pattern>(seed % 4);
          const Routing routing = random_routing(rng, world, experts, topk, tokens, pattern);
          std::vector<std::vector<float>> weights(world);
          for (int s = 0; s < world; ++s) {
            for (size_t i = 0; i < routing[s].size(); ++i) weights[s].push_back(std::generate_canonical<float, 24>(rng));
          }
          for (MoeCapacityKind kind : {MoeCapacityKind::kPerExpert, MoeCapacityKind::kPerRank}) {
            const int64_t roomy = moe_no_drop_capacity(shape_of(world, experts, topk, tokens, 1, kind));
            // Enough for anything; about what an even split needs (drops under skew); and tiny.
            const int64_t even = std::max<int64_t>(
                1, kind == MoeCapacityKind::kPerExpert ? int64_t{world} * tokens * topk / experts
                                                       : int64_t{tokens} * topk);
            for (int64_t capacity : {roomy, even, int64_t{1} + seed % 3}) {
              SCOPED_TRACE(::testing::Message() << "W " << world << ", E " << experts << ", k " << topk << ", seed "
                                                << seed << ", " << (kind == MoeCapacityKind::kPerRank ? "per rank" : "per expert")
                                                << " capacity " << capacity);
              const MoePlan p = make_moe_plan(shape_of(world, experts, topk, tokens, capacity, kind));
              const MoeReference ref = moe_reference(p, routing, weights);
              if (capacity == roomy) {
                ASSERT_FALSE(ref.overflow);
              }
              check_invariants(p, routing, ref);
              if (HasFatalFailure()) return;
              check_kernel_rules(p, routing, ref);
              if (HasFatalFailure()) return;
              ++cases;
              overflowed += ref.overflow;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 2 * 3 * 20 * 2 * 3);
  EXPECT_GT(overflowed, cases / 4);  // the tight capacities do drop
}

// ---- Bad arguments.

TEST(MoePlan, BadShapesRaise) {
  auto plan_error = [](const MoeShape& s) { return error_of([&] { make_moe_plan(s); }); };
  EXPECT_NE(plan_error(shape_of(3, 8, 2, 16, 4)).find("do not divide among 3 ranks"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(2, 8, 9, 16, 4)).find("top-9 of only 8 experts"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(2, 8, 0, 16, 4)).find("top-k must be"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(2, 8, 2, 16, 4, MoeCapacityKind::kPerExpert, 24)).find("multiple of 16"),
            std::string::npos);
  EXPECT_NE(plan_error(shape_of(2, 8, 2, 16, 4, MoeCapacityKind::kPerExpert, 0)).find("multiple of 16"),
            std::string::npos);
  EXPECT_NE(plan_error(shape_of(2, 8, 2, 16, 0)).find("capacity"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(2, 8, 2, 16, 0, MoeCapacityKind::kPerRank)).find("per rank"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(0, 8, 2, 16, 4)).find("ranks"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(73, 73, 1, 16, 4)).find("1 to 72 ranks"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(2, 8, 2, -1, 4)).find("tokens"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(2, 8, 2, 16, 4, static_cast<MoeCapacityKind>(7))).find("capacity kind"),
            std::string::npos);
  // 32-bit row indices: receive rows, combine rows, and the running sums of the closed forms.
  EXPECT_NE(plan_error(shape_of(1, 256, 2, 16, int64_t{1} << 24)).find("receive rows"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(1, 8, 8, int64_t{1} << 28, 4)).find("combine rows"), std::string::npos);
  EXPECT_NE(plan_error(shape_of(8, 256, 8, int64_t{1} << 25, 4, MoeCapacityKind::kPerRank)).find("row offsets"),
            std::string::npos);
  EXPECT_NE(plan_error(shape_of(8, 8, 1, int64_t{1} << 28, int64_t{1} << 30)).find("row offsets"), std::string::npos);
  // Flags past the op's region.
  EXPECT_NE(plan_error(shape_of(1, 1 << 16, 1, 16, 1)).find("flag region"), std::string::npos);
  // At the limits it plans.
  EXPECT_EQ(plan_error(shape_of(72, 72, 72, 16, 1)), "");
  EXPECT_EQ(plan_error(shape_of(1, 1, 1, 0, 1)), "");
  EXPECT_EQ(plan_error(shape_of(1, 1, 1, 0, std::numeric_limits<int32_t>::max(), MoeCapacityKind::kPerRank)), "");
}

TEST(MoePlan, BadRoutingsRaise) {
  const MoePlan p = make_moe_plan(shape_of(2, 4, 2, 2, 4));
  auto ref_error = [&p](const Routing& r, const std::vector<std::vector<float>>& w = {}) {
    return error_of([&] { moe_reference(p, r, w); });
  };
  EXPECT_NE(ref_error({{0, 1}}).find("routing for 1 ranks"), std::string::npos);
  EXPECT_NE(ref_error({{0, 1, 2}, {}}).find("multiple of k"), std::string::npos);
  EXPECT_NE(ref_error({{0, 1, 2, 3, 0, 1}, {}}).find("more than the plan's 2"), std::string::npos);
  EXPECT_NE(ref_error({{0, 4}, {}}).find("expert 4 of 4"), std::string::npos);
  EXPECT_NE(ref_error({{-2, 1}, {}}).find("expert -2"), std::string::npos);
  EXPECT_NE(ref_error({{3, 3}, {}}).find("lists expert 3 twice"), std::string::npos);
  EXPECT_NE(ref_error({{0, 1}, {}}, {{1.0f}}).find("weights for 1 ranks"), std::string::npos);
  EXPECT_NE(ref_error({{0, 1}, {}}, {{1.0f}, {}}).find("do not match"), std::string::npos);
  EXPECT_EQ(ref_error({{-1, -1}, {}}), "");  // unused entries may repeat
}

}  // namespace
}  // namespace interlace
