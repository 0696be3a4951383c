#include "interlace/runtime/group.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "interlace/base/cuda.h"
#include "interlace/runtime/cross_node_choice.h"
#include "interlace/runtime/kernels_across_nodes.h"
#include "interlace/runtime/launch_env.h"

namespace interlace {
using detail::concat;

namespace {

std::string this_hostname() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

Group::Group(GroupOptions options) : options_(std::move(options)) {
  check_cross_node_options(options_.cross_node, options_.loopback_rate_bytes_per_s);
  int num_devices = require_gpus();
  options_.bootstrap = resolve_bootstrap_options(options_.bootstrap, [](const char* n) { return std::getenv(n); });
  IL_CHECK(options_.timeout_s > 0, "timeout_s must be positive, got ", options_.timeout_s);
  IL_CHECK(options_.heap_bytes > 0, "heap_bytes must be positive");
  bootstrap_ = std::make_unique<Bootstrap>(options_.bootstrap);

  if (options_.node_name.empty()) options_.node_name = this_hostname();
  node_names_ = bootstrap_->all_gather(options_.node_name);
  topo_ = make_topology(bootstrap_->rank(), node_names_);
  // Several nodes: which backend, and so which heaps to map. Every rank knows num_nodes alike, so
  // the extra exchange is made by all or none; one node changes nothing.
  std::vector<std::string> hostnames;
  CrossNodeBackend backend = CrossNodeBackend::kLoopback;
  std::vector<int> mapped_ranks;
  if (topo_.num_nodes > 1) {
    hostnames = bootstrap_->all_gather(this_hostname());
    backend = choose_cross_node_backend(parse_cross_node_choice(options_.cross_node), node_names_, hostnames);
    mapped_ranks = heap_peers(topo_.rank, node_names_, hostnames, backend == CrossNodeBackend::kLoopback);
  }

  device_ = options_.device;
  if (device_ < 0) {
    int launcher = launcher_local_rank([](const char* n) { return std::getenv(n); });
    device_ = launcher >= 0 ? launcher : topo_.local_rank;
  }
  IL_CHECK(device_ < num_devices, "rank ", topo_.rank, " wants GPU ", device_, " but this process sees ", num_devices,
           " GPU(s); pass device= or start one process per GPU");
  DeviceGuard guard(device_);
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));

  // Two processes on one GPU would make the heap's peer mappings alias; refuse it early.
  auto devices = bootstrap_->all_gather(options_.node_name + "/" + std::to_string(device_));
  for (int r = 0; r < topo_.world_size; ++r) {
    IL_CHECK(r == topo_.rank || devices[r] != devices[topo_.rank], "ranks ", r, " and ", topo_.rank,
             " both use GPU ", device_, " of node ", options_.node_name, "; use one process per GPU");
  }
  if (!hostnames.empty()) {
    // Emulated nodes of one host: their GPUs are the host's, so the check above by node misses them.
    auto gpus = bootstrap_->all_gather(hostnames[topo_.rank] + "/" + std::to_string(device_));
    for (int r = 0; r < topo_.world_size; ++r) {
      IL_CHECK(r == topo_.rank || gpus[r] != gpus[topo_.rank], "ranks ", r, " and ", topo_.rank, " both use GPU ",
               device_, " of host ", hostnames[topo_.rank], " (as nodes ", node_names_[r], " and ",
               options_.node_name, "); give each rank its own GPU (device=)");
    }
  }

  IL_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&control_host_), sizeof(HostControl), cudaHostAllocMapped));
  *control_host_ = HostControl{};
  IL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&control_device_), control_host_, 0));
  IL_CUDA_CHECK(cudaEventCreateWithFlags(&last_op_, cudaEventDisableTiming));
  watchdog_ = std::make_unique<Watchdog>(*bootstrap_, &control_host_->abort, [this] { return describe_abort(); },
                                         options_.heartbeat_timeout_s, options_.timeout_s);
  const bool rdma = backend == CrossNodeBackend::kRc || backend == CrossNodeBackend::kSrd;
  heap_ = std::make_unique<SymmetricHeap>(*bootstrap_, topo_, device_, options_.heap_bytes, mapped_ranks, rdma);
  if (topo_.num_nodes > 1) {
    CrossNodePathOptions c;
    c.backend = backend;
    c.loopback_rate_bytes_per_s = options_.loopback_rate_bytes_per_s;
    c.timeout_ns = timeout_ns();
    c.on_failure = [this](const std::string& why) {
      abort(concat("rank ", topo_.rank, "'s cross-node proxy failed: ", why));
    };
    cross_node_ = std::make_unique<CrossNodePath>(topo_, *bootstrap_, *heap_, device_, control_device_, std::move(c));
    load_kernels_across_nodes();
  }
}

std::string Group::cross_node_backend() const {
  return cross_node_ ? cross_node_backend_name(cross_node_->backend()) : "";
}

device::ProxyTransport Group::proxy_transport() const {
  IL_CHECK(cross_node_ != nullptr, "rank ", topo_.rank, ": the group has one node, so every rank is reached over ",
           "NVLink and there is no proxy transport");
  return cross_node_->transport();
}

void Group::post_from_host(const ProxyRequest& request) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  check_aborted();
  IL_CHECK(cross_node_ != nullptr, "rank ", topo_.rank, ": the group has one node: there is no proxy to post to");
  DeviceGuard guard(device_);
  IL_CUDA_CHECK(cudaEventSynchronize(last_op_));
  const PostResult r = cross_node_->post_from_host(request, &control_host_->abort);
  check_aborted();
  IL_CHECK(r == PostResult::kPosted, "rank ", topo_.rank, ": the proxy FIFO had no room within timeout_s (",
           options_.timeout_s, " s): the proxy is stuck");
}

Group::~Group() {
  // Peers may still read our heap until they are done: meet them before unmapping. A peer that is
  // already gone must not turn this into a hang or an exception.
  auto aborted = [this] { return control_host_ && control_host_->abort; };
  bool peers_gone = aborted();
  try {
    if (!peers_gone) {
      bootstrap_->barrier();
      if (watchdog_) watchdog_->leaving_cleanly();  // else peers must take this rank's exit for a death
    }
  } catch (...) {
    peers_gone = true;  // a peer that died before the barrier, before the watchdog said so
  }
  if (cross_node_) {
    // This GPU's kernels may have posted requests peers still wait for: let them finish and the
    // proxy take them all before it stops (bounded). After an abort (seen now, or during the drain),
    // or a peer gone at the barrier, nobody waits for them, and the proxy must not sit out its bound
    // for writes to a dead peer.
    peers_gone = peers_gone || aborted();
    if (!peers_gone) {
      try {
        DeviceGuard guard(device_);
        if (cudaDeviceSynchronize() == cudaSuccess) cross_node_->drain(options_.timeout_s);
      } catch (...) {
      }
      peers_gone = aborted();
    }
    if (peers_gone) cross_node_->abandon_writes();
    cross_node_.reset();
  }
  // The heap's teardown waits for this GPU's kernels; the watchdog stays until then, so that a
  // kernel waiting on a dead peer is stopped rather than left to its timeout.
  heap_.reset();
  watchdog_.reset();
  for (auto& [user, side] : side_streams_) {
    cudaStreamDestroy(side.stream);
    cudaEventDestroy(side.fork);
    cudaEventDestroy(side.join);
  }
  if (last_op_) cudaEventDestroy(last_op_);
  if (control_host_) cudaFreeHost(control_host_);
}

const Group::SideStream& Group::side_stream(cudaStream_t user) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = side_streams_.find(user);
  if (it != side_streams_.end()) return it->second;
  SideStream side;
  IL_CUDA_CHECK(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking));
  IL_CUDA_CHECK(cudaEventCreateWithFlags(&side.fork, cudaEventDisableTiming));
  IL_CUDA_CHECK(cudaEventCreateWithFlags(&side.join, cudaEventDisableTiming));
  return side_streams_.emplace(user, side).first->second;
}

std::string Group::describe_abort() {
  const volatile DeviceFault& f = control_host_->fault;
  std::string device;
  if (f.code != 0) {
    const int peer_rank = fault_peer_rank(f.peer, topo_);
    const auto code = static_cast<FaultCode>(f.code);
    const std::string whose = peer_rank >= 0 ? concat("' of rank ", peer_rank) : std::string("' of this rank");
    const std::string where = concat(op_name(static_cast<OpId>(f.op)), " on rank ", f.rank, " (block ", f.block,
                                     ") waited for flag '", flag_name(static_cast<FlagId>(f.flag)), whose);
    if (code == FaultCode::kTimeout) {
      device = concat(where, " and timed out after ", f.waited_ns / 1e9, " s: expected >= ", f.expected, ", saw ",
                      f.seen, ". That peer is stuck, or not calling the same op");
      // The loopback and SRD proxies make CUDA calls, which a lazy kernel load beside the op holds up.
      if (cross_node_ && cross_node_->backend() != CrossNodeBackend::kRc) {
        device += " (or its proxy waits behind a kernel CUDA is loading lazily: if this program starts kernels "
                  "beside ops across nodes, run it with CUDA_MODULE_LOADING=EAGER)";
      }
    } else if (code == FaultCode::kMismatch) {
      device = concat(where, " and found another op or other arguments there (op #", f.expected >> kSignatureBits,
                      ": signature ", f.expected & kSignatureMask, " here, ", f.seen & kSignatureMask,
                      " there): ranks must call the same ops, in the same order, with the same arguments");
    } else if (code == FaultCode::kProxyPost) {
      device = concat(op_name(static_cast<OpId>(f.op)), " on rank ", f.rank, " (block ", f.block,
                      ") could not post a write raising flag '", flag_name(static_cast<FlagId>(f.flag)), "' on rank ",
                      peer_rank, " to its proxy: ",
                      f.seen == static_cast<uint64_t>(device::ProxySend::kTimedOut)
                          ? concat("the FIFO had no room for ", f.waited_ns / 1e9, " s (the proxy thread is stuck)")
                          : concat("the request was refused (code ", f.seen, ": outside the heap or unpaired; a bug)"));
    } else {
      device = concat(where, " when the group was aborted");
    }
  }
  const std::string host = watchdog_ ? watchdog_->abort_reason() : std::string();
  if (host.empty()) return device.empty() ? "aborted" : device;
  if (!device.empty()) return host.find(device) != std::string::npos ? host : concat(host, "; ", device);
  // No kernel of this rank has stopped at a flag (yet): name the op call that was last issued.
  const uint64_t last = last_issued_.load();
  if (last == 0) return host;
  return concat(host, "; the last op call this rank issued was ", op_name(static_cast<OpId>(last & 0xff)), " (call #",
                last >> 8, "), whose kernels stop without storing into peers");
}

void Group::check_aborted() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  IL_CHECK(broken_.empty(), broken_);
  if (control_host_->abort) {
    broken_ = concat("rank ", topo_.rank, ": the group is aborted: ", describe_abort(),
                     ". It stays unusable: every later call raises; create a new group.");
    IL_FAIL(broken_);
  }
}

void Group::check() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  check_aborted();
  // A call that another rank's failed checks cancelled: this rank's kernel skipped it. Every rank
  // hears of each cancel from rank 0; the kernel's word may come first, so give rank 0's a moment.
  volatile HostControl* c = control_host_;
  uint64_t call = 0;
  std::string why = take_earliest_cancel_reason(&call);
  for (int i = 0; i < 200 && why.empty() && c->cancelled > cancels_reported_; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    why = take_earliest_cancel_reason(&call);
  }
  IL_CHECK(why.empty(), "rank ", topo_.rank, ": an op call (#", call, ") was not run on any rank: ", why,
           ". The group is still usable.");
  // A dispatch that dropped slots: its kernel wrote the dropped count before the call number,
  // so a new number comes with its own count.
  const uint64_t overflowed = c->overflowed;
  if (overflowed > overflows_reported_) {
    overflows_reported_ = overflowed;
    IL_FAIL("rank ", topo_.rank, ": moe_dispatch or moe_dispatch_gemm (op call #", overflowed,
            ") overflowed its capacity: ",
            c->overflow_dropped, " (token, expert) slots were dropped over all ranks (the last sources' last tokens "
            "of each full expert); they add nothing to moe_combine's sums. Raise the capacity (moe_no_drop_capacity "
            "never drops). The group is still usable.");
  }
}

std::string Group::take_cancel_reason(uint64_t call) {
  std::string why = watchdog_->take_cancel_reason(call);
  if (!why.empty()) cancels_reported_ = std::max(cancels_reported_, call);
  return why;
}

std::string Group::take_earliest_cancel_reason(uint64_t* call) {
  std::string why = watchdog_->take_earliest_cancel_reason(calls_, call);
  if (!why.empty()) cancels_reported_ = std::max(cancels_reported_, *call);
  return why;
}

void Group::abort(const std::string& why) {
  watchdog_->abort(why.empty() ? concat("group.abort() was called on rank ", topo_.rank) : why);
}

size_t Group::allocate(size_t bytes, const std::string& what) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  size_t offset = heap_->allocator().allocate(bytes, what.c_str());
  auto all = bootstrap_->all_gather(std::to_string(offset) + ":" + std::to_string(bytes));
  for (int r = 0; r < topo_.world_size; ++r) {
    if (all[r] != all[topo_.rank]) {
      heap_->allocator().free(offset);
      IL_FAIL("symmetric allocations differ across ranks: rank ", topo_.rank, " got offset:bytes ", all[topo_.rank],
              ", rank ", r, " got ", all[r], "; every rank must allocate and free the same tensors in the same order");
    }
  }
  return offset;
}

void Group::free(size_t offset) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  heap_->allocator().free(offset);
}

size_t Group::scratch(size_t bytes, const char* what, bool capturing) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (bytes > scratch_.bytes) {
    if (!scratch_grown_) {
      scratch_before_ = scratch_;
      scratch_grown_ = true;
      if (scratch_.bytes && !scratch_.captured) heap_->allocator().free(scratch_.offset);
    } else if (scratch_.bytes) {
      heap_->allocator().free(scratch_.offset);  // grown twice in one call: the first never ran
    }
    scratch_ = ScratchBlock{};  // should the allocation raise, the rollback finds no new block
    scratch_ = ScratchBlock{heap_->allocator().allocate(bytes, what, /*from_top=*/true), bytes, false};
  }
  scratch_.captured = scratch_.captured || capturing;
  return scratch_.offset;
}

void Group::commit_scratch() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  scratch_grown_ = false;
}

// The old block goes back at its own offset, as on the ranks that never grew: its bytes are free
// (nothing else allocates in between: the call holds the group's lock).
void Group::rollback_scratch() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!scratch_grown_) return;
  scratch_grown_ = false;
  if (scratch_.bytes) heap_->allocator().free(scratch_.offset);
  scratch_ = scratch_before_;
  if (scratch_.bytes && !scratch_.captured) heap_->allocator().allocate_at(scratch_.offset, scratch_.bytes);
}

}  // namespace interlace
