// Host side of all_gather: argument checks and the split of the work over CTAs and rounds. Pure
// C++, so the CPU tests cover it.
#pragma once

#include <cstdint>
#include <string>

#include "interlace/base/tensor.h"

namespace interlace {

struct AllGatherPlan {
  int num_blocks = 1;        // CTAs
  uint64_t chunk_bytes = 0;  // one CTA's piece of the shard per round; a multiple of 16
  int rounds = 0;            // chunk c = round * num_blocks + block covers [c, c + 1) * chunk_bytes
};

struct AllGatherTuning {
  int num_blocks = 0;        // 0: automatic
  uint64_t chunk_bytes = 0;  // 0: automatic
};

// Stores to a peer need many CTAs in flight: by default as many as fit on the GPU at once (every
// CTA must be resident, since CTAs wait on their peers' CTAs). A message is cut into chunks small
// enough that the receive-side copy pipelines behind the stores, and large enough that a round's
// flag costs little.
constexpr uint64_t kAllGatherMinChunk = 16 * 1024;
constexpr uint64_t kAllGatherMaxChunk = 64 * 1024;  // 64 KiB beat 128 and 256 KiB at 256 MiB per rank

// resident_blocks: how many of the kernel's CTAs fit on the GPU at once.
AllGatherPlan plan_all_gather(uint64_t bytes_per_rank, int resident_blocks, AllGatherTuning tuning = {});

// Raises, naming the argument, unless out can hold world_size shards of inp on `device`:
// same dtype; out shaped [world_size, *inp.shape] or [world_size * inp.shape[0], *inp.shape[1:]];
// both C-contiguous CUDA tensors on `device`, in memory that does not overlap.
void check_all_gather_args(const TensorView& out, const TensorView& inp, int world_size, int device);

}  // namespace interlace
