#include "interlace/ops/all_gather/launch.h"

#include "interlace/base/cuda.h"
#include "interlace/ops/all_gather/kernel.cuh"
#include "interlace/ops/all_gather/plan.h"

namespace interlace {

void all_gather(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream, int num_blocks) {
  group.check();
  const Topology& topo = group.topology();
  check_all_gather_args(out, inp, topo.world_size, group.device());
  IL_CHECK(topo.num_nodes == 1, "all_gather: the group spans ", topo.num_nodes,
           " nodes; across nodes it needs the proxy transport, which is not built yet");
  const uint64_t bytes = inp.nbytes();
  const AllGatherPlan plan = plan_all_gather(bytes, group.num_sms(), num_blocks);

  SymmetricHeap& heap = group.heap();
  const long long inp_offset = heap.offset_of(inp.data, bytes);
  const bool staged = inp_offset < 0;
  group.require_same_across_ranks(detail::concat("all_gather(bytes_per_rank=", bytes, ", dtype=", inp.dtype_name(),
                                                 ", inp=", staged ? "staged" : "symmetric@" + std::to_string(inp_offset),
                                                 ", num_blocks=", plan.num_blocks, ")"));
  if (bytes == 0) return;
  const size_t src_offset = staged ? group.scratch(bytes) : static_cast<size_t>(inp_offset);

  AllGatherParams p{};
  p.out = static_cast<char*>(out.data);
  p.inp = static_cast<const char*>(inp.data);
  p.stage = staged ? heap.local_base() + src_offset : nullptr;
  for (int q = 0; q < topo.local_size(); ++q) {
    p.src[q] = q == topo.local_rank ? p.inp : heap.base(q) + src_offset;
    p.pads[q] = heap.pad(q);
  }
  p.bytes_per_rank = bytes;
  p.chunk_bytes = plan.chunk_bytes;
  p.rank = topo.rank;
  p.local_rank = topo.local_rank;
  p.local_size = topo.local_size();
  p.fault = group.device_fault();
  p.timeout_ns = group.timeout_ns();

  IL_CUDA_CHECK(cudaSetDevice(group.device()));
  all_gather_kernel<<<plan.num_blocks, kAllGatherThreads, 0, stream>>>(p);
  IL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace interlace
