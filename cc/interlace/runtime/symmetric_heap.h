// One cuMem VMM allocation per rank, mapped into every process of the node (and, for the loopback
// backend, of the host: see heap_peers in cross_node_choice.h).
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
  // `mapped_ranks`: the global ranks whose heaps to map here, ascending, with every rank of this
  // node; empty means this node's ranks. Ranks of other nodes among them (emulated nodes of one
  // host) are reachable only through base_of_rank: base() and pad() stay this node's, for NVLink.
  // rdma: allocate memory a NIC may reach (gpuDirectRDMACapable, where the GPU supports it with
  // VMM), for the cross-node RC / SRD paths.
  SymmetricHeap(Bootstrap& bootstrap, const Topology& topology, int device, size_t bytes,
                std::vector<int> mapped_ranks = {}, bool rdma = false);
  ~SymmetricHeap();
  SymmetricHeap(const SymmetricHeap&) = delete;
  SymmetricHeap& operator=(const SymmetricHeap&) = delete;

  size_t usable_bytes() const { return usable_bytes_; }
  // From the base to the end of the mapping: the signal pad and the usable bytes.
  size_t mapped_bytes() const { return mapped_bytes_; }
  char* base(int local_rank) const { return bases_.at(local_rank); }
  char* local_base() const { return bases_[local_rank_]; }
  SignalPad* pad(int local_rank) const { return reinterpret_cast<SignalPad*>(bases_.at(local_rank)); }
  // Every rank's heap as this process maps it, by global rank; null where not mapped.
  const std::vector<char*>& bases_by_rank() const { return by_rank_; }

  // Offsets from the heap's base (see HeapAllocator).
  HeapAllocator& allocator() { return *allocator_; }
  // The offset of [ptr, ptr+bytes) if it lies inside this rank's heap, else -1.
  long long offset_of(const void* ptr, size_t bytes) const;

  // A dmabuf file descriptor of this rank's whole mapping (signal pad included), for
  // ibv_reg_dmabuf_mr; the caller closes it. -1, with why in *why, where the GPU or driver cannot
  // export one (then RDMA registers by address, which needs nvidia-peermem).
  int export_dmabuf(std::string* why) const;

 private:
  int device_;
  int local_rank_;
  size_t usable_bytes_;
  size_t mapped_bytes_ = 0;
  size_t data_offset_ = 0;                        // first byte after the signal pad
  unsigned long long handle_ = 0;                 // CUmemGenericAllocationHandle
  std::vector<int> mapped_ranks_;                 // global ranks mapped here, ascending
  std::vector<unsigned long long> peer_handles_;  // imported, one per mapped rank (0 for self)
  std::vector<char*> mapped_;                     // base of each mapped rank's heap
  std::vector<char*> bases_;                      // mapped base of every local rank's heap
  std::vector<char*> by_rank_;                    // by global rank; null if not mapped
  std::unique_ptr<HeapAllocator> allocator_;
};

}  // namespace interlace
