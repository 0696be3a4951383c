// all_gather's flags, in its region of every rank's signal pad.
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"

namespace interlace {

struct AllGatherFlags {
  uint64_t done[kMaxBlocks][kMaxLocalRanks];  // [b][q]: rounds of peer q's CTA b that have landed here
  uint64_t rounds[kMaxBlocks];                // local: rounds completed by CTA b, over all launches
};

}  // namespace interlace
