// The host checks of moe_dispatch and moe_combine, made before any GPU work (no GPU needed: the CPU
// tests call them, and so does the Python binding's _check_moe_*_args).
#pragma once

#include <cstdint>

#include "interlace/base/tensor.h"
#include "interlace/gemm/grouped_args.h"
#include "interlace/ops/moe/plan.h"

namespace interlace {

// What a dispatch call asks for, beside its tensors.
struct MoeDispatchOptions {
  int64_t experts = 0;       // E, over all ranks
  int64_t capacity = 0;      // receive rows per local expert (kPerExpert) or per rank (kPerRank)
  MoeCapacityKind capacity_kind = MoeCapacityKind::kPerExpert;
  int64_t max_tokens = -1;   // the most tokens any rank dispatches (the same on every rank); -1: this rank's
};

// x [T, H] bfloat16, topk_idx [T, k] int32 or int64, topk_weights [T, k] float32, all contiguous on
// the group's GPU, x 16-byte aligned with H x 2 bytes a multiple of 16; T <= max_tokens. Returns the
// shape to plan with (make_moe_plan checks the rest: E % W, k, capacity, 32-bit rows).
MoeShape check_moe_dispatch_args(const TensorView& x, const TensorView& topk_idx, const TensorView& topk_weights,
                                 const MoeDispatchOptions& options, int world_size, int device,
                                 const char* op = "moe_dispatch");

// expert_out [recv_rows, H] bfloat16 (the receive buffer's layout), out [tokens, H] bfloat16, where
// tokens is the dispatch's T on this rank; contiguous, 16-byte aligned, on the group's GPU, apart.
void check_moe_combine_args(const TensorView& expert_out, const TensorView& out, const MoePlan& plan,
                            int64_t tokens, int device);

// moe_gemm_combine's: act [recv_rows, F] bfloat16 in the receive rows' layout (F: the FFN width), from
// a handle whose capacity_kind is per_expert (local expert l's rows start at l x capacity); w
// [L, F, H] bfloat16 with H or F contiguous (Linear weights [L, H, F] passed as w.transpose(1, 2));
// out [tokens, H] bfloat16, contiguous, 16-byte aligned, apart from act and w; rows: the handle's
// expert_rows. Returns the grouped GEMM of act viewed as [L, C, F] (grouped_args.h checks its
// strides and alignment; its messages call act "a" and w "b").
GroupedGemmProblem check_moe_gemm_combine_args(const TensorView& act, const TensorView& w, const TensorView& out,
                                               const TensorView& rows, const MoePlan& plan, int64_t tokens,
                                               int device);

// moe_dispatch_gemm's top-k: a warp per token lays out its entries, a lane each.
constexpr int kMoeDispatchGemmMaxTopk = 32;

// moe_dispatch_gemm's copy_ctas where the call leaves it 0, for an expert matmul N wide whose tiles
// come in clusters of `cluster` CTAs, on a grid of `ctas`: the rows to move per flop of the GEMM go as
// 1 / N, and so do the copier SMs that keep ahead of it: 16 at N = 4096 (DeepSeek-like GEMM1), at
// least 4, in whole clusters, and at most half the grid (a small GPU). Measured at world size 1
// (bench/results/NOTES.md, nineteenth session): of 4, 8, 16 and 24, 16 was fastest at N 4096 and 4 at
// N 28672 (Mixtral-like), about 5% ahead of 16 there.
int default_moe_copy_ctas(int64_t n, int cluster, int ctas);

// moe_dispatch_gemm's GEMM (its dispatch is checked as moe_dispatch's, with op named): from a handle
// whose capacity_kind is per_expert and top-k at most kMoeDispatchGemmMaxTopk, w [L, hidden, N]
// bfloat16 with N or hidden contiguous (Linear weights [L, N, hidden] passed as w.transpose(1, 2)),
// out [recv_rows, N] bfloat16, contiguous, 16-byte aligned, apart from w; expert_x: the handle's
// receive rows; rows: its expert_rows. Returns the grouped GEMM of expert_x viewed as [L, C, hidden]
// into out viewed as [L, C, N] (grouped_args.h checks strides and alignment; its messages call
// expert_x "a" and w "b").
GroupedGemmProblem check_moe_dispatch_gemm_args(const TensorView& w, const TensorView& out, const TensorView& expert_x,
                                                const TensorView& rows, const MoePlan& plan, int device);

}  // namespace interlace
