// Host and device plan of ring attention (issue 13): the zigzag sharding of the sequence, the ring
// schedule of K/V blocks, which (query chunk, key chunk) blocks and tiles need computing and masking,
// the double-buffered receive slots with their flag values, and GQA's head map.
//
// Zigzag: the global sequence of S rows is cut into 2W contiguous chunks; rank i holds chunks i and
// 2W-1-i, in that order, as its local rows. Under a causal mask chunk c sees chunks 0..c, so pairing
// an early chunk with a late one gives every rank the same work at every ring step (2 chunk blocks'
// worth; see RingAttentionPlan::kind). Non-causal attention sees everything, so it works on any
// sharding; the plan still names the chunks, and every block is kFull.
//
// Ring: at step s (0..W-1) rank r computes its Q against the K/V block that originated at rank
// (r - s) mod W: its own at step 0, from its input; for s >= 1, the block rank r-1 pushed into one of
// r's two receive slots during its step s-1, which r forwards to r+1 during step s.
//
// Everything is closed form over a few integers (trivially copyable, kernel parameters): nothing is
// uploaded per shape.
#pragma once

#include <cstdint>
#include <type_traits>

#include "interlace/base/host_device.h"

namespace interlace {

constexpr int kRingAttentionMaxRanks = 72;
// Flag values are op_number * stride + step: larger than any step (W <= 72), so every value of a
// call is above every value of an earlier call, and a wait "flag >= value" needs no reset.
constexpr uint64_t kRingAttentionFlagStride = 128;
// Landing flags: rows per flag (at least; more where the flags would not fit the signal pad) and
// the most flags a call uses.
constexpr int32_t kRingAttentionFlagRows = 1024;
constexpr int32_t kRingAttentionMaxPieces = 16384;

// What a (query chunk, key chunk) block needs under the mask. Decided by chunk index alone: chunks
// are contiguous and in order, so a lower key chunk lies wholly before the query chunk.
enum class RingBlockKind : int32_t {
  kFull = 0,      // every pair visible: no mask (only the ragged edges of the chunks)
  kDiagonal = 1,  // same chunk: key offset <= query offset, masked per element on the diagonal tiles
  kMasked = 2,    // key chunk after the query chunk: skipped, not even loaded
};

// One chunk of a rank's shard: global rows [global_start, + rows) are local rows [local_start, + rows)
// of the rank, which are rows [sharded_start, + rows) of the sharded (zigzag-ordered) tensor.
struct RingChunkRange {
  int64_t global_start = 0;
  int64_t sharded_start = 0;
  int64_t local_start = 0;
  int64_t rows = 0;
};

struct RingAttentionPlan {
  int32_t world = 1;
  int32_t rank = 0;
  int64_t seq = 0;             // S, global
  int32_t causal = 0;
  int32_t tile_q = 128;        // query rows per tile (a consumer warpgroup's)
  int32_t tile_k = 128;        // key rows per tile
  int32_t heads_q = 1;
  int32_t heads_kv = 1;
  int64_t chunk_base = 0;      // S / 2W
  int32_t chunk_extra = 0;     // S % 2W: chunks 0 .. chunk_extra-1 have one row more
  int32_t batch = 1;
  int32_t flag_rows = kRingAttentionFlagRows;  // rows per landing flag (a multiple of tile_k)

  // ---- Chunks. S = 2W * base + extra: the first `extra` chunks get base + 1 rows, the rest base. Any
  // S >= 0; with S < 2W some chunks (and so some ranks' halves) are empty.
  IL_HOST_DEVICE int32_t chunks() const { return 2 * world; }
  IL_HOST_DEVICE int64_t chunk_rows(int32_t c) const { return chunk_base + (c < chunk_extra ? 1 : 0); }
  IL_HOST_DEVICE int64_t chunk_start(int32_t c) const {
    return static_cast<int64_t>(c) * chunk_base + (c < chunk_extra ? c : chunk_extra);
  }
  // The chunk holding global row g (0 <= g < S): inverse of chunk_start.
  IL_HOST_DEVICE int32_t chunk_of_row(int64_t g) const {
    const int64_t long_rows = static_cast<int64_t>(chunk_extra) * (chunk_base + 1);
    if (g < long_rows) return static_cast<int32_t>(g / (chunk_base + 1));
    return chunk_extra + static_cast<int32_t>((g - long_rows) / chunk_base);  // chunk_base > 0 here
  }

  // ---- Zigzag. Rank r's halves: h = 0 is chunk r, h = 1 is chunk 2W-1-r.
  IL_HOST_DEVICE int32_t chunk_of(int32_t r, int32_t h) const { return h == 0 ? r : 2 * world - 1 - r; }
  IL_HOST_DEVICE int32_t rank_of_chunk(int32_t c) const { return c < world ? c : 2 * world - 1 - c; }
  IL_HOST_DEVICE int32_t half_of_chunk(int32_t c) const { return c < world ? 0 : 1; }
  IL_HOST_DEVICE int64_t local_rows(int32_t r) const { return chunk_rows(r) + chunk_rows(2 * world - 1 - r); }
  // Where rank r's shard starts in the sharded tensor (ranks' shards stacked in rank order): ranks
  // before r hold chunks 0 .. r-1 and 2W-r .. 2W-1.
  IL_HOST_DEVICE int64_t sharded_start(int32_t r) const { return chunk_start(r) + (seq - chunk_start(2 * world - r)); }
  // The largest shard, which sizes the symmetric receive slots (the same on every rank). The long
  // chunks are 0 .. extra-1, so rank r has [r < extra] + [2W-1-r < extra] of them: two on some rank
  // iff extra > W (rank W-1), else one on rank 0 if extra > 0. Shards differ by at most 2 rows.
  IL_HOST_DEVICE int64_t max_local_rows() const {
    return 2 * chunk_base + (chunk_extra > world ? 2 : chunk_extra > 0 ? 1 : 0);
  }

  // Rank r's half h, for ring_attention_shard (global -> sharded) and unshard (sharded -> global).
  IL_HOST_DEVICE RingChunkRange range(int32_t r, int32_t h) const {
    const int32_t c = chunk_of(r, h);
    const int64_t local = h == 0 ? 0 : chunk_rows(r);
    return RingChunkRange{chunk_start(c), sharded_start(r) + local, local, chunk_rows(c)};
  }
  // Global row g <-> (rank, local row).
  IL_HOST_DEVICE void to_local(int64_t g, int32_t& r, int64_t& local) const {
    const int32_t c = chunk_of_row(g);
    r = rank_of_chunk(c);
    local = g - chunk_start(c) + (half_of_chunk(c) == 0 ? 0 : chunk_rows(r));
  }
  IL_HOST_DEVICE int64_t to_global(int32_t r, int64_t local) const {
    const int64_t first = chunk_rows(r);
    return local < first ? chunk_start(r) + local : chunk_start(2 * world - 1 - r) + (local - first);
  }

  // ---- Ring. The K/V block rank r computes against at step s, its source and its destination.
  IL_HOST_DEVICE int32_t kv_origin(int32_t r, int32_t s) const { return ((r - s) % world + world) % world; }
  IL_HOST_DEVICE int32_t recv_from() const { return (rank + world - 1) % world; }
  IL_HOST_DEVICE int32_t send_to() const { return (rank + 1) % world; }

  // Query half qh of rank r against key half kh of the block that originated at rank `origin`.
  // Causal, with zigzag, this gives per step: step 0 (own block) 1 full + 2 diagonal blocks; a block
  // from an earlier rank (origin < r) both query halves against its first half; from a later rank
  // the second query half against both its halves. 2 chunk blocks' worth each, on every rank.
  IL_HOST_DEVICE RingBlockKind kind(int32_t r, int32_t qh, int32_t origin, int32_t kh) const {
    if (!causal) return RingBlockKind::kFull;
    const int32_t qc = chunk_of(r, qh), kc = chunk_of(origin, kh);
    return kc < qc ? RingBlockKind::kFull : kc == qc ? RingBlockKind::kDiagonal : RingBlockKind::kMasked;
  }

  // ceil(rows / n) for 0 <= rows < 2^31 (S is, checked on the host) and n >= 1, in 32 bits: on the GPU
  // the producer warps run these on 24 registers, where a 64-bit division is a call that spills.
  IL_HOST_DEVICE static int32_t tiles_of(int64_t rows, int32_t n) {
    return static_cast<int32_t>((static_cast<uint32_t>(rows) + static_cast<uint32_t>(n) - 1u) / static_cast<uint32_t>(n));
  }

  // ---- Tiles within a block: query tile i is rows [i * tile_q, ...) of the query chunk, key tile j
  // rows [j * tile_k, ...) of the key chunk (the last of each ragged).
  IL_HOST_DEVICE int32_t q_tiles(int32_t qc) const { return tiles_of(chunk_rows(qc), tile_q); }
  IL_HOST_DEVICE int32_t k_tiles(int32_t kc) const { return tiles_of(chunk_rows(kc), tile_k); }
  // The key tiles 0 .. n-1 query tile i computes in a block of this kind: all of them when full; on
  // the diagonal (same chunk, so same offsets) those starting at or before the tile's last query row.
  IL_HOST_DEVICE int32_t k_tiles_for(RingBlockKind kind, int32_t qc, int32_t kc, int32_t i) const {
    if (kind == RingBlockKind::kMasked) return 0;
    const int32_t all = k_tiles(kc);
    if (kind == RingBlockKind::kFull) return all;
    int64_t last = static_cast<int64_t>(i + 1) * tile_q;
    if (last > chunk_rows(qc)) last = chunk_rows(qc);
    const int32_t n = static_cast<int32_t>(last - 1) / tile_k + 1;  // 32-bit: see tiles_of
    return n < all ? n : all;
  }
  // Whether tile (i, j) of a block needs the causal mask: only on the diagonal, where some key of the
  // tile lies after the tile's first query. The others (and all of a full block) need only the
  // ragged-edge bounds.
  IL_HOST_DEVICE bool tile_masked(RingBlockKind kind, int32_t i, int32_t j) const {
    return kind == RingBlockKind::kDiagonal &&
           static_cast<int64_t>(j + 1) * tile_k - 1 > static_cast<int64_t>(i) * tile_q;
  }

  // ---- Receive slots and landing flags. The block of step s >= 1 lands in receive slot s - 1 of its
  // consumer (step 0's is the consumer's own input): W - 1 slots, none reused within a call, so a
  // sender never waits for its consumer, and a CTA that computes step s needs nothing but the
  // block's arrival (CTAs of one launch run in any order, and all of them need not be resident).
  // Within a block the rows of each (batch, KV head) are cut into pieces of flag_rows rows, each
  // with a landing flag, so that compute starts on the first heads while the rest still travel:
  // piece p of (b, h) is flag (b * Hkv + h) * pieces_per_head() + p. One sender CTA owns a piece for
  // every step: it raises the flag to landed_value(op, s) for step s, after step s - 1's, so one
  // flag per piece serves all steps and ">=" waits need no reset (values only grow across calls).
  IL_HOST_DEVICE static int32_t slot_of_step(int32_t s) { return s - 1; }
  IL_HOST_DEVICE static uint64_t epoch_base(uint64_t op_number) { return op_number * kRingAttentionFlagStride; }
  IL_HOST_DEVICE static uint64_t landed_value(uint64_t op_number, int32_t s) {
    return epoch_base(op_number) + static_cast<uint64_t>(s);
  }
  IL_HOST_DEVICE int32_t pieces_per_head() const { return tiles_of(max_local_rows(), flag_rows); }
  IL_HOST_DEVICE int32_t pieces() const { return batch * heads_kv * pieces_per_head(); }
  // In 32 bits (rows < 2^31): on the GPU the waiter warp runs it, on 24 registers (56 at D = 64).
  IL_HOST_DEVICE int32_t piece_of(int32_t b, int32_t h, int32_t row) const {
    return (b * heads_kv + h) * pieces_per_head() + row / flag_rows;
  }

  // ---- The compute CTAs' query tiles, tile_q rows each, one per (tile, head, batch), in the order the
  // CTAs take them from their queue. Causal: every tile of the rank's second halves (a late chunk,
  // which sees far more keys) before any of its first;
  // within a half, per (batch, head) together (they read the same K/V), the last tiles (the most of
  // the diagonal) first. Non-causal: the shard whole, as half 0.
  IL_HOST_DEVICE int64_t query_rows(int32_t h) const {
    return !causal ? (h == 0 ? local_rows(rank) : 0) : chunk_rows(chunk_of(rank, h));
  }
  IL_HOST_DEVICE int32_t query_tiles(int32_t h) const { return tiles_of(query_rows(h), tile_q); }
  IL_HOST_DEVICE int64_t work_tiles() const {
    return static_cast<int64_t>(query_tiles(0) + query_tiles(1)) * heads_q * batch;
  }
  // The x-th tile taken, 0 <= x < work_tiles(): local rows [row0, row0 + min(rows, tile_q)) of
  // (batch, head), rows counting to the end of its half; offset: row0's offset within the half.
  struct QueryTile {
    int32_t batch, head, half, row0, rows, offset;
  };
  // In 32 bits (work_tiles() < 2^30 and rows < 2^31, both checked on the host): on the GPU the
  // producer thread of a compute CTA runs it, on 24 registers (56 at D = 64), where 64-bit divisions
  // are calls.
  IL_HOST_DEVICE QueryTile query_tile(int32_t x) const {
    const int32_t second = query_tiles(1) * heads_q * batch;
    QueryTile t;
    t.half = x < second ? 1 : 0;
    const int32_t rest = x < second ? x : x - second;
    const int32_t tiles = query_tiles(t.half);
    t.head = rest / tiles % heads_q;
    t.batch = rest / (tiles * heads_q);
    t.offset = (tiles - 1 - rest % tiles) * tile_q;
    const int32_t start = causal && t.half == 1 ? static_cast<int32_t>(chunk_rows(rank)) : 0;
    t.row0 = start + t.offset;
    t.rows = static_cast<int32_t>(query_rows(t.half)) - t.offset;
    return t;
  }

  // ---- GQA: Hq = g * Hkv; query head hq reads key/value head hq / g (consecutive query heads share).
  IL_HOST_DEVICE int32_t group_size() const { return heads_q / heads_kv; }
  IL_HOST_DEVICE int32_t kv_head(int32_t hq) const { return hq / group_size(); }
};

// Flags in ring attention's region of every rank's signal pad.
struct RingAttentionFlags {
  uint64_t landed[kRingAttentionMaxPieces];  // written by rank - 1 (the sender), waited on here
  // Local counters, zero between calls (the call's last CTA out resets them): CTAs that took a role,
  // so that roles go by the order in which CTAs start (senders first: they must be running before
  // anyone waits for them); query tiles taken, the compute CTAs' queue; CTAs done.
  unsigned int ticket;
  unsigned int tiles;
  unsigned int arrived;
};

// Checks the arguments (W in 1 .. kRingAttentionMaxRanks, 0 <= rank < W, S >= 0 and under 2^31
// rows, tiles >= 1, heads >= 1 with Hq a multiple of Hkv, batch >= 1) and raises interlace::Error
// otherwise. flag_rows grows past kRingAttentionFlagRows (in whole tiles) until the pieces fit
// kRingAttentionMaxPieces.
RingAttentionPlan make_ring_attention_plan(int world, int rank, int64_t seq, bool causal, int heads_q, int heads_kv,
                                           int tile_q = 128, int tile_k = 128, int batch = 1);

static_assert(std::is_trivially_copyable<RingAttentionPlan>::value, "the plan is a kernel parameter");
static_assert(sizeof(RingAttentionPlan) <= 128, "the plan outgrew its share of kernel parameters");

}  // namespace interlace
