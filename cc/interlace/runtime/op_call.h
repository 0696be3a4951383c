// One call of a group op, from its argument checks to its launch. Every op follows the same steps:
//
//   OpCall call(group, OpId::kAllGather, stream);      // one call at a time; raises if aborted
//   const uint32_t signature = call.agree([&] {        // local checks; returns the call's signature
//     check_args(...);
//     return concat("all_gather(bytes=", n, ...);       // (scratch offsets included)
//   });
//   call.launch([&](cudaStream_t s) { kernel<<<grid, block, 0, s>>>(params_with(signature)); });
//
// The constructor numbers the call; agree() votes its signature through the watchdog: a signature seen before
// returns at once (the kernels' handshake still compares it), a new one waits for every rank's
// vote. If the checks raise on any rank, every rank raises, promptly, and each cancels the call on
// the device too (a tiny kernel that takes the call's place in the op sequence), so kernels that
// peers already queued skip it and the group stays usable.
// launch() runs the kernel after the group's previous op, whichever stream that went to (an
// internal event; in stream capture, external event nodes, so graph replays and eager calls chain
// alike): ops of one group never run at once, so they can share flags and scratch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "interlace/base/cuda.h"
#include "interlace/device/signal.cuh"
#include "interlace/device/signal_pad.h"
#include "interlace/device/transport.cuh"
#include "interlace/runtime/group.h"

namespace interlace {

class OpCall {
 public:
  OpCall(Group& group, OpId op, cudaStream_t stream);
  OpCall(const OpCall&) = delete;
  OpCall& operator=(const OpCall&) = delete;

  // Runs `checks` (which raise interlace::Error on bad arguments and otherwise return the
  // signature) and agrees on the result with every rank. Returns the signature's device hash.
  uint64_t agree(const std::function<std::string()>& checks);
  // Issues `kernel` on the call's stream, after the group's previous op.
  void launch(const std::function<void(cudaStream_t)>& kernel);
  // Whether the call's stream is being captured into a CUDA graph (known once agree's checks ran).
  bool capturing() const { return capturing_; }
  // What every op kernel is given to reach its node's peers and to wait on them: the local ranks'
  // heaps as mapped here, and this call's wait context (who waits, for the fault record).
  device::NvlinkTransport nvlink() const;
  device::WaitContext wait_context() const;

 private:
  void check_stream();  // the stream is usable and on the group's GPU
  void issue(const std::function<void(cudaStream_t)>& kernel);
  void cancel_on_device();

  std::unique_lock<std::recursive_mutex> lock_;
  DeviceGuard device_;
  Group& group_;
  OpId op_;
  cudaStream_t stream_;
  uint64_t call_;
  bool capturing_ = false;
};

// CTAs of `kernel` (blocks of `threads`, no dynamic shared memory) that fit on the group's GPU at
// once. Kernels whose CTAs wait on each other, or on peers' CTAs, never launch more: all must be
// resident. Depends only on the kernel and the device, so it is looked up once for each.
int resident_ctas(const Group& group, const void* kernel, int threads);

// Raises unless the group is one node: the ops address peers by local rank over NVLink; none uses the
// cross-node proxy yet. For OpCall::agree's checks.
void check_one_node(const Group& group, const char* op);

// The 24-bit hash of a signature that kernels compare (never kCancelSignature).
uint64_t signature_hash(const std::string& signature);

}  // namespace interlace
