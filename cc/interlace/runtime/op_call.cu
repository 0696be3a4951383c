#include "interlace/runtime/op_call.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "interlace/base/error.h"
#include "interlace/device/op_sequence.cuh"
#include "interlace/device/transport.cuh"
#include "interlace/runtime/kernels_across_nodes.h"

namespace interlace {
using detail::concat;
namespace {

// Takes a cancelled call's place in the op sequence: publishes "cancelled" and waits until every
// peer has reached this op (with its real kernel, which then skips it, or its own cancel).
__global__ void cancel_kernel(const __grid_constant__ device::NvlinkTransport t,
                              const __grid_constant__ device::WaitContext ctx) {
  if (device::op_begin(t, ctx, kCancelSignature) != device::kStop) device::op_end(t);
}

// Issued beside kernels across nodes when a call fails its checks.
[[maybe_unused]] const bool kCancelRegistered =
    register_kernels_across_nodes({reinterpret_cast<const void*>(cancel_kernel)});

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
  // Only an abort stops a call before it is numbered: anything else this rank has to report (an
  // earlier call its kernel skipped) waits until this call is issued, so that ranks keep numbering
  // their calls alike.
  group.check_aborted();
  call_ = ++group.calls_;
}

void OpCall::check_stream() {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream_, &capture);
  if (err != cudaSuccess) {
    cudaGetLastError();
    IL_FAIL(op_name(op_), ": the stream is not usable (", cudaGetErrorString(err), ")");
  }
  capturing_ = capture == cudaStreamCaptureStatusActive;
  // cudaStreamGetDevice is not permitted on a capturing stream (it would invalidate the capture):
  // there, a stream of another GPU fails at launch instead.
  if (capturing_) return;
  int device = -1;
  err = cudaStreamGetDevice(stream_, &device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    IL_FAIL(op_name(op_), ": the stream is not usable (", cudaGetErrorString(err), ")");
  }
  IL_CHECK(device == group_.device(), op_name(op_), ": the stream belongs to cuda:", device,
           " but the group's GPU is cuda:", group_.device());
}

uint64_t OpCall::agree(const std::function<std::string()>& checks) {
  Watchdog& watchdog = *group_.watchdog_;
  // Scratch grown by the checks counts only once every rank agreed: any way out of here before
  // that (a refusal here or elsewhere, an abort, an exception) rolls it back.
  struct ScratchVote {
    Group& group;
    bool agreed = false;
    ~ScratchVote() {
      try {
        if (agreed) {
          group.commit_scratch();
        } else {
          group.rollback_scratch();
        }
      } catch (const std::exception& e) {  // a heap this rank can no longer vouch for
        try {
          group.abort(concat("rank ", group.rank(), ": putting the op scratch back failed: ", e.what()));
        } catch (...) {
        }
      }
    }
  } scratch_vote{group_};
  std::string signature;
  std::string failure;
  try {
    check_stream();
    signature = checks();
  } catch (const Error& e) {
    failure = e.what();
  } catch (const std::exception& e) {
    failure = concat(op_name(op_), ": ", e.what());
  }
  if (!failure.empty()) {  // every rank must hear of it, whatever went wrong
    watchdog.vote(call_, failure, /*failed=*/true, /*wait=*/false);
    cancel_on_device();
    throw Error(failure);
  }
  // A known signature skips the wait: the kernels' handshake compares signatures and skips a call
  // some rank cancelled. That handshake spans one node, so a group of several nodes waits for every
  // call's vote: a call that differs, or was cancelled, on another node then raises here on every
  // rank, before any launch.
  const bool seen_before = group_.agreed_.touch(signature) && group_.topology().num_nodes == 1;
  const Verdict verdict = watchdog.vote(call_, signature, /*failed=*/false, /*wait=*/!seen_before);
  switch (verdict.kind) {
    case Verdict::kAgreed:
      scratch_vote.agreed = true;
      break;
    case Verdict::kCancelled:
      group_.take_cancel_reason(call_);  // reported here, not again by check()
      group_.cancels_reported_ = std::max(group_.cancels_reported_, call_);
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
  try {
    issue(kernel);
  } catch (const Error& e) {
    // Every rank has agreed on this call and may have queued its kernel: a rank that cannot launch
    // its own would leave them waiting, so the group aborts.
    group_.abort(concat("rank ", group_.rank(), " could not launch ", op_name(op_), ": ", e.what()));
    throw;
  }
  // Now that this call is issued (so every rank's numbering stays in step), report a call that this
  // rank's kernel skips, or skipped, because another rank's call of it failed.
  const std::string this_call = group_.take_cancel_reason(call_);
  IL_CHECK(this_call.empty(), "rank ", group_.rank(), ": ", op_name(op_), " was not run on any rank: ", this_call,
           ". The group is still usable.");
  uint64_t call = 0;
  const std::string earlier = group_.take_earliest_cancel_reason(&call);
  IL_CHECK(earlier.empty(), "rank ", group_.rank(), ": an earlier op call (#", call, ") was not run on any rank: ",
           earlier, ". (This call, ", op_name(op_), ", was issued normally.)");
}

void OpCall::issue(const std::function<void(cudaStream_t)>& kernel) {
  const bool capturing = capturing_;
  IL_CUDA_CHECK(cudaStreamWaitEvent(stream_, group_.last_op_, capturing ? cudaEventWaitExternal : cudaEventWaitDefault));
  kernel(stream_);
  IL_CUDA_CHECK(cudaGetLastError());
  IL_CUDA_CHECK(cudaEventRecordWithFlags(group_.last_op_, stream_,
                                         capturing ? cudaEventRecordExternal : cudaEventRecordDefault));
  group_.last_issued_.store(call_ << 8 | static_cast<uint64_t>(op_));
}

device::NvlinkTransport OpCall::nvlink() const {
  const Topology& topo = group_.topology();
  device::NvlinkTransport t{};
  for (int q = 0; q < topo.local_size(); ++q) t.heaps[q] = group_.heap().base(q);
  t.local_rank = topo.local_rank;
  t.local_size = topo.local_size();
  return t;
}

device::WaitContext OpCall::wait_context() const {
  const Topology& topo = group_.topology();
  return device::WaitContext{topo.rank, op_, group_.heap().pad(topo.local_rank), group_.device_control(),
                             group_.timeout_ns()};
}

void OpCall::cancel_on_device() {
  if (group_.topology().local_size() == 1) return;
  const device::NvlinkTransport t = nvlink();
  device::WaitContext ctx = wait_context();
  ctx.op = OpId::kCancel;
  try {
    try {
      issue([&](cudaStream_t s) { cancel_kernel<<<1, 128, 0, s>>>(t, ctx); });
    } catch (const Error&) {
      // The call's own stream may be what failed its checks: the group's chaining event orders the
      // cancel as well on this thread's stream of the group's GPU. (The failed call's error is not
      // sticky; cleared, it cannot fail the cancel's launch check.)
      cudaGetLastError();
      stream_ = cudaStreamPerThread;
      capturing_ = false;
      issue([&](cudaStream_t s) { cancel_kernel<<<1, 128, 0, s>>>(t, ctx); });
    }
  } catch (const Error& e) {
    // Peers' kernels wait for this rank's place in the op sequence: without it they never finish.
    group_.abort(concat("rank ", group_.rank(), " could not cancel ", op_name(op_), " on its GPU: ", e.what()));
  }
}

int resident_ctas(const Group& group, const void* kernel, int threads) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int> known;  // (kernel, device, threads)
  const auto key = std::make_tuple(kernel, group.device(), threads);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  int per_sm = 0;
  IL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return known[key] = per_sm * group.num_sms();
}

void check_one_node(const Group& group, const char* op) {
  const Topology& topo = group.topology();
  IL_CHECK(topo.num_nodes == 1, op, ": the group spans ", topo.num_nodes,
           " nodes; this op does not use the cross-node proxy yet");
  // Shares are owned by global rank and peers are addressed by local rank: the same on one node.
  IL_CHECK(topo.local_rank == topo.rank, op, ": local rank ", topo.local_rank, " is not global rank ", topo.rank);
}

}  // namespace interlace
