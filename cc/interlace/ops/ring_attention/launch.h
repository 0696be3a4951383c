#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "interlace/base/tensor.h"
#include "interlace/runtime/group.h"

namespace interlace {

// Ring attention over the group, in one launch: q, out [B, S_local, Hq, D] and k, v [B, S_local, Hkv,
// D] are this rank's zigzag shard of the global sequence (ring_attention/plan.h; rank i holds chunks
// i and 2W-1-i); out = softmax(Q K^T * scale) V over every rank's keys, causal over the global
// positions when asked; lse, when not null, float32 [B, Hq, S_local]. seq_len: the global S (0: W x
// S_local, which needs 2W to divide S). bf16/fp16, D 64 or 128, Hq a multiple of Hkv. The blocks
// travel through a receive buffer of W - 1 blocks in the group's heap scratch. Stream-ordered,
// graph-capturable; raises before any GPU work on bad arguments. sender_ctas: the CTAs that forward
// the blocks (0: automatic), a tuning.
void ring_attention(Group& group, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView* lse, bool causal, double softmax_scale, int64_t seq_len, cudaStream_t stream,
                    int sender_ctas = 0);

}  // namespace interlace
