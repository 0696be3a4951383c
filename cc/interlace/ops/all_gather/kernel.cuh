// all_gather over NVLink: every rank pulls each peer's shard with SM loads.
//
// CTA b of every rank owns bytes [b*chunk, (b+1)*chunk) of every shard. Per launch it:
//   1. stages its part of the input into the symmetric heap, if the input is not symmetric itself;
//   2. raises ready[b] on every peer: "my part b may be read";
//   3. waits for every peer's ready[b], then copies part b of every shard into out (peers first);
//   4. raises done[b] on every peer ("I have read your part b") and waits for theirs, so that when
//      the kernel ends no peer still reads this rank's input: the caller may overwrite it.
// Flags hold per-CTA epochs kept in device memory, so a captured CUDA graph replays correctly.
#pragma once

#include <cstdint>

#include "interlace/device/copy.cuh"
#include "interlace/device/signal.cuh"
#include "interlace/device/signal_pad.h"

namespace interlace {

struct AllGatherParams {
  char* out;
  const char* inp;                        // this rank's input
  char* stage;                            // non-null: copy inp here first; peers read it from here
  const char* src[kMaxLocalRanks];        // src[q]: rank q's shard as this rank sees it
  SignalPad* pads[kMaxLocalRanks];        // pads[q]: rank q's signal pad as this rank sees it
  uint64_t bytes_per_rank;
  uint64_t chunk_bytes;
  int32_t rank;
  int32_t local_rank;
  int32_t local_size;
  DeviceFault* fault;
  uint64_t timeout_ns;
};

constexpr int kAllGatherThreads = 512;

__global__ void __launch_bounds__(kAllGatherThreads) all_gather_kernel(const __grid_constant__ AllGatherParams p) {
  const int b = blockIdx.x;
  const int t = threadIdx.x;
  SignalPad* const my_pad = p.pads[p.local_rank];
  AllGatherFlags& flags = my_pad->all_gather;
  const uint64_t lo = min(static_cast<uint64_t>(b) * p.chunk_bytes, p.bytes_per_rank);
  const uint64_t hi = min(lo + p.chunk_bytes, p.bytes_per_rank);
  // Thread t < local_size talks to peer t.
  const bool talks = t < p.local_size && t != p.local_rank;

  __shared__ uint64_t epoch_shared;
  __shared__ int failed;
  if (t == 0) {
    epoch_shared = flags.epoch[b] + 1;
    failed = 0;
  }
  __syncthreads();
  const uint64_t epoch = epoch_shared;

  if (p.stage) device::block_copy(p.stage + lo, p.inp + lo, hi - lo);
  __syncthreads();
  if (talks) {
    __threadfence_system();
    device::store_release_sys(&p.pads[t]->all_gather.ready[b][p.local_rank], epoch);
    device::WaitSite site{p.rank, OpId::kAllGather, FlagId::kReady, b, t};
    if (!device::wait_at_least(&flags.ready[b][t], epoch, site, my_pad, p.fault, p.timeout_ns)) failed = 1;
  }
  __syncthreads();
  if (failed) return;

  // Remote shards first, starting with the next rank so that peers spread their reads; own shard last.
  for (int k = 1; k <= p.local_size; ++k) {
    const int q = (p.local_rank + k) % p.local_size;
    device::block_copy(p.out + q * p.bytes_per_rank + lo, p.src[q] + lo, hi - lo);
  }
  __syncthreads();
  if (talks) {
    __threadfence_system();
    device::store_release_sys(&p.pads[t]->all_gather.done[b][p.local_rank], epoch);
    device::WaitSite site{p.rank, OpId::kAllGather, FlagId::kDone, b, t};
    if (!device::wait_at_least(&flags.done[b][t], epoch, site, my_pad, p.fault, p.timeout_ns)) failed = 1;
  }
  __syncthreads();
  if (t == 0 && !failed) flags.epoch[b] = epoch;
}

}  // namespace interlace
