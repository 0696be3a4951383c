#include "interlace/runtime/heap_allocator.h"

#include <algorithm>
#include <iterator>

#include "interlace/base/error.h"

namespace interlace {

size_t HeapAllocator::allocate(size_t bytes, const char* what, bool from_top) {
  const size_t need = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  auto fits = [&](const std::pair<const size_t, size_t>& block) { return block.second >= need; };
  if (from_top) {
    auto rit = std::find_if(free_.rbegin(), free_.rend(), fits);
    if (rit != free_.rend()) {
      const size_t offset = rit->first + rit->second - need;
      rit->second -= need;
      if (rit->second == 0) free_.erase(rit->first);
      used_[offset] = need;
      return offset;
    }
  } else {
    auto it = std::find_if(free_.begin(), free_.end(), fits);
    if (it != free_.end()) {
      const size_t offset = it->first;
      const size_t rest = it->second - need;
      free_.erase(it);
      if (rest) free_[offset + need] = rest;
      used_[offset] = need;
      return offset;
    }
  }
  IL_FAIL("the symmetric heap is too small for ", what, ": it needs ", need, " bytes, the largest free block has ",
          largest_free_block(), " of ", size_, "; create the group with a larger heap_bytes");
}

void HeapAllocator::allocate_at(size_t offset, size_t bytes) {
  const size_t need = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  auto it = free_.upper_bound(offset);
  IL_CHECK(it != free_.begin(), "the symmetric heap's bytes at ", offset, " are not free");
  --it;  // the free block that starts at or before offset
  const size_t start = it->first, size = it->second;
  IL_CHECK(offset + need <= start + size, "the symmetric heap's bytes at ", offset, " (", need, ") are not free");
  free_.erase(it);
  if (offset > start) free_[start] = offset - start;
  if (start + size > offset + need) free_[offset + need] = start + size - offset - need;
  used_[offset] = need;
}

void HeapAllocator::free(size_t offset) {
  auto it = used_.find(offset);
  IL_CHECK(it != used_.end(), "freeing an offset the symmetric heap did not hand out: ", offset);
  size_t size = it->second;
  used_.erase(it);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

size_t HeapAllocator::largest_free_block() const {
  size_t best = 0;
  for (const auto& [offset, size] : free_) best = std::max(best, size);
  return best;
}

}  // namespace interlace
