// The device side of moving data between ranks: put, signal, wait. Ops are written against this
// interface. NvlinkTransport stores straight into peers' heaps as mapped here; the proxy transport
// (across nodes) will implement the same calls by posting to a host FIFO.
#pragma once

#include <cstdint>

#include "interlace/device/copy.cuh"
#include "interlace/device/signal.cuh"
#include "interlace/device/signal_pad.h"

namespace interlace::device {

struct NvlinkTransport {
  char* heaps[kMaxLocalRanks];  // every local rank's heap as mapped here; each starts with its SignalPad
  int32_t local_rank;
  int32_t local_size;

  __device__ __forceinline__ SignalPad* pad(int q) const { return reinterpret_cast<SignalPad*>(heaps[q]); }
  __device__ __forceinline__ SignalPad* my_pad() const { return pad(local_rank); }

  // The same location as `mine` (in this rank's heap), in rank q's heap.
  template <class T>
  __device__ __forceinline__ T* on_peer(int q, T* mine) const {
    return reinterpret_cast<T*>(heaps[q] + (reinterpret_cast<char*>(mine) - heaps[local_rank]));
  }

  // All threads of the CTA: bytes from local src into rank q's heap at `offset`.
  __device__ __forceinline__ void put(int q, uint64_t offset, const char* src, uint64_t bytes) const {
    block_copy(heaps[q] + offset, src, bytes);
  }

  // One thread: sets rank q's copy of `flag` (a flag of this rank's pad) to value, after the stores
  // this thread made, and those the CTA ordered before it with __syncthreads, are visible there.
  __device__ __forceinline__ void signal(int q, uint64_t* flag, uint64_t value) const {
    __threadfence_system();
    store_release_sys(on_peer(q, flag), value);
  }

  // One thread: waits until this rank's `flag` (raised by rank q) reaches value; see wait_at_least.
  __device__ __forceinline__ uint64_t wait(const uint64_t* flag, uint64_t value, const WaitContext& ctx, FlagId id,
                                           int q) const {
    return wait_at_least(flag, value, ctx, id, q);
  }
};

}  // namespace interlace::device
