// Host side of the standalone reduce_scatter and all_reduce (sum): argument checks, the split of a
// message into shares and chunks, and where partials land. Pure C++, so the CPU tests cover it
// (tests/cc/reduce_plan_test.cc); the kernel (kernel.cuh) evaluates the same closed forms.
//
// A message is cut into world shares; rank q reduces share q. Every sender pushes its copy of share
// q into a staging slot of q (symmetric heap scratch), in chunks as all_gather's: chunk
// c = round * num_blocks + block covers [c, c + 1) * chunk_bytes of a share. Owner q sums the
// world's copies in rank order in fp32 and rounds once (sum_in_rank_order); its own copy is read in
// place from its input, so a receiver has world - 1 slots. Then:
//   - reduce_scatter: the sum is out;
//   - all_reduce, two-shot: the owner pushes its reduced share to every rank (into its out when out
//     is symmetric, else into a landing buffer in the heap that the rank copies out of);
//   - all_reduce, one-shot: the share is the whole message, every rank pushes all of it to every
//     rank and every rank sums it; no second hop. Fewer steps, (world - 1) x the bytes: for small
//     messages.
// Both all_reduce algorithms add the same values in the same order, so they give the same bits, and
// every rank the same bits.
#pragma once

#include <cstdint>

#include "interlace/base/host_device.h"
#include "interlace/base/tensor.h"

namespace interlace {

// The owner's sum of one element: the world's partials in rank order 0, 1, ..., world - 1, in fp32,
// whatever order they arrived in. fp32 addition is not associative, so this fixed order is what
// makes the result bitwise equal run to run and, for all_reduce and gemm_ar, on every rank (each
// sums the same values in the same order). The sum starts from partial 0, not 0.0f, which would turn
// -0 into +0. partial(s) returns sender s's value as float.
template <class Partial>
IL_HOST_DEVICE inline float sum_in_rank_order(int32_t world, const Partial& partial) {
  float sum = partial(0);
  for (int32_t s = 1; s < world; ++s) sum += partial(s);
  return sum;
}

enum class ReduceAlgorithm : int32_t { kAuto = 0, kReduceScatter = 1, kOneShot = 2, kTwoShot = 3 };

// The reductions keep two counters per (CTA, sender) in their 1 MiB flag region (partials landed,
// reduced chunks landed), so they use at most this many CTAs (an H200 holds 264-396 of them).
constexpr int kReduceMaxBlocks = 512;

struct ReducePlan {
  int32_t world = 1;
  int32_t rank = 0;
  ReduceAlgorithm algorithm = ReduceAlgorithm::kReduceScatter;
  uint64_t bytes = 0;        // the whole message (reduce_scatter: world shares)
  uint64_t share_bytes = 0;  // a multiple of 16; one-shot: the whole message rounded up, reduced by every rank
  int32_t num_blocks = 1;    // CTAs
  uint64_t chunk_bytes = 0;  // a multiple of 16
  int32_t rounds = 0;        // of num_blocks chunks, over one share
  uint64_t staging_bytes = 0;  // (world - 1) slots of share_bytes: the partials this rank receives
  uint64_t landing_bytes = 0;  // two-shot into an ordinary out: (world - 1) slots for the reduced shares

  // Where share q starts in the message, and its size (the last shares may be short or empty).
  IL_HOST_DEVICE uint64_t share_begin(int32_t q) const {
    if (algorithm == ReduceAlgorithm::kOneShot) return 0;
    const uint64_t begin = static_cast<uint64_t>(q) * share_bytes;
    return begin < bytes ? begin : bytes;
  }
  IL_HOST_DEVICE uint64_t share_size(int32_t q) const {
    const uint64_t end = share_begin(q) + share_bytes;
    return (end < bytes ? end : bytes) - share_begin(q);
  }
  // Receiver q's slot for sender s (s != q), in staging and in landing: senders in rank order, q's own
  // skipped.
  IL_HOST_DEVICE static int32_t slot(int32_t s, int32_t q) { return s < q ? s : s - 1; }
  // Bytes [begin, begin + size) of a share that chunk `round` of CTA `block` covers, clipped to
  // share_size: the same range in every share.
  IL_HOST_DEVICE uint64_t chunk_begin(int32_t round, int32_t block) const {
    return (static_cast<uint64_t>(round) * num_blocks + block) * chunk_bytes;
  }
  // Counter steps one launch adds to each CTA's flags: a round's partials, and two-shot's reduced chunks.
  IL_HOST_DEVICE uint64_t steps() const {
    return algorithm == ReduceAlgorithm::kTwoShot ? 2 * static_cast<uint64_t>(rounds) : rounds;
  }
};

struct ReduceTuning {
  ReduceAlgorithm algorithm = ReduceAlgorithm::kAuto;  // all_reduce: kOneShot or kTwoShot forces it
  int num_blocks = 0;                                   // 0: automatic
  uint64_t chunk_bytes = 0;                             // 0: automatic; a multiple of 16
};

// all_reduce is one-shot for messages up to this many bytes per rank. One-shot saves a hop and a
// flag wait; two-shot moves (world - 1) / world of the bytes one-shot does. On two ranks both move
// the same bytes, and one-shot measured faster up to 4 MiB (2 x H200, under graph replay 16.1
// against 20.5 us at 1 MiB; eager 31.5 against 33.0 us at 4 MiB, even at 16 MiB, slower at 64:
// bench/results/NOTES.md); past two ranks 256 KiB is a starting point, not a measurement.
constexpr uint64_t kAllReduceOneShotMaxBytes = uint64_t{256} << 10;
constexpr uint64_t kAllReduceOneShotMaxBytesTwoRanks = uint64_t{4} << 20;

// out_bytes: one rank's share (out's bytes); element_bytes: 2 or 4; resident_blocks: how many of the
// kernel's CTAs fit on the GPU at once (all must run: they wait on each other across GPUs).
// symmetric_out: all_reduce's out lies in the symmetric heap, so owners push into it directly.
ReducePlan plan_reduce_scatter(uint64_t out_bytes, int element_bytes, int world, int rank, int resident_blocks,
                               ReduceTuning tuning = {});
ReducePlan plan_all_reduce(uint64_t bytes, int element_bytes, int world, int rank, int resident_blocks,
                           bool symmetric_out, ReduceTuning tuning = {});

// Across nodes (nodes_kernel.cuh): each share in chunks of at least min_chunk bytes (the kernel's:
// kHierDefaultChunk) and at most kHierMaxChunks of them, and the scratch: (world - 1) slots of
// partials, a send buffer of world slots, all_reduce's gather buffer of world slots; offsets from the
// scratch's start.
struct NodesReduceLayout {
  uint64_t chunk_bytes = 0;  // a multiple of 16
  int32_t chunks = 0;        // per share; 0 for an empty message
  uint64_t staging = 0, send = 0, gather = 0;
  uint64_t scratch_bytes = 0;
};
NodesReduceLayout nodes_reduce_layout(const ReducePlan& plan, bool gather, uint64_t min_chunk);

// Raise, naming the argument, unless (for reduce_scatter) out is one rank's block of inp:
// inp [world * n, ...] or [world, n, ...] or flat with world * out.numel() elements, out [n, ...];
// (for all_reduce) out has inp's shape. Both: fp16, bf16 or fp32, the same dtype; C-contiguous,
// 16-byte aligned CUDA tensors on `device`; out and inp do not overlap, except that all_reduce may
// run in place (out and inp the same memory).
void check_reduce_scatter_args(const TensorView& out, const TensorView& inp, int world_size, int device);
void check_all_reduce_args(const TensorView& out, const TensorView& inp, int device);

}  // namespace interlace
