// The host side of the proxy: a thread per GPU that takes the requests its kernels post to a
// ProxyFifo (transport/proxy_fifo.h), in ticket order, and hands them to a backend.
//
// A request is taken (and its slot's credit returned) only once the backend accepts it, so a
// backend that is full stops the proxy, the FIFO fills, and producers wait for credit: backpressure
// all the way to the GPU. When the backend fails, the proxy reports it once (the group then aborts
// on every rank) and from then on takes and drops requests, so that no producer waits on credit
// for a proxy that will never serve it.
#pragma once

#include <atomic>
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
  // Serves `queue` until destroyed. on_failure runs once, on the proxy's thread, with the reason:
  // the backend's failure, or a request naming a rank outside [0, world_size).
  Proxy(ProxyQueue queue, ProxyBackend& backend, int world_size, std::function<void(const std::string&)> on_failure);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  uint64_t taken() const { return taken_.load(); }  // requests taken from the queue so far

 private:
  void run();
  bool take_published();  // true if it took any, or one waits for room in the backend
  void fail(const std::string& why);

  ProxyQueue queue_;
  ProxyBackend& backend_;
  const int world_size_;
  std::function<void(const std::string&)> on_failure_;
  std::atomic<uint64_t> taken_{0};
  std::atomic<bool> stop_{false};
  bool failed_ = false;
  std::thread thread_;
};

}  // namespace interlace
