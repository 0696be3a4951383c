// Release/acquire flags between GPUs, and a bounded wait that also stops when the group is aborted.
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"

namespace interlace::device {

__device__ __forceinline__ void store_release_sys(uint64_t* flag, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

// Adds to a flag (on this GPU or a peer's) after everything this thread ordered before it: a count
// that several CTAs raise.
__device__ __forceinline__ void add_release_sys(uint64_t* flag, uint64_t value) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* flag) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ void store_release_gpu(uint64_t* flag, uint64_t value) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t load_acquire_gpu(const uint64_t* flag) {
  uint64_t value;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool host_aborted(const HostControl* control) {
  return *reinterpret_cast<const volatile int32_t*>(&control->abort) != 0;
}

__device__ __forceinline__ bool device_aborted(const SignalPad* pad) {
  return *reinterpret_cast<const volatile uint32_t*>(&pad->ops.aborted) != 0;
}

__device__ __forceinline__ void mark_aborted(SignalPad* pad) {
  *reinterpret_cast<volatile uint32_t*>(&pad->ops.aborted) = 1;
}

// Who waits, for the fault record, and what stops a wait.
struct WaitContext {
  int32_t rank;
  OpId op;
  SignalPad* pad;          // this rank's pad (for the fault claim)
  HostControl* control;    // mapped host memory
  uint64_t timeout_ns;     // last resort: a wait this long means a peer is stuck, not slow
};

// Records the first fault of the group into the host control block, `code` last. A timeout or a
// mismatch also aborts the group: its flags are out of step from then on.
__device__ inline void record_fault(const WaitContext& ctx, FaultCode code, FlagId flag, int peer,
                                    uint64_t expected, uint64_t seen, uint64_t waited_ns) {
  if (atomicCAS(&ctx.pad->ops.fault_claimed, 0u, 1u) == 0u) {
    volatile DeviceFault* f = &ctx.control->fault;
    f->rank = ctx.rank;
    f->op = static_cast<int32_t>(ctx.op);
    f->flag = static_cast<int32_t>(flag);
    f->block = static_cast<int32_t>(blockIdx.x);
    f->peer = peer;
    f->expected = expected;
    f->seen = seen;
    f->waited_ns = waited_ns;
    __threadfence_system();
    f->code = static_cast<int32_t>(code);
  }
  mark_aborted(ctx.pad);
  if (code != FaultCode::kAborted) {
    __threadfence_system();
    *reinterpret_cast<volatile int32_t*>(&ctx.control->abort) = 1;
  }
  __threadfence_system();
}

// A waiting thread reads the host's abort word once every this many rounds of 64 polls (a few
// hundred microseconds): rarely, since every waiting CTA does it; in between it reads the GPU's own
// copy, which any CTA that saw the abort has set.
constexpr uint32_t kHostAbortPollRounds = 16;

// Spins until *flag >= expected and returns the value seen. Returns 0 instead (a flag value no wait
// expects), after recording why, if the group is aborted or the wait outlasts the timeout. Called
// by one thread. wait_at_least is for flags that peers raise; wait_at_least_local for flags of
// this GPU's own CTAs.
template <bool kFromPeer>
__device__ inline uint64_t wait_until(const uint64_t* flag, uint64_t expected, const WaitContext& ctx, FlagId id,
                                      int peer) {
  auto load = [flag] { return kFromPeer ? load_acquire_sys(flag) : load_acquire_gpu(flag); };
  uint64_t seen = load();
  if (seen >= expected) return seen;
  const uint64_t start = global_timer_ns();
  for (uint32_t round = 1;; ++round) {
    for (int i = 0; i < 64; ++i) {
      seen = load();
      if (seen >= expected) return seen;
    }
    const uint64_t waited = global_timer_ns() - start;
    const bool stop = device_aborted(ctx.pad) || (round % kHostAbortPollRounds == 0 && host_aborted(ctx.control));
    if (stop) {
      record_fault(ctx, FaultCode::kAborted, id, peer, expected, seen, waited);
      return 0;
    }
    if (waited > ctx.timeout_ns) {
      record_fault(ctx, FaultCode::kTimeout, id, peer, expected, seen, waited);
      return 0;
    }
  }
}

__device__ __forceinline__ uint64_t wait_at_least(const uint64_t* flag, uint64_t expected, const WaitContext& ctx,
                                                  FlagId id, int peer) {
  return wait_until<true>(flag, expected, ctx, id, peer);
}

__device__ __forceinline__ uint64_t wait_at_least_local(const uint64_t* flag, uint64_t expected,
                                                        const WaitContext& ctx) {
  return wait_until<false>(flag, expected, ctx, FlagId::kGate, -1);
}

}  // namespace interlace::device
