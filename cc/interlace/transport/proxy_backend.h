// What a proxy backend does: carry writes from this rank's heap to other ranks' heaps and add to a
// flag there once a write has landed. Backends: MemoryBackend (host memory as heaps, for the CPU
// tests); RcBackend and SrdBackend (verbs_backend.h, over IbvVerbs); LoopbackBackend (loopback_backend.h:
// GPUs of one host as separate nodes).
#pragma once

#include <cstdint>
#include <string>

namespace interlace {

struct ProxyWrite {
  int peer;
  uint64_t src_offset;   // in this rank's heap
  uint64_t dst_offset;   // in the peer's heap
  uint64_t bytes;        // may be 0: the flag alone
  uint64_t flag_offset;  // in the peer's heap; 8-byte aligned
  uint64_t add;          // added to the flag after the bytes have landed
};

class ProxyBackend {
 public:
  virtual ~ProxyBackend() = default;
  // Starts carrying `w`. Returns false, taking nothing, when there is no room now (a full send
  // queue); the proxy then retries after progress(). That is how backpressure reaches the GPU.
  virtual bool post(const ProxyWrite& w) = 0;
  // Moves writes in flight along: delivery, completions, room for more posts, and (SRD) flags that
  // arrived for this rank. Returns whether anything moved or writes are still out: the proxy keeps
  // polling without pause while it does, so that a rank that only receives is not served late.
  virtual bool progress() = 0;
  // Why the backend can carry no more writes (a dead peer, a device error); "" while healthy.
  virtual std::string failure() const = 0;
  // Writes handed to something that carries them on without the proxy (a NIC's send queue, a GPU
  // stream) and not yet seen complete. The proxy's teardown waits for them (bounded, proxy.h), so
  // that what they run on (queue pairs, registrations) is not destroyed under them and a peer is not
  // left waiting for a write its sender dropped on exit. A backend that moves bytes only inside
  // progress() has none out.
  virtual uint64_t outstanding() const = 0;
};

}  // namespace interlace
