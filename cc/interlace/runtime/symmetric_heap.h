// One cuMem VMM allocation per rank, mapped into every process of the node.
//
// The heap starts with a SignalPad (flags that kernels exchange); HeapAllocator hands out the rest. Ranks make the same allocations in the same order, so a symmetric tensor
// has the same offset on every rank; Group checks that across ranks.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "interlace/device/signal_pad.h"
#include "interlace/runtime/bootstrap.h"
#include "interlace/runtime/heap_allocator.h"
#include "interlace/runtime/topology.h"

namespace interlace {

class SymmetricHeap {
 public:
  // Collective over all ranks. `bytes` is the usable size and must be equal on every rank.
  SymmetricHeap(Bootstrap& bootstrap, const Topology& topology, int device, size_t bytes);
  ~SymmetricHeap();
  SymmetricHeap(const SymmetricHeap&) = delete;
  SymmetricHeap& operator=(const SymmetricHeap&) = delete;

  size_t usable_bytes() const { return usable_bytes_; }
  char* base(int local_rank) const { return bases_.at(local_rank); }
  char* local_base() const { return bases_[local_rank_]; }
  SignalPad* pad(int local_rank) const { return reinterpret_cast<SignalPad*>(bases_.at(local_rank)); }

  // Offsets from the heap's base (see HeapAllocator).
  HeapAllocator& allocator() { return *allocator_; }
  // The offset of [ptr, ptr+bytes) if it lies inside this rank's heap, else -1.
  long long offset_of(const void* ptr, size_t bytes) const;

 private:
  int device_;
  int local_rank_;
  size_t usable_bytes_;
  size_t mapped_bytes_ = 0;
  size_t data_offset_ = 0;                        // first byte after the signal pad
  unsigned long long handle_ = 0;                 // CUmemGenericAllocationHandle
  std::vector<unsigned long long> peer_handles_;  // imported, one per local rank (0 for self)
  std::vector<char*> bases_;                      // mapped base of every local rank's heap
  std::unique_ptr<HeapAllocator> allocator_;
};

}  // namespace interlace
