// A Group is the job's processes (one per GPU) with their bootstrap, topology, symmetric heap,
// watchdog and the host control block that kernels read and write. Ops take a Group.
//
// Faults: a dead rank, a device wait that times out, ranks that call different ops, or
// group.abort() abort the group on every rank. Aborted is sticky: running and queued kernels (a
// CUDA graph included) stop without storing into peers, and every later call raises.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "interlace/device/proxy_transport.h"
#include "interlace/device/signal_pad.h"
#include "interlace/runtime/bootstrap.h"
#include "interlace/runtime/cross_node_path.h"
#include "interlace/runtime/signature_cache.h"
#include "interlace/runtime/symmetric_heap.h"
#include "interlace/runtime/topology.h"
#include "interlace/runtime/watchdog.h"

namespace interlace {

struct GroupOptions {
  BootstrapOptions bootstrap;
  int device = -1;                     // CUDA device; default: the launcher's local rank, else the node-local index
  size_t heap_bytes = size_t{1} << 30;
  // A device wait this long, or a new call some rank has not made for this long, means a peer is
  // stuck rather than slow. Dead peers are caught sooner, by the watchdog; this is the last resort.
  double timeout_s = 300.0;
  // A rank from which nothing (not even the watchdog's heartbeat, sent every second) arrives for
  // this long is taken for dead. Process deaths are seen at once, through the closed connection.
  double heartbeat_timeout_s = 30.0;
  std::string node_name;               // ranks with the same name share NVLink; default: the hostname
  // Groups of several nodes only: how writes reach ranks on other nodes (cross_node_choice.h).
  // "auto": loopback when every rank runs on one host (node names then only split it into emulated
  // nodes), else ibverbs RC; or "loopback", "rc", "srd".
  std::string cross_node = "auto";
  double loopback_rate_bytes_per_s = 0;  // throttles loopback like a NIC (50e9 ~ 400 Gb/s); 0: unthrottled
};

// Shared ownership: Python holds a Group through std::shared_ptr (make_shared in the binding), and
// enable_shared_from_this lets nanobind hand C++ that same owner when Python passes the group back,
// so a std::weak_ptr taken then (the XLA FFI registry) lives as long as the Python object does.
class Group : public std::enable_shared_from_this<Group> {
 public:
  explicit Group(GroupOptions options);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const Topology& topology() const { return topo_; }
  int rank() const { return topo_.rank; }
  int world_size() const { return topo_.world_size; }
  int device() const { return device_; }
  int num_sms() const { return num_sms_; }
  uint64_t timeout_ns() const { return static_cast<uint64_t>(options_.timeout_s * 1e9); }
  Bootstrap& bootstrap() { return *bootstrap_; }
  SymmetricHeap& heap() { return *heap_; }
  HostControl* device_control() const { return control_device_; }
  // Every rank's node name, by rank (what the Topology was built from).
  const std::vector<std::string>& node_names() const { return node_names_; }
  // The backend that carries writes to other nodes: "loopback", "ibverbs" or "efa"; "" with one node.
  std::string cross_node_backend() const;
  // What this rank's kernels post through to ranks on other nodes: this GPU's FIFO, its heap, the
  // timeout and the abort words. A value to copy into kernel parameters beside the NvlinkTransport
  // (see DESIGN.md, "Across nodes"). Raises when the group has one node (no proxy exists).
  device::ProxyTransport proxy_transport() const;
  // Posts one request to this GPU's FIFO from the host, after the group's queued ops have finished
  // (the FIFO's ticket counter is the kernels'). For tests and tools; raises if not posted.
  void post_from_host(const ProxyRequest& request);

  // Raises if the group is aborted (naming the rank, the op and the flag where a kernel stopped, or
  // the rank that died), or if a kernel skipped an op call because a peer's call of it failed its
  // argument checks, or if a moe_dispatch dropped slots for want of capacity (each reported once;
  // the group stays usable). Ops call it first; callers call it
  // after synchronizing.
  void check();
  // Raises only if the group is aborted.
  void check_aborted();
  // Aborts the group on every rank, like ncclCommAbort: kernels stop, later calls raise.
  void abort(const std::string& why = "");

  // A symmetric allocation for the caller; the offset is checked equal on every rank.
  size_t allocate(size_t bytes, const std::string& what);
  void free(size_t offset);

  // Symmetric scratch of at least `bytes` for ops' staging, grown on demand; an op's scratch offset
  // is part of its signature, so ranks agree on it. A block that a captured CUDA graph may use
  // (capturing: the calling op is being captured) is never moved or freed while the group lives.
  // One no graph uses is freed when outgrown: the group's ops run in order, so later ops are done
  // with it first; only memory the caller allocates from the heap right after a growth may still be
  // in use by an op in flight, so only stream-ordered work should touch it.
  // A growth takes effect once every rank has agreed on the call (OpCall::agree commits it); a call
  // that any rank's checks refused rolls it back, so that the ranks' heaps stay alike.
  size_t scratch(size_t bytes, const char* what, bool capturing);

  // A stream beside `user` for an op's copy-engine work, with events to fork it from `user` and
  // join it back: created on first use per user stream (a capture on one user stream then never
  // takes in another's), kept for the group's life. Call under an OpCall.
  struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr;
    cudaEvent_t join = nullptr;
  };
  const SideStream& side_stream(cudaStream_t user);

 private:
  friend class OpCall;
  std::string describe_abort();
  // Why a peer's failed checks cancelled call `call` ("" if they did not), once.
  std::string take_cancel_reason(uint64_t call);
  // The same for the earliest cancelled call this rank has made, whose number goes to *call.
  std::string take_earliest_cancel_reason(uint64_t* call);

  GroupOptions options_;
  std::unique_ptr<Bootstrap> bootstrap_;
  Topology topo_;
  int device_ = -1;
  int num_sms_ = 0;
  std::vector<std::string> node_names_;
  std::unique_ptr<SymmetricHeap> heap_;
  std::unique_ptr<CrossNodePath> cross_node_;  // only with several nodes; destroyed before the heap
  HostControl* control_host_ = nullptr;
  HostControl* control_device_ = nullptr;
  std::unique_ptr<Watchdog> watchdog_;
  std::string broken_;  // set once an abort was reported: the group stays unusable

  // Ops are issued one at a time (the binding releases the GIL, so calls may come from many
  // threads) and run one after another on the device: each waits for the previous op's event.
  std::recursive_mutex mutex_;
  cudaEvent_t last_op_ = nullptr;
  uint64_t calls_ = 0;  // op calls so far, failed ones included: ranks number them alike
  uint64_t cancels_reported_ = 0;  // the last call whose cancel was reported
  uint64_t overflows_reported_ = 0;  // the last moe_dispatch call whose dropped slots were reported
  // The last op call issued, so that an abort names the op that was in flight. Atomic: the
  // watchdog's thread describes aborts too.
  std::atomic<uint64_t> last_issued_{0};  // call number << 8 | OpId
  SignatureCache agreed_{1024};  // signatures every rank has agreed on

  struct ScratchBlock {
    size_t offset = 0;
    size_t bytes = 0;
    bool captured = false;
  };
  ScratchBlock scratch_;
  // The block scratch_ replaced in the call being agreed (freed at the growth unless a graph holds
  // it), put back on rollback.
  bool scratch_grown_ = false;
  ScratchBlock scratch_before_;
  void commit_scratch();
  void rollback_scratch();
  std::unordered_map<cudaStream_t, SideStream> side_streams_;
};

}  // namespace interlace
