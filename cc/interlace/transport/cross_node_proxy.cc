#include "interlace/transport/cross_node_proxy.h"

#include <algorithm>
#include <cstdio>
#include <system_error>

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;

const char* cross_node_backend_name(CrossNodeBackend backend) {
  switch (backend) {
    case CrossNodeBackend::kMemory: return "memory";
    case CrossNodeBackend::kLoopback: return "loopback";
    case CrossNodeBackend::kRc: return "ibverbs";
    case CrossNodeBackend::kSrd: return "efa";
  }
  return "unknown";
}

CrossNodeBackend parse_cross_node_backend(const std::string& name) {
  for (CrossNodeBackend b : {CrossNodeBackend::kMemory, CrossNodeBackend::kLoopback, CrossNodeBackend::kRc,
                             CrossNodeBackend::kSrd}) {
    if (name == cross_node_backend_name(b)) return b;
  }
  IL_FAIL("unknown cross-node backend '", name, "': choose loopback (GPUs of one host as nodes), ibverbs ",
          "(InfiniBand / RoCE) or efa");
}

namespace {

bool on_this_node(const Topology& t, int rank) {
  return std::find(t.local_ranks.begin(), t.local_ranks.end(), rank) != t.local_ranks.end();
}

}  // namespace

CrossNodeProxy::CrossNodeProxy(const Topology& topology, CrossNodeOptions options)
    : rank_(topology.rank), kind_(options.backend), on_failure_(std::move(options.on_failure)) {
  check_options(topology, options);
  make_backend(topology, options);
  try {
    proxy_ = std::make_unique<Proxy>(options.queue, *backend_, topology.world_size,
                                     [this](const std::string& why) { report(why); });
  } catch (const std::system_error& e) {
    IL_FAIL("rank ", topology.rank, "'s cross-node proxy (", cross_node_backend_name(kind_),
            "): could not start its thread: ", e.what());
  }
}

CrossNodeProxy::~CrossNodeProxy() {
  // Joins the thread once the backend's writes are done (bounded): nothing touches the backend
  // after this, and the queue pairs destroyed below have no writes left on them but those told of.
  stop(true);
  proxy_.reset();
  backend_.reset();
  verbs_.reset();
}

void CrossNodeProxy::stop(bool settle) {
  if (stopped_) return;
  stopped_ = true;
  const uint64_t abandoned = proxy_->stop(settle);
  if (settle && abandoned > 0) tell_abandoned(abandoned);
}

void CrossNodeProxy::tell_abandoned(uint64_t writes) const noexcept {
  try {
    const std::string why = backend_->failure();
    const std::string line =
        concat("interlace: rank ", rank_, "'s cross-node proxy (", cross_node_backend_name(kind_), ") tore down with ",
               writes, " write(s) still in flight, which their peers may never see: ",
               why.empty() ? concat("no completion within ", Proxy::kTeardownWait.count(),
                                    " ms (a peer that stopped answering, or a stuck NIC)")
                           : concat("the backend had failed (", why, ")"),
               "\n");
    std::fputs(line.c_str(), stderr);
  } catch (...) {
    // Out of memory while telling: the teardown goes on regardless.
  }
}

std::string CrossNodeProxy::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void CrossNodeProxy::report(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return;
    failure_ = why;
  }
  if (on_failure_) on_failure_(why);
}

void CrossNodeProxy::check_options(const Topology& t, const CrossNodeOptions& o) const {
  const std::string who = concat("rank ", t.rank, "'s cross-node proxy (", cross_node_backend_name(kind_), ")");
  IL_CHECK(t.num_nodes > 1, who, ": the group has one node, so nothing crosses nodes and no proxy is needed");
  IL_CHECK(o.queue.slots != nullptr && o.queue.consumed != nullptr, who, ": no FIFO memory was given");
  IL_CHECK(o.queue.capacity > 0 && (o.queue.capacity & (o.queue.capacity - 1)) == 0, who,
           ": the FIFO's capacity must be a power of two, got ", o.queue.capacity);
  if (kind_ == CrossNodeBackend::kMemory || kind_ == CrossNodeBackend::kLoopback) {
    IL_CHECK(o.heaps.size() == static_cast<size_t>(t.world_size), who, " needs every rank's heap mapped in this ",
             "process, one per rank: got ", o.heaps.size(), " for ", t.world_size, " ranks");
    for (int r = 0; r < t.world_size; ++r) {
      IL_CHECK(o.heaps[r] != nullptr, who, ": rank ", r, "'s heap is not mapped in this process; the ",
               cross_node_backend_name(kind_), " backend carries writes between heaps of one host, so every rank ",
               "must run on it (node names then only say which ranks act as one node)");
    }
    IL_CHECK(o.heap_bytes > 0, who, ": heap_bytes must be positive");
  }
  if (kind_ == CrossNodeBackend::kLoopback) IL_CHECK(o.engine != nullptr, who, ": no loopback engine was given");
  if (kind_ == CrossNodeBackend::kRc || kind_ == CrossNodeBackend::kSrd) {
    IL_CHECK(static_cast<bool>(o.all_gather), who, ": no exchange (all_gather) to connect the ranks through");
    IL_CHECK(o.ibv.heap_address != 0 && o.ibv.heap_bytes > 0, who, ": the heap to register was not given");
  }
  if (kind_ == CrossNodeBackend::kSrd) {
    IL_CHECK(static_cast<bool>(o.flag_sink), who, ": SRD needs a flag sink (the receiver adds the flags)");
    IL_CHECK(o.srd_receive_slots > 0, who, ": srd_receive_slots must be positive");
  }
}

void CrossNodeProxy::make_backend(const Topology& t, CrossNodeOptions& o) {
  switch (kind_) {
    case CrossNodeBackend::kMemory:
      backend_ = std::make_unique<MemoryBackend>(t.rank, o.heaps, o.memory_max_in_flight, o.memory_order);
      return;
    case CrossNodeBackend::kLoopback:
      backend_ = std::make_unique<LoopbackBackend>(t.rank, o.heaps, o.heap_bytes, *o.engine, o.loopback);
      return;
    case CrossNodeBackend::kRc:
    case CrossNodeBackend::kSrd:
      break;
  }
  if (o.ibv.connect.empty()) {
    o.ibv.connect.assign(t.world_size, false);
    for (int r = 0; r < t.world_size; ++r) o.ibv.connect[r] = !on_this_node(t, r);
  }
  IL_CHECK(o.ibv.connect.size() == static_cast<size_t>(t.world_size), "rank ", t.rank,
           "'s cross-node proxy: ibv.connect names ", o.ibv.connect.size(), " ranks, the group has ", t.world_size);
  try {
    verbs_ = open_ibv_verbs(o.ibv, t.rank, t.world_size, o.all_gather);
  } catch (const Error& e) {
    throw Error(concat("rank ", t.rank, "'s cross-node proxy (", cross_node_backend_name(kind_),
                       ") could not connect to the other nodes: ", e.what()));
  }
  const IbvTransport wanted = kind_ == CrossNodeBackend::kSrd ? IbvTransport::kSrd : IbvTransport::kRc;
  if (verbs_->transport() != wanted) {
    const std::string what = kind_ == CrossNodeBackend::kSrd ? "an EFA device (SRD)" : "an InfiniBand or RoCE device (RC)";
    IL_FAIL("rank ", t.rank, "'s cross-node proxy (", cross_node_backend_name(kind_), ") needs ", what, ", but ",
            verbs_->device_name(), " is not one; choose the backend that matches the NIC");
  }
  if (kind_ == CrossNodeBackend::kRc) {
    backend_ = std::make_unique<RcBackend>(t.rank, *verbs_);
  } else {
    backend_ = std::make_unique<SrdBackend>(t.rank, *verbs_, o.flag_sink, o.srd_receive_slots);
  }
}

}  // namespace interlace
