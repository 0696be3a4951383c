// What a Group will hold for its ranks on other nodes: the backend that carries writes there and
// the Proxy thread that feeds it from this GPU's FIFO. It makes them in order (the verbs, if any;
// the backend; the thread) and tears them down in reverse, the thread first so that nothing runs
// against a backend being destroyed. The thread ends only once the backend's writes still out have
// completed, or after Proxy::kTeardownWait: the queue pairs go after the last completion, and a
// process that exits right after its last op still delivers it. Writes abandoned at that bound are
// told on stderr (the group is going away: there is no one else to tell). Setup failures raise
// interlace::Error naming the backend and why; failures later (a dead peer, a device error) are
// reported once through on_failure, on the proxy's thread, for the group to abort on.
//
// It needs no GPU: the FIFO, the heaps and the loopback engine come from the caller, so the CPU
// tests build it over host memory with the memory backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "interlace/runtime/topology.h"
#include "interlace/transport/ibv_verbs.h"
#include "interlace/transport/loopback_backend.h"
#include "interlace/transport/memory_backend.h"
#include "interlace/transport/proxy.h"
#include "interlace/transport/verbs_backend.h"

namespace interlace {

enum class CrossNodeBackend {
  kMemory,    // host memory as heaps (the CPU tests)
  kLoopback,  // GPUs of one host as separate nodes (LoopbackBackend over a LoopbackEngine)
  kRc,        // InfiniBand / RoCE (RcBackend over IbvVerbs)
  kSrd,       // EFA (SrdBackend over IbvVerbs)
};

const char* cross_node_backend_name(CrossNodeBackend backend);
// "memory", "loopback", "ibverbs" (RC) or "efa" (SRD); raises naming the choices otherwise.
CrossNodeBackend parse_cross_node_backend(const std::string& name);

struct CrossNodeOptions {
  CrossNodeBackend backend = CrossNodeBackend::kLoopback;
  ProxyQueue queue{};  // this GPU's FIFO as the proxy sees it (the kernels' ProxyFifo over the same memory)

  // kMemory, kLoopback: every rank's heap as this process maps it, by global rank, heap_bytes each.
  std::vector<char*> heaps;
  uint64_t heap_bytes = 0;

  // kLoopback: the engine that moves the bytes (a CudaLoopbackEngine in a Group); outlives this.
  LoopbackEngine* engine = nullptr;
  LoopbackOptions loopback;

  // kMemory.
  size_t memory_max_in_flight = 64;
  MemoryBackend::Order memory_order = MemoryBackend::Order::kInOrder;

  // kRc, kSrd: the heap to register (ibv.heap_address, heap_bytes, dmabuf), the exchange through
  // the bootstrap (collective: every rank constructs its proxy at once). ibv.connect is filled in
  // from the topology (the ranks on other nodes) when empty.
  IbvOptions ibv;
  AllGather all_gather;
  FlagSink flag_sink;  // kSrd: adds arriving increments to this rank's heap (the GPU's, in a Group)
  int srd_receive_slots = 1024;

  // Called once, on the proxy's thread, when the backend fails or a kernel posts a bad request.
  std::function<void(const std::string&)> on_failure;
};

class CrossNodeProxy {
 public:
  CrossNodeProxy(const Topology& topology, CrossNodeOptions options);
  ~CrossNodeProxy();
  CrossNodeProxy(const CrossNodeProxy&) = delete;
  CrossNodeProxy& operator=(const CrossNodeProxy&) = delete;

  CrossNodeBackend backend_kind() const { return kind_; }
  ProxyBackend& backend() { return *backend_; }
  uint64_t taken() const { return proxy_->taken(); }
  // The failure reported so far ("" while healthy).
  std::string failure() const;
  // Stops the proxy's thread. With settle, once the backend's writes in flight have completed
  // (bounded by Proxy::kTeardownWait; those abandoned are told on stderr); without (the group has
  // aborted: no peer waits for them), at once. The destructor stops with settle; later calls do nothing.
  void stop(bool settle);

 private:
  void check_options(const Topology& topology, const CrossNodeOptions& o) const;
  void make_backend(const Topology& topology, CrossNodeOptions& o);
  void report(const std::string& why);
  void tell_abandoned(uint64_t writes) const noexcept;

  const int rank_;
  const CrossNodeBackend kind_;
  std::function<void(const std::string&)> on_failure_;
  mutable std::mutex mutex_;
  std::string failure_;
  bool stopped_ = false;
  // Destroyed bottom up: the thread, then the backend, then the verbs it posts through.
  std::unique_ptr<IbvVerbs> verbs_;
  std::unique_ptr<ProxyBackend> backend_;
  std::unique_ptr<Proxy> proxy_;
};

}  // namespace interlace
