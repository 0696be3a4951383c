#include "interlace/ops/all_gather/plan.h"

#include <algorithm>

#include "interlace/base/error.h"
#include "interlace/device/signal_pad.h"

namespace interlace {

AllGatherPlan plan_all_gather(uint64_t bytes_per_rank, int resident_blocks, AllGatherTuning tuning) {
  const int most = std::min(resident_blocks, kMaxBlocks);
  IL_CHECK(tuning.num_blocks >= 0 && tuning.num_blocks <= most, "all_gather: num_blocks must be in [0, ", most,
           "] (the CTAs that fit on the GPU at once: they wait on each other across GPUs), got ", tuning.num_blocks);
  IL_CHECK(tuning.chunk_bytes % 16 == 0, "all_gather: chunk_bytes must be a multiple of 16, got ", tuning.chunk_bytes);
  AllGatherPlan plan;
  plan.num_blocks = tuning.num_blocks;
  if (plan.num_blocks == 0) {
    const uint64_t by_size = (bytes_per_rank + kAllGatherMinChunk - 1) / kAllGatherMinChunk;
    plan.num_blocks = static_cast<int>(std::clamp<uint64_t>(by_size, 1, static_cast<uint64_t>(most)));
  }
  plan.chunk_bytes = tuning.chunk_bytes;
  if (plan.chunk_bytes == 0) {
    const uint64_t per_block = (bytes_per_rank + plan.num_blocks - 1) / plan.num_blocks;
    plan.chunk_bytes = std::clamp<uint64_t>((per_block + 15) / 16 * 16, kAllGatherMinChunk, kAllGatherMaxChunk);
  }
  const uint64_t per_round = plan.chunk_bytes * plan.num_blocks;
  const uint64_t rounds = (bytes_per_rank + per_round - 1) / per_round;
  IL_CHECK(rounds < (uint64_t{1} << 31), "all_gather: ", bytes_per_rank, " bytes per rank in chunks of ",
           plan.chunk_bytes, " over ", plan.num_blocks, " CTAs needs ", rounds,
           " rounds, more than the kernel's 32-bit round counter allows; pass a larger chunk_bytes");
  plan.rounds = static_cast<int>(rounds);
  return plan;
}

namespace {

bool overlaps(const TensorView& a, const TensorView& b) {
  const auto lo_a = reinterpret_cast<uintptr_t>(a.data), lo_b = reinterpret_cast<uintptr_t>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && lo_a < lo_b + b.nbytes() && lo_b < lo_a + a.nbytes();
}

}  // namespace

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
  IL_CHECK(!overlaps(out, inp), "all_gather: out and inp overlap; they must be separate memory");
}

}  // namespace interlace
