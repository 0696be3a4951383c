// all_gather over NVLink: every rank pushes its shard into every peer with SM stores.
//
// Stores beat loads here (2 x H200, 256 MiB per rank: 326 GB/s pushing against 283 pulling; see
// bench/results/NOTES.md). The work is cut into chunks of chunk_bytes; CTA b moves chunks
// b, b + num_blocks, b + 2*num_blocks, ... of this rank's shard, one per round. Per launch, CTA b:
//   1. raises ready[b] on every peer ("your chunks of round 0.. may land in my buffer") and waits for
//      every peer's ready[b], so that no write lands while the receiver still uses its buffer;
//   2. per round: stores its chunk into every peer (and its own out), then raises done[b] = seq on
//      every peer, seq counting rounds over all launches;
//   3. when out is not symmetric, peers wrote into this rank's receive buffer instead; CTA b copies
//      chunk r of every peer from there into out once done[b] >= seq of round r, one round behind
//      its own stores so that NVLink stays busy while it copies.
// All counters live in device memory and only grow, so a captured CUDA graph replays correctly.
#pragma once

#include <cstdint>

#include "interlace/device/copy.cuh"
#include "interlace/device/signal.cuh"
#include "interlace/device/signal_pad.h"

namespace interlace {

struct AllGatherParams {
  const char* inp;                  // this rank's shard
  char* out;                        // [world * bytes_per_rank]
  char* dst[kMaxLocalRanks];        // dst[q]: where this rank's shard goes on rank q (as mapped here)
  const char* recv;                 // non-null: peers' shards land here ([world * bytes]) and are copied to out
  SignalPad* pads[kMaxLocalRanks];  // pads[q]: rank q's signal pad as mapped here
  uint64_t bytes_per_rank;
  uint64_t chunk_bytes;
  int32_t rounds;                   // ceil(bytes_per_rank / (chunk_bytes * gridDim.x))
  int32_t rank;
  int32_t local_rank;
  int32_t local_size;
  DeviceFault* fault;
  uint64_t timeout_ns;
};

constexpr int kAllGatherThreads = 512;

namespace all_gather_detail {

// Thread t < local_size (t != local_rank) speaks for peer t: it raises that peer's flag, and waits
// on the flag that peer raises here.
__device__ __forceinline__ bool speaks_for_peer(const AllGatherParams& p) {
  return threadIdx.x < p.local_size && threadIdx.x != p.local_rank;
}

__device__ __forceinline__ uint64_t* flag_slot(AllGatherFlags& f, FlagId flag, int peer) {
  return flag == FlagId::kReady ? &f.ready[blockIdx.x][peer] : &f.done[blockIdx.x][peer];
}

// Raises `flag` = value on the peer this thread speaks for. The CTA's earlier stores are ordered
// before it by the __syncthreads that must precede the call, and by the system fence.
__device__ __forceinline__ void raise_flag(const AllGatherParams& p, FlagId flag, uint64_t value) {
  if (!speaks_for_peer(p)) return;
  __threadfence_system();
  device::store_release_sys(flag_slot(p.pads[threadIdx.x]->all_gather, flag, p.local_rank), value);
}

// Waits until the peer this thread speaks for has raised `flag` to at least value. Sets *failed on
// timeout (the fault is recorded). Callers __syncthreads before reading *failed.
__device__ __forceinline__ void wait_flag(const AllGatherParams& p, FlagId flag, uint64_t value, int* failed) {
  if (!speaks_for_peer(p)) return;
  const int t = threadIdx.x;
  device::WaitSite site{p.rank, OpId::kAllGather, flag, static_cast<int32_t>(blockIdx.x), t};
  SignalPad* pad = p.pads[p.local_rank];
  if (!device::wait_at_least(flag_slot(pad->all_gather, flag, t), value, site, pad, p.fault, p.timeout_ns)) *failed = 1;
}

__device__ __forceinline__ void chunk_range(const AllGatherParams& p, int round, uint64_t* lo, uint64_t* n) {
  const uint64_t chunk = static_cast<uint64_t>(round) * gridDim.x + blockIdx.x;
  *lo = min(chunk * p.chunk_bytes, p.bytes_per_rank);
  *n = min(*lo + p.chunk_bytes, p.bytes_per_rank) - *lo;
}

__device__ __forceinline__ void copy_received(const AllGatherParams& p, int round) {
  uint64_t lo, n;
  chunk_range(p, round, &lo, &n);
  for (int k = 1; k < p.local_size; ++k) {
    const int q = (p.local_rank + k) % p.local_size;
    device::block_copy(p.out + q * p.bytes_per_rank + lo, p.recv + q * p.bytes_per_rank + lo, n);
  }
}

}  // namespace all_gather_detail

__global__ void __launch_bounds__(kAllGatherThreads, 3) all_gather_kernel(const __grid_constant__ AllGatherParams p) {
  using namespace all_gather_detail;
  AllGatherFlags& flags = p.pads[p.local_rank]->all_gather;
  __shared__ uint64_t epoch, seq;
  __shared__ int failed;
  if (threadIdx.x == 0) {
    epoch = flags.epoch[blockIdx.x] + 1;
    seq = flags.seq[blockIdx.x];
    failed = 0;
  }
  __syncthreads();
  raise_flag(p, FlagId::kReady, epoch);
  wait_flag(p, FlagId::kReady, epoch, &failed);
  __syncthreads();
  if (failed) return;

  const bool staged = p.recv != nullptr;
  for (int r = 0; r < p.rounds; ++r) {
    uint64_t lo, n;
    chunk_range(p, r, &lo, &n);
    for (int k = 1; k < p.local_size; ++k) {  // start at the next rank so that peers spread their writes
      const int q = (p.local_rank + k) % p.local_size;
      device::block_copy(p.dst[q] + lo, p.inp + lo, n);
    }
    __syncthreads();
    raise_flag(p, FlagId::kDone, seq + r + 1);
    device::block_copy(p.out + p.local_rank * p.bytes_per_rank + lo, p.inp + lo, n);
    if (staged && r > 0) {  // round r-1 has had a round's time to land: copy it while round r flies
      wait_flag(p, FlagId::kDone, seq + r, &failed);
      __syncthreads();
      if (failed) return;
      copy_received(p, r - 1);
    }
  }
  wait_flag(p, FlagId::kDone, seq + p.rounds, &failed);
  __syncthreads();
  if (failed) return;
  if (staged && p.rounds > 0) copy_received(p, p.rounds - 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    flags.seq[blockIdx.x] = seq + p.rounds;
    flags.epoch[blockIdx.x] = epoch;
  }
}

}  // namespace interlace
