// Expert-parallel MoE over NVLink, unfused: moe_dispatch sends each token's row to the ranks of its
// top-k experts (once per rank), moe_combine brings the experts' outputs home and sums them there.
// The layout, overflow and combine rules are ops/moe/plan.h's.
//
//   MoeHandle handle(group, shape);                       // once per shape: symmetric workspace
//   moe_dispatch(group, handle, x, topk_idx, topk_weights, stream);
//   ... expert FFN on handle.expert_x() -> expert_out (same rows) ...
//   moe_combine(group, handle, expert_out, out, stream);
//   cudaStreamSynchronize(stream); group.check();        // raises if a dispatch dropped slots
//
// Nothing syncs with the host: counts stay on the device and a layer can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "interlace/base/tensor.h"
#include "interlace/gemm/grouped_args.h"
#include "interlace/ops/moe/args.h"
#include "interlace/ops/moe/plan.h"
#include "interlace/runtime/group.h"

namespace interlace {

class OpCall;
struct MoeCommonParams;

// What a dispatch leaves for its combine and for the expert GEMMs: the receive rows, their slot
// metadata, the exchanged counts, per local expert its rows, and at home each slot's row and weight.
// Its own symmetric allocation, not the group's scratch: other ops may run between a dispatch and
// its combine. A dispatch overwrites what the last one with the same handle left.
// enable_shared_from_this: Python owns a handle through a shared_ptr, and nanobind hands C++ that
// same owner when Python passes it back (the XLA FFI registry keeps weak references, as for groups).
class MoeHandle : public std::enable_shared_from_this<MoeHandle> {
 public:
  // Collective (a symmetric allocation): every rank makes its handles in the same order, with the
  // same shape (make_moe_plan checks it). The handle must not outlive the group.
  MoeHandle(Group& group, const MoeShape& shape);
  ~MoeHandle();
  MoeHandle(const MoeHandle&) = delete;
  MoeHandle& operator=(const MoeHandle&) = delete;

  const MoeShape& shape() const { return shape_; }
  const MoePlan& plan() const { return plan_; }
  int64_t hidden() const { return shape_.row_bytes / 2; }
  // This rank's tokens in the last dispatch; -1 before the first.
  int64_t tokens() const { return tokens_; }
  uint64_t workspace() const { return offset_; }

  // Device tensors of this rank, valid after a dispatch (stream-ordered), in the group's heap.
  TensorView expert_x() const;       // [recv_rows, H] bf16: rows past an expert's kept rows hold stale data
  TensorView counts() const;         // [W, E] int32: counts[s][e], source s's tokens routed to e
  TensorView slots() const;          // [recv_rows, 4] int32: MoeSlot per receive row (16 bytes)
  TensorView expert_starts() const;  // [L] int32: a local expert's first row in expert_x
  TensorView expert_rows() const;    // [L] int32: its kept rows (the grouped GEMM's M)

  // Raises unless out lies outside this handle's workspace and `in` outside all of it but the
  // receive rows (an input may be expert_x itself): a combine writes the combine rows and reads the
  // slots and home arrays there while it runs, and out is written last.
  void check_apart(const char* op, const char* in_name, const TensorView& in, const TensorView& out) const;

 private:
  friend void moe_dispatch(Group&, MoeHandle&, const TensorView&, const TensorView&, const TensorView&, cudaStream_t);
  friend void moe_dispatch_gemm(Group&, MoeHandle&, const TensorView&, const TensorView&, const TensorView&,
                                const TensorView&, const TensorView&, cudaStream_t, GroupedGemmTuning, int);
  friend MoeCommonParams moe_common_params(Group&, const OpCall&, uint64_t, const MoeHandle&, int64_t);
  TensorView view(uint64_t offset, std::vector<int64_t> shape, DLDataType dtype) const;

  Group& group_;
  MoeShape shape_;
  MoePlan plan_;
  size_t offset_ = 0;  // the workspace in the heap: the plan's buffers, then the local arrays below
  uint64_t bytes_ = 0;
  uint64_t home_row_ = 0, home_weight_ = 0, expert_start_ = 0, expert_rows_ = 0;  // from offset_
  int64_t tokens_ = -1;
};

// Sends x [T, H] bf16 to the experts topk_idx [T, k] (int32 or int64; -1: unused) names, with
// topk_weights [T, k] fp32 for the combine; T may differ between ranks (at most shape.tokens).
// The shape the arguments give (check_moe_dispatch_args with the handle's experts, capacity and
// tokens) must be the handle's. Slots past the capacity are dropped (plan.h), never written out of
// bounds; the group's check() then raises once.
void moe_dispatch(Group& group, MoeHandle& handle, const TensorView& x, const TensorView& topk_idx,
                  const TensorView& topk_weights, cudaStream_t stream);

// out [T, H] bf16 (T: this rank's tokens in the handle's dispatch) = for each token, the sum over its
// top-k entries in order of weight x expert_out's row for that slot, in fp32, rounded once; unused
// and dropped entries add nothing (a token with none gets zeros). expert_out [recv_rows, H] bf16 is in
// expert_x's layout (only the kept rows are read).
void moe_combine(Group& group, MoeHandle& handle, const TensorView& expert_out, const TensorView& out,
                 cudaStream_t stream);

// moe_dispatch fused with the experts' first FFN matmul, in one launch (ops/moe/dispatch_gemm.cuh):
// dispatches x as moe_dispatch does (the handle then serves moe_combine and moe_gemm_combine alike),
// while out [recv_rows, N] = expert_x's kept rows of expert l @ w[l] is computed, each tile as soon as
// the rows it reads have landed. w [L, H, N] bf16 (Linear weights [L, N, H] as w.transpose(1, 2)); the
// handle's capacity_kind must be per_expert and top-k at most 32 (args.h). Rows of out past an
// expert's kept rows are left alone. tuning: grouped_gemm's. copy_ctas: SMs that dispatch (a multiple
// of the tiling's cluster size) while the others compute; 0: default_moe_copy_ctas (args.h).
void moe_dispatch_gemm(Group& group, MoeHandle& handle, const TensorView& x, const TensorView& topk_idx,
                       const TensorView& topk_weights, const TensorView& w, const TensorView& out,
                       cudaStream_t stream, GroupedGemmTuning tuning = {}, int copy_ctas = 0);

// The experts' second FFN matmul fused with moe_combine, in one launch (ops/moe/gemm_combine.cuh):
// expert l's output rows act[l C + r] @ w[l] for its kept rows r, each sent home from the GEMM's
// epilogue as it is computed, then out [T, H] as moe_combine makes it, bit for bit (the same bits as
// grouped_gemm into expert_out, then moe_combine). act [recv_rows, F] bf16 in expert_x's layout, w
// [L, F, H] bf16 (Linear weights [L, H, F] as w.transpose(1, 2)); the handle's capacity_kind must be
// per_expert (args.h). tuning: grouped_gemm's.
void moe_gemm_combine(Group& group, MoeHandle& handle, const TensorView& act, const TensorView& w,
                      const TensorView& out, cudaStream_t stream, GroupedGemmTuning tuning = {});

}  // namespace interlace
