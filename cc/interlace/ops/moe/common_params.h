// What every MoE kernel reads of its call and its handle, filled on the host (defined in launch.cu,
// used by the unfused ops and by moe_gemm_combine).
#pragma once

#include <cstdint>

#include "interlace/ops/moe/device.cuh"
#include "interlace/ops/moe/launch.h"
#include "interlace/runtime/op_call.h"

namespace interlace {

// The call's transport and waits, the handle's plan, workspace and home-side arrays, this rank's tokens.
MoeCommonParams moe_common_params(Group& group, const OpCall& call, uint64_t signature, const MoeHandle& handle,
                                  int64_t tokens);

}  // namespace interlace
