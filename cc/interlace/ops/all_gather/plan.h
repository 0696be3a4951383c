// Host side of all_gather: argument checks and the split of the work over CTAs and rounds. Pure
// C++, so the CPU tests cover it.
#pragma once

#include <cstdint>
#include <string>

#include "interlace/base/tensor.h"
#include "interlace/ops/chunks.h"

namespace interlace {

using AllGatherPlan = ChunkPlan;

struct AllGatherTuning {
  int num_blocks = 0;        // 0: automatic
  uint64_t chunk_bytes = 0;  // 0: automatic
};

// resident_blocks: how many of the kernel's CTAs fit on the GPU at once (see ops/chunks.h).
AllGatherPlan plan_all_gather(uint64_t bytes_per_rank, int resident_blocks, AllGatherTuning tuning = {});

// Raises, naming the argument, unless out can hold world_size shards of inp on `device`:
// same dtype; out shaped [world_size, *inp.shape] or [world_size * inp.shape[0], *inp.shape[1:]];
// both C-contiguous CUDA tensors on `device`, in memory that does not overlap.
void check_all_gather_args(const TensorView& out, const TensorView& inp, int world_size, int device);

}  // namespace interlace
