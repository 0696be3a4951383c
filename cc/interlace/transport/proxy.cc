#include "interlace/transport/proxy.h"

#include <chrono>

#include "interlace/base/error.h"

namespace interlace {
namespace {

// How long the proxy keeps polling without pause after its last traffic.
constexpr auto kSpinAfterTraffic = std::chrono::milliseconds(1);
// The pause between polls while teardown waits for completions that have not come: short next to
// a write's latency, long enough not to take a core from whatever else is shutting down.
constexpr auto kSettlePause = std::chrono::microseconds(50);

}  // namespace
using detail::concat;

Proxy::Proxy(ProxyQueue queue, ProxyBackend& backend, int world_size,
             std::function<void(const std::string&)> on_failure)
    : queue_(queue), backend_(backend), world_size_(world_size), on_failure_(std::move(on_failure)) {
  IL_CHECK(queue.capacity > 0 && (queue.capacity & (queue.capacity - 1)) == 0,
           "proxy: the queue's capacity must be a power of two, got ", queue.capacity);
  thread_ = std::thread([this] { run(); });
}

Proxy::~Proxy() { stop(); }

uint64_t Proxy::stop(bool settle) {
  if (!stop_) settle_ = settle;
  stop_ = true;
  if (thread_.joinable()) thread_.join();  // the thread settles the backend before it ends
  return abandoned_;
}

uint64_t Proxy::settle() {
  const auto deadline = std::chrono::steady_clock::now() + kTeardownWait;
  while (true) {
    const uint64_t out = backend_.outstanding();
    if (out == 0 || !settle_ || !backend_.failure().empty() || std::chrono::steady_clock::now() >= deadline) {
      return out;
    }
    backend_.progress();
    if (backend_.outstanding() == out) std::this_thread::sleep_for(kSettlePause);
  }
}

void Proxy::fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  on_failure_(why);
}

bool Proxy::take_published() {
  uint64_t next = taken_.load(std::memory_order_relaxed);
  const uint64_t first = next;
  bool waiting = false;
  while (true) {
    ProxyRequest& slot = queue_.slots[next & (queue_.capacity - 1)];
    if (fifo_detail::load_acquire(&slot.ticket) != next + 1) break;
    if (!failed_) {
      const ProxyWrite w{slot.peer, slot.src_offset, slot.dst_offset, slot.bytes, slot.flag_offset, slot.add};
      if (w.peer < 0 || w.peer >= world_size_) {
        fail(concat("proxy: a kernel posted a write to rank ", w.peer, ", outside the group of ", world_size_));
      } else if (!backend_.post(w)) {
        waiting = true;
        break;  // full: leave the slot, and its credit, until there is room
      }
    }
    ++next;
    taken_.store(next, std::memory_order_relaxed);
    fifo_detail::store_release(queue_.consumed, next);
  }
  return next != first || waiting;
}

void Proxy::run() {
  auto last_busy = std::chrono::steady_clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    bool busy = take_published();
    if (!failed_) {
      busy |= backend_.progress();
      const std::string why = backend_.failure();
      if (!why.empty()) fail(why);
    }
    // Spin while there is traffic, sent or received (latency matters), and for kSpinAfterTraffic
    // after it (an op's next request is rarely far behind); then back off to short sleeps. A
    // request the backend refused is traffic too: a sleep then would let a rate-limited backend's
    // bucket (loopback_backend.h) fill and overflow, and the rate fall short.
    const auto now = std::chrono::steady_clock::now();
    if (busy) {
      last_busy = now;
    } else if (now - last_busy > kSpinAfterTraffic) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  abandoned_ = settle();
}

}  // namespace interlace
