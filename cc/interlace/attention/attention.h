// interlace::attention: softmax(q k^T * scale) v on one GPU with the Hopper attention engine, the
// compute that ring attention runs per block. bf16/fp16 in, fp32 softmax and accumulation.
#pragma once

#include <cuda_runtime_api.h>

#include "interlace/base/tensor.h"

namespace interlace {

// q, out: [B, S_q, Hq, D]; k, v: [B, S_k, Hkv, D] (see check_attention_args). lse, when not null,
// receives the natural-log log-sum-exp of each query's scaled scores, [B, Hq, S_q] float32.
// softmax_scale 0 means 1 / sqrt(D). Checks everything before any GPU work.
void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const TensorView* lse, bool causal, double softmax_scale, cudaStream_t stream);

}  // namespace interlace
