#include "interlace/device/signal_pad.h"

namespace interlace {

const char* op_name(OpId op) {
  switch (op) {
    case OpId::kAllGather: return "all_gather";
    case OpId::kAgGemm: return "ag_gemm";
    case OpId::kCancel: return "a cancelled call";
    default: return "unknown op";
  }
}

const char* flag_name(FlagId flag) {
  switch (flag) {
    case FlagId::kHello: return "hello";
    case FlagId::kDone: return "done";
    case FlagId::kGate: return "gate (CTA 0's abort check)";
    case FlagId::kChunk: return "chunk (a chunk of a peer's shard has landed)";
    default: return "unknown flag";
  }
}

}  // namespace interlace
