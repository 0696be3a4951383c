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
    case OpId::kMoeDispatch: return "moe_dispatch";
    case OpId::kMoeCombine: return "moe_combine";
    case OpId::kRingAttention: return "ring_attention";
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
    case FlagId::kCounts: return "counts (a source's row of expert counts has landed)";
    case FlagId::kArrived: return "arrived (a source's rows for a local expert have landed)";
    case FlagId::kCombined: return "combined (an expert's outputs for this rank's tokens have landed)";
    case FlagId::kBarrier: return "barrier (a CTA of this rank finished a phase)";
    case FlagId::kLanded: return "landed (a piece of a K/V block from the previous rank has landed)";
    case FlagId::kReady: return "ready (a rank on another node has started this all_gather)";
    case FlagId::kNetChunk: return "network chunk (a chunk of a shard from another node has landed)";
    case FlagId::kDrained: return "drained (a rank on another node holds this rank's data)";
    case FlagId::kFilled: return "filled (a source's rows for a local expert have landed, secondary rows filled)";
    default: return "unknown flag";
  }
}

}  // namespace interlace
