// ag_gemm's flags, in its region of every rank's signal pad.
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"
#include "interlace/ops/ag_gemm/plan.h"

namespace interlace {

struct AgGemmFlags {
  // [q][c]: the op number of the last call in which chunk c of rank q's shard landed here. Op
  // numbers only grow, so "landed in this call" is arrived[q][c] >= this call's op number.
  uint64_t arrived[kMaxLocalRanks][kAgGemmMaxChunks];
};

}  // namespace interlace
