// The loopback proxy backend: GPUs of one host act as separate nodes. Every heap of the host is
// mapped in this process (SymmetricHeap::base(local_rank)), so a write is carried by a copy from
// this rank's heap into the peer's, then an add to the flag there, ordered after the copy as a NIC
// orders an RDMA write and a fenced flag write. The GPU work sits behind LoopbackEngine (the CUDA
// one is CudaLoopbackEngine, cuda_loopback_engine.h; the CPU tests bring a host-memory one).
//
// To behave as a network would, it carries at most `rate_bytes_per_s` (a token bucket: 50e9 for a
// 400 Gb/s NIC) and at most `max_in_flight` writes at a time (a send queue's depth). A write that
// does not fit now is refused by post(), which is how backpressure reaches the GPU (proxy.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "interlace/transport/proxy_backend.h"

namespace interlace {

// The device that moves the bytes. A write is issued as copy() (absent for a flag alone), then
// add(), then record(): the add must land after the copy's bytes, and the ticket is done once
// both have. Writes issued before one another may complete in any order (the CUDA engine keeps
// issue order, the CPU tests' engine does not). Never throws: an error latches into failure(),
// after which calls do nothing and no ticket completes.
class LoopbackEngine {
 public:
  using Ticket = uint32_t;

  virtual ~LoopbackEngine() = default;
  virtual void copy(char* dst, const char* src, uint64_t bytes) = 0;
  // Adds `value` to the 64-bit flag, visible to every GPU and the host (system scope).
  virtual void add(uint64_t* flag, uint64_t value) = 0;
  // Marks the end of a write.
  virtual Ticket record() = 0;
  // Whether that write has landed. Once it says true the ticket is retired (its event goes back to
  // a pool) and must not be asked about again.
  virtual bool done(Ticket ticket) = 0;
  // Why the engine stopped (a CUDA error, with where); "" while healthy.
  virtual std::string failure() const = 0;
};

// A token bucket over bytes: tokens accrue at `rate_bytes_per_s` up to `burst_bytes`. A write is
// admitted once the bucket holds its size (or, for a write larger than the bucket, once the bucket
// is full; it then leaves the bucket in debt). So over any interval T the bytes admitted are at
// most max(burst_bytes, largest write) + rate x T, and in the long run exactly the rate. Time comes
// in as an argument, so it is deterministic under test.
class ByteRateLimiter {
 public:
  // rate_bytes_per_s 0: admit everything.
  ByteRateLimiter(double rate_bytes_per_s, uint64_t burst_bytes, uint64_t now_ns);
  bool admit(uint64_t bytes, uint64_t now_ns);
  double tokens() const { return tokens_; }

 private:
  const double rate_per_ns_;
  const double burst_;
  double tokens_;
  uint64_t last_ns_;
};

struct LoopbackOptions {
  double rate_bytes_per_s = 0;           // 0: as fast as the copy goes; 50e9 ~ a 400 Gb/s NIC
  uint64_t burst_bytes = 256 << 10;      // how far a burst may run ahead of the rate (5 us at 50 GB/s)
  uint32_t max_in_flight = 256;          // writes posted and not yet landed (a send queue's depth)
  std::function<uint64_t()> now_ns;      // the rate limiter's clock; steady_clock when empty
};

class LoopbackBackend : public ProxyBackend {
 public:
  // heaps[r]: rank r's heap as this process maps it (SymmetricHeap::base(r)), heap_bytes long on
  // every rank. `engine` outlives the backend. post() and progress() are called from one thread
  // (the proxy's); they never throw.
  LoopbackBackend(int my_rank, std::vector<char*> heaps, uint64_t heap_bytes, LoopbackEngine& engine,
                  LoopbackOptions options = {});

  // Refuses (false) when max_in_flight writes are out or the rate limit says wait. A write naming
  // a rank outside `heaps`, or ranges outside the heap, is taken and dropped with failure() set:
  // the group aborts on it, and a device fault is avoided.
  bool post(const ProxyWrite& w) override;
  bool progress() override;
  std::string failure() const override;
  // Writes issued to the engine and not yet seen landed (a GPU stream runs them on its own).
  uint64_t outstanding() const override { return in_flight_.size(); }

  size_t in_flight() const { return in_flight_.size(); }
  size_t most_in_flight() const { return most_in_flight_; }
  uint64_t bytes_posted() const { return bytes_posted_; }
  uint64_t writes_landed() const { return writes_landed_; }

 private:
  std::string check(const ProxyWrite& w) const;  // "" when the write fits the heaps

  const int my_rank_;
  const std::vector<char*> heaps_;
  const uint64_t heap_bytes_;
  LoopbackEngine& engine_;
  const uint32_t max_in_flight_;
  std::function<uint64_t()> now_ns_;
  ByteRateLimiter limiter_;
  std::vector<LoopbackEngine::Ticket> in_flight_;
  size_t most_in_flight_ = 0;
  uint64_t bytes_posted_ = 0;
  uint64_t writes_landed_ = 0;
  std::string failure_;  // this backend's own (a bad write); the engine's is asked for separately
};

}  // namespace interlace
