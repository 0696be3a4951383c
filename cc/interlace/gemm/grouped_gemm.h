// interlace::grouped_gemm: G GEMMs in one launch, group g computing out[g, :rows[g]] =
// a[g, :rows[g]] @ b[g], with the row counts read on the GPU: a mixture of experts' FFN matmul on the
// tokens each expert received, with no host sync for the counts. bf16/fp16 in, fp32 accumulation.
// Checks everything before any GPU work (grouped_args.h).
#pragma once

#include <cuda_runtime_api.h>

#include "interlace/base/tensor.h"
#include "interlace/gemm/grouped_args.h"

namespace interlace {

// a: [G, C, K]; b: [G, K, N] (or Linear weights [G, N, K] passed as w.transpose(1, 2)); out: [G, C, N];
// rows: int32 [G] on the GPU. Rows of out at or past rows[g] (clamped to C) are left as they are.
// Every role of every CTA reads rows itself: it must not change while the kernel runs (it is read
// in stream order, like any input; a write racing the kernel could make the roles disagree and hang).
void grouped_gemm(const TensorView& a, const TensorView& b, const TensorView& out, const TensorView& rows,
                  cudaStream_t stream, GroupedGemmTuning tuning = {});

}  // namespace interlace
