#include "interlace/ops/ag_gemm/plan.h"

#include <algorithm>

#include "interlace/base/error.h"

namespace interlace {

AgGemmRows make_ag_gemm_rows(const std::vector<int64_t>& rows_per_rank, int rank, int tile_m) {
  return AgGemmRows{make_row_blocks(rows_per_rank, rank, tile_m, "ag_gemm")};
}

std::vector<int32_t> ag_gemm_tile_row_order(const AgGemmRows& rows) {
  return slot_tile_row_order(rows.tiles_m(), rows.world, [&rows](int32_t t) { return rows.slot_of(t); });
}

AgGemmOrder::Params AgGemmOrder::make(const AgGemmRows& rows, int32_t tiles_n, int32_t band_m) {
  return SlotOrder::make(
      rows.tiles_m(), rows.world, [&rows](int32_t t) { return rows.slot_of(t); }, tiles_n, band_m, "ag_gemm");
}

int32_t ag_gemm_band_m(const AgGemmRows& rows, int32_t preferred, int32_t requested) {
  IL_CHECK(requested >= 0, "ag_gemm: band_m must be >= 0 (0: automatic), got ", requested);
  if (requested > 0) return requested;
  int64_t largest = 0;
  for (int q = 0; q < rows.world; ++q) largest = std::max(largest, rows.rows_of(q));
  const int64_t tile_rows = (largest + rows.tile_m - 1) / rows.tile_m;
  return static_cast<int32_t>(std::min<int64_t>(preferred, std::max<int64_t>(2, tile_rows / 2)));
}

AgGemmTransfer ag_gemm_transfer(AgGemmTransfer requested) {
  return requested == AgGemmTransfer::kAuto ? AgGemmTransfer::kCopyEngine : requested;
}

AgGemmTransfer ag_gemm_transfer_named(const std::string& name) {
  if (name == "auto") return AgGemmTransfer::kAuto;
  if (name == "copy_engine") return AgGemmTransfer::kCopyEngine;
  if (name == "ctas") return AgGemmTransfer::kCopyCtas;
  IL_FAIL("ag_gemm: transfer must be 'auto', 'copy_engine' or 'ctas', got '", name, "'");
}

int ag_gemm_copy_ctas(int ctas, int cluster, int requested) {
  IL_CHECK(requested >= 0, "ag_gemm: copy_ctas must be >= 0 (0: automatic), got ", requested);
  if (requested == 0) return std::min(kAgGemmCopyCtas, (ctas - cluster) / cluster * cluster);
  IL_CHECK(requested % cluster == 0 && requested <= ctas - cluster, "ag_gemm: copy_ctas=", requested,
           " must be a multiple of ", cluster, " and leave a cluster of the ", ctas, " resident CTAs to compute");
  return requested;
}

int64_t ag_gemm_chunk_rows(const AgGemmRows& rows, int64_t row_bytes, AgGemmTransfer transfer, int ctas,
                           int64_t requested) {
  int64_t largest = 0;
  for (int q = 0; q < rows.world; ++q) largest = std::max(largest, rows.rows_of(q));
  const int64_t fewest = std::max<int64_t>(1, (largest + kAgGemmMaxChunks - 1) / kAgGemmMaxChunks);
  if (requested > 0) {
    IL_CHECK(requested >= fewest, "ag_gemm: chunk_rows=", requested, " cuts a shard of ", largest, " rows into more than ",
             kAgGemmMaxChunks, " chunks; use at least ", fewest);
    return std::min(requested, std::max<int64_t>(largest, 1));  // one chunk per shard at most: no overflow
  }
  if (transfer == AgGemmTransfer::kCopyEngine) {
    const int64_t by_bytes = std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(row_bytes, 1));
    const int64_t by_count = (largest + kAgGemmCopyEngineChunks - 1) / kAgGemmCopyEngineChunks;
    return std::max({fewest, by_count, std::min(by_bytes, std::max<int64_t>(largest, 1))});
  }
  const int64_t by_bytes = std::max<int64_t>(1, (int64_t{256} << 10) / std::max<int64_t>(row_bytes, 1));
  const int64_t by_ctas = std::max<int64_t>(1, (largest + 2 * ctas - 1) / (2 * std::max(ctas, 1)));
  return std::max(fewest, std::min(by_bytes, by_ctas));
}

}  // namespace interlace
