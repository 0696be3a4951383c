#pragma once

#include <cuda_runtime_api.h>

#include "interlace/api/tensor.h"
#include "interlace/runtime/group.h"

namespace interlace {

// out = concatenation of every rank's inp, in rank order. Stream-ordered and graph-capturable.
// If inp lies in the group's symmetric heap, peers read it in place; otherwise it is staged into the
// heap first (within the same kernel). num_blocks = 0 picks the CTA count automatically.
void all_gather(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream, int num_blocks = 0);

}  // namespace interlace
