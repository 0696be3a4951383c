#pragma once

#include <cuda_runtime_api.h>

#include "interlace/base/tensor.h"
#include "interlace/ops/all_gather/plan.h"
#include "interlace/runtime/group.h"

namespace interlace {

// out = every rank's inp concatenated in rank order. Stream-ordered and graph-capturable. Peers
// store straight into out when out lies in the group's symmetric heap; otherwise into a receive
// buffer in the heap (world * inp bytes), from which each rank copies into out as chunks land.
void all_gather(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                AllGatherTuning tuning = {});

}  // namespace interlace
