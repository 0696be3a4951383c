// Host-side checks of interlace::attention's arguments: everything is validated before any GPU work.
#pragma once

#include <cstdint>

#include "interlace/base/tensor.h"

namespace interlace {

enum class AttentionDtype { kBf16, kF16 };

// The kernel counts rows in 32-bit integers and launches a CTA per (query tile, head, batch), so heads
// and batch are bounded by the grid's y and z dimensions.
inline constexpr int64_t kMaxAttentionSeq = (int64_t{1} << 31) - 256;
inline constexpr int64_t kMaxAttentionGrid = 65535;

struct AttentionProblem {
  int64_t batch = 0, seq_q = 0, seq_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  AttentionDtype dtype = AttentionDtype::kBf16;
  bool causal = false;
  float softmax_scale = 0;  // resolved: 1 / sqrt(D) when the caller gave 0
};

// q and out: [B, S_q, Hq, D]; k and v: [B, S_k, Hkv, D]; all contiguous, bf16 or fp16 alike, on CUDA
// `device`, 16-byte aligned (TMA). D is 64 or 128; Hq a multiple of Hkv (GQA). Causal attention
// (query i sees keys 0 .. i) needs S_q == S_k. lse, when given: float32 [B, Hq, S_q], contiguous.
// out may not overlap an input or lse. softmax_scale: 0 for 1 / sqrt(D), else positive and finite.
AttentionProblem check_attention_args(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView* lse, bool causal,
                                      double softmax_scale, int device);

}  // namespace interlace
