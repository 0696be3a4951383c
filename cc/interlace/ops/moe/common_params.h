// What every MoE kernel reads of its call and its handle, filled on the host (defined in launch.cu,
// used by the unfused ops and by the fused ones).
#pragma once

#include <cstdint>
#include <string>

#include "interlace/ops/moe/device.cuh"
#include "interlace/ops/moe/launch.h"
#include "interlace/runtime/op_call.h"

namespace interlace {

// The call's transport and waits, the handle's plan, workspace and home-side arrays, this rank's tokens.
MoeCommonParams moe_common_params(Group& group, const OpCall& call, uint64_t signature, const MoeHandle& handle,
                                  int64_t tokens);

// A dispatch call's scratch in the group's heap, byte offsets: pos [max_tokens x k] at 0, run_row and
// run_kept [E], two drop counters; for a grid of ctas CTAs that numbers by chunks (moe_dispatch's),
// chunk_counts [E][ctas] (offset 0 where ctas is 0: none); with lists (moe_dispatch_gemm's),
// slot_start [E], slot_list [max_tokens x k] and the copiers' chunk counters [2][E]; bytes in all.
struct MoeDispatchScratch {
  uint64_t run_row = 0, run_kept = 0, dropped = 0, chunk_counts = 0, slot_start = 0, slot_list = 0, chunks = 0,
           bytes = 0;
};
MoeDispatchScratch moe_dispatch_scratch(const MoePlan& plan, int ctas, bool lists);

// Raises unless a dispatch's tensors are good (check_moe_dispatch_args, errors naming op) and their
// shape is the handle's, which it returns.
MoeShape check_dispatch_for_handle(const char* op, Group& group, const MoeHandle& handle, const TensorView& x,
                                   const TensorView& topk_idx, const TensorView& topk_weights);

// "world=..., experts=..., ...": a shape as the ops' signatures and errors give it.
std::string describe_moe_shape(const MoeShape& shape);

// A dispatch's kernel parameters: the common ones (moe_common_params, x's tokens), its tensors, and
// its scratch `at`, placed at heap offset `scratch`.
MoeDispatchParams moe_dispatch_params(Group& group, const OpCall& call, uint64_t signature, const MoeHandle& handle,
                                      const TensorView& x, const TensorView& topk_idx,
                                      const TensorView& topk_weights, size_t scratch, const MoeDispatchScratch& at);

}  // namespace interlace
