// What a Group of several nodes holds for its ranks on other nodes: this GPU's proxy FIFO (slots
// and `consumed` in pinned host memory mapped into the GPU, `claimed` in device memory, where the
// kernels' atomics are cheap), the CUDA engine the loopback backend copies with (for SRD, the one
// that adds arriving flags into the GPU heap), and the CrossNodeProxy thread. It hands kernels a
// device::ProxyTransport over that FIFO and this rank's heap.
//
// Made after the heap and destroyed before it: the proxy copies out of and into mapped heaps.
// For rc and srd the constructor is collective (the verbs connect through the bootstrap).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "interlace/device/proxy_transport.h"
#include "interlace/device/signal_pad.h"
#include "interlace/runtime/bootstrap.h"
#include "interlace/runtime/symmetric_heap.h"
#include "interlace/runtime/topology.h"

namespace interlace {

// Declared here so that op kernels including group.h see none of the verbs headers.
class CrossNodeProxy;
class CudaLoopbackEngine;
enum class CrossNodeBackend;  // transport/cross_node_proxy.h

struct CrossNodePathOptions {
  CrossNodeBackend backend{};            // set it: loopback, RC or SRD
  double loopback_rate_bytes_per_s = 0;  // 0: unthrottled
  uint32_t fifo_capacity = 1024;         // requests; a power of two
  uint64_t timeout_ns = 0;               // the longest wait for FIFO credit
  // Runs once, on the proxy's thread, when the backend fails (the group aborts on it).
  std::function<void(const std::string&)> on_failure;
};

class CrossNodePath {
 public:
  // `heap` maps every rank of the host when the backend is loopback (heap_peers); `control` is the
  // group's host control block as the device sees it (its abort word stops producers).
  CrossNodePath(const Topology& topology, Bootstrap& bootstrap, SymmetricHeap& heap, int device,
                const HostControl* control, CrossNodePathOptions options);
  ~CrossNodePath();
  CrossNodePath(const CrossNodePath&) = delete;
  CrossNodePath& operator=(const CrossNodePath&) = delete;

  CrossNodeBackend backend() const;
  // What a kernel posts through: copy it into the kernel's parameters.
  const device::ProxyTransport& transport() const { return transport_; }
  std::string failure() const;

  // Posts one request from a host thread (tests, tools). Kernels of this GPU must not be posting
  // meanwhile: the ticket counter lives in device memory, so it is read, used here and written back.
  PostResult post_from_host(const ProxyRequest& request, const volatile int32_t* host_abort);
  // Waits, at most timeout_s, until the proxy has taken every request posted so far; false if it
  // has not. Call once this GPU's kernels are done (nothing posts any more).
  bool drain(double timeout_s);
  // Stops the proxy without waiting for its writes in flight: the group has aborted, so no peer
  // waits for them (teardown would otherwise wait up to Proxy::kTeardownWait).
  void abandon_writes();

 private:
  void release();  // the teardown, in reverse: the thread, the engine, the memory

  const int device_;
  const uint32_t capacity_;
  const uint64_t timeout_ns_;
  void* host_memory_ = nullptr;      // slots, then `consumed` (pinned, mapped)
  ProxyRequest* slots_ = nullptr;
  uint64_t* consumed_ = nullptr;
  uint64_t* claimed_ = nullptr;      // device memory
  std::unique_ptr<CudaLoopbackEngine> engine_;
  std::unique_ptr<CrossNodeProxy> proxy_;
  device::ProxyTransport transport_{};
};

}  // namespace interlace
