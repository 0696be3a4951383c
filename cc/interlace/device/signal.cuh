// Release/acquire flags between GPUs and a bounded wait that records what it waited for.
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"

namespace interlace::device {

__device__ __forceinline__ void store_release_sys(uint64_t* flag, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* flag) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Where a wait happens, for the fault record.
struct WaitSite {
  int32_t rank;
  OpId op;
  FlagId flag;
  int32_t block;
  int32_t peer_local_rank;
};

// Records the first timeout of this launch into `fault` (pinned host memory). Later ones are dropped.
__device__ inline void record_timeout(SignalPad* pad, DeviceFault* fault, const WaitSite& site,
                                      uint64_t expected, uint64_t seen, uint64_t waited_ns) {
  if (atomicCAS(&pad->fault_claimed, 0u, 1u) != 0u) return;
  volatile DeviceFault* f = fault;
  f->rank = site.rank;
  f->op = static_cast<int32_t>(site.op);
  f->flag = static_cast<int32_t>(site.flag);
  f->block = site.block;
  f->peer_local_rank = site.peer_local_rank;
  f->expected = expected;
  f->seen = seen;
  f->waited_ns = waited_ns;
  __threadfence_system();
  f->code = 1;
  __threadfence_system();
}

// Spins until *flag >= expected. Returns false, after recording a fault, if that takes longer than
// timeout_ns. Called by one thread.
__device__ inline bool wait_at_least(const uint64_t* flag, uint64_t expected, const WaitSite& site,
                                     SignalPad* pad, DeviceFault* fault, uint64_t timeout_ns) {
  uint64_t seen = load_acquire_sys(flag);
  if (seen >= expected) return true;
  const uint64_t start = global_timer_ns();
  while (true) {
    for (int i = 0; i < 64; ++i) {
      seen = load_acquire_sys(flag);
      if (seen >= expected) return true;
    }
    const uint64_t waited = global_timer_ns() - start;
    if (waited > timeout_ns) {
      record_timeout(pad, fault, site, expected, seen, waited);
      return false;
    }
  }
}

}  // namespace interlace::device
