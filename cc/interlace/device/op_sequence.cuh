// How every op kernel starts and ends, so that ranks agree on what they run before moving data.
//
// On entry CTA 0 reads the group's sticky abort word in host memory and passes it to the other
// CTAs through OpSignals::gate; all exit at once if it is set (queued launches and the rest of a
// captured graph never store into peers after an abort). Each CTA numbers the op from the
// device counter OpSignals::completed, publishes (number, signature) to every peer and waits for
// theirs. A peer with another signature is a mismatch (fault, abort); a peer whose call of this op
// failed its argument checks published kCancelSignature, and every rank then skips the op but
// still counts it, so the group stays usable. The last CTA to finish advances the counter.
#pragma once

#include <cstdint>

#include "interlace/device/signal.cuh"
#include "interlace/device/signal_pad.h"

namespace interlace::device {

enum OpStart : int { kRun = 0, kSkip = 1, kStop = 2 };

// op_begin's two steps. The gate, one thread per CTA: CTA 0 reads the abort words (the host's over
// PCIe, about 1 us) and opens the gate for op `number` to the other CTAs, which wait for it. True:
// the op must stop.
template <class Transport>
__device__ inline bool pass_gate(const Transport& t, const WaitContext& ctx, uint64_t number) {
  OpSignals& ops = t.my_pad()->ops;
  if (blockIdx.x == 0) {
    const bool stop = device_aborted(t.my_pad()) || host_aborted(ctx.control);
    if (stop) mark_aborted(t.my_pad());
    store_release_gpu(&ops.gate, number << 1 | (stop ? 1 : 0));
    return stop;
  }
  // CTA 0 starts first in practice (CTAs are dispatched in order), so this wait is short.
  const uint64_t gate = wait_at_least_local(&ops.gate, number << 1, ctx);
  return gate == 0 || (gate & 1) != 0;
}

// The hello with peer q (not this rank), one thread: publishes (op n, signature) there and checks
// theirs. kRun, kSkip (q's call was cancelled) or kStop (a mismatch, recorded, or a failed wait).
template <class Transport>
__device__ inline OpStart greet(const Transport& t, const WaitContext& ctx, uint64_t n, uint64_t signature, int q) {
  OpSignals& ops = t.my_pad()->ops;
  const uint64_t word = n << kSignatureBits | signature;
  t.signal(q, &ops.hello[n & 1][t.local_rank], word);
  const uint64_t seen = t.wait(&ops.hello[n & 1][q], n << kSignatureBits, ctx, FlagId::kHello, q);
  const uint64_t theirs = seen & kSignatureMask;
  if (seen == 0) return kStop;
  if (signature == kCancelSignature) return kRun;  // a cancelled call only needs every peer to reach this op
  if (theirs == kCancelSignature) return kSkip;
  if (theirs != signature) {
    record_fault(ctx, FaultCode::kMismatch, FlagId::kHello, q, word, seen, 0);
    return kStop;
  }
  return kRun;
}

// Called by all threads of every CTA, blockDim.x >= local_size. On kSkip call op_end and exit; on
// kStop exit (op_enter below does both, for kernels that need nothing else).
template <class Transport>
__device__ inline OpStart op_begin(const Transport& t, const WaitContext& ctx, uint64_t signature) {
  __shared__ int state;
  __shared__ uint64_t number;
  if (threadIdx.x == 0) {
    number = *reinterpret_cast<volatile uint64_t*>(&t.my_pad()->ops.completed) + 1;
    state = pass_gate(t, ctx, number) ? kStop : kRun;
  }
  __syncthreads();
  const bool stop = state == kStop;
  const uint64_t n = number;
  __syncthreads();  // everyone has read state before anyone changes it
  if (stop) return kStop;
  const int q = threadIdx.x;
  if (q < t.local_size && q != t.local_rank) {
    const OpStart vote = greet(t, ctx, n, signature, q);
    if (vote != kRun) atomicMax(&state, vote);
  }
  __syncthreads();
  const OpStart start = static_cast<OpStart>(state);
  if (start == kSkip && threadIdx.x == 0) *reinterpret_cast<volatile uint64_t*>(&ctx.control->cancelled) = n;
  return start;
}

// op_begin made by one warp (all 32 lanes), for a kernel whose other warps meanwhile do work that
// touches nothing of a peer's and nothing an earlier op may still use (a GEMM's mainloop on this
// rank's inputs): they wait for its result before anything that does. The same start in every lane;
// its caller passes it on, and on kSkip calls op_end, on kStop does not.
template <class Transport>
__device__ inline OpStart op_begin_warp(const Transport& t, const WaitContext& ctx, uint64_t signature) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  uint64_t n = 0;
  int stop = 0;
  if (lane == 0) {
    n = *reinterpret_cast<volatile uint64_t*>(&t.my_pad()->ops.completed) + 1;
    stop = pass_gate(t, ctx, n) ? 1 : 0;
  }
  n = __shfl_sync(0xffffffffu, n, 0);
  if (__shfl_sync(0xffffffffu, stop, 0) != 0) return kStop;
  int vote = kRun;
  for (int q = lane; q < t.local_size; q += 32) {
    if (q != t.local_rank) vote = max(vote, static_cast<int>(greet(t, ctx, n, signature, q)));
  }
  const OpStart start = static_cast<OpStart>(__reduce_max_sync(0xffffffffu, vote));
  if (start == kSkip && lane == 0) *reinterpret_cast<volatile uint64_t*>(&ctx.control->cancelled) = n;
  return start;
}

// All threads of every CTA: true (in every thread) in the last CTA to arrive, which then sees what
// the other CTAs stored before arriving; `arrived` (device memory, zero before the first arrival) is
// reset for the next round. kSystem: the CTAs' stores went to peers too, so the fences are
// system-wide.
template <bool kSystem = false>
__device__ inline bool last_cta_to_arrive(uint32_t* arrived) {
  __shared__ int last;
  const auto fence = [] { kSystem ? __threadfence_system() : __threadfence(); };
  __syncthreads();
  if (threadIdx.x == 0) {
    fence();
    last = atomicAdd(arrived, 1u) == gridDim.x - 1;
    if (last) {
      fence();  // acquire: what this CTA does next is ordered after the others' arrivals
      *arrived = 0;
    }
  }
  __syncthreads();
  return last;
}

// Called by all threads of every CTA that did not stop: the last CTA out counts the op as done.
// (The op's number is read again here rather than kept live through the op: registers are scarce.)
template <class Transport>
__device__ inline void op_end(const Transport& t) {
  __syncthreads();
  if (threadIdx.x == 0) {
    OpSignals& ops = t.my_pad()->ops;
    const uint64_t number = *reinterpret_cast<volatile uint64_t*>(&ops.completed) + 1;
    __threadfence();
    if (atomicAdd(&ops.exited, 1u) == gridDim.x - 1) {
      ops.exited = 0;
      *reinterpret_cast<volatile uint64_t*>(&ops.completed) = number;
      __threadfence();
    }
  }
}

// The start every op kernel makes, all threads of every CTA: op_begin, and for a call that every
// rank skips (cancelled on one), its op_end at once. True when the op runs; false: exit.
template <class Transport>
__device__ inline bool op_enter(const Transport& t, const WaitContext& ctx, uint64_t signature) {
  const OpStart start = op_begin(t, ctx, signature);
  if (start == kSkip) op_end(t);
  return start == kRun;
}

}  // namespace interlace::device
