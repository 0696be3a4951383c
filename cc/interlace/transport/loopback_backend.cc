#include "interlace/transport/loopback_backend.h"

#include <algorithm>
#include <chrono>

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;
namespace {

uint64_t steady_now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// [offset, offset + bytes) lies in a heap of heap_bytes (written so that nothing overflows).
bool fits(uint64_t offset, uint64_t bytes, uint64_t heap_bytes) {
  return bytes <= heap_bytes && offset <= heap_bytes - bytes;
}

}  // namespace

ByteRateLimiter::ByteRateLimiter(double rate_bytes_per_s, uint64_t burst_bytes, uint64_t now_ns)
    : rate_per_ns_(rate_bytes_per_s / 1e9), burst_(static_cast<double>(burst_bytes)), tokens_(burst_),
      last_ns_(now_ns) {
  IL_CHECK(rate_bytes_per_s >= 0, "ByteRateLimiter: the rate must not be negative, got ", rate_bytes_per_s);
  IL_CHECK(rate_bytes_per_s == 0 || burst_bytes > 0, "ByteRateLimiter: a rate needs a positive burst size");
}

bool ByteRateLimiter::admit(uint64_t bytes, uint64_t now_ns) {
  if (rate_per_ns_ == 0) return true;
  if (now_ns > last_ns_) {  // a clock that steps back adds nothing, and takes nothing either
    tokens_ = std::min(burst_, tokens_ + static_cast<double>(now_ns - last_ns_) * rate_per_ns_);
    last_ns_ = now_ns;
  }
  // A write larger than the bucket waits for a full bucket, else it would never go.
  const double needed = std::min(static_cast<double>(bytes), burst_);
  if (tokens_ < needed) return false;
  tokens_ -= static_cast<double>(bytes);
  return true;
}

LoopbackBackend::LoopbackBackend(int my_rank, std::vector<char*> heaps, uint64_t heap_bytes, LoopbackEngine& engine,
                                 LoopbackOptions options)
    : my_rank_(my_rank), heaps_(std::move(heaps)), heap_bytes_(heap_bytes), engine_(engine),
      max_in_flight_(options.max_in_flight), now_ns_(options.now_ns ? std::move(options.now_ns) : steady_now_ns),
      limiter_(options.rate_bytes_per_s, options.burst_bytes, now_ns_()) {
  IL_CHECK(my_rank_ >= 0 && my_rank_ < static_cast<int>(heaps_.size()), "LoopbackBackend: rank ", my_rank_,
           " has no heap among the ", heaps_.size(), " given");
  IL_CHECK(max_in_flight_ > 0, "LoopbackBackend: max_in_flight must be positive");
  for (size_t r = 0; r < heaps_.size(); ++r) IL_CHECK(heaps_[r] != nullptr, "LoopbackBackend: rank ", r, "'s heap is null");
  in_flight_.reserve(max_in_flight_);
}

std::string LoopbackBackend::check(const ProxyWrite& w) const {
  const std::string who = concat("rank ", my_rank_, "'s loopback proxy: a write");
  if (w.peer < 0 || w.peer >= static_cast<int>(heaps_.size())) {
    return concat(who, " to rank ", w.peer, ", which has no heap on this host (", heaps_.size(), " heaps)");
  }
  if (!fits(w.src_offset, w.bytes, heap_bytes_) || !fits(w.dst_offset, w.bytes, heap_bytes_)) {
    return concat(who, " of ", w.bytes, " bytes from offset ", w.src_offset, " to rank ", w.peer, "'s offset ",
                  w.dst_offset, " runs past the heap (", heap_bytes_, " bytes)");
  }
  if (w.flag_offset % 8 != 0 || !fits(w.flag_offset, 8, heap_bytes_)) {
    return concat(who, " to rank ", w.peer, " names a flag at offset ", w.flag_offset,
                  ", which is not an 8-byte aligned word of the heap (", heap_bytes_, " bytes)");
  }
  return "";
}

bool LoopbackBackend::post(const ProxyWrite& w) {
  if (!failure().empty()) return true;  // taken and dropped: the group is aborting
  std::string bad = check(w);
  if (!bad.empty()) {
    failure_ = std::move(bad);
    return true;
  }
  if (in_flight_.size() >= max_in_flight_) return false;
  if (!limiter_.admit(w.bytes, now_ns_())) return false;
  // Issue order is the fence: the engine lands the add after the bytes.
  if (w.bytes > 0) engine_.copy(heaps_[w.peer] + w.dst_offset, heaps_[my_rank_] + w.src_offset, w.bytes);
  engine_.add(reinterpret_cast<uint64_t*>(heaps_[w.peer] + w.flag_offset), w.add);
  in_flight_.push_back(engine_.record());
  most_in_flight_ = std::max(most_in_flight_, in_flight_.size());
  bytes_posted_ += w.bytes;
  return true;
}

bool LoopbackBackend::progress() {
  const bool out = !in_flight_.empty();
  // Writes may land in any order: look at every one, keep those still out.
  size_t kept = 0;
  for (size_t i = 0; i < in_flight_.size(); ++i) {
    if (engine_.done(in_flight_[i])) {
      ++writes_landed_;
    } else {
      in_flight_[kept++] = in_flight_[i];
    }
  }
  in_flight_.resize(kept);
  return out;
}

std::string LoopbackBackend::failure() const {
  if (!failure_.empty()) return failure_;
  const std::string engine = engine_.failure();
  return engine.empty() ? engine : concat("rank ", my_rank_, "'s loopback proxy: ", engine);
}

}  // namespace interlace
