#include "interlace/ops/all_gather/launch.h"

#include <atomic>

#include "interlace/base/cuda.h"
#include "interlace/ops/all_gather/kernel.cuh"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

using Kernel = void (*)(AllGatherParams<device::NvlinkTransport>);
constexpr Kernel kKernel = all_gather_kernel<device::NvlinkTransport>;

// CTAs of the kernel that fit on the group's GPU at once: the plan never launches more, since CTAs
// wait on their peers' CTAs and all of them must be resident. It depends only on the kernel and the
// device, so it is looked up once per device (racing lookups store the same value).
int resident_blocks(const Group& group) {
  static std::atomic<int> by_device[64] = {};
  const int device = group.device();
  int known = device < 64 ? by_device[device].load() : 0;
  if (known > 0) return known;
  int per_sm = 0;
  IL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kAllGatherThreads, 0));
  known = per_sm * group.num_sms();
  if (device < 64) by_device[device].store(known);
  return known;
}

}  // namespace

void all_gather(Group& group, const TensorView& out, const TensorView& inp, cudaStream_t stream,
                AllGatherTuning tuning) {
  OpCall call(group, OpId::kAllGather, stream);
  const Topology& topo = group.topology();
  SymmetricHeap& heap = group.heap();
  const uint64_t bytes = inp.nbytes();
  AllGatherPlan plan;
  long long out_offset = -1;
  size_t landing = 0;
  const uint64_t signature = call.agree([&] {
    check_all_gather_args(out, inp, topo.world_size, group.device());
    check_one_node(group, "all_gather");
    plan = plan_all_gather(bytes, resident_blocks(group), tuning);
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
