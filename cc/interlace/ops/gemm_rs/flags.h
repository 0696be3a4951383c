// gemm_rs's and gemm_ar's flags, each op in its own region of every rank's signal pad.
#pragma once

#include <cstdint>

#include "interlace/device/signal_pad.h"
#include "interlace/ops/gemm_rs/plan.h"

namespace interlace {

struct GemmRsFlags {
  // [GemmRsPlan::partial_slot(me, s, m_idx, n_idx)]: sender s's partial of tile (m_idx, n_idx) has
  // landed in this rank's staging. Raised to the call's op number (op numbers only grow, so "landed in
  // this call" is flag >= the op number: nothing is reset and captured graphs replay). The sender's
  // own partial, which it stores into its own staging, has a flag like any other. Past partial_flags,
  // gemm_ar's reduced_flag()s: the owner's reduced tile has landed in this rank's landing tile.
  uint64_t flag[kGemmRsMaxFlags];
};

static_assert(sizeof(GemmRsFlags) <= kOpRegionBytes, "gemm_rs's flags must fit its region of the signal pad");

}  // namespace interlace
