#include "interlace/ops/all_gather/plan.h"

#include <algorithm>

#include "interlace/base/error.h"
#include "interlace/device/signal_pad.h"

namespace interlace {

AllGatherPlan plan_all_gather(uint64_t bytes_per_rank, int num_sms, int num_blocks) {
  IL_CHECK(num_blocks >= 0 && num_blocks <= kMaxBlocks, "all_gather: num_blocks must be in [0, ", kMaxBlocks,
           "], got ", num_blocks);
  AllGatherPlan plan;
  if (num_blocks == 0) {
    // One CTA per SM saturates NVLink with loads (BASELINES.md: 375 GB/s with 132 CTAs); small
    // messages use fewer CTAs so that each one's flag round trip moves a useful amount of data.
    const uint64_t by_size = (bytes_per_rank + kAllGatherMinBytesPerBlock - 1) / kAllGatherMinBytesPerBlock;
    num_blocks = static_cast<int>(std::clamp<uint64_t>(by_size, 1, std::min(num_sms, kMaxBlocks)));
  }
  const uint64_t per_block = (bytes_per_rank + num_blocks - 1) / num_blocks;
  plan.chunk_bytes = std::max<uint64_t>(16, (per_block + 15) / 16 * 16);
  plan.num_blocks = num_blocks;
  return plan;
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
}

}  // namespace interlace
