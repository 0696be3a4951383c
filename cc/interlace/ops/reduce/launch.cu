#include "interlace/ops/reduce/launch.h"

#include <algorithm>
#include <functional>

#include "interlace/base/cuda.h"
#include "interlace/ops/reduce/kernel.cuh"
#include "interlace/ops/reduce/nodes_kernel.cuh"
#include "interlace/runtime/kernels_across_nodes.h"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

using Params = ReduceParams<device::NvlinkTransport>;
using Kernel = void (*)(Params);

// The kernel for an op and a dtype (checked before: float16, bfloat16 or float32).
template <OpId kOp>
Kernel kernel_for(const DLDataType& dtype) {
  if (dtype.code == kDLBfloat) return reduce_kernel<device::NvlinkTransport, __nv_bfloat16, kOp>;
  if (dtype.bits == 16) return reduce_kernel<device::NvlinkTransport, __half, kOp>;
  return reduce_kernel<device::NvlinkTransport, float, kOp>;
}

// What every call fills in the same way; the caller sets the buffers.
Params base_params(Group& group, const OpCall& call, uint64_t signature, const ReducePlan& plan,
                   const TensorView& out, const TensorView& inp, size_t staging) {
  SymmetricHeap& heap = group.heap();
  Params p{};
  p.transport = call.nvlink();
  p.wait = call.wait_context();
  p.signature = signature;
  p.plan = plan;
  p.inp = static_cast<const char*>(inp.data);
  p.out = static_cast<char*>(out.data);
  p.staging = staging;
  p.staging_here = heap.local_base() + staging;
  return p;
}

const char* algorithm_name(ReduceAlgorithm a) {
  switch (a) {
    case ReduceAlgorithm::kOneShot: return "one_shot";
    case ReduceAlgorithm::kTwoShot: return "two_shot";
    case ReduceAlgorithm::kReduceScatter: return "reduce_scatter";
    default: return "auto";
  }
}

using NodesKernel = void (*)(NodesReduceParams);

template <OpId kOp>
NodesKernel nodes_kernel_for(const DLDataType& dtype) {
  if (dtype.code == kDLBfloat) return nodes_reduce_kernel<__nv_bfloat16, kOp>;
  if (dtype.bits == 16) return nodes_reduce_kernel<__half, kOp>;
  return nodes_reduce_kernel<float, kOp>;
}

[[maybe_unused]] const bool kNodesKernelsRegistered = register_kernels_across_nodes({
    reinterpret_cast<const void*>(nodes_reduce_kernel<__nv_bfloat16, OpId::kReduceScatter>),
    reinterpret_cast<const void*>(nodes_reduce_kernel<__half, OpId::kReduceScatter>),
    reinterpret_cast<const void*>(nodes_reduce_kernel<float, OpId::kReduceScatter>),
    reinterpret_cast<const void*>(nodes_reduce_kernel<__nv_bfloat16, OpId::kAllReduce>),
    reinterpret_cast<const void*>(nodes_reduce_kernel<__half, OpId::kAllReduce>),
    reinterpret_cast<const void*>(nodes_reduce_kernel<float, OpId::kAllReduce>),
});

// A group of several nodes (nodes_kernel.cuh): `plan` has the shares; this picks the chunks, the
// scratch and the grid, and launches. The caller's OpCall has checked the arguments.
// checks(): the op's argument checks, returning its plan (the shares).
template <OpId kOp>
void reduce_across_nodes(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                         ReduceTuning tuning, const char* op, const std::function<ReducePlan()>& checks) {
  OpCall call(group, kOp, stream);
  const Topology& topo = group.topology();
  SymmetricHeap& heap = group.heap();
  const int world = topo.world_size;
  const NodesKernel kernel = nodes_kernel_for<kOp>(inp.dtype);
  NodesReduceParams p{};
  ReducePlan plan;
  size_t scratch = 0;
  int num_blocks = 1;
  const uint64_t signature = call.agree([&] {
    plan = checks();
    IL_CHECK(tuning.num_blocks == 0 && tuning.chunk_bytes == 0, op,
             " across nodes: num_blocks and chunk_bytes are chosen from the shares; leave them 0");
    IL_CHECK(world <= kNodesReduceMaxRanks, op, " across nodes: ", world, " ranks, at most ", kNodesReduceMaxRanks,
             " supported");
    const NodesReduceLayout layout = nodes_reduce_layout(plan, kOp == OpId::kAllReduce, kHierDefaultChunk);
    plan.chunk_bytes = layout.chunk_bytes;
    const int64_t chunks = layout.chunks;
    if (plan.share_bytes > 0) {
      scratch = group.scratch(layout.scratch_bytes,
                              kOp == OpId::kAllReduce ? "all_reduce's staging across nodes (about 3 x the input)"
                                                      : "reduce_scatter's staging across nodes (about 2 x the input)",
                              call.capturing());
    }
    p.staging = scratch + layout.staging;
    p.send = scratch + layout.send;
    p.gather = scratch + layout.gather;
    p.chunks = layout.chunks;
    // CTAs are never paired across ranks, so num_blocks stays out of the signature.
    const int items = std::max<int>({static_cast<int>((world - 1) * chunks), static_cast<int>(chunks), 1});
    num_blocks = std::min({items, group.num_sms(),
                           resident_ctas(group, reinterpret_cast<const void*>(kernel), kNodesReduceThreads)});
    return detail::concat(op, "_across_nodes(bytes=", plan.bytes, ", dtype=", inp.dtype_name(), ", share_bytes=",
                          plan.share_bytes, ", chunk_bytes=", plan.chunk_bytes, ", scratch=", scratch, ")");
  });
  p.nvlink = call.nvlink();
  p.proxy = group.proxy_transport();
  p.wait = call.wait_context();
  p.signature = signature;
  p.plan = plan;
  p.inp = static_cast<const char*>(inp.data);
  p.out = static_cast<char*>(out.data);
  p.staging_here = heap.local_base() + p.staging;
  for (int r = 0; r < world; ++r) p.local_of[r] = -1;
  for (int l = 0; l < topo.local_size(); ++l) p.local_of[topo.local_ranks[l]] = l;
  call.launch([&](cudaStream_t s) { kernel<<<num_blocks, kNodesReduceThreads, 0, s>>>(p); });
}

}  // namespace

void reduce_scatter(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                    ReduceTuning tuning) {
  const Topology& topo = group.topology();
  if (topo.num_nodes > 1) {
    return reduce_across_nodes<OpId::kReduceScatter>(group, out, inp, stream, tuning, "reduce_scatter", [&] {
      check_reduce_scatter_args(out, inp, topo.world_size, group.device());
      return plan_reduce_scatter(out.nbytes(), static_cast<int>(inp.itemsize()), topo.world_size, topo.rank,
                                 kReduceMaxBlocks, {});
    });
  }
  OpCall call(group, OpId::kReduceScatter, stream);
  ReducePlan plan;
  Kernel kernel = nullptr;
  size_t staging = 0;
  const uint64_t signature = call.agree([&] {
    check_reduce_scatter_args(out, inp, topo.world_size, group.device());
    kernel = kernel_for<OpId::kReduceScatter>(inp.dtype);
    const int resident = resident_ctas(group, reinterpret_cast<const void*>(kernel), kReduceThreads);
    plan = plan_reduce_scatter(out.nbytes(), static_cast<int>(inp.itemsize()), topo.world_size, topo.rank, resident,
                               tuning);
    if (plan.staging_bytes > 0) {
      staging = group.scratch(plan.staging_bytes, "reduce_scatter's staging ((world_size - 1) x out)", call.capturing());
    }
    return detail::concat("reduce_scatter(bytes_per_rank=", out.nbytes(), ", dtype=", inp.dtype_name(),
                          ", staging=", staging, ", num_blocks=", plan.num_blocks, ", chunk_bytes=", plan.chunk_bytes,
                          ")");
  });
  // An empty call still runs (its kernel only makes the handshake), as all_gather's.
  Params p = base_params(group, call, signature, plan, out, inp, staging);
  call.launch([&](cudaStream_t s) { kernel<<<plan.num_blocks, kReduceThreads, 0, s>>>(p); });
}

void all_reduce(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream, ReduceTuning tuning) {
  const Topology& topo = group.topology();
  if (topo.num_nodes > 1) {
    return reduce_across_nodes<OpId::kAllReduce>(group, out, inp, stream, tuning, "all_reduce", [&] {
      check_all_reduce_args(out, inp, group.device());
      IL_CHECK(tuning.algorithm == ReduceAlgorithm::kAuto || tuning.algorithm == ReduceAlgorithm::kTwoShot,
               "all_reduce across nodes: it is two-shot (reduce_scatter, then the sums to every rank); leave "
               "algorithm automatic");
      ReduceTuning shares;
      shares.algorithm = ReduceAlgorithm::kTwoShot;
      return plan_all_reduce(inp.nbytes(), static_cast<int>(inp.itemsize()), topo.world_size, topo.rank,
                             kReduceMaxBlocks, /*symmetric_out=*/false, shares);
    });
  }
  OpCall call(group, OpId::kAllReduce, stream);
  SymmetricHeap& heap = group.heap();
  ReducePlan plan;
  Kernel kernel = nullptr;
  long long out_offset = -1;
  size_t staging = 0;
  const uint64_t signature = call.agree([&] {
    check_all_reduce_args(out, inp, group.device());
    kernel = kernel_for<OpId::kAllReduce>(inp.dtype);
    out_offset = out.nbytes() > 0 ? heap.offset_of(out.data, out.nbytes()) : -1;
    const int resident = resident_ctas(group, reinterpret_cast<const void*>(kernel), kReduceThreads);
    plan = plan_all_reduce(inp.nbytes(), static_cast<int>(inp.itemsize()), topo.world_size, topo.rank, resident,
                           out_offset >= 0, tuning);
    const uint64_t scratch = plan.staging_bytes + plan.landing_bytes;
    if (scratch > 0) {
      staging = group.scratch(scratch,
                              "all_reduce's staging ((world_size - 1) x the input for one-shot, up to twice "
                              "(world_size - 1) / world_size x for two-shot)",
                              call.capturing());
    }
    return detail::concat("all_reduce(bytes=", inp.nbytes(), ", dtype=", inp.dtype_name(),
                          ", algorithm=", algorithm_name(plan.algorithm), ", out_offset=", out_offset,
                          ", in_place=", out.data == inp.data, ", staging=", staging, ", num_blocks=", plan.num_blocks,
                          ", chunk_bytes=", plan.chunk_bytes, ")");
  });
  Params p = base_params(group, call, signature, plan, out, inp, staging);
  if (plan.algorithm == ReduceAlgorithm::kTwoShot) {
    if (out_offset < 0) {  // into landing slots after the staging, copied into out
      p.landing = staging + plan.staging_bytes;
      p.landing_here = heap.local_base() + p.landing;
    } else {  // straight into out, at the same offset on every rank
      p.landing = static_cast<uint64_t>(out_offset);
      p.landing_here = nullptr;
    }
  }
  call.launch([&](cudaStream_t s) { kernel<<<plan.num_blocks, kReduceThreads, 0, s>>>(p); });
}

}  // namespace interlace
