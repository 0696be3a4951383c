// One cuMem VMM allocation per rank, mapped into every process of the node.
//
// The heap starts with a SignalPad (flags that kernels exchange); the rest is handed out by a
// first-fit allocator. Ranks make the same allocations in the same order, so a symmetric tensor
// has the same offset on every rank; Group checks that across ranks.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "interlace/device/signal_pad.h"
#include "interlace/runtime/bootstrap.h"
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

  // Offset (from the heap's base) of a new block; raises with the sizes when it does not fit.
  // Tensors come from the bottom of the heap, ops' scratch from the top (from_top), so that scratch
  // growing with message size does not fragment the space between tensors.
  size_t allocate(size_t bytes, const char* what, bool from_top = false);
  void free(size_t offset);
  // The offset of [ptr, ptr+bytes) if it lies inside this rank's heap, else -1.
  long long offset_of(const void* ptr, size_t bytes) const;
  size_t largest_free_block() const;

  static constexpr size_t kAlignment = 256;

 private:
  int device_;
  int local_rank_;
  size_t usable_bytes_;
  size_t mapped_bytes_ = 0;
  size_t data_offset_ = 0;                        // first byte after the signal pad
  unsigned long long handle_ = 0;                 // CUmemGenericAllocationHandle
  std::vector<unsigned long long> peer_handles_;  // imported, one per local rank (0 for self)
  std::vector<char*> bases_;                      // mapped base of every local rank's heap
  std::map<size_t, size_t> free_;                 // offset -> size
  std::map<size_t, size_t> used_;
};

}  // namespace interlace
