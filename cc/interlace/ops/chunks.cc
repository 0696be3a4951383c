#include "interlace/ops/chunks.h"

#include <algorithm>

#include "interlace/base/error.h"
#include "interlace/device/signal_pad.h"

namespace interlace {

ChunkPlan plan_chunks(const char* op, uint64_t bytes, int resident_blocks, int num_blocks, uint64_t chunk_bytes) {
  const int most = std::min(resident_blocks, kMaxBlocks);
  IL_CHECK(most >= 1, op, ": no CTA of the kernel fits on the GPU");
  IL_CHECK(num_blocks >= 0 && num_blocks <= most, op, ": num_blocks must be in [0, ", most,
           "] (the CTAs that fit on the GPU at once: they wait on each other across GPUs), got ", num_blocks);
  IL_CHECK(chunk_bytes % 16 == 0, op, ": chunk_bytes must be a multiple of 16, got ", chunk_bytes);
  ChunkPlan plan;
  plan.num_blocks = num_blocks;
  if (plan.num_blocks == 0) {
    const uint64_t by_size = bytes / kMinChunk + (bytes % kMinChunk != 0);
    plan.num_blocks = static_cast<int>(std::clamp<uint64_t>(by_size, 1, static_cast<uint64_t>(most)));
  }
  plan.chunk_bytes = chunk_bytes;
  if (plan.chunk_bytes == 0) {
    const uint64_t per_block = bytes / plan.num_blocks + (bytes % plan.num_blocks != 0);
    plan.chunk_bytes = std::clamp<uint64_t>((per_block + 15) / 16 * 16, kMinChunk, kMaxChunk);
  }
  const uint64_t per_round = plan.chunk_bytes * plan.num_blocks;
  const uint64_t rounds = bytes / per_round + (bytes % per_round != 0);
  IL_CHECK(rounds < (uint64_t{1} << 31), op, ": ", bytes, " bytes in chunks of ", plan.chunk_bytes, " over ",
           plan.num_blocks, " CTAs needs ", rounds,
           " rounds, more than the kernel's 32-bit round counter allows; pass a larger chunk_bytes");
  plan.rounds = static_cast<int>(rounds);
  return plan;
}

}  // namespace interlace
