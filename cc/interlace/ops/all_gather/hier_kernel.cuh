// all_gather across nodes in one launch: NVLink inside a node, the proxy between nodes, and relays
// that fan a shard from another node out to the rest of theirs. Routes, balance and flags are the
// plan's (hierarchy.h); this kernel runs them. Chunk c of a shard covers [c, c + 1) * chunk_bytes.
//
// CTA 0 first raises ready[me], through the proxy, on every rank whose shard lands here from the
// network. Then each CTA takes its share of four phases, in order; items are dealt over the CTAs
// by index:
//   1. own chunk c: into out, and over NVLink into each node peer's landing slot (landed[me] += 1
//      there);
//   2. own chunk c, once every network receiver has started this launch (ready): copied into the
//      staging buffer and posted to each network receiver, raising arrived[slot][c] there;
//   3. relay slot j, chunk c, once arrived: landed[s] += 1 here, then over NVLink into each node
//      peer (landed[s] += 1 there);
//   4. every other rank's shard s: once landed[s] = base + chunks, copied chunk by chunk out of
//      scratch when out is not the landing area.
// The last CTA out raises drained[me] on every rank whose shard came here over the network, and waits
// for drained from this rank's own network receivers: the kernel ends only once the network has read
// its staging, which a later op (of any kind, from any rank of the node) may then reuse. It also
// moves the local counters on, so a graph replays correctly.
// A wait depends only on remote ranks, on peers' earlier phases, or on this rank's earlier phases in
// other CTAs, all resident (the launch never exceeds what fits): no cycle.
#pragma once

#include <cstdint>

#include "interlace/device/copy.cuh"
#include "interlace/device/op_sequence.cuh"
#include "interlace/device/proxy_transport.h"
#include "interlace/device/transport.cuh"
#include "interlace/ops/all_gather/flags.h"
#include "interlace/ops/all_gather/hierarchy.h"

namespace interlace {

constexpr int kHierAllGatherThreads = 512;
constexpr int kHierMaxNetworkPeers = 128;  // other nodes
static_assert(kHierMaxNetworkPeers <= kHierAllGatherThreads && kHierMaxRelayed <= kHierAllGatherThreads,
              "one thread posts to each network peer and each relayed rank");

struct HierAllGatherParams {
  device::NvlinkTransport nvlink;  // this node's ranks
  device::ProxyTransport proxy;    // the other nodes'
  device::WaitContext wait;
  uint64_t signature;
  const char* inp;
  char* out;
  uint64_t landing;  // heap offset: rank s's shard lands at landing + s * bytes_per_rank, on every rank
  uint64_t staging;  // heap offset of this rank's shard as the network reads it
  int32_t copy_out;  // the landing area is scratch: copy every shard into out
  int32_t rank;
  int32_t world;
  uint64_t bytes_per_rank;
  uint64_t chunk_bytes;
  int32_t chunks;
  int32_t num_network;
  int32_t num_relayed;
  int32_t network_peer[kHierMaxNetworkPeers];  // the rank on each other node that takes this rank's shard
  int32_t network_slot[kHierMaxNetworkPeers];  // the relay slot it lands in there
  int32_t relayed[kHierMaxRelayed];            // [j]: the rank whose shard lands here in relay slot j
};

namespace hier_all_gather_detail {

__device__ __forceinline__ HierAllGatherFlags& flags_of(const device::NvlinkTransport& t) {
  return *reinterpret_cast<HierAllGatherFlags*>(
      reinterpret_cast<char*>(op_flags<AllGatherFlags, OpId::kAllGather>(t.my_pad())) + kHierFlagsInRegion);
}

__device__ __forceinline__ void chunk_range(const HierAllGatherParams& p, int c, uint64_t* lo, uint64_t* n) {
  *lo = min(static_cast<uint64_t>(c) * p.chunk_bytes, p.bytes_per_rank);
  *n = min(*lo + p.chunk_bytes, p.bytes_per_rank) - *lo;
}

// One thread: device::proxy_posted for this kernel's posts.
__device__ __forceinline__ bool posted(device::ProxySend sent, const HierAllGatherParams& p, FlagId flag, int peer) {
  return device::proxy_posted(sent, p.wait, p.proxy.timeout_ns, flag, peer);
}

// All threads: after __syncthreads (the CTA's stores are ordered before), thread q raises
// landed[s] on node peer q.
__device__ __forceinline__ void raise_landed_on_peers(const device::NvlinkTransport& t, HierAllGatherFlags& flags,
                                                      int s) {
  __syncthreads();
  const int q = threadIdx.x;
  if (q < t.local_size && q != t.local_rank) {
    __threadfence_system();
    device::add_release_sys(t.on_peer(q, &flags.landed[s]), 1);
  }
}

}  // namespace hier_all_gather_detail

__global__ void __launch_bounds__(kHierAllGatherThreads, 1)
    hier_all_gather_kernel(const __grid_constant__ HierAllGatherParams p) {
  using namespace hier_all_gather_detail;
  const device::NvlinkTransport& t = p.nvlink;
  if (!device::op_enter(t, p.wait, p.signature)) return;
  HierAllGatherFlags& flags = flags_of(t);
  __shared__ uint64_t base, launch;
  if (threadIdx.x == 0) {
    base = flags.base;
    launch = flags.launches + 1;
  }
  __syncthreads();
  const int me = p.rank;
  const uint64_t bytes = p.bytes_per_rank;
  char* heap = t.heaps[t.local_rank];
  const int ctas = gridDim.x;
  // A failed wait or post has recorded why and aborted the group; __syncthreads_or(bad) gets every
  // thread of the CTA out together.
  bool bad = false;

  if (blockIdx.x == 0 && threadIdx.x < p.num_relayed) {
    device::ProxyTransport proxy = p.proxy;  // a posting thread's own copy
    const int s = p.relayed[threadIdx.x];
    bad = !posted(proxy.signal(s, &flags.ready[me], 1), p, FlagId::kReady, s);
  }
  if (__syncthreads_or(bad)) return;

  // 1. This rank's shard into out and over NVLink.
  for (int c = blockIdx.x; c < p.chunks; c += ctas) {
    uint64_t lo, n;
    chunk_range(p, c, &lo, &n);
    for (int k = 1; k < t.local_size; ++k) {  // start at the next rank so that peers spread their writes
      const int q = (t.local_rank + k) % t.local_size;
      t.put(q, p.landing + me * bytes + lo, p.inp + lo, n);
    }
    device::block_copy(p.out + me * bytes + lo, p.inp + lo, n);
    raise_landed_on_peers(t, flags, me);
  }

  // 2. This rank's shard to the other nodes, once their receivers have started this launch.
  if (p.num_network > 0 && static_cast<int>(blockIdx.x) < p.chunks) {
    if (threadIdx.x < p.num_network) {
      const int q = p.network_peer[threadIdx.x];
      bad = t.wait(&flags.ready[q], launch, p.wait, FlagId::kReady, kFaultPeerGlobal + q) == 0;
    }
    if (__syncthreads_or(bad)) return;
    for (int c = blockIdx.x; c < p.chunks; c += ctas) {
      uint64_t lo, n;
      chunk_range(p, c, &lo, &n);
      device::block_copy(heap + p.staging + lo, p.inp + lo, n);
      __syncthreads();
      if (threadIdx.x < p.num_network) {
        device::ProxyTransport proxy = p.proxy;
        const int q = p.network_peer[threadIdx.x];
        __threadfence_system();  // the CTA's staging stores before the request that reads them
        const device::ProxySend sent = proxy.put_signal(q, p.landing + me * bytes + lo, heap + p.staging + lo, n,
                                                        &flags.arrived[p.network_slot[threadIdx.x]][c], 1);
        bad = !posted(sent, p, FlagId::kNetChunk, q);
      }
      if (__syncthreads_or(bad)) return;  // also: the staging is not rewritten before it is posted
    }
  }

  // 3. Relays: each chunk that arrived from the network, to the rest of this node.
  const int relay_items = p.num_relayed * p.chunks;
  for (int i = blockIdx.x; i < relay_items; i += ctas) {
    const int j = i / p.chunks, c = i % p.chunks;
    const int s = p.relayed[j];
    if (threadIdx.x == 0) {
      const uint64_t seen = t.wait(&flags.arrived[j][c], flags.consumed[j][c] + 1, p.wait, FlagId::kNetChunk,
                                   kFaultPeerGlobal + s);
      bad = seen == 0;
      if (!bad) {
        flags.consumed[j][c] = seen;
        device::add_release_sys(&flags.landed[s], 1);
      }
    }
    if (__syncthreads_or(bad)) return;
    uint64_t lo, n;
    chunk_range(p, c, &lo, &n);
    for (int k = 1; k < t.local_size; ++k) {
      const int q = (t.local_rank + k) % t.local_size;
      t.put(q, p.landing + s * bytes + lo, heap + p.landing + s * bytes + lo, n);
    }
    raise_landed_on_peers(t, flags, s);
  }

  // 4. Every other shard, whatever its path: wait for all of it, then copy it out of scratch.
  const int per_shard = p.copy_out ? p.chunks : 1;
  for (int i = blockIdx.x; i < (p.world - 1) * per_shard; i += ctas) {
    const int s = (me + 1 + i / per_shard) % p.world, c = i % per_shard;
    if (threadIdx.x == 0) {
      bad = t.wait(&flags.landed[s], base + p.chunks, p.wait, FlagId::kChunk, kFaultPeerGlobal + s) == 0;
    }
    if (__syncthreads_or(bad)) return;
    if (p.copy_out) {
      uint64_t lo, n;
      chunk_range(p, c, &lo, &n);
      device::block_copy(p.out + s * bytes + lo, heap + p.landing + s * bytes + lo, n);
    }
  }

  // The last CTA out: every shard is here, so tell the ranks whose shards came over the network that
  // their reads of this launch are done, and wait to hear the same from this rank's network receivers
  // (its staging is then free for any later op, which the node's handshake alone does not ensure).
  if (device::last_cta_to_arrive(&flags.finished)) {
    if (threadIdx.x < p.num_relayed) {
      device::ProxyTransport proxy = p.proxy;
      const int s = p.relayed[threadIdx.x];
      bad = !posted(proxy.signal(s, &flags.drained[me], 1), p, FlagId::kDrained, s);
    }
    if (__syncthreads_or(bad)) return;
    if (threadIdx.x < p.num_network) {
      const int q = p.network_peer[threadIdx.x];
      bad = t.wait(&flags.drained[q], launch, p.wait, FlagId::kDrained, kFaultPeerGlobal + q) == 0;
    }
    if (__syncthreads_or(bad)) return;
    if (threadIdx.x == 0) {
      flags.base = base + p.chunks;
      flags.launches = launch;
      __threadfence();
    }
  }
  device::op_end(t);
}

}  // namespace interlace
