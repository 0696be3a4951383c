// The flags of reduce_scatter and all_reduce across nodes (the kernel is nodes_kernel.cuh), in the
// op's region of every rank's signal pad after the single-node ones (ReduceFlags). Host code, so the
// CPU tests see the layout (tests/cc/nodes_reduce_host_test.cc runs the kernel's protocol on threads).
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"
#include "interlace/ops/all_gather/hierarchy.h"
#include "interlace/ops/reduce/flags.h"

namespace interlace {

constexpr int kNodesReduceMaxRanks = kMaxLocalRanks;  // the plan's bound (and one waiting thread per sender)
constexpr int kNodesReduceMaxChunks = kHierMaxChunks;

// In the op's region of the signal pad, after ReduceFlags.
constexpr uint64_t kNodesReduceFlagsInRegion = 640 << 10;
struct NodesReduceFlags {
  uint64_t landed[kNodesReduceMaxRanks][kNodesReduceMaxChunks];    // [s][c]: sender s's partials of chunk c
  uint64_t gathered[kNodesReduceMaxRanks][kNodesReduceMaxChunks];  // [s][c]: all_reduce: owner s's sums of chunk c
  uint64_t ready[kNodesReduceMaxRanks];    // [q]: launches rank q (of another node) has started
  uint64_t drained[kNodesReduceMaxRanks];  // [q]: launches whose data from here rank q (another node) holds
  uint64_t uses[kNodesReduceMaxChunks];  // local: launches that had a chunk c
  uint64_t launches;                     // local
  uint32_t finished;                     // local: CTAs of the running launch that are done
};
static_assert(sizeof(ReduceFlags) <= kNodesReduceFlagsInRegion &&
                  kNodesReduceFlagsInRegion + sizeof(NodesReduceFlags) <= kOpRegionBytes,
              "the reductions' flags across nodes must fit after the single-node ones");

}  // namespace interlace
