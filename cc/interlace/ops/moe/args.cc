#include "interlace/ops/moe/args.h"

#include <algorithm>

#include "interlace/base/error.h"

namespace interlace {
namespace {

bool is_bf16(const TensorView& t) { return t.dtype.code == kDLBfloat && t.dtype.bits == 16 && t.dtype.lanes == 1; }

// A combine's out: [tokens, H] bfloat16 (tokens: the dispatch's T on this rank), contiguous, 16-byte
// aligned, on the group's GPU.
void check_combine_out(const char* op, const TensorView& out, const MoePlan& plan, int64_t tokens, int device) {
  const int64_t hidden = plan.row_bytes / 2;
  IL_CHECK(is_bf16(out), op, ": out has dtype ", out.dtype_name(), "; it must be bfloat16");
  IL_CHECK(out.shape == std::vector<int64_t>({tokens, hidden}), op, ": out has shape ", out.shape_string(),
           "; it must be [", tokens, ", ", hidden, "], the dispatch's tokens on this rank");
  check_placed(op, "out", out, device, kMoeRowAlignBytes);
}

// The fused GEMMs view the receive rows as [L, C, ...]: expert l's rows must start at l x C.
void check_per_expert(const char* op, const MoePlan& plan) {
  IL_CHECK(plan.capacity_kind == MoeCapacityKind::kPerExpert, op,
           ": the handle's capacity_kind is per_rank; the fused GEMM needs per_expert, where local expert l's rows "
           "start at l x capacity (make the MoeHandle with capacity_kind='per_expert')");
}

}  // namespace

MoeShape check_moe_dispatch_args(const TensorView& x, const TensorView& topk_idx, const TensorView& topk_weights,
                                 const MoeDispatchOptions& o, int world_size, int device, const char* op) {
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
  IL_CHECK(expert_out.shape == std::vector<int64_t>({plan.recv_rows, hidden}), op, ": expert_out has shape ",
           expert_out.shape_string(), "; it must be [", plan.recv_rows, ", ", hidden,
           "], the layout of the dispatch's expert_x (its handle's receive rows)");
  check_placed(op, "expert_out", expert_out, device, kMoeRowAlignBytes);
  check_combine_out(op, out, plan, tokens, device);
  IL_CHECK(!bytes_overlap(expert_out, out), op, ": expert_out and out overlap; they must be separate memory");
}

GroupedGemmProblem check_moe_gemm_combine_args(const TensorView& act, const TensorView& w, const TensorView& out,
                                               const TensorView& rows, const MoePlan& plan, int64_t tokens,
                                               int device) {
  const char* op = "moe_gemm_combine";
  const int64_t hidden = plan.row_bytes / 2, local = plan.experts_per_rank;
  check_per_expert(op, plan);
  IL_CHECK(is_bf16(act), op, ": act has dtype ", act.dtype_name(), "; it must be bfloat16");
  IL_CHECK(is_bf16(w), op, ": w has dtype ", w.dtype_name(), "; it must be bfloat16");
  IL_CHECK(act.shape.size() == 2 && act.shape[0] == plan.recv_rows, op, ": act has shape ", act.shape_string(),
           "; it must be [", plan.recv_rows, ", F], the layout of the dispatch's expert_x (its handle's receive rows) "
           "with the FFN width F");
  const int64_t ffn = act.shape[1];
  IL_CHECK(ffn >= 1, op, ": act has no columns (F = 0); the FFN width must be positive");
  IL_CHECK(w.shape == std::vector<int64_t>({local, ffn, hidden}), op, ": w has shape ", w.shape_string(),
           "; it must be [", local, ", ", ffn, ", ", hidden,
           "] (local experts, F, hidden); for Linear weights [L, hidden, F] pass w.transpose(1, 2)");
  check_combine_out(op, out, plan, tokens, device);
  IL_CHECK(!bytes_overlap(act, out) && !bytes_overlap(w, out), op,
           ": out overlaps act or w; it must be separate memory");
  // act's rows as the grouped GEMM's [L, C, F]: expert l's capacity rows, l x C rows apart.
  TensorView a = act;
  const int64_t lda = act.strides.empty() ? ffn : act.strides[0];
  IL_CHECK(act.strides.empty() || act.strides[1] == 1 || ffn <= 1, op, ": act's rows must be contiguous (F)");
  a.shape = {local, plan.capacity, ffn};
  a.strides = {plan.capacity * lda, lda, 1};
  return check_grouped_gemm_operands(op, a, w, nullptr, rows, device);
}

GroupedGemmProblem check_moe_dispatch_gemm_args(const TensorView& w, const TensorView& out, const TensorView& expert_x,
                                                const TensorView& rows, const MoePlan& plan, int device) {
  const char* op = "moe_dispatch_gemm";
  const int64_t hidden = plan.row_bytes / 2, local = plan.experts_per_rank;
  check_per_expert(op, plan);
  IL_CHECK(plan.topk <= kMoeDispatchGemmMaxTopk, op, ": top-", plan.topk, " is more than the ",
           kMoeDispatchGemmMaxTopk, " the fused op takes (a warp per token lays out its entries); call "
           "moe_dispatch, then grouped_gemm");
  IL_CHECK(is_bf16(w), op, ": w has dtype ", w.dtype_name(), "; it must be bfloat16");
  IL_CHECK(w.shape.size() == 3 && w.shape[0] == local && w.shape[1] == hidden && w.shape[2] >= 1, op,
           ": w has shape ", w.shape_string(), "; it must be [", local, ", ", hidden,
           ", N] (local experts, hidden, N); for Linear weights [L, N, hidden] pass w.transpose(1, 2)");
  const int64_t n = w.shape[2];
  IL_CHECK(is_bf16(out), op, ": out has dtype ", out.dtype_name(), "; it must be bfloat16");
  IL_CHECK(out.shape == std::vector<int64_t>({plan.recv_rows, n}), op, ": out has shape ", out.shape_string(),
           "; it must be [", plan.recv_rows, ", ", n, "], the layout of the dispatch's expert_x (its handle's "
           "receive rows) with w's N columns");
  check_placed(op, "out", out, device, kMoeRowAlignBytes);
  // expert_x and out as the grouped GEMM's [L, C, hidden] and [L, C, N].
  TensorView a = expert_x, c = out;
  a.shape = {local, plan.capacity, hidden};
  a.strides = {plan.capacity * hidden, hidden, 1};
  c.shape = {local, plan.capacity, n};
  c.strides = {plan.capacity * n, n, 1};
  return check_grouped_gemm_operands(op, a, w, &c, rows, device);
}

int default_moe_copy_ctas(int64_t n, int cluster, int ctas) {
  constexpr int64_t kCtasAt4096 = 16, kFewest = 4;
  const int64_t wanted = n > 0 ? (kCtasAt4096 * 4096 + n - 1) / n : kCtasAt4096;
  const int64_t copiers = (std::min(kCtasAt4096, std::max(kFewest, wanted)) + cluster - 1) / cluster * cluster;
  const int64_t half = std::max<int64_t>(cluster, ctas / 2 / cluster * cluster);
  return static_cast<int>(std::min(copiers, half));
}

}  // namespace interlace
