// Host side of all_gather: argument checks and the split of the work over CTAs. Pure C++, so the
// CPU tests cover it.
#pragma once

#include <cstdint>
#include <string>

#include "interlace/api/tensor.h"

namespace interlace {

struct AllGatherPlan {
  int num_blocks = 1;        // CTAs; CTA b moves bytes [b*chunk_bytes, (b+1)*chunk_bytes) of every shard
  uint64_t chunk_bytes = 0;  // a multiple of 16 so that every CTA's range stays 16-byte aligned
};

// Default split: enough CTAs to keep NVLink busy, each with at least kMinBytesPerBlock. A num_blocks
// > 0 overrides it (for tuning).
AllGatherPlan plan_all_gather(uint64_t bytes_per_rank, int num_sms, int num_blocks = 0);

constexpr uint64_t kAllGatherMinBytesPerBlock = 64 * 1024;

// Raises, naming the argument, unless out can hold world_size shards of inp on `device`:
// same dtype; out shaped [world_size, *inp.shape] or [world_size * inp.shape[0], *inp.shape[1:]];
// both C-contiguous CUDA tensors on `device`.
void check_all_gather_args(const TensorView& out, const TensorView& inp, int world_size, int device);

}  // namespace interlace
