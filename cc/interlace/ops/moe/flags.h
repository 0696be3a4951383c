// moe_dispatch's and moe_combine's flags, in each op's region of every rank's signal pad: the
// plan's flags (MoePlan::counts_flag etc., indices into `plan`) after the grid barrier's two words.
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"
#include "interlace/ops/moe/plan.h"

namespace interlace {

struct MoeFlags {
  // Local, the grid barrier (moe_detail::arrive): the last phase every CTA of this rank has finished,
  // as op number x kMoePhases + phase (it only grows, like every flag), and the CTAs that have
  // finished the phase under way (back to 0 once all have).
  uint64_t release;
  uint32_t arrived;
  uint32_t unused;
  uint64_t plan[kMoeMaxFlags];  // MoePlan's flags by index, raised to the op number
};

// Barrier values per op number: a kernel's phases, numbered 0 .. kMoePhases - 1.
constexpr uint64_t kMoePhases = 4;

static_assert(sizeof(MoeFlags) <= kOpRegionBytes, "MoE's flags must fit an op's region of the signal pad");

}  // namespace interlace
