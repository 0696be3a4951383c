#include "interlace/ops/gemm_rs/plan.h"

#include <algorithm>
#include <limits>

#include "interlace/base/error.h"

namespace interlace {

GemmRsRows make_gemm_rs_rows(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m) {
  return GemmRsRows{make_row_blocks(rows_per_rank, rank, tile_m, "gemm_rs")};
}

std::vector<int64_t> gemm_ar_rows_per_rank(int64_t m, int world, int tile_m) {
  IL_CHECK(world >= 1 && world <= kGemmRsMaxRanks, "gemm_ar: 1 to ", kGemmRsMaxRanks, " ranks, got ", world);
  IL_CHECK(m >= 0 && tile_m > 0, "gemm_ar: bad rows (m ", m, ", tile_m ", tile_m, ")");
  const int64_t tiles = (m + tile_m - 1) / tile_m;
  std::vector<int64_t> rows(world);
  int64_t begin = 0;
  for (int q = 0; q < world; ++q) {
    const int64_t end = std::min(m, (q + 1) * (tiles / world) * tile_m + std::min<int64_t>(q + 1, tiles % world) * tile_m);
    rows[q] = end - begin;
    begin = end;
  }
  return rows;
}

std::vector<int32_t> gemm_rs_tile_row_order(const GemmRsRows& rows) {
  return slot_tile_row_order(rows.tiles_m(), rows.world, [&rows](int32_t t) { return rows.send_slot(t); });
}

GemmRsOrder::Params GemmRsOrder::make(const GemmRsRows& rows, int32_t tiles_n, int32_t band_m) {
  return SlotOrder::make(
      rows.tiles_m(), rows.world, [&rows](int32_t t) { return rows.send_slot(t); }, tiles_n, band_m, "gemm_rs");
}

namespace {

// The tile rows of the largest block.
int32_t longest_block(const GemmRsRows& rows) {
  int32_t most = 0;
  for (int32_t q = 0; q < rows.world; ++q) most = std::max(most, rows.rows_of(q) > 0 ? rows.tile_rows_of(q) : 0);
  return most;
}

// make_rounds' slots: (round, owner) bands, rounds in order, owners in send order; empty bands left out.
void round_slots(const GemmRsRows& rows, int32_t round_m, std::vector<int32_t>* first_row,
                 std::vector<int32_t>* count) {
  IL_CHECK(round_m >= 1, "gemm_rs: round_m must be >= 1, got ", round_m);
  const int32_t most = longest_block(rows);
  for (int32_t i = 0; i * round_m < most; ++i) {
    for (int32_t j = 0; j < rows.world; ++j) {
      const int32_t q = (rows.rank + 1 + j) % rows.world;
      if (rows.rows_of(q) == 0) continue;
      const int32_t first = rows.first_tile_row(q) + i * round_m;
      const int32_t left = rows.first_tile_row(q) + rows.tile_rows_of(q) - first;
      if (left <= 0) continue;
      first_row->push_back(first);
      count->push_back(std::min(round_m, left));
    }
  }
}

}  // namespace

int32_t gemm_rs_min_round_m(const GemmRsRows& rows) {
  // Every round holds at most world slots, so rounds <= kRowBlocksMaxRanks / world suffice.
  const int32_t rounds = std::max(1, kRowBlocksMaxRanks / rows.world);
  return std::max(1, (longest_block(rows) + rounds - 1) / rounds);
}

GemmRsOrder::Params GemmRsOrder::make_rounds(const GemmRsRows& rows, int32_t tiles_n, int32_t band_m,
                                             int32_t round_m) {
  IL_CHECK(gemm_rs_sums_in_epilogue(rows), "gemm_rs: round_m needs every block to start on the ",
           kGemmRsClusterTileM, "-row grid (one owner per tile row)");
  std::vector<int32_t> first_row, count;
  round_slots(rows, round_m, &first_row, &count);
  IL_CHECK(static_cast<int32_t>(count.size()) <= kRowBlocksMaxRanks, "gemm_rs: round_m=", round_m, " makes ",
           count.size(), " bands; at most ", kRowBlocksMaxRanks, " (round_m >= ", gemm_rs_min_round_m(rows), ")");
  if (count.empty()) {  // no rows: one empty slot
    const int32_t none = 0;
    return SlotOrder::make(1, &none, &none, tiles_n, band_m, "gemm_rs");
  }
  return SlotOrder::make(static_cast<int32_t>(count.size()), first_row.data(), count.data(), tiles_n, band_m,
                         "gemm_rs");
}

std::vector<int32_t> gemm_rs_round_tile_row_order(const GemmRsRows& rows, int32_t round_m) {
  std::vector<int32_t> first_row, count, order;
  round_slots(rows, round_m, &first_row, &count);
  for (size_t s = 0; s < count.size(); ++s) {
    for (int32_t t = 0; t < count[s]; ++t) order.push_back(first_row[s] + t);
  }
  return order;
}

GemmRsPlan make_gemm_rs_plan(const GemmRsRows& rows, int64_t n, int tile_n, GemmRsKind kind, GemmRsPath path,
                             GemmRsPartials partials, int reduce_band_m, int k_runs) {
  const char* op = kind == GemmRsKind::kAllReduce ? "gemm_ar" : "gemm_rs";
  IL_CHECK(n >= 0 && tile_n > 0, op, ": bad output columns (n ", n, ", tile_n ", tile_n, ")");
  IL_CHECK(path == GemmRsPath::kThroughput || path == GemmRsPath::kOneShot, op,
           ": the plan needs a path (choose_gemm_rs_path decides kAuto)");
  IL_CHECK(reduce_band_m >= 1, op, ": reduce_band_m must be >= 1, got ", reduce_band_m);
  IL_CHECK(k_runs >= 1 && (k_runs == 1 || (kind == GemmRsKind::kAllReduce && path == GemmRsPath::kOneShot)), op,
           ": runs of K (", k_runs, ") are gemm_ar's one-shot path's only");
  GemmRsPlan p;
  p.rows = rows;
  p.tile_n = tile_n;
  const int64_t tiles_n = (n + tile_n - 1) / tile_n;
  IL_CHECK(tiles_n <= kMaxGemmTiles, op, ": ", n, " columns make too many tiles");
  p.tiles_n = static_cast<int32_t>(tiles_n);
  p.partial_bytes = partials == GemmRsPartials::kFp32 ? 4 : 2;
  p.every_rank_reduces = kind == GemmRsKind::kAllReduce && path == GemmRsPath::kOneShot;
  p.broadcast = kind == GemmRsKind::kAllReduce && path == GemmRsPath::kThroughput;
  p.reduce_band_m = reduce_band_m;
  p.k_runs = k_runs;
  if (p.broadcast) {
    // A reduced tile has one owner, so one sender and one flag (gemm_ar_rows_per_rank does this).
    for (int q = 1; q < rows.world; ++q) {
      IL_CHECK(rows.start[q] % rows.tile_m == 0 || rows.start[q] == rows.m(), op, ": rank ", q,
               "'s rows start at ", rows.start[q], ", inside a tile row of ", rows.tile_m,
               "; gemm_ar's owners own whole tile rows (gemm_ar_rows_per_rank)");
    }
  }
  // Flags a receiver needs, in 64 bits before the check; staging is sized for the busiest receiver.
  int64_t most_rows = 0;
  int32_t busiest = 0;
  for (int32_t q = 0; q < rows.world; ++q) {
    if (p.reduced_rows(q) > most_rows) {
      most_rows = p.reduced_rows(q);
      busiest = q;
    }
  }
  const int64_t partial_flags = int64_t{rows.world} * most_rows * tiles_n;
  const int64_t run_tiles = int64_t{rows.tiles_m()} * tiles_n * (k_runs - 1);
  const int64_t flags = partial_flags + (p.broadcast ? int64_t{rows.tiles_m()} * tiles_n : 0) + run_tiles;
  IL_CHECK(flags <= kGemmRsMaxFlags, op, ": rank ", busiest, " sums ", most_rows, " x ", tiles_n, " tiles of ",
           rows.tile_m, " x ", tile_n, " from ", rows.world, " ranks", p.broadcast ? ", and receives every reduced tile" : "",
           k_runs > 1 ? ", and adds runs of K" : "",
           ": ", flags, " flags, more than the ", kGemmRsMaxFlags, " that fit the op's ", kOpRegionBytes >> 10,
           " KiB flag region; use wider tiles (tile_n=256) or split the call along M or N");
  p.partial_flags = static_cast<int32_t>(partial_flags);
  p.flags = static_cast<int32_t>(flags);
  p.tile_bytes = static_cast<uint64_t>(rows.tile_m) * tile_n * p.partial_bytes;
  p.staging_bytes = static_cast<uint64_t>(partial_flags + run_tiles) * p.tile_bytes;
  return p;
}

int gemm_ar_k_runs(int64_t tiles, int ctas) {
  IL_CHECK(tiles >= 0 && ctas >= 1, "gemm_ar: bad tiles (", tiles, ") or CTAs (", ctas, ")");
  if (tiles == 0 || 2 * tiles > ctas) return 1;
  return static_cast<int>(std::min<int64_t>(4, ctas / tiles));
}

bool gemm_rs_sums_in_epilogue(const RowBlocks& rows) {
  for (int32_t q = 1; q < rows.world; ++q) {  // a block starting at M: trailing empty ranks
    if (rows.start[q] % kGemmRsClusterTileM != 0 && rows.start[q] != rows.m()) return false;
  }
  return true;
}

int gemm_rs_reduce_ctas(int ctas, int cluster, int requested) {
  IL_CHECK(cluster >= 1 && ctas >= 2 * cluster, "gemm_rs: ", ctas, " resident CTAs leave no room for reducers beside ",
           "a computing cluster of ", cluster);
  IL_CHECK(requested >= 0, "gemm_rs: reduce_ctas must be >= 0 (0: automatic), got ", requested);
  if (requested == 0) return std::min(kGemmRsReduceCtas, (ctas - cluster) / cluster * cluster);
  IL_CHECK(requested % cluster == 0 && requested <= ctas - cluster, "gemm_rs: reduce_ctas=", requested,
           " must be a multiple of ", cluster, " and leave a cluster of the ", ctas, " resident CTAs to compute");
  return requested;
}

GemmRsPath choose_gemm_rs_path(int64_t m, int64_t n, int64_t k, int world, GemmRsKind kind, GemmRsPartials partials,
                               int num_sms, int tile_n, GemmRsPathRule rule) {
  IL_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm_rs: bad shape (m ", m, ", n ", n, ", k ", k, ")");
  IL_CHECK(world >= 1 && world <= kGemmRsMaxRanks, "gemm_rs: 1 to ", kGemmRsMaxRanks, " ranks, got ", world);
  IL_CHECK(num_sms >= 2 && tile_n > 0, "gemm_rs: bad GPU or tile (num_sms ", num_sms, ", tile_n ", tile_n, ")");
  if (rule.path != GemmRsPath::kAuto) return rule.path;
  if (m > rule.one_shot_max_m) return GemmRsPath::kThroughput;
  const int64_t cluster_tiles = (m + kGemmRsClusterTileM - 1) / kGemmRsClusterTileM * ((n + tile_n - 1) / tile_n);
  if (cluster_tiles > num_sms / 2) return GemmRsPath::kThroughput;  // more than one wave: overlap pays
  if (kind == GemmRsKind::kAllReduce) {
    // m <= one_shot_max_m and n within one wave of tiles, so this cannot overflow.
    const uint64_t push = static_cast<uint64_t>(world - 1) * m * n * (partials == GemmRsPartials::kFp32 ? 4 : 2);
    if (push > rule.one_shot_max_push_bytes) return GemmRsPath::kThroughput;
  }
  return GemmRsPath::kOneShot;
}

}  // namespace interlace
