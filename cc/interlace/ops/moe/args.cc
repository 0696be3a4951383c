#include "interlace/ops/moe/args.h"

#include "interlace/base/error.h"

namespace interlace {
namespace {

bool is_bf16(const TensorView& t) { return t.dtype.code == kDLBfloat && t.dtype.bits == 16 && t.dtype.lanes == 1; }

}  // namespace

MoeShape check_moe_dispatch_args(const TensorView& x, const TensorView& topk_idx, const TensorView& topk_weights,
                                 const MoeDispatchOptions& o, int world_size, int device) {
  const char* op = "moe_dispatch";
  IL_CHECK(x.shape.size() == 2, op, ": x must be 2-D [tokens, hidden], got shape ", x.shape_string());
  IL_CHECK(is_bf16(x), op, ": x has dtype ", x.dtype_name(), "; it must be bfloat16");
  // The kernels index every tensor as dense rows; rows move as 16-byte vectors, the routing in elements.
  check_placed(op, "x", x, device, kMoeRowAlignBytes);
  const int64_t tokens = x.shape[0], hidden = x.shape[1];
  IL_CHECK(hidden >= 1 && (hidden * 2) % kMoeRowAlignBytes == 0, op, ": hidden size ", hidden, " is ", hidden * 2,
           " bytes a row; it must be a positive multiple of 8 elements (16 bytes): pad the hidden size");
  IL_CHECK(topk_idx.shape.size() == 2 && topk_idx.shape[0] == tokens, op, ": topk_idx has shape ",
           topk_idx.shape_string(), "; it must be [tokens, k] with tokens = ", tokens, " (x's rows)");
  const bool int_index = topk_idx.dtype.code == kDLInt && topk_idx.dtype.lanes == 1 &&
                         (topk_idx.dtype.bits == 32 || topk_idx.dtype.bits == 64);
  IL_CHECK(int_index, op, ": topk_idx has dtype ", topk_idx.dtype_name(), "; it must be int32 or int64");
  check_placed(op, "topk_idx", topk_idx, device, topk_idx.itemsize());
  const int64_t k = topk_idx.shape[1];
  IL_CHECK(k >= 1 && k <= kMoeMaxTopk, op, ": top-k must be 1 to ", kMoeMaxTopk, ", got ", k);
  IL_CHECK(topk_weights.shape == topk_idx.shape, op, ": topk_weights has shape ", topk_weights.shape_string(),
           " but topk_idx has ", topk_idx.shape_string(), "; they must match");
  IL_CHECK(topk_weights.dtype.code == kDLFloat && topk_weights.dtype.bits == 32 && topk_weights.dtype.lanes == 1, op,
           ": topk_weights has dtype ", topk_weights.dtype_name(), "; it must be float32");
  check_placed(op, "topk_weights", topk_weights, device, sizeof(float));
  const int64_t max_tokens = o.max_tokens < 0 ? tokens : o.max_tokens;
  IL_CHECK(tokens <= max_tokens, op, ": ", tokens, " tokens on this rank, more than max_tokens = ", max_tokens);
  MoeShape shape;
  shape.world = world_size;
  shape.experts = o.experts;
  shape.topk = static_cast<int>(k);
  shape.row_bytes = hidden * 2;
  shape.tokens = max_tokens;
  shape.capacity = o.capacity;
  shape.capacity_kind = o.capacity_kind;
  make_moe_plan(shape);  // raises on what remains (E % W, k <= E, capacity, 32-bit rows, flags)
  return shape;
}

void check_moe_combine_args(const TensorView& expert_out, const TensorView& out, const MoePlan& plan, int64_t tokens,
                            int device) {
  const char* op = "moe_combine";
  const int64_t hidden = plan.row_bytes / 2;
  IL_CHECK(is_bf16(expert_out), op, ": expert_out has dtype ", expert_out.dtype_name(), "; it must be bfloat16");
  IL_CHECK(is_bf16(out), op, ": out has dtype ", out.dtype_name(), "; it must be bfloat16");
  IL_CHECK(expert_out.shape == std::vector<int64_t>({plan.recv_rows, hidden}), op, ": expert_out has shape ",
           expert_out.shape_string(), "; it must be [", plan.recv_rows, ", ", hidden,
           "], the layout of the dispatch's expert_x (its handle's receive rows)");
  IL_CHECK(out.shape == std::vector<int64_t>({tokens, hidden}), op, ": out has shape ", out.shape_string(),
           "; it must be [", tokens, ", ", hidden, "], the dispatch's tokens on this rank");
  check_placed(op, "expert_out", expert_out, device, kMoeRowAlignBytes);
  check_placed(op, "out", out, device, kMoeRowAlignBytes);
  IL_CHECK(!bytes_overlap(expert_out, out), op, ": expert_out and out overlap; they must be separate memory");
}

}  // namespace interlace
