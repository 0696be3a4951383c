// The host side of the proxy: a thread per GPU that takes the requests its kernels post to a
// ProxyFifo (transport/proxy_fifo.h), in ticket order, and hands them to a backend.
//
// A request is taken (and its slot's credit returned) only once the backend accepts it, so a
// backend that is full stops the proxy, the FIFO fills, and producers wait for credit: backpressure
// all the way to the GPU. When the backend fails, the proxy reports it once (the group then aborts
// on every rank) and from then on takes and drops requests, so that no producer waits on credit
// for a proxy that will never serve it.
//
// Teardown stops taking requests (the Group drains the FIFO first: CrossNodePath::drain), then
// waits, bounded, for the writes the backend still has out (ProxyBackend::outstanding), so that the
// owner destroys the backend's queue pairs and registrations only once nothing runs on them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "interlace/transport/proxy_backend.h"
#include "interlace/transport/proxy_fifo.h"

namespace interlace {

// The queue as the proxy sees it (the same memory as the producers' ProxyFifo).
struct ProxyQueue {
  ProxyRequest* slots;
  uint64_t* consumed;
  uint32_t capacity;  // a power of two
};

class Proxy {
 public:
  // How long teardown waits for writes still out. Healthy writes complete in micro- to
  // milliseconds, but a packet lost once is resent only after RC's local ACK timeout (4.3 s,
  // ibv_connect.h), and that write should still land. A peer that never answers is declared dead
  // only after all retries (about 35 s), which a process exiting must not sit through: past this
  // bound the writes are abandoned, and said so.
  static constexpr std::chrono::milliseconds kTeardownWait{5000};

  // Serves `queue` until stopped. on_failure runs once, on the proxy's thread, with the reason:
  // the backend's failure, or a request naming a rank outside [0, world_size).
  Proxy(ProxyQueue queue, ProxyBackend& backend, int world_size, std::function<void(const std::string&)> on_failure);
  ~Proxy();  // stop()
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Takes no more requests, then keeps the backend progressing until it has no writes out, it has
  // failed (the group aborts: nobody waits for them), or kTeardownWait has passed; with settle false
  // (the group has aborted: no peer waits for the writes), not at all. Returns how many writes it
  // gave up on (0 when all completed). Never throws; later calls return the same.
  uint64_t stop(bool settle = true);

  uint64_t taken() const { return taken_.load(); }  // requests taken from the queue so far

 private:
  void run();
  bool take_published();  // true if it took any, or one waits for room in the backend
  void fail(const std::string& why);
  uint64_t settle();      // the bounded wait of stop(), on the proxy's thread; returns writes still out

  ProxyQueue queue_;
  ProxyBackend& backend_;
  const int world_size_;
  std::function<void(const std::string&)> on_failure_;
  std::atomic<uint64_t> taken_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> settle_{true};  // set before stop_
  bool failed_ = false;
  uint64_t abandoned_ = 0;  // written by the thread before it ends, read after the join
  std::thread thread_;
};

}  // namespace interlace
