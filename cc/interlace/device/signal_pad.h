// Layout of the flags that kernels exchange, shared by host and device code.
//
// Every rank's symmetric heap starts with one SignalPad, so a peer's flag lives at the same offset
// in the peer's heap. Flag values are per-block epochs that only grow: a wait is "flag >= epoch",
// which stays true when a peer has already moved on to its next launch.
#pragma once

#include <cstdint>

namespace interlace {

// Ranks that share an NVLink domain (a node, or an NVL72 rack). Flags are indexed by local rank.
constexpr int kMaxLocalRanks = 72;
// CTAs one op may use; flags are kept per CTA so that CTAs never wait on each other.
constexpr int kMaxBlocks = 1024;

enum class OpId : int32_t { kNone = 0, kAllGather = 1 };
enum class FlagId : int32_t { kNone = 0, kReady = 1, kDone = 2 };

struct AllGatherFlags {
  uint64_t ready[kMaxBlocks][kMaxLocalRanks];  // [b][q]: peer q's CTA b may write into this rank (launch epoch)
  uint64_t done[kMaxBlocks][kMaxLocalRanks];   // [b][q]: rounds of peer q's CTA b that have landed here
  uint64_t epoch[kMaxBlocks];                  // local: launches completed by CTA b
  uint64_t seq[kMaxBlocks];                    // local: rounds completed by CTA b, over all launches
};

struct SignalPad {
  uint32_t fault_claimed;  // local: the first CTA to time out claims the fault record
  uint32_t pad_[3];
  AllGatherFlags all_gather;
};

// What a kernel whose bounded wait expired saw. It lives in pinned host memory so the host can read
// it without any CUDA call; `code` is written last.
struct DeviceFault {
  int32_t code;  // 0: none; 1: timeout
  int32_t rank;  // global rank of the waiting process
  int32_t op;    // OpId
  int32_t flag;  // FlagId
  int32_t block;
  int32_t peer_local_rank;
  uint64_t expected;
  uint64_t seen;
  uint64_t waited_ns;
};

const char* op_name(OpId op);
const char* flag_name(FlagId flag);

}  // namespace interlace
