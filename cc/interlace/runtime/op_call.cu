#include "interlace/runtime/op_call.h"

#include "interlace/base/error.h"
#include "interlace/device/op_sequence.cuh"
#include "interlace/device/transport.cuh"

namespace interlace {
using detail::concat;
namespace {

// Takes a cancelled call's place in the op sequence: publishes "cancelled" and waits until every
// peer has reached this op (with its real kernel, which then skips it, or its own cancel).
__global__ void cancel_kernel(const __grid_constant__ device::NvlinkTransport t,
                              const __grid_constant__ device::WaitContext ctx) {
  const device::OpEntry entry = device::op_begin(t, ctx, kCancelSignature);
  if (entry.start != device::kStop) device::op_end(t);
}

}  // namespace

uint64_t signature_hash(const std::string& signature) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : signature) {
    h ^= c;
    h *= 1099511628211ull;
  }
  uint64_t folded = (h ^ (h >> kSignatureBits) ^ (h >> (2 * kSignatureBits))) & kSignatureMask;
  return folded == kCancelSignature ? folded - 1 : folded;
}

OpCall::OpCall(Group& group, OpId op, cudaStream_t stream)
    : lock_(group.mutex_), device_(group.device()), group_(group), op_(op), stream_(stream) {
  group.check();
  call_ = ++group.calls_;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  // A bad stream must fail the call's checks on every rank, not here, before the vote.
  if (cudaStreamIsCapturing(stream_, &capture) != cudaSuccess) cudaGetLastError();
  capturing_ = capture == cudaStreamCaptureStatusActive;
}

uint64_t OpCall::agree(const std::function<std::string()>& checks) {
  Watchdog& watchdog = *group_.watchdog_;
  std::string signature;
  try {
    signature = checks();
  } catch (const Error& e) {
    watchdog.vote(call_, e.what(), /*failed=*/true, /*wait=*/false);
    cancel_on_device();
    throw;
  }
  const bool seen_before = group_.agreed_.touch(signature);
  const Verdict verdict = watchdog.vote(call_, signature, /*failed=*/false, /*wait=*/!seen_before);
  switch (verdict.kind) {
    case Verdict::kAgreed:
      break;
    case Verdict::kCancelled:
      watchdog.take_cancel_reason();  // reported here, not again by check()
      cancel_on_device();
      IL_FAIL("rank ", group_.rank(), ": ", op_name(op_), " was not run: ", verdict.text);
    default:
      group_.check();  // raises, naming what aborted the group
      IL_FAIL("rank ", group_.rank(), ": ", op_name(op_), ": ", verdict.text);
  }
  if (!seen_before) group_.agreed_.add(signature);
  return signature_hash(signature);
}

void OpCall::launch(const std::function<void(cudaStream_t)>& kernel) {
  const bool capturing = capturing_;
  IL_CUDA_CHECK(cudaStreamWaitEvent(stream_, group_.last_op_, capturing ? cudaEventWaitExternal : cudaEventWaitDefault));
  kernel(stream_);
  IL_CUDA_CHECK(cudaGetLastError());
  IL_CUDA_CHECK(cudaEventRecordWithFlags(group_.last_op_, stream_,
                                         capturing ? cudaEventRecordExternal : cudaEventRecordDefault));
}

void OpCall::cancel_on_device() {
  if (group_.topology().local_size() == 1) return;
  device::NvlinkTransport t{};
  const Topology& topo = group_.topology();
  for (int q = 0; q < topo.local_size(); ++q) t.heaps[q] = group_.heap().base(q);
  t.local_rank = topo.local_rank;
  t.local_size = topo.local_size();
  device::WaitContext ctx{group_.rank(), OpId::kCancel, group_.heap().pad(topo.local_rank), group_.device_control(),
                          group_.timeout_ns()};
  try {
    launch([&](cudaStream_t s) { cancel_kernel<<<1, 128, 0, s>>>(t, ctx); });
  } catch (const Error&) {
    // The call's own error is the one to report; an unusable stream leaves peers to their timeout.
  }
}

}  // namespace interlace
