#include "interlace/device/signal_pad.h"

namespace interlace {

const char* op_name(OpId op) {
  switch (op) {
    case OpId::kAllGather: return "all_gather";
    case OpId::kAgGemm: return "ag_gemm";
    case OpId::kReduceScatter: return "reduce_scatter";
    case OpId::kAllReduce: return "all_reduce";
    case OpId::kGemmRs: return "gemm_rs";
    case OpId::kGemmAr: return "gemm_ar";
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
    case FlagId::kPartial: return "partial (a peer's partial of this rank's share has landed)";
    case FlagId::kReduced: return "reduced (an owner's reduced share has landed)";
    default: return "unknown flag";
  }
}

}  // namespace interlace
