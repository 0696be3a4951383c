// How a collective's kernel cuts a message over CTAs and rounds of chunks: all_gather's, and the
// reductions' (gemm_rs/plan.h). Stores to a peer need many CTAs in flight: by default as many as fit
// on the GPU at once (every CTA must be resident, since CTAs wait on their peers' CTAs). Chunks are
// small enough that a receiver's copy or reduction pipelines behind the stores, and large enough
// that a round's flag costs little.
#pragma once

#include <cstdint>

namespace interlace {

struct ChunkPlan {
  int num_blocks = 1;        // CTAs
  uint64_t chunk_bytes = 0;  // one CTA's piece per round; a multiple of 16
  int rounds = 0;            // chunk c = round * num_blocks + block covers [c, c + 1) * chunk_bytes
};

constexpr uint64_t kMinChunk = 16 * 1024;
constexpr uint64_t kMaxChunk = 64 * 1024;  // 64 KiB beat 128 and 256 KiB for all_gather at 256 MiB per rank

// `bytes` over at most resident_blocks CTAs. num_blocks and chunk_bytes override the choice (0:
// automatic). Raises, naming `op`, on a bad override or more rounds than a 32-bit counter holds.
ChunkPlan plan_chunks(const char* op, uint64_t bytes, int resident_blocks, int num_blocks, uint64_t chunk_bytes);

}  // namespace interlace
