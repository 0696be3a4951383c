#pragma once

#include <cuda_runtime_api.h>

#include "interlace/base/tensor.h"
#include "interlace/ops/reduce/plan.h"
#include "interlace/runtime/group.h"

namespace interlace {

// out = this rank's block of the sum over ranks of inp: inp holds world_size blocks of out's size
// (inp [world * n, ...], [world, n, ...] or flat; out [n, ...]), and rank r gets the sum of every
// rank's block r. fp16, bf16 or fp32; summed in fp32 in rank order and rounded once, so the result is
// the same bits on every run. A block's bytes must be a multiple of 16. Every rank pushes its
// blocks into their owners' staging in the symmetric heap ((world - 1) x out's bytes of scratch).
// Stream-ordered and graph-capturable.
void reduce_scatter(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                    ReduceTuning tuning = {});

// out = the sum over ranks of inp (same shape), the same bits on every rank and every run: summed in
// fp32 in rank order and rounded once. fp16, bf16 or fp32, any element count; out may be inp (in
// place). One-shot (every rank sums every rank's whole input) for small messages, else two-shot
// (reduce_scatter, then each rank's reduced share to every rank), in one launch; scratch in the
// symmetric heap: (world - 1) x the input for one-shot, about 2 x (world - 1) / world x for two-shot
// (half that when out lies in the heap: owners then store into it directly). Stream-ordered and
// graph-capturable.
void all_reduce(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                ReduceTuning tuning = {});

}  // namespace interlace
