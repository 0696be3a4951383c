// reduce_scatter and all_reduce (sum) on a group of several nodes, one launch: ranks of this node over
// NVLink, the others through the proxy (device/proxy_transport.h). Flat: each partial goes straight
// to its owner, which sums the world's partials in rank order in fp32 and rounds once
// (sum_in_rank_order), so the bits are those of the single-node kernels. Shares as ReducePlan's,
// each cut into `chunks` chunks of chunk_bytes (chunk c covers [c, c + 1) * chunk_bytes of a share).
//
// CTA 0 first raises ready[me], through the proxy, on every rank of another node. Then each CTA takes
// its share of the phases below, in order; items are dealt over the CTAs by index:
//   1. partial (owner q, chunk c), q != me: over NVLink into q's staging slot for this rank, or, for
//      a rank on another node once it has started this launch (ready), copied into this rank's send
//      buffer and posted from there; landed[me][c] += 1 on q either way;
//   2. own chunk c: once landed[s][c] counts this launch for every s != me, summed into out
//      (reduce_scatter) or into this rank's slot of the gather buffer and out (all_reduce), then, for
//      all_reduce, pushed to every rank the same two ways, raising gathered[me][c] there;
//   3. all_reduce, (rank s, chunk c), s != me: once gathered[s][c] counts this launch, copied from the
//      gather buffer into out.
// Counts only grow; uses[c] (local) counts the launches that had a chunk c, so this launch waits for
// uses[c] + 1. A sender writes into a peer's buffers only once that peer has started the launch (the
// op handshake on this node, ready across nodes), so a peer never sees a count from a launch ahead.
// The last CTA out raises drained[me] on every rank of another node and waits for theirs: the kernel
// ends only once the network has read this rank's send and gather buffers, which a later op may then
// reuse. It also moves the local counters on.
// Waits depend on remote ranks, on peers' earlier phases, or on this rank's earlier phases in other
// CTAs, all resident: no cycle.
#pragma once

#include <cstdint>

#include "interlace/device/op_sequence.cuh"
#include "interlace/device/proxy_transport.h"
#include "interlace/device/transport.cuh"
#include "interlace/ops/all_gather/hierarchy.h"
#include "interlace/ops/reduce/flags.h"
#include "interlace/ops/reduce/kernel.cuh"
#include "interlace/ops/reduce/nodes_flags.h"

namespace interlace {

constexpr int kNodesReduceThreads = 512;

struct NodesReduceParams {
  device::NvlinkTransport nvlink;  // this node's ranks
  device::ProxyTransport proxy;    // the other nodes'
  device::WaitContext wait;
  uint64_t signature;
  ReducePlan plan;  // world, rank, bytes, share_bytes; chunk_bytes as below (rounds, num_blocks unused)
  const char* inp;
  char* out;
  uint64_t staging;          // heap offset: partials from sender s at slot(s, me) * share_bytes, on every rank
  const char* staging_here;  // this rank's, as mapped here
  uint64_t send;             // heap offset: this rank's partial for owner q (another node) at q * share_bytes
  uint64_t gather;           // all_reduce: heap offset of world * share_bytes, owner s's sum at s * share_bytes
  int32_t chunks;
  int32_t local_of[kNodesReduceMaxRanks];  // a rank's index on this node, or -1 for another node's
};

namespace nodes_reduce_detail {

template <OpId kOp>
__device__ __forceinline__ NodesReduceFlags& flags_of(const device::NvlinkTransport& t) {
  return *reinterpret_cast<NodesReduceFlags*>(reinterpret_cast<char*>(op_flags<ReduceFlags, kOp>(t.my_pad())) +
                                              kNodesReduceFlagsInRegion);
}

// Bytes [lo, lo + n) of share q that chunk c covers; n may be 0 (the last shares can be short).
__device__ __forceinline__ void chunk_of(const NodesReduceParams& p, int32_t q, int c, uint64_t* lo, uint64_t* n) {
  const uint64_t size = p.plan.share_size(q);
  *lo = static_cast<uint64_t>(c) * p.plan.chunk_bytes;
  *n = *lo < size ? min(p.plan.chunk_bytes, size - *lo) : 0;
}

// One thread: device::proxy_posted for this kernel's posts.
__device__ __forceinline__ bool posted(device::ProxySend sent, const NodesReduceParams& p, FlagId flag, int peer) {
  return device::proxy_posted(sent, p.wait, p.proxy.timeout_ns, flag, peer);
}

// All threads: bytes at src (n of them, 16-byte aligned) to rank q's heap at `offset`, then
// flag += 1 there: over NVLink for a rank of this node, else through the proxy, from `stage` (this
// rank's heap) when src is not in the heap already (null: src is). For another node's rank, waits
// first until q has started this launch. False (for every thread) if a wait or a post failed: it
// has recorded why and aborted the group.
__device__ __forceinline__ bool send(const NodesReduceParams& p, uint64_t* ready, uint64_t launch, int32_t q,
                                     uint64_t offset, const char* src, char* stage, uint64_t n, uint64_t* flag,
                                     FlagId id) {
  const device::NvlinkTransport& t = p.nvlink;
  const int32_t local = p.local_of[q];
  if (local >= 0) {
    t.put(local, offset, src, n);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      device::add_release_sys(t.on_peer(local, flag), 1);
    }
    return true;
  }
  bool bad = threadIdx.x == 0 && t.wait(ready, launch, p.wait, FlagId::kReady, kFaultPeerGlobal + q) == 0;
  if (__syncthreads_or(bad)) return false;
  if (stage != nullptr) {
    reduce_detail::copy_aligned(stage, src, n);
    __syncthreads();
    src = stage;
  }
  if (threadIdx.x == 0) {
    device::ProxyTransport proxy = p.proxy;  // a posting thread's own copy
    __threadfence_system();                  // the CTA's stores before the request that reads them
    bad = !posted(proxy.put_signal(q, offset, src, n, flag, 1), p, id, q);
  }
  return !__syncthreads_or(bad);
}

// Threads s < world, s != me: wait until row[s][c] >= value. False (for every thread) if one failed.
__device__ __forceinline__ bool wait_senders(const NodesReduceParams& p, uint64_t (*row)[kNodesReduceMaxChunks],
                                             int c, uint64_t value, FlagId id) {
  const int s = threadIdx.x;
  const bool bad = s < p.plan.world && s != p.plan.rank &&
                   p.nvlink.wait(&row[s][c], value, p.wait, id, kFaultPeerGlobal + s) == 0;
  return !__syncthreads_or(bad);
}

}  // namespace nodes_reduce_detail

// T: __half, __nv_bfloat16 or float; kOp: kReduceScatter or kAllReduce (its flag region, and whether
// the sums are gathered).
template <class T, OpId kOp>
__global__ void __launch_bounds__(kNodesReduceThreads, 1)
    nodes_reduce_kernel(const __grid_constant__ NodesReduceParams p) {
  using namespace nodes_reduce_detail;
  constexpr bool kGather = kOp == OpId::kAllReduce;
  const device::NvlinkTransport& t = p.nvlink;
  if (!device::op_enter(t, p.wait, p.signature)) return;
  NodesReduceFlags& flags = flags_of<kOp>(t);
  __shared__ uint64_t launch;
  if (threadIdx.x == 0) launch = flags.launches + 1;
  __syncthreads();
  const ReducePlan& plan = p.plan;
  const int32_t me = plan.rank, world = plan.world;
  char* heap = t.heaps[t.local_rank];
  const int ctas = gridDim.x;

  // Every rank of another node sends here (a partial of this rank's share, and all_reduce's sums);
  // tell each that this launch has started. Thread q speaks for rank q.
  const bool remote = threadIdx.x < world && p.local_of[threadIdx.x] < 0;
  bool bad = false;
  if (blockIdx.x == 0 && remote) {
    device::ProxyTransport proxy = p.proxy;
    bad = !posted(proxy.signal(threadIdx.x, &flags.ready[me], 1), p, FlagId::kReady, threadIdx.x);
  }
  if (__syncthreads_or(bad)) return;

  // 1. Partials to their owners.
  for (int i = blockIdx.x; i < (world - 1) * p.chunks; i += ctas) {
    const int32_t q = (me + 1 + i / p.chunks) % world;
    const int c = i % p.chunks;
    uint64_t lo, n;
    chunk_of(p, q, c, &lo, &n);
    const uint64_t at = p.staging + ReducePlan::slot(me, q) * plan.share_bytes + lo;
    if (!send(p, &flags.ready[q], launch, q, at, p.inp + plan.share_begin(q) + lo,
              heap + p.send + q * plan.share_bytes + lo, n, &flags.landed[me][c], FlagId::kPartial)) {
      return;
    }
  }

  // 2. This rank's share: sum each chunk once every partial of it landed; all_reduce: push the sum.
  for (int c = blockIdx.x; c < p.chunks; c += ctas) {
    if (!wait_senders(p, flags.landed, c, flags.uses[c] + 1, FlagId::kPartial)) return;
    uint64_t lo, n;
    chunk_of(p, me, c, &lo, &n);
    const char* own = p.inp + plan.share_begin(me) + lo;
    if (!kGather) {
      reduce_detail::reduce_range<T>(p, own, p.staging_here + lo, p.out + lo, n);
      continue;
    }
    const uint64_t at = p.gather + me * plan.share_bytes + lo;
    reduce_detail::reduce_range<T>(p, own, p.staging_here + lo, heap + at, n);
    __syncthreads();  // the chunk's whole sum, for every thread to copy and push
    reduce_detail::copy_aligned(p.out + plan.share_begin(me) + lo, heap + at, n);
    for (int32_t k = 1; k < world; ++k) {
      const int32_t q = (me + k) % world;
      if (!send(p, &flags.ready[q], launch, q, at, heap + at, nullptr, n, &flags.gathered[me][c], FlagId::kReduced)) {
        return;
      }
    }
  }

  // 3. all_reduce: every other owner's sums, into out.
  for (int i = blockIdx.x; kGather && i < (world - 1) * p.chunks; i += ctas) {
    const int32_t s = (me + 1 + i / p.chunks) % world;
    const int c = i % p.chunks;
    bad = threadIdx.x == 0 &&
          t.wait(&flags.gathered[s][c], flags.uses[c] + 1, p.wait, FlagId::kReduced, kFaultPeerGlobal + s) == 0;
    if (__syncthreads_or(bad)) return;
    uint64_t lo, n;
    chunk_of(p, s, c, &lo, &n);
    reduce_detail::copy_aligned(p.out + plan.share_begin(s) + lo, heap + p.gather + s * plan.share_bytes + lo, n);
  }

  // The last CTA out: everything every rank of another node sends here has landed, so tell each that
  // its network reads of this launch are done, and wait to hear the same from each of them (this
  // rank's send and gather buffers are then free for any later op).
  if (device::last_cta_to_arrive(&flags.finished)) {
    if (remote) {
      device::ProxyTransport proxy = p.proxy;
      bad = !posted(proxy.signal(threadIdx.x, &flags.drained[me], 1), p, FlagId::kDrained, threadIdx.x);
    }
    if (__syncthreads_or(bad)) return;
    if (remote) {
      bad = t.wait(&flags.drained[threadIdx.x], launch, p.wait, FlagId::kDrained, kFaultPeerGlobal + threadIdx.x) == 0;
    }
    if (__syncthreads_or(bad)) return;
    if (threadIdx.x == 0) {
      for (int c = 0; c < p.chunks; ++c) flags.uses[c] += 1;
      flags.launches = launch;
      __threadfence();
    }
  }
  device::op_end(t);
}

}  // namespace interlace
