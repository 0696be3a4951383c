#include "interlace/ops/moe/launch.h"

#include "interlace/base/cuda.h"
#include "interlace/ops/moe/common_params.h"
#include "interlace/ops/moe/kernel.cuh"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

uint64_t align_up(uint64_t bytes) { return (bytes + kMoeBufferAlign - 1) / kMoeBufferAlign * kMoeBufferAlign; }

const char* kind_name(MoeCapacityKind kind) {
  return kind == MoeCapacityKind::kPerExpert ? "per_expert" : "per_rank";
}

bool same_shape(const MoeShape& a, const MoeShape& b) {
  return a.world == b.world && a.experts == b.experts && a.topk == b.topk && a.row_bytes == b.row_bytes &&
         a.tokens == b.tokens && a.capacity == b.capacity && a.capacity_kind == b.capacity_kind;
}

// The phases' grid barriers need every CTA resident: one per SM (the kernels take a whole SM's
// threads at most).
int num_blocks(const Group& group) { return group.num_sms(); }

}  // namespace

std::string describe_moe_shape(const MoeShape& s) {
  return detail::concat("world=", s.world, ", experts=", s.experts, ", topk=", s.topk, ", hidden=", s.row_bytes / 2,
                        ", max_tokens=", s.tokens, ", capacity=", s.capacity, ", capacity_kind=",
                        kind_name(s.capacity_kind));
}

MoeDispatchScratch moe_dispatch_scratch(const MoePlan& plan, int ctas, bool lists) {
  const uint64_t entries_bytes = align_up(static_cast<uint64_t>(plan.combine_rows) * sizeof(int32_t));
  const uint64_t experts_bytes = align_up(static_cast<uint64_t>(plan.experts) * sizeof(int32_t));
  MoeDispatchScratch s;  // pos at 0
  s.run_row = entries_bytes;
  s.run_kept = s.run_row + experts_bytes;
  s.dropped = s.run_kept + experts_bytes;
  s.bytes = s.dropped + kMoeBufferAlign;
  if (ctas > 0) {
    s.chunk_counts = s.bytes;
    s.bytes += align_up(static_cast<uint64_t>(plan.experts) * ctas * sizeof(int32_t));
  }
  if (lists) {
    s.slot_start = s.bytes;
    s.slot_list = s.slot_start + experts_bytes;
    s.chunks = s.slot_list + entries_bytes;
    s.bytes = s.chunks + 2 * experts_bytes;
  }
  return s;
}

MoeShape check_dispatch_for_handle(const char* op, Group& group, const MoeHandle& handle, const TensorView& x,
                                   const TensorView& topk_idx, const TensorView& topk_weights) {
  const MoeShape& want = handle.shape();
  MoeDispatchOptions options{want.experts, want.capacity, want.capacity_kind, want.tokens};
  const MoeShape shape = check_moe_dispatch_args(x, topk_idx, topk_weights, options, group.topology().world_size,
                                                 group.device(), op);
  IL_CHECK(same_shape(shape, want), op, ": the arguments give (", describe_moe_shape(shape),
           ") but the handle was made for (", describe_moe_shape(want), ")");
  return want;
}

MoeDispatchParams moe_dispatch_params(Group& group, const OpCall& call, uint64_t signature, const MoeHandle& handle,
                                      const TensorView& x, const TensorView& topk_idx,
                                      const TensorView& topk_weights, size_t scratch, const MoeDispatchScratch& at) {
  MoeDispatchParams p{};
  p.c = moe_common_params(group, call, signature, handle, x.shape[0]);
  char* base = group.heap().local_base() + scratch;
  p.x = static_cast<const char*>(x.data);
  p.topk_idx = topk_idx.data;
  p.topk_weights = static_cast<const float*>(topk_weights.data);
  p.pos = reinterpret_cast<int32_t*>(base);
  p.run_row = reinterpret_cast<int32_t*>(base + at.run_row);
  p.run_kept = reinterpret_cast<int32_t*>(base + at.run_kept);
  p.dropped = reinterpret_cast<int32_t*>(base + at.dropped);
  p.chunk_counts = at.chunk_counts != 0 ? reinterpret_cast<int32_t*>(base + at.chunk_counts) : nullptr;
  return p;
}

MoeCommonParams moe_common_params(Group& group, const OpCall& call, uint64_t signature, const MoeHandle& h,
                                  int64_t tokens) {
  MoeCommonParams c{};
  c.transport = call.nvlink();
  c.wait = call.wait_context();
  c.signature = signature;
  c.plan = h.plan();
  c.tokens = static_cast<int32_t>(tokens);
  c.workspace = h.workspace();
  c.workspace_here = group.heap().local_base() + h.workspace();
  c.home_row = reinterpret_cast<int32_t*>(c.workspace_here + h.home_row_);
  c.home_weight = reinterpret_cast<float*>(c.workspace_here + h.home_weight_);
  c.expert_start = reinterpret_cast<int32_t*>(c.workspace_here + h.expert_start_);
  c.expert_rows = reinterpret_cast<int32_t*>(c.workspace_here + h.expert_rows_);
  return c;
}

MoeHandle::MoeHandle(Group& group, const MoeShape& shape) : group_(group), shape_(shape), plan_(make_moe_plan(shape)) {
  const uint64_t slots = static_cast<uint64_t>(plan_.combine_rows);
  home_row_ = plan_.heap_bytes;
  home_weight_ = align_up(home_row_ + slots * sizeof(int32_t));
  expert_start_ = align_up(home_weight_ + slots * sizeof(float));
  expert_rows_ = align_up(expert_start_ + static_cast<uint64_t>(plan_.experts_per_rank) * sizeof(int32_t));
  bytes_ = align_up(expert_rows_ + static_cast<uint64_t>(plan_.experts_per_rank) * sizeof(int32_t));
  offset_ = group.allocate(bytes_, "moe handle (" + describe_moe_shape(shape) + ")");
}

MoeHandle::~MoeHandle() {
  try {
    group_.free(offset_);
  } catch (...) {  // a destructor never throws; the heap only leaks the block
  }
}

TensorView MoeHandle::view(uint64_t offset, std::vector<int64_t> shape, DLDataType dtype) const {
  TensorView v;
  v.data = group_.heap().local_base() + offset_ + offset;
  v.device = DLDevice{kDLCUDA, group_.device()};
  v.dtype = dtype;
  v.shape = std::move(shape);
  return v;
}

void MoeHandle::check_apart(const char* op, const char* in_name, const TensorView& in, const TensorView& out) const {
  const DLDataType byte{kDLUInt, 8, 1};
  const uint64_t recv_end = plan_.recv_offset + static_cast<uint64_t>(plan_.recv_rows) * plan_.row_bytes;
  const TensorView whole = view(0, {static_cast<int64_t>(bytes_)}, byte);
  const TensorView before = view(0, {static_cast<int64_t>(plan_.recv_offset)}, byte);
  const TensorView after = view(recv_end, {static_cast<int64_t>(bytes_ - recv_end)}, byte);
  IL_CHECK(!bytes_overlap(out, whole), op, ": out lies in the handle's workspace; it must be separate memory");
  IL_CHECK(!bytes_overlap(in, before) && !bytes_overlap(in, after), op, ": ", in_name,
           " overlaps the handle's slots, combine rows or home arrays; only its receive rows (expert_x) may be read");
}

TensorView MoeHandle::expert_x() const {
  return view(plan_.recv_offset, {plan_.recv_rows, hidden()}, DLDataType{kDLBfloat, 16, 1});
}
TensorView MoeHandle::counts() const {
  return view(plan_.counts_offset, {plan_.world, plan_.experts}, DLDataType{kDLInt, 32, 1});
}
TensorView MoeHandle::slots() const {
  return view(plan_.slots_offset, {plan_.recv_rows, 4}, DLDataType{kDLInt, 32, 1});
}
TensorView MoeHandle::expert_starts() const {
  return view(expert_start_, {plan_.experts_per_rank}, DLDataType{kDLInt, 32, 1});
}
TensorView MoeHandle::expert_rows() const {
  return view(expert_rows_, {plan_.experts_per_rank}, DLDataType{kDLInt, 32, 1});
}

void moe_dispatch(Group& group, MoeHandle& handle, const TensorView& x, const TensorView& topk_idx,
                  const TensorView& topk_weights, cudaStream_t stream) {
  OpCall call(group, OpId::kMoeDispatch, stream);
  const int blocks = num_blocks(group);
  // chunk_counts only where moe_dispatch numbers by chunks (the small layout's experts).
  const int chunk_ctas = handle.plan().experts <= kMoeSmallExperts ? blocks : 0;
  const MoeDispatchScratch at = moe_dispatch_scratch(handle.plan(), chunk_ctas, /*lists=*/false);
  size_t scratch = 0;
  const uint64_t signature = call.agree([&] {
    check_one_node(group, "moe_dispatch");
    const MoeShape shape = check_dispatch_for_handle("moe_dispatch", group, handle, x, topk_idx, topk_weights);
    scratch = group.scratch(at.bytes, "moe_dispatch's slot numbers and runs", call.capturing());
    return detail::concat("moe_dispatch(", describe_moe_shape(shape), ", index_bits=",
                          static_cast<int>(topk_idx.dtype.bits), ", workspace=", handle.workspace(),
                          ", scratch=", scratch, ", num_blocks=", blocks, ")");
  });
  const MoeDispatchParams p = moe_dispatch_params(group, call, signature, handle, x, topk_idx, topk_weights, scratch, at);
  const bool wide = topk_idx.dtype.bits == 64;
  // Before the launch: launch() can raise after issuing the kernel (an earlier call's cancel), and
  // the combine must still see this dispatch's token count.
  handle.tokens_ = x.shape[0];
  call.launch([&](cudaStream_t s) {
    if (wide) {
      moe_dispatch_kernel<int64_t><<<blocks, kMoeThreads, 0, s>>>(p);
    } else {
      moe_dispatch_kernel<int32_t><<<blocks, kMoeThreads, 0, s>>>(p);
    }
  });
}

void moe_combine(Group& group, MoeHandle& handle, const TensorView& expert_out, const TensorView& out,
                 cudaStream_t stream) {
  OpCall call(group, OpId::kMoeCombine, stream);
  const int blocks = num_blocks(group);
  const uint64_t signature = call.agree([&] {
    check_one_node(group, "moe_combine");
    IL_CHECK(handle.tokens() >= 0, "moe_combine: the handle has not dispatched yet; call moe_dispatch with it first");
    check_moe_combine_args(expert_out, out, handle.plan(), handle.tokens(), group.device());
    handle.check_apart("moe_combine", "expert_out", expert_out, out);
    return detail::concat("moe_combine(", describe_moe_shape(handle.shape()), ", workspace=", handle.workspace(),
                          ", num_blocks=", blocks, ")");
  });
  MoeCombineParams p{};
  p.c = moe_common_params(group, call, signature, handle, handle.tokens());
  p.expert_out = static_cast<const char*>(expert_out.data);
  p.out = static_cast<char*>(out.data);
  call.launch([&](cudaStream_t s) { moe_combine_kernel<<<blocks, kMoeThreads, 0, s>>>(p); });
}

}  // namespace interlace
