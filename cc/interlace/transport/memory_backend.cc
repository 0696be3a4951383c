#include "interlace/transport/memory_backend.h"

#include <algorithm>
#include <cstring>

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;

MemoryBackend::MemoryBackend(int my_rank, std::vector<char*> heaps, size_t max_in_flight, Order order, uint64_t seed)
    : my_rank_(my_rank), heaps_(std::move(heaps)), max_in_flight_(max_in_flight), order_(order), random_(seed),
      dead_(heaps_.size(), false) {
  IL_CHECK(max_in_flight_ > 0, "MemoryBackend: max_in_flight must be positive");
}

bool MemoryBackend::post(const ProxyWrite& w) {
  if (in_flight_.size() >= max_in_flight_) return false;
  in_flight_.push_back(w);
  most_in_flight_ = std::max(most_in_flight_, in_flight_.size());
  return true;
}

bool MemoryBackend::progress() {
  if (held_) return !in_flight_.empty();
  std::vector<ProxyWrite> batch(in_flight_.begin(), in_flight_.end());
  in_flight_.clear();
  if (order_ == Order::kReversed) std::reverse(batch.begin(), batch.end());
  if (order_ == Order::kShuffled) std::shuffle(batch.begin(), batch.end(), random_);
  for (const ProxyWrite& w : batch) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (dead_[w.peer]) {
        if (failure_.empty()) {
          failure_ = concat("rank ", my_rank_, "'s proxy: rank ", w.peer, " is unreachable (a write of ", w.bytes,
                            " bytes to it failed)");
        }
        continue;
      }
    }
    std::memcpy(heaps_[w.peer] + w.dst_offset, heaps_[my_rank_] + w.src_offset, w.bytes);
    // The flag moves after the bytes: the receiver that sees the count sees the data.
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(heaps_[w.peer] + w.flag_offset), w.add, __ATOMIC_RELEASE);
  }
  return !batch.empty();
}

std::string MemoryBackend::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void MemoryBackend::kill(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  dead_[rank] = true;
}

}  // namespace interlace
