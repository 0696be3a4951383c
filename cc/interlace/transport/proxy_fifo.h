// The queue from a GPU's kernels to its proxy thread, which carries writes to ranks on other nodes.
//
// Slots live in pinned host memory mapped into the GPU; producers (GPU threads) claim tickets from
// a counter in device memory, wait for credit (a free slot: ticket - consumed < capacity), fill the
// slot and publish it by writing its ticket + 1 last. The proxy takes slots in ticket order, copies
// each out and advances `consumed`, which returns the credit. A slot's ticket field tells a
// published slot from a stale one of an earlier lap, so the queue wraps around without resets.
//
// post() is the producer's side, written once for both the GPU and the CPU threads that stand in
// for it in the tests (tests/cc/proxy_test.cc).
#pragma once

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <chrono>
#endif

#include "interlace/base/host_device.h"

namespace interlace {

// Write `bytes` of this rank's heap at src_offset to rank `peer`'s heap at dst_offset; once they
// have landed, add `add` to the 64-bit flag at flag_offset in the peer's heap (bytes may be 0: a
// signal alone). Flags count: a receiver waits for "flag >= n", which holds however the network
// orders the writes (EFA's SRD delivers them in any order).
struct alignas(64) ProxyRequest {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t bytes;
  uint64_t flag_offset;
  uint64_t add;
  int32_t peer;
  uint32_t reserved;
  uint64_t ticket;  // written last: the request's ticket + 1 once the slot is published
};

// The queue as a producer sees it.
struct ProxyFifo {
  ProxyRequest* slots;       // `capacity` slots (host memory, mapped)
  uint64_t* claimed;         // tickets handed out (device memory; producers' atomic counter)
  const uint64_t* consumed;  // slots the proxy has taken (host memory, written by the proxy)
  uint32_t capacity;         // a power of two
};

namespace fifo_detail {

IL_HOST_DEVICE inline uint64_t fetch_add(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
#else
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

IL_HOST_DEVICE inline uint64_t load_acquire(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

IL_HOST_DEVICE inline void store_release(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

IL_HOST_DEVICE inline uint64_t now_ns() {
#if defined(__CUDA_ARCH__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
#endif
}

}  // namespace fifo_detail

enum class PostResult { kPosted, kStopped, kTimedOut };

// Posts `r` (its ticket field is ignored). Waits for credit while the proxy is behind, at most
// timeout_ns, and gives up at once when stop() says so (the group was aborted). A producer that
// gives up after claiming its ticket leaves a hole the proxy never gets past: the group is then
// aborted anyway, and the proxy is torn down with it.
template <class Stop>
IL_HOST_DEVICE PostResult proxy_post(const ProxyFifo& f, const ProxyRequest& r, uint64_t timeout_ns, Stop stop) {
  const uint64_t ticket = fifo_detail::fetch_add(f.claimed, 1);
  if (ticket - fifo_detail::load_acquire(f.consumed) >= f.capacity) {
    const uint64_t start = fifo_detail::now_ns();
    for (uint32_t spin = 1; ticket - fifo_detail::load_acquire(f.consumed) >= f.capacity; ++spin) {
      if (spin % 64 == 0) {
        if (stop()) return PostResult::kStopped;
        if (fifo_detail::now_ns() - start > timeout_ns) return PostResult::kTimedOut;
      }
    }
  }
  ProxyRequest& slot = f.slots[ticket & (f.capacity - 1)];
  slot.src_offset = r.src_offset;
  slot.dst_offset = r.dst_offset;
  slot.bytes = r.bytes;
  slot.flag_offset = r.flag_offset;
  slot.add = r.add;
  slot.peer = r.peer;
  fifo_detail::store_release(&slot.ticket, ticket + 1);
  return PostResult::kPosted;
}

}  // namespace interlace
