// What kernels and the host share: the signal pad at the start of every rank's heap, and the host
// control block in pinned, mapped host memory.
//
// A peer's flag lives at the same offset in the peer's heap. The pad holds the group's op handshake
// (OpSignals) and hands each op a region for its own flags; an op's flag layout lives with the op
// (ops/<op>/flags.h). Flag values only grow, so a wait is "flag >= value", which stays true when a
// peer has already moved on to its next launch, and a captured CUDA graph replays correctly.
#pragma once

#include <cstdint>

#include "interlace/base/host_device.h"

namespace interlace {

// Ranks that share an NVLink domain (a node, or an NVL72 rack). Flags are indexed by local rank.
constexpr int kMaxLocalRanks = 72;
// CTAs one op may use (all_gather keeps its flags per CTA, so that its CTAs never wait on each other).
constexpr int kMaxBlocks = 1024;

// Ops with flags come first, one region of the signal pad each (kNumOpRegions).
enum class OpId : int32_t {
  kNone = 0,
  kAllGather = 1,
  kAgGemm = 2,
  kReduceScatter = 3,
  kAllReduce = 4,
  kGemmRs = 5,
  kGemmAr = 6,
  kMoeDispatch = 7,
  kMoeCombine = 8,
  kRingAttention = 9,
  kCancel = 10,  // no flags: after the ops with regions
};
enum class FlagId : int32_t {
  kNone = 0,
  kHello = 1,
  kDone = 2,
  kGate = 3,
  kChunk = 4,
  kPartial = 5,
  kReduced = 6,
  kCounts = 7,    // moe_dispatch: a source's row of expert counts
  kArrived = 8,   // moe_dispatch: a source's rows for a local expert
  kCombined = 9,  // moe_combine: an expert's outputs for this rank's tokens
  kBarrier = 10,  // moe: a CTA of this rank has finished a phase
  kLanded = 11,   // ring_attention: a piece of a K/V block from rank - 1
  kReady = 12,    // all_gather across nodes: a network receiver has started the launch
  kNetChunk = 13, // all_gather across nodes: a chunk of a shard from another node, in a relay slot
  kDrained = 14,  // across nodes: a receiver holds this rank's data, so its network reads are done
  kFilled = 15,   // moe_dispatch_gemm: a source's rows for a local expert landed, its secondaries filled
};

// The handshake every op kernel makes on entry (device/op_sequence.cuh). Ops of a group run one
// after another on each rank (Group chains them), so a device counter numbers them; a kernel for op
// number s publishes (s << kSignatureBits | signature) to every peer and waits for theirs, so ranks
// that run different ops or arguments stop before moving any data.
constexpr int kSignatureBits = 24;
constexpr uint64_t kSignatureMask = (uint64_t{1} << kSignatureBits) - 1;
constexpr uint64_t kCancelSignature = kSignatureMask;  // "my call of this op failed its checks"

struct OpSignals {
  // [s % 2][q]: what rank q published for its op number s. Two slots: a peer can be at most one op
  // ahead (it cannot finish op s + 1 without this rank's hello for it), so it never overwrites a
  // hello this rank has yet to read.
  uint64_t hello[2][kMaxLocalRanks];
  uint64_t completed;      // local: ops this rank's kernels have finished
  // local: (op number << 1 | aborted), from CTA 0's one read of the host's abort word for that op.
  // Other CTAs wait for it instead of each reading host memory: hundreds of reads of one host
  // address at a kernel's start queue behind each other on PCIe (milliseconds, measured).
  uint64_t gate;
  uint32_t exited;         // local: CTAs of the running op that have finished it
  uint32_t fault_claimed;  // local: the first CTA to fail claims the fault record
  uint32_t aborted;        // local, sticky: a copy of the host's abort word, once any CTA has seen it
};

constexpr uint64_t kOpRegionBytes = uint64_t{1} << 20;
// One region per op kind with flags: OpIds 1 .. kNumOpRegions (kAllGather, kAgGemm, kReduceScatter,
// kAllReduce, kGemmRs, kGemmAr, kMoeDispatch, kMoeCombine, kRingAttention). Grows with the ops.
constexpr int kNumOpRegions = 9;
static_assert(static_cast<int>(OpId::kCancel) == kNumOpRegions + 1, "every op before kCancel has a region");

struct SignalPad {
  OpSignals ops;
  alignas(256) unsigned char regions[kNumOpRegions][kOpRegionBytes];
};

// The flags of op kOp in a pad; both the op's region and the flags' size are checked here.
template <class Flags, OpId kOp>
IL_HOST_DEVICE inline Flags* op_flags(SignalPad* pad) {
  static_assert(static_cast<int>(kOp) >= 1 && static_cast<int>(kOp) <= kNumOpRegions,
                "this op has no region in the signal pad: grow kNumOpRegions");
  static_assert(sizeof(Flags) <= kOpRegionBytes, "an op's flags must fit its region of the signal pad");
  return reinterpret_cast<Flags*>(pad->regions[static_cast<int>(kOp) - 1]);
}

// kProxyPost: a kernel could not post a request to the proxy FIFO; DeviceFault::seen holds the
// device::ProxySend result (no credit within the timeout, or a request outside the heap).
enum class FaultCode : int32_t { kNone = 0, kTimeout = 1, kAborted = 2, kMismatch = 3, kProxyPost = 4 };

// A wait's peer argument at or above this names a global rank (peer - kFaultPeerGlobal): a rank of
// another node, which has no local rank; below, a local rank (NVLink peers).
constexpr int32_t kFaultPeerGlobal = 1 << 24;

// What a kernel that stopped early saw, written before `code`.
struct DeviceFault {
  int32_t code;  // FaultCode
  int32_t rank;  // global rank of the waiting process
  int32_t op;    // OpId
  int32_t flag;  // FlagId
  int32_t block;
  int32_t peer;  // whose flag: a local rank, or kFaultPeerGlobal + a global rank (waits across nodes); -1: none
  uint64_t expected;
  uint64_t seen;
  uint64_t waited_ns;
};

// In pinned host memory mapped into the device: the host's way to stop kernels that are running or
// queued (a CUDA graph included), and the kernels' way to report why they stopped.
struct HostControl {
  int32_t abort;       // sticky: nonzero once the group is aborted; kernels check it on entry and in every wait
  // The number of the last op a kernel skipped because a peer's call of it failed its checks; op
  // numbers are call numbers, since every call, a failed one too, takes its place in the op sequence.
  uint64_t cancelled;
  DeviceFault fault;   // the first fault of this group
  // moe_dispatch: the number of the last op call that dropped slots (a capacity too small), and how
  // many slots every rank together dropped in it (each rank computes the same total from the
  // exchanged counts). Not a fault: nothing was written out of bounds and the group stays usable;
  // Group::check() raises on it once.
  uint64_t overflowed;
  int64_t overflow_dropped;
};

const char* op_name(OpId op);
const char* flag_name(FlagId flag);

}  // namespace interlace
