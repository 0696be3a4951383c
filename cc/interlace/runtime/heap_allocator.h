// First-fit allocator over the offsets of a symmetric heap. Pure bookkeeping: the same sequence of
// calls gives the same offsets on every rank.
#pragma once

#include <cstddef>
#include <map>

namespace interlace {

class HeapAllocator {
 public:
  static constexpr size_t kAlignment = 256;

  HeapAllocator(size_t begin, size_t size) : size_(size) { free_[begin] = size; }

  // Tensors come from the bottom, ops' scratch from the top (from_top), so that scratch growing with
  // message size does not fragment the space between tensors. Raises, naming `what` and the sizes,
  // when no free block is large enough.
  size_t allocate(size_t bytes, const char* what, bool from_top = false);
  void free(size_t offset);
  // Takes [offset, offset + bytes) (rounded up as allocate rounds), which must be free: puts a block
  // freed a moment ago back where it was.
  void allocate_at(size_t offset, size_t bytes);
  size_t largest_free_block() const;
  size_t size() const { return size_; }

 private:
  size_t size_;
  std::map<size_t, size_t> free_;  // offset -> size
  std::map<size_t, size_t> used_;
};

}  // namespace interlace
