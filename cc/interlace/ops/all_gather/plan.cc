#include "interlace/ops/all_gather/plan.h"

#include <algorithm>

#include "interlace/base/error.h"
#include "interlace/device/signal_pad.h"

namespace interlace {

AllGatherPlan plan_all_gather(uint64_t bytes_per_rank, int resident_blocks, AllGatherTuning tuning) {
  return plan_chunks("all_gather", bytes_per_rank, resident_blocks, tuning.num_blocks, tuning.chunk_bytes);
}

void check_all_gather_args(const TensorView& out, const TensorView& inp, int world_size, int device) {
  IL_CHECK(out.dtype.code == inp.dtype.code && out.dtype.bits == inp.dtype.bits && out.dtype.lanes == inp.dtype.lanes,
           "all_gather: out has dtype ", out.dtype_name(), " but inp has ", inp.dtype_name(), "; they must match");
  bool stacked = out.shape.size() == inp.shape.size() + 1 && out.shape[0] == world_size &&
                 std::equal(inp.shape.begin(), inp.shape.end(), out.shape.begin() + 1);
  bool concatenated = !inp.shape.empty() && out.shape.size() == inp.shape.size() &&
                      out.shape[0] == world_size * inp.shape[0] &&
                      std::equal(inp.shape.begin() + 1, inp.shape.end(), out.shape.begin() + 1);
  IL_CHECK(stacked || concatenated, "all_gather: out has shape ", out.shape_string(), " but inp has ",
           inp.shape_string(), "; with world_size ", world_size, " out must be [", world_size, ", *inp.shape] or [",
           world_size, " * inp.shape[0], *inp.shape[1:]]");
  IL_CHECK(inp.contiguous(), "all_gather: inp must be contiguous (C order), its strides are not");
  IL_CHECK(out.contiguous(), "all_gather: out must be contiguous (C order), its strides are not");
  IL_CHECK(inp.device.device_type == kDLCUDA && inp.device.device_id == device, "all_gather: inp is on ",
           inp.device_string(), " but the group's GPU is cuda:", device);
  IL_CHECK(out.device.device_type == kDLCUDA && out.device.device_id == device, "all_gather: out is on ",
           out.device_string(), " but the group's GPU is cuda:", device);
  IL_CHECK(!bytes_overlap(out, inp), "all_gather: out and inp overlap; they must be separate memory");
}

}  // namespace interlace
