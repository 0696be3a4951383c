// Host and device plan of gemm_rs and gemm_ar (issue 9: fused GEMM+ReduceScatter and GEMM+AllReduce).
// Everything here is CPU-tested (tests/cc/gemm_rs_plan_test.cc). The kernel (kernel.cuh) runs gemm_rs
// and both gemm_ar paths with fp32 partials; partials in the input
// dtype are the plan's only. The standalone reduce_scatter and all_reduce: ops/reduce/.
//
// K is split across ranks, so every rank computes a partial of EVERY output tile. Rank r owns the
// output rows [start[r], start[r + 1]) (uneven blocks, empty ones allowed); each partial tile goes to
// the owners of its rows, which sum the world's partials in fp32, in rank order, and round once.
//
// - Tile order (GemmRsOrder): rank me computes the block of owner me + 1 first, then me + 2, ...,
//   its own block last. At any moment different ranks then send to different owners (with even
//   blocks, slot j of rank s feeds owner s + 1 + j: a permutation, so every owner's NVLink ingress
//   carries one stream), and the partial each owner gets last is its own, which crosses no link: the
//   tail after the GEMM is the reduction alone, not a transfer. A tile row spanning several owners
//   goes in the earliest of their slots, so no owner waits for it past its block's turn. Within a
//   slot, bands of tile rows for L2 reuse, as BandedOrder.
// - Flags and staging (GemmRsPlan): on each receiver, one flag and one staging tile per (tile it
//   reduces, sender), numbered tile-major, sender-minor, so a tile's world flags and partials lie
//   together. A staging tile is one contiguous tile_m x tile_n block: the epilogue can push it with a
//   single bulk copy from shared memory (no tensor map per peer), and the reducer reads world
//   contiguous blocks. A tile spanning owners is pushed whole to each; rows outside an owner's block
//   land unused. Staging is the same size on every rank (symmetric heap).
// - Partials in fp32 (the default) keep the "summed in fp32, rounded once" exactly, at twice
//   the NVLink bytes and staging of partials in the input dtype; the input dtype rounds each partial
//   once more (still deterministic and identical on every rank). Every partial, the owner's own
//   included, is rounded to the staging type before the sum, so both paths give the same bits.
// - Paths (choose_gemm_rs_path): throughput (owners reduce while the GEMM runs; gemm_ar's owners
//   then push each reduced tile to every rank) or one-shot for decode (partials go to every rank that
//   needs the sum, each sums once its GEMM is done; gemm_ar needs no second hop).
//
// Everything the kernel evaluates is closed form over tables that fit in kernel parameters, so
// nothing is uploaded per shape and a first call can be captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <vector>

#include "interlace/base/host_device.h"
#include "interlace/device/signal_pad.h"
#include "interlace/gemm/tile_plan.h"
#include "interlace/ops/reduce/plan.h"
#include "interlace/ops/row_blocks.h"

namespace interlace {

constexpr int kGemmRsMaxRanks = kRowBlocksMaxRanks;
static_assert(kGemmRsMaxRanks <= kMaxLocalRanks, "every rank needs a local rank (NVLink) for now");
// Flags are 64-bit op numbers (a flag holds the number of the last call whose data landed: values
// only grow, so nothing is reset and graphs replay), so an op's 1 MiB region holds this many.
constexpr int32_t kGemmRsMaxFlags = static_cast<int32_t>(kOpRegionBytes / sizeof(uint64_t));
// The engine's cluster tiles are 2 x 128 rows: the order walks them, flags and staging count the
// 128-row CTA tiles.
constexpr int32_t kGemmRsTileM = 128;
constexpr int32_t kGemmRsClusterTileM = 2 * kGemmRsTileM;

// Which rows each rank owns, in tile rows of tile_m: row blocks (ops/row_blocks.h), rank q owning
// rows [start[q], start[q + 1]), and the turn in which this rank computes each owner's block.
struct GemmRsRows : RowBlocks {
  // When this rank computes q's block: 0 for rank + 1, 1 for rank + 2, ..., world - 1 for itself.
  IL_HOST_DEVICE int32_t send_position(int32_t q) const { return (q - rank - 1 + 2 * world) % world; }

  // The slot tile row t is computed in: the earliest send position among the owners it touches.
  IL_HOST_DEVICE int32_t send_slot(int32_t t) const {
    int32_t earliest = world;
    for (int32_t q = first_owner(t); q <= last_owner(t); ++q) {
      if (rows_of(q) > 0 && send_position(q) < earliest) earliest = send_position(q);
    }
    return earliest;
  }
};

// The producing GEMM's order over (cluster tile row, tile column), a GEMM engine Order policy:
// SlotOrder over the send slots (owner rank + 1's block first, this rank's own last), BandedOrder's
// bands within a slot.
struct GemmRsOrder : SlotOrder {
  // rows.tile_m is the height of the tiles the order walks (a cluster's, kGemmRsClusterTileM).
  static Params make(const GemmRsRows& rows, int32_t tiles_n, int32_t band_m);

  // In rounds: round i takes the i-th band of round_m tile rows of every owner's block, in the
  // owners' send order (rank + 1 first, this rank's own last), so that the pushes spread over the
  // whole GEMM instead of filling the first (W - 1) / W of it (at 4096 x 8192 x 8192 on two ranks
  // they need about 340 GB/s of NVLink then, 170 spread). Only for blocks of one owner per tile row
  // (gemm_rs_sums_in_epilogue): a peer pushes every tile at a position no later than the one where
  // its owner waits for it (CPU-tested), so waits that only ever follow pushes form no cycle. Raises
  // past kRowBlocksMaxRanks slots: round_m must be at least gemm_rs_min_round_m.
  static Params make_rounds(const GemmRsRows& rows, int32_t tiles_n, int32_t band_m, int32_t round_m);
};

// The smallest round_m whose rounds fit SlotOrder's kRowBlocksMaxRanks slots.
int32_t gemm_rs_min_round_m(const GemmRsRows& rows);

// The tile rows in make_rounds' order: the host reference, and what its tests walk.
std::vector<int32_t> gemm_rs_round_tile_row_order(const GemmRsRows& rows, int32_t round_m);

enum class GemmRsKind : int32_t { kReduceScatter = 0, kAllReduce = 1 };  // gemm_rs, gemm_ar
enum class GemmRsPath : int32_t { kAuto = 0, kThroughput = 1, kOneShot = 2 };
enum class GemmRsPartials : int32_t { kFp32 = 0, kInputDtype = 1 };  // the staging type of partials

// Flags and staging of one call on this rank (rows.rank), in CTA tiles (rows.tile_m x tile_n).
struct GemmRsPlan {
  GemmRsRows rows;
  int32_t tile_n = 128;
  int32_t tiles_n = 0;
  int32_t partial_bytes = 4;        // 4: fp32 partials; 2: the input dtype's
  bool every_rank_reduces = false;  // gemm_ar one-shot: every rank receives and sums every tile
  bool broadcast = false;           // gemm_ar throughput: owners push each reduced tile to every rank
  int32_t reduce_band_m = 1;        // the reducer's bands, in tile rows
  // gemm_ar's one-shot path: K in this many runs per tile (GemmParams::k_runs), so that a few tiles
  // still fill the SMs; the earlier runs' partials land in this rank's own run tiles (run_flag,
  // run_staging_offset), and the CTA of the last run adds them before anything goes to a peer.
  int32_t k_runs = 1;
  int32_t partial_flags = 0;        // flags [0, partial_flags) of a receiver's region: one per (tile, sender)
  int32_t flags = 0;                // then, with broadcast, one per output tile: reduced_flag(); then run_flag()s
  uint64_t tile_bytes = 0;          // one staging tile: tile_m x tile_n partials (row-major, or the consumers' order)
  uint64_t staging_bytes = 0;       // partial_flags tiles, then the run tiles; the same on every rank

  // The tile rows receiver q sums: first_reduced_row(q) .. + reduced_rows(q) - 1.
  IL_HOST_DEVICE int32_t first_reduced_row(int32_t q) const { return every_rank_reduces ? 0 : rows.first_tile_row(q); }
  IL_HOST_DEVICE int32_t reduced_rows(int32_t q) const {
    return every_rank_reduces ? rows.tiles_m() : rows.tile_rows_of(q);
  }
  // Whether a sender pushes its partials of tile row m_idx to rank q.
  IL_HOST_DEVICE bool receives(int32_t q, int32_t m_idx) const {
    return m_idx >= first_reduced_row(q) && m_idx < first_reduced_row(q) + reduced_rows(q);
  }

  // Sender s's partial of tile (m_idx, n_idx) on receiver q: its flag and its staging tile.
  IL_HOST_DEVICE int32_t partial_slot(int32_t q, int32_t s, int32_t m_idx, int32_t n_idx) const {
    return ((m_idx - first_reduced_row(q)) * tiles_n + n_idx) * rows.world + s;
  }
  IL_HOST_DEVICE uint64_t staging_offset(int32_t q, int32_t s, int32_t m_idx, int32_t n_idx) const {
    return static_cast<uint64_t>(partial_slot(q, s, m_idx, n_idx)) * tile_bytes;
  }
  // With broadcast: the flag, on every rank, of the reduced tile (m_idx, n_idx) from its owner.
  IL_HOST_DEVICE int32_t reduced_flag(int32_t m_idx, int32_t n_idx) const {
    return partial_flags + m_idx * tiles_n + n_idx;
  }

  // With k_runs: run r (0 .. k_runs - 2) of tile (m_idx, n_idx) on this rank, its flag and its
  // staging tile, after the partials' (and the reduced tiles') ones.
  IL_HOST_DEVICE int32_t run_slot(int32_t m_idx, int32_t n_idx, int32_t r) const {
    return (m_idx * tiles_n + n_idx) * (k_runs - 1) + r;
  }
  IL_HOST_DEVICE int32_t run_flag(int32_t m_idx, int32_t n_idx, int32_t r) const {
    return partial_flags + (broadcast ? rows.tiles_m() * tiles_n : 0) + run_slot(m_idx, n_idx, r);
  }
  IL_HOST_DEVICE uint64_t run_staging_offset(int32_t m_idx, int32_t n_idx, int32_t r) const {
    return (static_cast<uint64_t>(partial_flags) + run_slot(m_idx, n_idx, r)) * tile_bytes;
  }

  // The reducer's walk on this rank: position i of reduced_rows(rank) * tiles_n to a tile, in bands
  // as the senders produce them.
  IL_HOST_DEVICE void reduce_tile(int32_t i, int32_t& m_idx, int32_t& n_idx) const {
    const int32_t tiles_m = reduced_rows(rows.rank);
    const BandedOrder::Params bands{tiles_m, tiles_n, reduce_band_m < tiles_m ? reduce_band_m : tiles_m};
    BandedOrder::tile(bands, i, m_idx, n_idx);
    m_idx += first_reduced_row(rows.rank);
  }
};

// Small enough that the plan and the order leave most of the 4 KiB of kernel parameters to the engine.
static_assert(sizeof(GemmRsPlan) <= 1024 && sizeof(GemmRsOrder::Params) <= 1024, "plan tables outgrew kernel parameters");

// The owner's sum of one element is sum_in_rank_order (ops/reduce/plan.h), as the standalone
// reductions': partials in rank order, in fp32, rounded once.

// Rows per rank (any may be 0; 1 to kGemmRsMaxRanks ranks) into the plan's table.
GemmRsRows make_gemm_rs_rows(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m = kGemmRsTileM);

// gemm_ar's owners: out is whole on every rank, so the plan picks who reduces what: whole tile rows
// of tile_m, as even as possible, so that every output tile has one owner (its broadcast has one
// sender and one flag).
std::vector<int64_t> gemm_ar_rows_per_rank(int64_t m, int world, int tile_m = kGemmRsTileM);

// The plan of one call. rows.tile_m is the CTA tile's height; tile_n its width; n the output's
// columns; k_runs (gemm_ar's one-shot path only) as gemm_ar_k_runs. Raises when the flags exceed
// kGemmRsMaxFlags (see DESIGN.md for the limit and remedies).
GemmRsPlan make_gemm_rs_plan(const GemmRsRows& rows, int64_t n, int tile_n, GemmRsKind kind, GemmRsPath path,
                             GemmRsPartials partials, int reduce_band_m = 16, int k_runs = 1);

// gemm_ar's one-shot path: runs of K per tile such that the tiles' runs fill at most `ctas` CTAs
// (up to 4; 1 where the tiles already fill half of them). From the tiles alone, not K (which may
// differ across ranks), so that every rank's staging is the same: a rank whose k-tiles are not a
// multiple of it runs past K, where TMA reads zeros. At decode sizes the tiles are few: 1 x 4096 @
// 4096 x 8192 has 64 of 128 x 128, each a third of the GEMM's time on one SM.
int gemm_ar_k_runs(int64_t tiles, int ctas);

// The tile rows in the producing GEMM's order: slot by slot, ascending within a slot. Host
// reference; GemmRsOrder walks the same order in closed form.
std::vector<int32_t> gemm_rs_tile_row_order(const GemmRsRows& rows);

// Whether gemm_rs's owners sum their own tiles in the GEMM's epilogue instead of in reducer CTAs:
// when every block starts on the cluster-tile grid (kGemmRsClusterTileM rows) or at M, so that each
// tile row has one owner. A rank then computes all of its own tiles last (GemmRsOrder) and only they wait (for
// the peers' partials); the peers compute those tiles in earlier slots, which never wait: no cycle of
// waits, and every SM computes. Blocks off the grid (a tile row spanning owners, waited on by each
// of them in different slots) keep the reducers.
bool gemm_rs_sums_in_epilogue(const RowBlocks& rows);

// The reducers: CTAs set aside from the GEMM (the engine's SM budget, GemmParams::copy_ctas) that sum
// the tiles this rank owns as their partials land. A multiple of the cluster size leaving at least one
// cluster of the `ctas` resident CTAs to compute; requested 0 means kGemmRsReduceCtas (or fewer on a
// small GPU). Measured on 2 x H200 at 8192 x 14336 x 8192 when every gemm_rs call still used
// reducers: 3.47 ms with 8, 2.24 with 16, 1.73 with 32 (the GEMM alone: 1.36); a reducer sums one
// tile at a time, so it takes many (bench/results/NOTES.md).
constexpr int kGemmRsReduceCtas = 32;
int gemm_rs_reduce_ctas(int ctas, int cluster, int requested);

// Path rule, a starting point to be tuned on the GPU: its numbers are placeholders, not measurements.
struct GemmRsPathRule {
  GemmRsPath path = GemmRsPath::kAuto;                // anything else forces that path
  int64_t one_shot_max_m = 256;                       // the decode range
  uint64_t one_shot_max_push_bytes = uint64_t{16} << 20;  // gemm_ar: what one rank pushes on the one-shot path
};

// One-shot when M is in the decode range, every cluster tile runs in the first wave (the partials
// are then all ready at about the same time: nothing for per-tile overlap to hide, only per-tile
// flags to pay) and, for gemm_ar, the one-shot push ((world - 1) partials of M x N) is small.
// Otherwise throughput. k is not used by the starting rule; the GEMM's length decides how much
// transfer the throughput path hides, which the GPU tuning may fold in.
GemmRsPath choose_gemm_rs_path(int64_t m, int64_t n, int64_t k, int world, GemmRsKind kind, GemmRsPartials partials,
                               int num_sms, int tile_n = 128, GemmRsPathRule rule = {});

}  // namespace interlace
