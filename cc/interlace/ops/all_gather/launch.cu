#include "interlace/ops/all_gather/launch.h"

#include <algorithm>

#include "interlace/base/cuda.h"
#include "interlace/ops/all_gather/hier_kernel.cuh"
#include "interlace/ops/all_gather/hierarchy.h"
#include "interlace/ops/all_gather/kernel.cuh"
#include "interlace/runtime/kernels_across_nodes.h"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

using Kernel = void (*)(AllGatherParams<device::NvlinkTransport>);
constexpr Kernel kKernel = all_gather_kernel<device::NvlinkTransport>;
[[maybe_unused]] const bool kHierKernelRegistered =
    register_kernels_across_nodes({reinterpret_cast<const void*>(hier_all_gather_kernel)});

// A group of several nodes: hier_kernel.cuh.
void all_gather_across_nodes(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                             AllGatherTuning tuning) {
  OpCall call(group, OpId::kAllGather, stream);
  const Topology& topo = group.topology();
  SymmetricHeap& heap = group.heap();
  const uint64_t bytes = inp.nbytes();
  const NodeLayout layout = make_node_layout(group.node_names());
  const AgRankWork work = all_gather_rank_work(layout, topo.rank);
  HierAllGatherPlan plan;
  long long out_offset = -1;
  size_t scratch = 0;
  int num_blocks = 1;
  const uint64_t signature = call.agree([&] {
    check_all_gather_args(out, inp, topo.world_size, group.device());
    IL_CHECK(tuning.num_blocks == 0, "all_gather across nodes: num_blocks is chosen from the chunks; leave it 0");
    IL_CHECK(static_cast<int>(work.network_peers.size()) <= kHierMaxNetworkPeers, "all_gather across nodes: ",
             layout.num_nodes(), " nodes, more than the ", kHierMaxNetworkPeers + 1, " supported");
    plan = plan_hier_all_gather(layout, bytes, tuning.chunk_bytes);
    out_offset = heap.offset_of(out.data, out.nbytes());
    // The staging buffer the network reads this rank's shard from, after the landing area when that
    // is scratch too.
    const size_t landing_bytes = out_offset >= 0 ? 0 : bytes * topo.world_size;
    if (bytes > 0) {
      scratch = group.scratch(landing_bytes + bytes, "all_gather's staging and landing buffers across nodes",
                              call.capturing());
    }
    // CTAs are never paired across ranks, so grids may differ (uneven nodes relay unequal shares):
    // num_blocks stays out of the signature.
    const int items = std::max({plan.chunks, static_cast<int>(work.relayed.size()) * plan.chunks,
                                (topo.world_size - 1) * (out_offset >= 0 ? 1 : plan.chunks), 1});
    const int resident = resident_ctas(group, reinterpret_cast<const void*>(hier_all_gather_kernel),
                                       kHierAllGatherThreads);
    num_blocks = std::min({items, group.num_sms(), resident});
    return detail::concat("all_gather_across_nodes(bytes_per_rank=", bytes, ", dtype=", inp.dtype_name(),
                          ", out=", out_offset < 0 ? "ordinary" : "symmetric", ", out_offset=", out_offset,
                          ", scratch=", scratch, ", chunk_bytes=", plan.chunk_bytes, ")");
  });

  HierAllGatherParams p{};
  p.nvlink = call.nvlink();
  p.proxy = group.proxy_transport();
  p.wait = call.wait_context();
  p.signature = signature;
  p.inp = static_cast<const char*>(inp.data);
  p.out = static_cast<char*>(out.data);
  p.copy_out = out_offset < 0;
  p.landing = out_offset >= 0 ? static_cast<uint64_t>(out_offset) : scratch;
  p.staging = scratch + (out_offset >= 0 ? 0 : bytes * topo.world_size);
  p.rank = topo.rank;
  p.world = topo.world_size;
  p.bytes_per_rank = bytes;
  p.chunk_bytes = plan.chunk_bytes;
  p.chunks = plan.chunks;
  p.num_network = static_cast<int>(work.network_peers.size());
  p.num_relayed = static_cast<int>(work.relayed.size());
  for (int k = 0; k < p.num_network; ++k) {
    const int q = work.network_peers[k];
    p.network_peer[k] = q;
    p.network_slot[k] = relay_slot(layout, topo.rank, layout.node_of[q]);
  }
  for (int j = 0; j < p.num_relayed; ++j) p.relayed[j] = work.relayed[j];
  call.launch([&](cudaStream_t s) { hier_all_gather_kernel<<<num_blocks, kHierAllGatherThreads, 0, s>>>(p); });
}

}  // namespace

void all_gather(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                AllGatherTuning tuning) {
  if (group.topology().num_nodes > 1) return all_gather_across_nodes(group, out, inp, stream, tuning);
  OpCall call(group, OpId::kAllGather, stream);
  const Topology& topo = group.topology();
  SymmetricHeap& heap = group.heap();
  const uint64_t bytes = inp.nbytes();
  AllGatherPlan plan;
  long long out_offset = -1;
  size_t landing = 0;
  const uint64_t signature = call.agree([&] {
    check_all_gather_args(out, inp, topo.world_size, group.device());
    const int resident = resident_ctas(group, reinterpret_cast<const void*>(kKernel), kAllGatherThreads);
    plan = plan_all_gather(bytes, resident, tuning);
    out_offset = heap.offset_of(out.data, out.nbytes());
    landing = out_offset >= 0 || bytes == 0
                  ? static_cast<size_t>(std::max(out_offset, 0LL))
                  : group.scratch(bytes * topo.local_size(),
                                  "all_gather's receive buffer (world_size x input; or allocate out with group.empty)",
                                  call.capturing());
    return detail::concat("all_gather(bytes_per_rank=", bytes, ", dtype=", inp.dtype_name(),
                          ", out=", out_offset < 0 ? "ordinary" : "symmetric", ", landing=", landing,
                          ", num_blocks=", plan.num_blocks, ", chunk_bytes=", plan.chunk_bytes, ")");
  });
  // An empty call still runs (its kernel only makes the handshake): every call takes its place in
  // the op sequence on every rank, so a cancel elsewhere can never be matched with the wrong call.

  AllGatherParams<device::NvlinkTransport> p{};
  p.transport = call.nvlink();
  p.wait = call.wait_context();
  p.signature = signature;
  p.inp = static_cast<const char*>(inp.data);
  p.out = static_cast<char*>(out.data);
  p.landing = landing;
  p.recv = out_offset < 0 ? heap.local_base() + landing : nullptr;
  p.bytes_per_rank = bytes;
  p.chunk_bytes = plan.chunk_bytes;
  p.rounds = plan.rounds;
  call.launch([&](cudaStream_t s) { kKernel<<<plan.num_blocks, kAllGatherThreads, 0, s>>>(p); });
}

}  // namespace interlace
