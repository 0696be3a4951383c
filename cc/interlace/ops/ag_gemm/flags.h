// ag_gemm's flags, in its region of every rank's signal pad.
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"
#include "interlace/ops/ag_gemm/plan.h"

namespace interlace {

struct AgGemmFlags {
  // Every flag here is zeroed by the call's stream before its kernel (the group's ops run one after
  // another, and peers write here only after this call's handshake) and raised to 1: the copy
  // engines' stream writes hold the values of their capture, so no op number can be used; and a
  // constant keeps the producer warp's waits within its 40 registers.
  //
  // Copy engines only. own_staged: helper warps (of every CTA) that have copied their share of
  // this rank's shard into its landing buffer (the kernel stages it: a copy within one GPU runs on
  // the SMs, which the GEMM holds, so the copy engines cannot); staged[q]: rank q's shard is staged
  // and may be pulled (its kernel writes it here once its own_staged is complete). The kernel raises
  // every staged[q] itself when the call stops early, so that the side stream never waits forever.
  uint64_t own_staged;
  uint64_t staged[kMaxLocalRanks];
  // pulled[q]: rank q holds every chunk of this rank's shard (its kernel writes it here). A kernel
  // ends only once every peer has pulled its shard: the landing buffer it pulls from is the
  // caller's (gathered) or scratch the next op may use, free again once the call is done.
  uint64_t pulled[kMaxLocalRanks];
  // [q][c]: chunk c of rank q's shard has landed here (last: only the ranks' rows are zeroed).
  uint64_t arrived[kMaxLocalRanks][kAgGemmMaxChunks];
};

}  // namespace interlace
