// all_gather over NVLink: every rank pushes its shard into every peer with SM stores.
//
// Stores beat loads here (2 x H200, 256 MiB per rank: 326 GB/s pushing against 283 pulling; see
// bench/results/NOTES.md). The work is cut into chunks of chunk_bytes; CTA b moves chunks
// b, b + num_blocks, b + 2*num_blocks, ... of this rank's shard, one per round. Per launch, CTA b:
//   1. makes the op handshake (device/op_sequence.cuh): every peer has started this op, so its
//      previous op no longer uses the buffer this rank's stores land in, and runs the same call;
//   2. per round: puts its chunk into every peer (and its own out), then raises done[b] = seq on
//      every peer, seq counting rounds over all launches;
//   3. when out is not symmetric, peers wrote into this rank's receive buffer instead; CTA b copies
//      chunk r of every peer from there into out once done[b] >= seq of round r, one round behind
//      its own stores so that NVLink stays busy while it copies.
// All counters live in device memory and only grow, so a captured CUDA graph replays correctly.
#pragma once

#include <cstdint>

#include "interlace/device/copy.cuh"
#include "interlace/device/op_sequence.cuh"
#include "interlace/device/transport.cuh"
#include "interlace/ops/all_gather/flags.h"

namespace interlace {

template <class Transport>
struct AllGatherParams {
  Transport transport;
  device::WaitContext wait;
  uint64_t signature;
  const char* inp;           // this rank's shard
  char* out;                 // [world * bytes_per_rank]
  uint64_t landing;          // heap offset where rank q's shard lands on every rank (+ q * bytes_per_rank)
  const char* recv;          // non-null: peers' shards land here ([world * bytes]) and are copied to out
  uint64_t bytes_per_rank;
  uint64_t chunk_bytes;
  int32_t rounds;            // ceil(bytes_per_rank / (chunk_bytes * gridDim.x))
};

constexpr int kAllGatherThreads = 512;

namespace all_gather_detail {

template <class P>
__device__ __forceinline__ void chunk_range(const P& p, int round, uint64_t* lo, uint64_t* n) {
  const uint64_t chunk = static_cast<uint64_t>(round) * gridDim.x + blockIdx.x;
  *lo = min(chunk * p.chunk_bytes, p.bytes_per_rank);
  *n = min(*lo + p.chunk_bytes, p.bytes_per_rank) - *lo;
}

// Thread q < local_size, q != local_rank, speaks for peer q: it raises that peer's flag and waits
// on the one that peer raises here.
template <class P>
__device__ __forceinline__ bool speaks_for_peer(const P& p) {
  return threadIdx.x < p.transport.local_size && threadIdx.x != p.transport.local_rank;
}

// Waits until every peer's round count for this CTA reaches value. Callers __syncthreads after and
// then read *failed.
template <class P>
__device__ __forceinline__ void wait_done(const P& p, AllGatherFlags& flags, uint64_t value, int* failed) {
  if (!speaks_for_peer(p)) return;
  const int q = threadIdx.x;
  if (p.transport.wait(&flags.done[blockIdx.x][q], value, p.wait, FlagId::kDone, q) == 0) *failed = 1;
}

template <class P>
__device__ __forceinline__ void copy_received(const P& p, int round) {
  uint64_t lo, n;
  chunk_range(p, round, &lo, &n);
  const int me = p.transport.local_rank;
  for (int k = 1; k < p.transport.local_size; ++k) {
    const int q = (me + k) % p.transport.local_size;
    device::block_copy(p.out + q * p.bytes_per_rank + lo, p.recv + q * p.bytes_per_rank + lo, n);
  }
}

}  // namespace all_gather_detail

template <class Transport>
__global__ void __launch_bounds__(kAllGatherThreads, 3)
    all_gather_kernel(const __grid_constant__ AllGatherParams<Transport> p) {
  using namespace all_gather_detail;
  const Transport& t = p.transport;
  if (!device::op_enter(t, p.wait, p.signature)) return;
  AllGatherFlags& flags = *op_flags<AllGatherFlags, OpId::kAllGather>(t.my_pad());
  __shared__ uint64_t seq;
  __shared__ int failed;
  if (threadIdx.x == 0) {
    seq = flags.rounds[blockIdx.x];
    failed = 0;
  }
  __syncthreads();

  const int me = t.local_rank;
  const bool staged = p.recv != nullptr;
  for (int r = 0; r < p.rounds; ++r) {
    uint64_t lo, n;
    chunk_range(p, r, &lo, &n);
    for (int k = 1; k < t.local_size; ++k) {  // start at the next rank so that peers spread their writes
      const int q = (me + k) % t.local_size;
      t.put(q, p.landing + me * p.bytes_per_rank + lo, p.inp + lo, n);
    }
    __syncthreads();
    if (speaks_for_peer(p)) t.signal(threadIdx.x, &flags.done[blockIdx.x][me], seq + r + 1);
    device::block_copy(p.out + me * p.bytes_per_rank + lo, p.inp + lo, n);
    if (staged && r > 0) {  // round r-1 has had a round's time to land: copy it while round r flies
      wait_done(p, flags, seq + r, &failed);
      __syncthreads();
      if (failed) return;
      copy_received(p, r - 1);
    }
  }
  wait_done(p, flags, seq + p.rounds, &failed);
  __syncthreads();
  if (failed) return;
  if (staged && p.rounds > 0) copy_received(p, p.rounds - 1);
  if (threadIdx.x == 0) flags.rounds[blockIdx.x] = seq + p.rounds;
  device::op_end(t);
}

}  // namespace interlace
