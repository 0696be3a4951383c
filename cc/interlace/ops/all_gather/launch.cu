#include "interlace/ops/all_gather/launch.h"

#include <atomic>

#include "interlace/base/cuda.h"
#include "interlace/ops/all_gather/kernel.cuh"

namespace interlace {
namespace {

// CTAs of the kernel that fit on the group's GPU at once. It depends only on the kernel and the
// device, so it is looked up once per device (racing lookups store the same value).
int resident_blocks(const Group& group) {
  static std::atomic<int> by_device[64] = {};
  const int device = group.device();
  int known = device < 64 ? by_device[device].load() : 0;
  if (known > 0) return known;
  int per_sm = 0;
  IL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, all_gather_kernel, kAllGatherThreads, 0));
  known = per_sm * group.num_sms();
  if (device < 64) by_device[device].store(known);
  return known;
}

}  // namespace

void all_gather(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                AllGatherTuning tuning) {
  group.check();
  const Topology& topo = group.topology();
  check_all_gather_args(out, inp, topo.world_size, group.device());
  IL_CHECK(topo.num_nodes == 1, "all_gather: the group spans ", topo.num_nodes,
           " nodes; across nodes it needs the proxy transport, which is not built yet");
  const uint64_t bytes = inp.nbytes();
  IL_CUDA_CHECK(cudaSetDevice(group.device()));
  const AllGatherPlan plan = plan_all_gather(bytes, resident_blocks(group), tuning);
  SymmetricHeap& heap = group.heap();
  const long long out_offset = heap.offset_of(out.data, out.nbytes());
  const bool staged = out_offset < 0;
  group.require_same_across_ranks(detail::concat(
      "all_gather(bytes_per_rank=", bytes, ", dtype=", inp.dtype_name(),
      ", out=", staged ? "ordinary" : "symmetric@" + std::to_string(out_offset), ", num_blocks=", plan.num_blocks,
      ", chunk_bytes=", plan.chunk_bytes, ")"));
  if (bytes == 0) return;
  const size_t recv_offset = staged ? group.scratch(
      bytes * topo.local_size(), "all_gather's receive buffer (world_size x input; or allocate out with group.empty)") : static_cast<size_t>(out_offset);

  AllGatherParams p{};
  p.inp = static_cast<const char*>(inp.data);
  p.out = static_cast<char*>(out.data);
  for (int q = 0; q < topo.local_size(); ++q) {
    p.dst[q] = heap.base(q) + recv_offset + topo.local_rank * bytes;
    p.pads[q] = heap.pad(q);
  }
  p.recv = staged ? heap.local_base() + recv_offset : nullptr;
  p.bytes_per_rank = bytes;
  p.chunk_bytes = plan.chunk_bytes;
  p.rounds = plan.rounds;
  p.rank = topo.rank;
  p.local_rank = topo.local_rank;
  p.local_size = topo.local_size();
  p.fault = group.device_fault();
  p.timeout_ns = group.timeout_ns();

  all_gather_kernel<<<plan.num_blocks, kAllGatherThreads, 0, stream>>>(p);
  IL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace interlace
