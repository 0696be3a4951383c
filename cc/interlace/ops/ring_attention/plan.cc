#include "interlace/ops/ring_attention/plan.h"

#include "interlace/base/error.h"

namespace interlace {

RingAttentionPlan make_ring_attention_plan(int world, int rank, int64_t seq, bool causal, int heads_q, int heads_kv,
                                           int tile_q, int tile_k, int batch) {
  IL_CHECK(world >= 1 && world <= kRingAttentionMaxRanks, "ring_attention: 1 to ", kRingAttentionMaxRanks,
           " ranks, got ", world);
  IL_CHECK(rank >= 0 && rank < world, "ring_attention: rank ", rank, " out of range for ", world, " ranks");
  // Under 2^31 rows: the kernel's tile and row counters are 32-bit.
  IL_CHECK(seq >= 0 && seq < (int64_t{1} << 31), "ring_attention: sequence length ", seq, " out of range [0, 2^31)");
  IL_CHECK(tile_q >= 1 && tile_k >= 1, "ring_attention: tiles of ", tile_q, " x ", tile_k, " rows");
  IL_CHECK(heads_q >= 1 && heads_kv >= 1 && heads_q % heads_kv == 0, "ring_attention: ", heads_q,
           " query heads are not a multiple of ", heads_kv, " key/value heads");
  IL_CHECK(batch >= 1 && batch <= kRingAttentionMaxPieces, "ring_attention: batch ", batch, " out of range");
  RingAttentionPlan plan;
  plan.world = world;
  plan.rank = rank;
  plan.seq = seq;
  plan.causal = causal ? 1 : 0;
  plan.tile_q = tile_q;
  plan.tile_k = tile_k;
  plan.heads_q = heads_q;
  plan.heads_kv = heads_kv;
  plan.chunk_base = seq / (2 * world);
  plan.chunk_extra = static_cast<int32_t>(seq % (2 * world));
  plan.batch = batch;
  const int64_t heads = static_cast<int64_t>(batch) * heads_kv;
  IL_CHECK(heads <= kRingAttentionMaxPieces, "ring_attention: batch x KV heads = ", heads, " exceeds ",
           kRingAttentionMaxPieces);
  const int64_t per_head = kRingAttentionMaxPieces / heads;  // pieces each (batch, head) may have
  const int64_t rows = (plan.max_local_rows() + per_head - 1) / per_head;
  const int64_t at_least = rows > kRingAttentionFlagRows ? rows : kRingAttentionFlagRows;
  plan.flag_rows = static_cast<int32_t>((at_least + tile_k - 1) / tile_k * tile_k);
  return plan;
}

}  // namespace interlace
