// The reductions' flags, in the op's region of every rank's signal pad (reduce_scatter and
// all_reduce each have a region of their own, laid out alike).
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"
#include "interlace/ops/reduce/plan.h"

namespace interlace {

struct ReduceFlags {
  // [b][s]: counter steps of sender s's CTA b whose partials have landed here. Round r of a launch
  // whose CTA b starts at step `seq` raises it to seq + r + 1.
  uint64_t partial[kReduceMaxBlocks][kMaxLocalRanks];
  // [b][q]: two-shot: steps of owner q's CTA b whose reduced chunks have landed here; round r raises
  // it to seq + rounds + r + 1. A second array, since the two kinds of signal interleave in time and
  // a counter must only grow.
  uint64_t reduced[kReduceMaxBlocks][kMaxLocalRanks];
  uint64_t steps[kReduceMaxBlocks];  // local: steps completed by CTA b, over all launches (ReducePlan::steps)
};

static_assert(sizeof(ReduceFlags) <= kOpRegionBytes, "the reductions' counters must fit an op's flag region");

}  // namespace interlace
