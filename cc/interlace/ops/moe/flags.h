// moe_dispatch's and moe_combine's flags, in each op's region of every rank's signal pad: the
// plan's flags (MoePlan::counts_flag etc., indices into `plan`) after one barrier word per CTA.
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"
#include "interlace/ops/moe/plan.h"

namespace interlace {

struct MoeFlags {
  // [b], local: the last phase CTA b of this rank has finished, as op number x kMoePhases + phase.
  // The kernels' phases need every CTA's writes of the phase before (a grid barrier); these words
  // only grow, like every flag, so nothing is reset between calls or graph replays.
  uint64_t barrier[kMoeBarrierWords];
  uint64_t plan[kMoeMaxFlags];  // MoePlan's flags by index, raised to the op number
};

// Barrier values per op number: a kernel's phases, numbered 0 .. kMoePhases - 1.
constexpr uint64_t kMoePhases = 4;

static_assert(sizeof(MoeFlags) <= kOpRegionBytes, "MoE's flags must fit an op's region of the signal pad");

}  // namespace interlace
