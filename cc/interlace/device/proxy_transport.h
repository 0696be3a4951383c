// The transport to ranks on other nodes: the same put / signal / wait as NvlinkTransport
// (transport.cuh), carried by posting requests to this GPU's FIFO (transport/proxy_fifo.h), which
// the proxy thread hands to a network backend. Compiled for the device and for the host, where the
// CPU tests' threads stand in for the GPU's.
//
// How put and signal become requests. A request is "write these bytes, then add to this flag", and
// the backends order only the two halves of one request: SRD delivers separate writes in any order,
// and the loopback engine lands separate writes in any order too. A put followed by a signal in a
// second request could raise the flag before the bytes land. So put() posts nothing: it is held in
// the calling thread's copy of the transport, and the signal() that follows to the same peer posts
// both as one request (put_signal() does it in one call). A signal with no put before it is a
// request of zero bytes.
//
// Why signal adds where NvlinkTransport's sets. A value set by an unordered network may be
// overtaken by an older one (set 6 landing before set 5 leaves 5); adds commute, so a flag that
// counts is right in any order. Receivers wait for "flag >= n" either way. An op driving both
// transports passes the running count to NVLink and the increment (1 per chunk) to the proxy.
//
// Each posting thread uses its own copy (`ProxyTransport t = params.proxy;`): the held put lives
// in it. Waits for FIFO credit are bounded by timeout_ns and stop when the group is aborted.
#pragma once

#include <cstdint>

#include "interlace/base/host_device.h"
#include "interlace/device/signal_pad.h"
#include "interlace/transport/proxy_fifo.h"

#if defined(__CUDACC__)
#include "interlace/device/signal.cuh"
#endif

namespace interlace::device {

enum class ProxySend : int32_t {
  kPosted = 0,    // the request is in the FIFO
  kHeld = 1,      // put(): held until the signal that follows
  kStopped = 2,   // the group is aborted: nothing posted
  kTimedOut = 3,  // no credit within timeout_ns: the proxy is stuck (the caller aborts the group)
  kOutsideHeap = 4,  // source, destination or flag not in the heap (or a misaligned flag): nothing posted
  kUnpaired = 5,  // a put while one is held, or a signal to another peer than the held put's
};

IL_HOST_DEVICE inline bool proxy_send_ok(ProxySend s) { return s == ProxySend::kPosted || s == ProxySend::kHeld; }

struct ProxyTransport {
  ProxyFifo fifo;
  char* heap = nullptr;               // this rank's heap as the caller maps it (the backends register it)
  uint64_t heap_bytes = 0;            // the same on every rank
  uint64_t timeout_ns = 0;            // the longest wait for credit
  const int32_t* host_abort = nullptr;       // HostControl::abort, mapped; null: never
  const uint32_t* device_aborted = nullptr;  // this rank's SignalPad::ops.aborted; null: never

  // The put held for the next signal (this copy's).
  int32_t held_peer = -1;
  uint64_t held_dst = 0;
  uint64_t held_src = 0;
  uint64_t held_bytes = 0;

  // One thread: `bytes` at src (in this rank's heap) for rank q's heap at `offset`, carried with
  // the next signal to q.
  IL_HOST_DEVICE ProxySend put(int q, uint64_t offset, const char* src, uint64_t bytes) {
    if (held_peer >= 0) return ProxySend::kUnpaired;
    if (!in_heap(src, bytes) || !fits(offset, bytes)) return ProxySend::kOutsideHeap;
    held_peer = q;
    held_dst = offset;
    held_src = static_cast<uint64_t>(src - heap);
    held_bytes = bytes;
    return ProxySend::kHeld;
  }

  // One thread: adds `add` to rank q's copy of `flag` (a flag of this rank's pad, so its offset
  // names it everywhere) once the held put's bytes have landed there.
  IL_HOST_DEVICE ProxySend signal(int q, uint64_t* flag, uint64_t add) {
    if (held_peer >= 0 && held_peer != q) return ProxySend::kUnpaired;
    const char* f = reinterpret_cast<const char*>(flag);
    if (!in_heap(f, sizeof(uint64_t)) || (f - heap) % sizeof(uint64_t) != 0) return ProxySend::kOutsideHeap;
    ProxyRequest r{};
    if (held_peer >= 0) {
      r.src_offset = held_src;
      r.dst_offset = held_dst;
      r.bytes = held_bytes;
    }
    r.flag_offset = static_cast<uint64_t>(f - heap);
    r.add = add;
    r.peer = q;
    held_peer = -1;
    const AbortWords stop{host_abort, device_aborted};
    switch (proxy_post(fifo, r, timeout_ns, stop)) {
      case PostResult::kPosted: return ProxySend::kPosted;
      case PostResult::kStopped: return ProxySend::kStopped;
      default: return ProxySend::kTimedOut;
    }
  }

  IL_HOST_DEVICE ProxySend put_signal(int q, uint64_t offset, const char* src, uint64_t bytes, uint64_t* flag,
                                      uint64_t add) {
    const ProxySend p = put(q, offset, src, bytes);
    return p == ProxySend::kHeld ? signal(q, flag, add) : p;
  }

  // One thread: waits until this rank's `flag` (raised by rank q's requests) reaches value;
  // returns the value seen, or 0 once the group is aborted or after ctx.timeout_ns. On the device
  // it is wait_at_least (the fault is recorded); on the host a bounded spin with the same answer.
  template <class Context>
  IL_HOST_DEVICE uint64_t wait(const uint64_t* flag, uint64_t value, const Context& ctx, FlagId id, int q) const {
#if defined(__CUDA_ARCH__)
    return wait_at_least(flag, value, ctx, id, kFaultPeerGlobal + q);  // q is a global rank
#else
    (void)id;
    (void)q;
    const uint64_t start = fifo_detail::now_ns();
    AbortWords stop{host_abort, device_aborted};
    for (uint32_t spin = 1;; ++spin) {
      const uint64_t seen = fifo_detail::load_acquire(flag);
      if (seen >= value) return seen;
      if (spin % 64 == 0 && (stop() || fifo_detail::now_ns() - start > ctx.timeout_ns)) return 0;
    }
#endif
  }

 private:
  // proxy_post's stop condition: the GPU's own abort copy on every call, the host's word on every
  // 16th (each read of it crosses PCIe).
  struct AbortWords {
    const int32_t* host;
    const uint32_t* device;
    uint32_t calls = 0;
    IL_HOST_DEVICE bool operator()() {
      if (device != nullptr && *reinterpret_cast<const volatile uint32_t*>(device) != 0) return true;
      return host != nullptr && ++calls % 16 == 1 && *reinterpret_cast<const volatile int32_t*>(host) != 0;
    }
  };

  IL_HOST_DEVICE bool fits(uint64_t offset, uint64_t bytes) const {
    return bytes <= heap_bytes && offset <= heap_bytes - bytes;
  }
  IL_HOST_DEVICE bool in_heap(const char* p, uint64_t bytes) const {
    return p >= heap && fits(static_cast<uint64_t>(p - heap), bytes);
  }
};

#if defined(__CUDACC__)
// One thread, after a post to global rank `peer` raising `flag` there: true if it was posted, else
// false after recording why in the fault record (a refused post aborts the group; a stopped one
// found it aborted already).
__device__ inline bool proxy_posted(ProxySend sent, const WaitContext& ctx, uint64_t timeout_ns, FlagId flag,
                                    int peer) {
  if (sent == ProxySend::kPosted) return true;
  const FaultCode code = sent == ProxySend::kStopped ? FaultCode::kAborted : FaultCode::kProxyPost;
  record_fault(ctx, code, flag, kFaultPeerGlobal + peer, 0, static_cast<uint64_t>(sent), timeout_ns);
  return false;
}
#endif

}  // namespace interlace::device
