#include "interlace/runtime/group.h"

#include <unistd.h>

#include <cstdlib>

#include "interlace/base/cuda.h"
#include "interlace/runtime/launch_env.h"

namespace interlace {

Group::Group(GroupOptions options) : options_(std::move(options)) {
  int num_devices = require_gpus();
  options_.bootstrap = resolve_bootstrap_options(options_.bootstrap, [](const char* n) { return std::getenv(n); });
  IL_CHECK(options_.timeout_s > 0, "timeout_s must be positive, got ", options_.timeout_s);
  IL_CHECK(options_.heap_bytes > 0, "heap_bytes must be positive");
  bootstrap_ = std::make_unique<Bootstrap>(options_.bootstrap);

  if (options_.node_name.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    options_.node_name = host;
  }
  std::vector<std::string> names = bootstrap_->all_gather(options_.node_name);
  topo_ = make_topology(bootstrap_->rank(), names);

  device_ = options_.device;
  if (device_ < 0) {
    int launcher = launcher_local_rank([](const char* n) { return std::getenv(n); });
    device_ = launcher >= 0 ? launcher : topo_.local_rank;
  }
  IL_CHECK(device_ < num_devices, "rank ", topo_.rank, " wants GPU ", device_, " but this process sees ", num_devices,
           " GPU(s); pass device= or start one process per GPU");
  IL_CUDA_CHECK(cudaSetDevice(device_));
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));

  // Two processes on one GPU would make the heap's peer mappings alias; refuse it early.
  auto devices = bootstrap_->all_gather(options_.node_name + "/" + std::to_string(device_));
  for (int r = 0; r < topo_.world_size; ++r) {
    IL_CHECK(r == topo_.rank || devices[r] != devices[topo_.rank], "ranks ", r, " and ", topo_.rank,
             " both use GPU ", device_, " of node ", options_.node_name, "; use one process per GPU");
  }

  IL_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&fault_host_), sizeof(DeviceFault), cudaHostAllocMapped));
  *fault_host_ = DeviceFault{};
  IL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&fault_device_), fault_host_, 0));
  heap_ = std::make_unique<SymmetricHeap>(*bootstrap_, topo_, device_, options_.heap_bytes);
}

Group::~Group() {
  // Peers may still read our heap until they are done: meet them before unmapping. A peer that is
  // already gone must not turn this into a hang or an exception.
  try {
    if (broken_.empty()) bootstrap_->barrier();
  } catch (...) {
  }
  heap_.reset();
  if (fault_host_) cudaFreeHost(fault_host_);
}

void Group::check() {
  IL_CHECK(broken_.empty(), broken_);
  volatile DeviceFault* f = fault_host_;
  if (f->code == 0) return;
  const auto peer = f->peer_local_rank;
  const int peer_rank = peer >= 0 && peer < topo_.local_size() ? topo_.local_ranks[peer] : -1;
  broken_ = detail::concat(
      "rank ", f->rank, ": ", op_name(static_cast<OpId>(f->op)), " timed out after ", f->waited_ns / 1e9,
      " s waiting for flag '", flag_name(static_cast<FlagId>(f->flag)), "' of rank ", peer_rank, " (block ", f->block,
      "): expected >= ", f->expected, ", saw ", f->seen,
      ". That peer is dead, stuck, or not calling the same op. The group is unusable now: create a new one.");
  IL_FAIL(broken_);
}

void Group::require_same_across_ranks(const std::string& signature) {
  if (verified_.count(signature)) return;
  auto all = bootstrap_->all_gather(signature);
  for (int r = 0; r < topo_.world_size; ++r) {
    IL_CHECK(all[r] == signature, "arguments differ across ranks: rank ", topo_.rank, " called ", signature,
             " but rank ", r, " called ", all[r]);
  }
  verified_.insert(signature);
}

size_t Group::allocate(size_t bytes, const std::string& what) {
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

size_t Group::scratch(size_t bytes, const char* what) {
  if (bytes <= scratch_bytes_) return scratch_offset_;
  if (scratch_bytes_) heap_->allocator().free(scratch_offset_);
  scratch_bytes_ = 0;
  scratch_offset_ = heap_->allocator().allocate(bytes, what, /*from_top=*/true);
  scratch_bytes_ = bytes;
  return scratch_offset_;
}

}  // namespace interlace
