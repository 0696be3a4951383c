// A Group is the job's processes (one per GPU) with their bootstrap, topology, symmetric heap and
// the fault record that device waits write to. Ops take a Group.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "interlace/device/signal_pad.h"
#include "interlace/runtime/bootstrap.h"
#include "interlace/runtime/symmetric_heap.h"
#include "interlace/runtime/topology.h"

namespace interlace {

struct GroupOptions {
  BootstrapOptions bootstrap;
  int device = -1;                     // CUDA device; default: the launcher's local rank, else the node-local index
  size_t heap_bytes = size_t{1} << 30;
  double timeout_s = 10.0;             // how long a device wait may last before the op fails
  std::string node_name;               // ranks with the same name share NVLink; default: the hostname
};

class Group {
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
  DeviceFault* device_fault() const { return fault_device_; }

  // Raises if a kernel of this group has timed out (naming rank, op, flag, expected, seen), or if one
  // did earlier. Ops call it before launching; callers call it after synchronizing.
  void check();

  // Raises unless every rank passes the same `signature` (op name and arguments). Each signature is
  // exchanged once, on its first use; later calls are a lookup.
  void require_same_across_ranks(const std::string& signature);

  // A symmetric allocation for the caller; the offset is checked equal on every rank.
  size_t allocate(size_t bytes, const std::string& what);
  void free(size_t offset) { heap_->allocator().free(offset); }

  // Symmetric scratch of at least `bytes` that ops may use for staging; grown on demand. `what`
  // completes the error when the heap is too small. Growing frees the old block at once, on the
  // host: ops still in flight may use it, so only stream-ordered work may touch memory allocated
  // from the heap right after a growth (the usual case; a host write there could race).
  size_t scratch(size_t bytes, const char* what);

 private:
  GroupOptions options_;
  std::unique_ptr<Bootstrap> bootstrap_;
  Topology topo_;
  int device_ = -1;
  int num_sms_ = 0;
  std::unique_ptr<SymmetricHeap> heap_;
  DeviceFault* fault_host_ = nullptr;
  DeviceFault* fault_device_ = nullptr;
  std::string broken_;  // set once a fault was reported: the flags are out of step after it
  std::set<std::string> verified_;
  size_t scratch_offset_ = 0;
  size_t scratch_bytes_ = 0;
};

}  // namespace interlace
