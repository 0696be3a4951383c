#include "interlace/ops/ring_attention/plan.h"

#include <algorithm>
#include <array>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"

namespace interlace {
namespace {

// Sequence lengths: 0, shorter than 2W (empty chunks), divisible by 2W, and every remainder.
std::vector<int64_t> lengths(int world) {
  std::vector<int64_t> out = {0, 1, 2, 3, 2 * world - 1, 2 * world, 2 * world + 1, 37, 64, 100, 8 * world * 2 + 5};
  for (int e = 0; e < 2 * world; ++e) out.push_back(4 * 2 * world + e);
  return out;
}

TEST(RingAttentionPlan, ChunksSplitAnyLength) {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t seq : lengths(world)) {
      SCOPED_TRACE(::testing::Message() << "W " << world << ", S " << seq);
      const RingAttentionPlan p = make_ring_attention_plan(world, 0, seq, true, 1, 1);
      // Contiguous, covering [0, S), sizes floor(S / 2W) or one more, the longer ones first.
      int64_t next = 0;
      for (int c = 0; c < p.chunks(); ++c) {
        EXPECT_EQ(p.chunk_start(c), next);
        EXPECT_EQ(p.chunk_rows(c), seq / (2 * world) + (c < seq % (2 * world) ? 1 : 0));
        for (int64_t g = next; g < next + p.chunk_rows(c); ++g) ASSERT_EQ(p.chunk_of_row(g), c) << "row " << g;
        next += p.chunk_rows(c);
      }
      EXPECT_EQ(next, seq);
      int64_t largest = 0, smallest = seq;
      for (int r = 0; r < world; ++r) largest = std::max(largest, p.local_rows(r));
      for (int r = 0; r < world; ++r) smallest = std::min(smallest, p.local_rows(r));
      EXPECT_EQ(p.max_local_rows(), largest);
      EXPECT_LE(largest - smallest, 2);
    }
  }
  // S = 10 over W = 2: 4 chunks of 3, 3, 2, 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const RingAttentionPlan p = make_ring_attention_plan(2, 0, 10, true, 1, 1);
  EXPECT_EQ(p.range(0, 0).global_start, 0);
  EXPECT_EQ(p.range(0, 1).global_start, 8);
  EXPECT_EQ(p.range(1, 0).global_start, 3);
  EXPECT_EQ(p.range(1, 1).global_start, 6);
  EXPECT_EQ(p.range(1, 0).sharded_start, 5);
  EXPECT_EQ(p.range(1, 1).sharded_start, 8);
}

// shard then unshard are inverse permutations of the sequence, and agree with to_local / to_global.
TEST(RingAttentionPlan, ShardUnshardArePermutations) {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t seq : lengths(world)) {
      SCOPED_TRACE(::testing::Message() << "W " << world << ", S " << seq);
      const RingAttentionPlan p = make_ring_attention_plan(world, 0, seq, false, 1, 1);
      std::vector<int64_t> sharded(seq, -1);  // sharded row -> global row, by copying the ranges
      int64_t shard_start = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(p.sharded_start(r), shard_start);
        for (int h = 0; h < 2; ++h) {
          const RingChunkRange c = p.range(r, h);
          EXPECT_EQ(c.sharded_start, p.sharded_start(r) + c.local_start);
          for (int64_t i = 0; i < c.rows; ++i) {
            ASSERT_EQ(sharded[c.sharded_start + i], -1) << "row written twice";
            sharded[c.sharded_start + i] = c.global_start + i;
            int32_t rank = -1;
            int64_t local = -1;
            p.to_local(c.global_start + i, rank, local);
            EXPECT_EQ(rank, r);
            EXPECT_EQ(local, c.local_start + i);
            EXPECT_EQ(p.to_global(r, c.local_start + i), c.global_start + i);
          }
        }
        shard_start += p.local_rows(r);
      }
      std::vector<int64_t> unsharded(seq, -1);  // unshard: the same ranges, copied back
      for (int64_t i = 0; i < seq; ++i) {
        ASSERT_GE(sharded[i], 0) << "sharded row " << i << " not written";
        ASSERT_EQ(unsharded[sharded[i]], -1);
        unsharded[sharded[i]] = i;
      }
      for (int64_t g = 0; g < seq; ++g) EXPECT_EQ(sharded[unsharded[g]], g);
    }
  }
}

// Walks the whole ring as the kernel would (every rank, step, block and tile) and counts each
// (query, key) pair it computes unmasked. Against the dense mask: every visible pair exactly once,
// nothing masked. Also gives the unmasked pairs per [step][rank] for the balance check.
void check_coverage(int world, int64_t seq, bool causal, int tile_q, int tile_k,
                    std::vector<std::vector<int64_t>>* work_out = nullptr) {
  SCOPED_TRACE(::testing::Message() << "W " << world << ", S " << seq << ", causal " << causal << ", tiles "
                                    << tile_q << " x " << tile_k);
  std::vector<int32_t> covered(seq * seq, 0);
  std::vector<std::vector<int64_t>> work(world, std::vector<int64_t>(world, 0));
  for (int r = 0; r < world; ++r) {
    const RingAttentionPlan p = make_ring_attention_plan(world, r, seq, causal, 1, 1, tile_q, tile_k);
    for (int s = 0; s < world; ++s) {
      const int origin = p.kv_origin(r, s);
      EXPECT_EQ(origin, ((r - s) % world + world) % world);
      for (int qh = 0; qh < 2; ++qh) {
        for (int kh = 0; kh < 2; ++kh) {
          const RingBlockKind kind = p.kind(r, qh, origin, kh);
          const int qc = p.chunk_of(r, qh), kc = p.chunk_of(origin, kh);
          const RingChunkRange q = p.range(r, qh), k = p.range(origin, kh);
          for (int i = 0; i < p.q_tiles(qc); ++i) {
            const int n = p.k_tiles_for(kind, qc, kc, i);
            EXPECT_LE(n, p.k_tiles(kc));
            for (int j = 0; j < n; ++j) {
              const bool masked = p.tile_masked(kind, i, j);
              const int64_t computed_before = work[s][r];
              for (int64_t a = int64_t{i} * tile_q; a < std::min<int64_t>((i + 1) * int64_t{tile_q}, q.rows); ++a) {
                for (int64_t b = int64_t{j} * tile_k; b < std::min<int64_t>((j + 1) * int64_t{tile_k}, k.rows); ++b) {
                  if (masked && b > a) continue;  // the per-element diagonal mask: same chunk, so offsets compare
                  const int64_t qg = q.global_start + a, kg = k.global_start + b;
                  ASSERT_TRUE(!causal || kg <= qg) << "masked pair computed: query " << qg << ", key " << kg;
                  ++covered[qg * seq + kg];
                  ++work[s][r];
                }
              }
              // No tile is loaded only to be masked away entirely.
              ASSERT_GT(work[s][r], computed_before) << "rank " << r << ", step " << s << ", tile " << i << " x " << j;
            }
          }
        }
      }
    }
  }
  for (int64_t qg = 0; qg < seq; ++qg) {
    for (int64_t kg = 0; kg < seq; ++kg) {
      const bool visible = !causal || kg <= qg;
      ASSERT_EQ(covered[qg * seq + kg], visible ? 1 : 0) << "query " << qg << ", key " << kg;
    }
  }
  if (work_out != nullptr) *work_out = work;
}

TEST(RingAttentionPlan, EveryVisiblePairExactlyOnce) {
  const int tiles[][2] = {{4, 3}, {3, 4}, {1, 1}, {128, 128}, {128, 192}, {5, 5}};
  for (int world = 1; world <= 8; ++world) {
    for (int64_t seq : lengths(world)) {
      for (bool causal : {false, true}) {
        for (const auto& t : tiles) check_coverage(world, seq, causal, t[0], t[1]);
      }
    }
  }
}

// Zigzag's point: every rank does the same causal work at every step. With S divisible by 2W
// exactly; otherwise chunks differ by a row, so within 4 rows of the longest chunk (two blocks, each
// off by at most one row and one column).
TEST(RingAttentionPlan, CausalWorkIsBalancedPerStep) {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t seq : lengths(world)) {
      SCOPED_TRACE(::testing::Message() << "W " << world << ", S " << seq);
      std::vector<std::vector<int64_t>> work;
      check_coverage(world, seq, true, 16, 16, &work);
      const RingAttentionPlan p = make_ring_attention_plan(world, 0, seq, true, 1, 1);
      const int64_t longest = p.chunk_rows(0);
      for (int s = 0; s < world; ++s) {
        const auto [lo, hi] = std::minmax_element(work[s].begin(), work[s].end());
        if (seq % (2 * world) == 0) {
          EXPECT_EQ(*lo, *hi) << "step " << s;
        } else {
          EXPECT_LE(*hi - *lo, 4 * longest) << "step " << s;
        }
      }
      // The same blocks by kind on every rank: step 0 one full and two diagonal, later steps two full.
      for (int r = 0; r < world; ++r) {
        const RingAttentionPlan pr = make_ring_attention_plan(world, r, seq, true, 1, 1);
        for (int s = 0; s < world; ++s) {
          int count[3] = {};
          for (int qh = 0; qh < 2; ++qh) {
            for (int kh = 0; kh < 2; ++kh) ++count[static_cast<int>(pr.kind(r, qh, pr.kv_origin(r, s), kh))];
          }
          EXPECT_EQ(count[0], s == 0 ? 1 : 2) << "rank " << r << ", step " << s;
          EXPECT_EQ(count[1], s == 0 ? 2 : 0) << "rank " << r << ", step " << s;
          EXPECT_EQ(count[2], s == 0 ? 1 : 2) << "rank " << r << ", step " << s;
        }
      }
    }
  }
}

TEST(RingAttentionPlan, SlotsAndFlagValues) {
  for (int world = 1; world <= 8; ++world) {
    uint64_t previous = 0;  // the last landed value of a piece, across steps and calls
    for (uint64_t op : {uint64_t{1}, uint64_t{2}, uint64_t{7}, uint64_t{1} << 40}) {
      std::vector<bool> used(world, false);
      for (int s = 1; s < world; ++s) {
        const int slot = RingAttentionPlan::slot_of_step(s);
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, world - 1);
        EXPECT_FALSE(used[slot]) << "a slot reused within a call";
        used[slot] = true;
        const uint64_t landed = RingAttentionPlan::landed_value(op, s);
        EXPECT_GT(landed, previous);  // monotonic: a wait ">=" never passes on an older value
        previous = landed;
        EXPECT_GT(landed, RingAttentionPlan::epoch_base(op));
        EXPECT_LT(landed, RingAttentionPlan::epoch_base(op + 1));
      }
    }
  }
}

TEST(RingAttentionPlan, PiecesCoverEveryRowAndFitThePad) {
  struct Case { int world; int64_t seq; int heads_kv; int batch; };
  for (const Case& c : {Case{2, 16384, 32, 1}, Case{2, 65536, 8, 4}, Case{8, 1 << 20, 64, 2}, Case{3, 1000, 4, 3},
                        Case{1, 5, 1, 1}, Case{4, 0, 2, 1}, Case{2, (int64_t{1} << 30), 128, 128}}) {
    for (int tile_k : {128, 192}) {  // the engine's key tiles: D = 64 and D = 128
      SCOPED_TRACE(::testing::Message() << "W " << c.world << " S " << c.seq << " tile_k " << tile_k);
      const RingAttentionPlan p =
          make_ring_attention_plan(c.world, 0, c.seq, tile_k == 192, c.heads_kv, c.heads_kv, 128, tile_k, c.batch);
      EXPECT_EQ(p.flag_rows % p.tile_k, 0);
      EXPECT_GE(p.flag_rows, kRingAttentionFlagRows);
      EXPECT_LE(p.pieces(), kRingAttentionMaxPieces);
      if (p.max_local_rows() == 0) continue;
      std::vector<int> seen(p.pieces(), 0);
      for (int b = 0; b < c.batch; ++b) {
        for (int h = 0; h < c.heads_kv; ++h) {
          for (int64_t start = 0; start < p.max_local_rows(); start += p.flag_rows) {
            const int piece = p.piece_of(b, h, start);
            ASSERT_GE(piece, 0);
            ASSERT_LT(piece, p.pieces());
            EXPECT_EQ(p.piece_of(b, h, std::min(start + p.flag_rows, p.max_local_rows()) - 1), piece);
            ++seen[piece];
          }
        }
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; })) << "a piece of two rows' ranges";
    }
  }
}

// A host simulation of the protocol under random interleavings: W ranks, several calls; per rank, a
// sender per piece forwards each step's block to rank + 1's slot and raises its flag there, after
// the step's own block landed; computing step s waits for the flag. Checks that a block is read
// only after it landed and holds the right origin and call, and that nothing deadlocks. Between
// calls, the op handshake: no rank sends in call k before every rank has started it (and so
// finished call k - 1 and its reads of the slots).
TEST(RingAttentionPlan, SlotProtocolSimulation) {
  std::mt19937 random(13);
  for (int world = 1; world <= 6; ++world) {
    for (int trial = 0; trial < 20; ++trial) {
      const std::vector<uint64_t> ops = {3, 4, 9};
      constexpr int kPieces = 3;
      struct Slot { int call = -1, origin = -1; };
      struct Rank {
        int call = 0;
        int sent[kPieces] = {};   // steps each sender has forwarded in this call
        int computed = 0;         // steps computed in this call
        std::vector<std::array<Slot, kPieces>> slots;
        uint64_t landed[kPieces] = {};
      };
      std::vector<Rank> ranks(world);
      for (Rank& x : ranks) x.slots.resize(std::max(world - 1, 1));
      const RingAttentionPlan p = make_ring_attention_plan(world, 0, 64, true, 1, 1);
      auto started = [&](int call) {
        return std::all_of(ranks.begin(), ranks.end(), [&](const Rank& x) { return x.call >= call; });
      };
      for (;;) {
        struct Move { int rank, piece; };  // piece -1: compute the next step
        std::vector<Move> moves;
        bool done = true;
        for (int r = 0; r < world; ++r) {
          Rank& x = ranks[r];
          if (x.call == static_cast<int>(ops.size())) continue;
          done = false;
          const uint64_t op = ops[x.call];
          for (int piece = 0; piece < kPieces; ++piece) {
            const int s = x.sent[piece];
            if (s + 1 < world && started(x.call) &&
                (s == 0 || x.landed[piece] >= RingAttentionPlan::landed_value(op, s))) {
              moves.push_back({r, piece});
            }
          }
          const int s = x.computed;
          bool ready = true;
          for (int piece = 0; piece < kPieces && s > 0; ++piece) {
            ready = ready && x.landed[piece] >= RingAttentionPlan::landed_value(op, s);
          }
          if (s < world && ready) moves.push_back({r, -1});
        }
        if (done) break;
        ASSERT_FALSE(moves.empty()) << "deadlock, W " << world;
        const Move m = moves[random() % moves.size()];
        Rank& x = ranks[m.rank];
        const uint64_t op = ops[x.call];
        if (m.piece >= 0) {
          const int s = x.sent[m.piece];
          if (s > 0) {
            ASSERT_EQ(x.slots[RingAttentionPlan::slot_of_step(s)][m.piece].call, x.call);
          }
          Rank& next = ranks[(m.rank + 1) % world];
          next.slots[RingAttentionPlan::slot_of_step(s + 1)][m.piece] = Slot{x.call, p.kv_origin(m.rank, s)};
          next.landed[m.piece] = RingAttentionPlan::landed_value(op, s + 1);
          ++x.sent[m.piece];
        } else {
          const int s = x.computed;
          for (int piece = 0; piece < kPieces && s > 0; ++piece) {
            const Slot& held = x.slots[RingAttentionPlan::slot_of_step(s)][piece];
            ASSERT_EQ(held.call, x.call) << "W " << world << ": rank " << m.rank << " step " << s << " reads a stale block";
            ASSERT_EQ(held.origin, p.kv_origin(m.rank, s));
          }
          ++x.computed;
        }
        const bool finished = x.computed == world &&
                              std::all_of(x.sent, x.sent + kPieces, [&](int n) { return n == std::max(world - 1, 0); });
        if (finished) {
          ++x.call;
          x.computed = 0;
          std::fill(x.sent, x.sent + kPieces, 0);
        }
      }
    }
  }
}

// The compute CTAs' tiles: every query row of every (batch, head) in exactly one tile, within its
// half; causal, every second-half tile before any first-half one, and within a (half, batch, head)
// the tiles from last to first.
TEST(RingAttentionPlan, QueryTilesCoverEveryRowOnceHeaviestFirst) {
  for (int world = 1; world <= 5; ++world) {
    for (int64_t seq : lengths(world)) {
      for (bool causal : {false, true}) {
        for (int rank = 0; rank < world; ++rank) {
          const int heads = 3, batch = 2, tile = 16;
          const RingAttentionPlan p = make_ring_attention_plan(world, rank, seq, causal, heads, 1, tile, tile, batch);
          const int64_t rows = p.local_rows(rank);
          std::vector<int> seen(static_cast<size_t>(batch * heads * rows), 0);
          int last_half = 1;
          std::vector<int> last_offset(2 * batch * heads, 1 << 30);
          for (int64_t x = 0; x < p.work_tiles(); ++x) {
            const RingAttentionPlan::QueryTile t = p.query_tile(x);
            ASSERT_TRUE(t.batch >= 0 && t.batch < batch && t.head >= 0 && t.head < heads);
            ASSERT_GT(t.rows, 0) << "a tile without queries";
            if (causal) {
              ASSERT_LE(t.half, last_half) << "a first-half tile before a second-half one";
              last_half = t.half;
              // Within its half: the half's rows are [start, start + query_rows(half)).
              const int64_t start = t.half == 1 ? p.chunk_rows(rank) : 0;
              ASSERT_EQ(t.row0, start + t.offset);
              ASSERT_EQ(t.rows, p.query_rows(t.half) - t.offset);
            } else {
              ASSERT_EQ(t.half, 0);
            }
            int& previous = last_offset[(t.half * batch + t.batch) * heads + t.head];
            ASSERT_LT(t.offset, previous) << "tiles of a half not from last to first";
            previous = t.offset;
            for (int64_t r = t.row0; r < t.row0 + std::min<int64_t>(t.rows, tile); ++r) {
              ASSERT_LT(r, rows);
              ++seen[static_cast<size_t>((t.batch * heads + t.head) * rows + r)];
            }
          }
          ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }))
              << "W " << world << " S " << seq << " causal " << causal << " rank " << rank;
        }
      }
    }
  }
}

TEST(RingAttentionPlan, GqaHeads) {
  for (int heads_kv : {1, 2, 8, 32}) {
    const RingAttentionPlan p = make_ring_attention_plan(2, 1, 100, true, 32, heads_kv);
    std::vector<int> readers(heads_kv, 0);
    for (int hq = 0; hq < 32; ++hq) {
      ASSERT_LT(p.kv_head(hq), heads_kv);
      ++readers[p.kv_head(hq)];
      EXPECT_EQ(p.kv_head(hq), hq / (32 / heads_kv));  // consecutive query heads share a KV head
    }
    for (int n : readers) EXPECT_EQ(n, 32 / heads_kv);
  }
}

TEST(RingAttentionPlan, RejectsBadArguments) {
  EXPECT_THROW(make_ring_attention_plan(0, 0, 16, true, 1, 1), Error);
  EXPECT_THROW(make_ring_attention_plan(kRingAttentionMaxRanks + 1, 0, 16, true, 1, 1), Error);
  EXPECT_THROW(make_ring_attention_plan(2, 2, 16, true, 1, 1), Error);
  EXPECT_THROW(make_ring_attention_plan(2, 0, -1, true, 1, 1), Error);
  EXPECT_THROW(make_ring_attention_plan(2, 0, int64_t{1} << 31, true, 1, 1), Error);
  EXPECT_THROW(make_ring_attention_plan(2, 0, 16, true, 32, 6), Error);
  EXPECT_THROW(make_ring_attention_plan(2, 0, 16, true, 1, 1, 0, 128), Error);
  EXPECT_NO_THROW(make_ring_attention_plan(kRingAttentionMaxRanks, kRingAttentionMaxRanks - 1, 0, false, 8, 8));
}

}  // namespace
}  // namespace interlace
