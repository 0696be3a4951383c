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

GemmRsPlan make_gemm_rs_plan(const GemmRsRows& rows, int64_t n, int tile_n, GemmRsKind kind, GemmRsPath path,
                             GemmRsPartials partials, int reduce_band_m) {
  const char* op = kind == GemmRsKind::kAllReduce ? "gemm_ar" : "gemm_rs";
  IL_CHECK(n >= 0 && tile_n > 0, op, ": bad output columns (n ", n, ", tile_n ", tile_n, ")");
  IL_CHECK(path == GemmRsPath::kThroughput || path == GemmRsPath::kOneShot, op,
           ": the plan needs a path (choose_gemm_rs_path decides kAuto)");
  IL_CHECK(reduce_band_m >= 1, op, ": reduce_band_m must be >= 1, got ", reduce_band_m);
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
  const int64_t flags = partial_flags + (p.broadcast ? int64_t{rows.tiles_m()} * tiles_n : 0);
  IL_CHECK(flags <= kGemmRsMaxFlags, op, ": rank ", busiest, " sums ", most_rows, " x ", tiles_n, " tiles of ",
           rows.tile_m, " x ", tile_n, " from ", rows.world, " ranks", p.broadcast ? ", and receives every reduced tile" : "",
           ": ", flags, " flags, more than the ", kGemmRsMaxFlags, " that fit the op's ", kOpRegionBytes >> 10,
           " KiB flag region; use wider tiles (tile_n=256) or split the call along M or N");
  p.partial_flags = static_cast<int32_t>(partial_flags);
  p.flags = static_cast<int32_t>(flags);
  p.tile_bytes = static_cast<uint64_t>(rows.tile_m) * tile_n * p.partial_bytes;
  p.staging_bytes = static_cast<uint64_t>(partial_flags) * p.tile_bytes;
  return p;
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

namespace {

// Splits one share over CTAs and rounds of chunks (ops/chunks.h); the reduction kernel also numbers
// chunks round * num_blocks + block, and offsets within a chunk, in 32 bits.
void plan_reduce_chunks(const char* op, ReducePlan& plan, int resident_blocks, const ReduceTuning& tuning) {
  IL_CHECK(tuning.chunk_bytes <= (uint64_t{1} << 30), op,
           ": chunk_bytes must be a multiple of 16 and at most 1 GiB (offsets within a chunk are 32-bit), got ",
           tuning.chunk_bytes);
  const uint64_t share = plan.share_bytes;
  const ChunkPlan chunks = plan_chunks(op, share, resident_blocks, tuning.num_blocks, tuning.chunk_bytes);
  plan.num_blocks = chunks.num_blocks;
  plan.chunk_bytes = chunks.chunk_bytes;
  IL_CHECK(static_cast<uint64_t>(chunks.rounds) <= ((uint64_t{1} << 31) - 1) / plan.num_blocks, op, ": a share of ",
           share, " bytes in chunks of ", plan.chunk_bytes, " over ", plan.num_blocks, " CTAs needs ", chunks.rounds,
           " rounds, more chunks than the kernel's 32-bit chunk counter allows; pass a larger chunk_bytes");
  plan.rounds = chunks.rounds;
  IL_CHECK(share <= std::numeric_limits<uint64_t>::max() / plan.world, op, ": ", plan.world, " staging slots of ",
           share, " bytes overflow 64 bits");
  plan.staging_bytes = share * plan.world;
}

void check_message(const char* op, int element_bytes, int world) {
  IL_CHECK(element_bytes == 2 || element_bytes == 4, op, ": elements of 2 or 4 bytes, got ", element_bytes);
  IL_CHECK(world >= 1 && world <= kMaxLocalRanks, op, ": 1 to ", kMaxLocalRanks, " ranks, got ", world);
}

}  // namespace

ReducePlan plan_reduce_scatter(uint64_t out_bytes, int element_bytes, int world, int resident_blocks,
                               ReduceTuning tuning) {
  check_message("reduce_scatter", element_bytes, world);
  IL_CHECK(out_bytes % element_bytes == 0, "reduce_scatter: ", out_bytes, " bytes is not a whole number of ",
           element_bytes, "-byte elements");
  IL_CHECK(tuning.algorithm == ReduceAlgorithm::kAuto || tuning.algorithm == ReduceAlgorithm::kReduceScatter,
           "reduce_scatter: it has one algorithm; leave algorithm automatic");
  IL_CHECK(out_bytes <= std::numeric_limits<uint64_t>::max() / world, "reduce_scatter: ", world, " shares of ",
           out_bytes, " bytes overflow 64 bits");
  ReducePlan plan;
  plan.world = world;
  plan.algorithm = ReduceAlgorithm::kReduceScatter;
  plan.bytes = out_bytes * world;
  IL_CHECK(out_bytes % 16 == 0, "reduce_scatter: a share of ", out_bytes,
           " bytes must be a multiple of 16 (rows of 16-byte multiples), so that 16-byte vectors stay aligned");
  plan.share_bytes = out_bytes;
  plan_reduce_chunks("reduce_scatter", plan, resident_blocks, tuning);
  return plan;
}

ReducePlan plan_all_reduce(uint64_t bytes, int element_bytes, int world, int resident_blocks, ReduceTuning tuning) {
  check_message("all_reduce", element_bytes, world);
  IL_CHECK(bytes % element_bytes == 0, "all_reduce: ", bytes, " bytes is not a whole number of ", element_bytes,
           "-byte elements");
  IL_CHECK(tuning.algorithm == ReduceAlgorithm::kAuto || tuning.algorithm == ReduceAlgorithm::kOneShot ||
               tuning.algorithm == ReduceAlgorithm::kTwoShot,
           "all_reduce: algorithm must be automatic, one-shot or two-shot");
  ReducePlan plan;
  plan.world = world;
  plan.bytes = bytes;
  plan.algorithm = tuning.algorithm;
  if (plan.algorithm == ReduceAlgorithm::kAuto) {
    const bool small = bytes <= kAllReduceOneShotMaxPushBytes / std::max(world - 1, 1);
    plan.algorithm = small ? ReduceAlgorithm::kOneShot : ReduceAlgorithm::kTwoShot;
  }
  // Two-shot: world shares of a 16-byte multiple, the last ones shorter or empty. One-shot: every
  // rank reduces the whole message. Both sum in rank order, so they give the same bits.
  const uint64_t even = bytes / world + (bytes % world != 0);
  plan.share_bytes = plan.algorithm == ReduceAlgorithm::kOneShot ? bytes : even + (16 - even % 16) % 16;
  plan_reduce_chunks("all_reduce", plan, resident_blocks, tuning);
  return plan;
}

}  // namespace interlace
