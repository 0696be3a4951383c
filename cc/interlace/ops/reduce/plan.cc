#include "interlace/ops/reduce/plan.h"

#include <algorithm>
#include <limits>

#include "interlace/base/error.h"
#include "interlace/device/signal_pad.h"
#include "interlace/ops/all_gather/hierarchy.h"
#include "interlace/ops/chunks.h"

namespace interlace {
namespace {

void check_message(const char* op, int element_bytes, int world, int rank) {
  IL_CHECK(element_bytes == 2 || element_bytes == 4, op, ": elements of 2 or 4 bytes, got ", element_bytes);
  IL_CHECK(world >= 1 && world <= kMaxLocalRanks, op, ": 1 to ", kMaxLocalRanks, " ranks, got ", world);
  IL_CHECK(rank >= 0 && rank < world, op, ": rank ", rank, " is not in [0, ", world, ")");
}

// Splits one share over CTAs and rounds of chunks (ops/chunks.h); the kernel numbers chunks
// round * num_blocks + block in 32 bits, and its counters grow by steps() per launch.
void plan_reduce_chunks(const char* op, ReducePlan& plan, int resident_blocks, const ReduceTuning& tuning) {
  IL_CHECK(tuning.chunk_bytes <= (uint64_t{1} << 30), op,
           ": chunk_bytes must be a multiple of 16 and at most 1 GiB, got ", tuning.chunk_bytes);
  const ChunkPlan chunks = plan_chunks(op, plan.share_bytes, std::min(resident_blocks, kReduceMaxBlocks),
                                       tuning.num_blocks, tuning.chunk_bytes);
  plan.num_blocks = chunks.num_blocks;
  plan.chunk_bytes = chunks.chunk_bytes;
  IL_CHECK(static_cast<uint64_t>(chunks.rounds) <= ((uint64_t{1} << 31) - 1) / plan.num_blocks, op, ": a share of ",
           plan.share_bytes, " bytes in chunks of ", plan.chunk_bytes, " over ", plan.num_blocks, " CTAs needs ",
           chunks.rounds, " rounds, more chunks than the kernel's 32-bit chunk counter allows; pass a larger chunk_bytes");
  plan.rounds = chunks.rounds;
  const uint64_t slots = static_cast<uint64_t>(plan.world - 1);
  IL_CHECK(slots == 0 || plan.share_bytes <= std::numeric_limits<uint64_t>::max() / 2 / slots, op, ": ", slots,
           " staging slots of ", plan.share_bytes, " bytes overflow 64 bits");
  plan.staging_bytes = plan.share_bytes * slots;
}

uint64_t round_up_16(uint64_t bytes) { return bytes + (16 - bytes % 16) % 16; }

}  // namespace

ReducePlan plan_reduce_scatter(uint64_t out_bytes, int element_bytes, int world, int rank, int resident_blocks,
                               ReduceTuning tuning) {
  check_message("reduce_scatter", element_bytes, world, rank);
  IL_CHECK(out_bytes % element_bytes == 0, "reduce_scatter: ", out_bytes, " bytes is not a whole number of ",
           element_bytes, "-byte elements");
  IL_CHECK(tuning.algorithm == ReduceAlgorithm::kAuto || tuning.algorithm == ReduceAlgorithm::kReduceScatter,
           "reduce_scatter: it has one algorithm; leave algorithm automatic");
  IL_CHECK(out_bytes <= std::numeric_limits<uint64_t>::max() / world, "reduce_scatter: ", world, " shares of ",
           out_bytes, " bytes overflow 64 bits");
  // Shares lie back to back in inp and are summed in 16-byte vectors, so each must start aligned.
  IL_CHECK(out_bytes % 16 == 0, "reduce_scatter: each rank's block is ", out_bytes,
           " bytes; it must be a multiple of 16 bytes (8 fp16/bf16 or 4 fp32 elements), so that every rank's "
           "block of inp starts 16-byte aligned");
  ReducePlan plan;
  plan.world = world;
  plan.rank = rank;
  plan.algorithm = ReduceAlgorithm::kReduceScatter;
  plan.bytes = out_bytes * world;
  plan.share_bytes = out_bytes;
  plan_reduce_chunks("reduce_scatter", plan, resident_blocks, tuning);
  return plan;
}

ReducePlan plan_all_reduce(uint64_t bytes, int element_bytes, int world, int rank, int resident_blocks,
                           bool symmetric_out, ReduceTuning tuning) {
  check_message("all_reduce", element_bytes, world, rank);
  IL_CHECK(bytes % element_bytes == 0, "all_reduce: ", bytes, " bytes is not a whole number of ", element_bytes,
           "-byte elements");
  IL_CHECK(tuning.algorithm == ReduceAlgorithm::kAuto || tuning.algorithm == ReduceAlgorithm::kOneShot ||
               tuning.algorithm == ReduceAlgorithm::kTwoShot,
           "all_reduce: algorithm must be automatic, one-shot or two-shot");
  IL_CHECK(bytes <= (uint64_t{1} << 62), "all_reduce: ", bytes, " bytes is too large");
  ReducePlan plan;
  plan.world = world;
  plan.rank = rank;
  plan.bytes = bytes;
  plan.algorithm = tuning.algorithm;
  if (plan.algorithm == ReduceAlgorithm::kAuto) {
    const uint64_t one_shot_max = world == 2 ? kAllReduceOneShotMaxBytesTwoRanks : kAllReduceOneShotMaxBytes;
    plan.algorithm = bytes <= one_shot_max || world == 1 ? ReduceAlgorithm::kOneShot : ReduceAlgorithm::kTwoShot;
  }
  // Two-shot: world shares of a 16-byte multiple, the last ones shorter or empty. One-shot: one share,
  // the whole message. Staging slots are share_bytes apart, so share_bytes is a multiple of 16 either
  // way; only the message's last chunk can end off a 16-byte boundary (the kernel sums that tail in
  // scalars).
  const uint64_t even = bytes / world + (bytes % world != 0);
  plan.share_bytes = round_up_16(plan.algorithm == ReduceAlgorithm::kOneShot ? bytes : even);
  plan_reduce_chunks("all_reduce", plan, resident_blocks, tuning);
  if (plan.algorithm == ReduceAlgorithm::kTwoShot && !symmetric_out) plan.landing_bytes = plan.staging_bytes;
  return plan;
}

namespace {

bool same_dtype(const TensorView& a, const TensorView& b) {
  return a.dtype.code == b.dtype.code && a.dtype.bits == b.dtype.bits && a.dtype.lanes == b.dtype.lanes;
}


// What both ops require of each tensor on its own.
void check_tensor(const char* op, const char* name, const TensorView& t, int device) {
  const bool reducible = t.dtype.lanes == 1 && ((t.dtype.code == kDLFloat && (t.dtype.bits == 16 || t.dtype.bits == 32)) ||
                                                (t.dtype.code == kDLBfloat && t.dtype.bits == 16));
  IL_CHECK(reducible, op, ": ", name, " has dtype ", t.dtype_name(), "; it sums float16, bfloat16 or float32");
  IL_CHECK(t.contiguous(), op, ": ", name, " must be contiguous (C order), its strides are not");
  IL_CHECK(t.device.device_type == kDLCUDA && t.device.device_id == device, op, ": ", name, " is on ",
           t.device_string(), " but the group's GPU is cuda:", device);
  IL_CHECK(reinterpret_cast<uintptr_t>(t.data) % 16 == 0, op, ": ", name,
           " must start 16-byte aligned (it is summed in 16-byte vectors); it starts at byte ",
           reinterpret_cast<uintptr_t>(t.data) % 16, " of 16 (a view that starts mid-row?)");
}

}  // namespace

void check_reduce_scatter_args(const TensorView& out, const TensorView& inp, int world_size, int device) {
  IL_CHECK(same_dtype(out, inp), "reduce_scatter: out has dtype ", out.dtype_name(), " but inp has ",
           inp.dtype_name(), "; they must match");
  check_tensor("reduce_scatter", "inp", inp, device);
  check_tensor("reduce_scatter", "out", out, device);
  const bool stacked = inp.shape.size() == out.shape.size() + 1 && inp.shape[0] == world_size &&
                       std::equal(out.shape.begin(), out.shape.end(), inp.shape.begin() + 1);
  const bool concatenated = !out.shape.empty() && inp.shape.size() == out.shape.size() &&
                            inp.shape[0] == world_size * out.shape[0] &&
                            std::equal(out.shape.begin() + 1, out.shape.end(), inp.shape.begin() + 1);
  const bool flat = inp.shape.size() == 1 && inp.shape[0] == world_size * out.numel();
  IL_CHECK(stacked || concatenated || flat, "reduce_scatter: inp has shape ", inp.shape_string(), " but out has ",
           out.shape_string(), "; with world_size ", world_size, " inp must be [", world_size, " * out.shape[0], ",
           "*out.shape[1:]], [", world_size, ", *out.shape] or flat with ", world_size, " x out's elements");
  IL_CHECK(!bytes_overlap(out, inp), "reduce_scatter: out and inp overlap; they must be separate memory");
}

void check_all_reduce_args(const TensorView& out, const TensorView& inp, int device) {
  IL_CHECK(same_dtype(out, inp), "all_reduce: out has dtype ", out.dtype_name(), " but inp has ", inp.dtype_name(),
           "; they must match");
  check_tensor("all_reduce", "inp", inp, device);
  check_tensor("all_reduce", "out", out, device);
  IL_CHECK(out.shape == inp.shape, "all_reduce: out has shape ", out.shape_string(), " but inp has ",
           inp.shape_string(), "; they must match");
  // In place is safe: each CTA reads a chunk of inp before anything writes that chunk of out (kernel.cuh).
  IL_CHECK(out.data == inp.data || !bytes_overlap(out, inp),
           "all_reduce: out and inp overlap without being the same memory; pass separate tensors, or the same "
           "tensor twice to reduce in place");
}

NodesReduceLayout nodes_reduce_layout(const ReducePlan& plan, bool gather, uint64_t min_chunk) {
  NodesReduceLayout l;
  const uint64_t fitting = (plan.share_bytes + kHierMaxChunks - 1) / kHierMaxChunks;
  l.chunk_bytes = std::max<uint64_t>(min_chunk, round_up_16(fitting));
  l.chunks = static_cast<int32_t>((plan.share_bytes + l.chunk_bytes - 1) / l.chunk_bytes);
  l.staging = 0;
  l.send = plan.share_bytes * (plan.world - 1);
  l.gather = l.send + plan.share_bytes * plan.world;
  l.scratch_bytes = l.gather + (gather ? plan.share_bytes * plan.world : 0);
  return l;
}

}  // namespace interlace
