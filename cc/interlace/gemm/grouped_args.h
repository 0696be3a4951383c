// Host-side checks of interlace::grouped_gemm's arguments: everything is validated before any GPU work.
#pragma once

#include <cstdint>
#include <type_traits>

#include "interlace/base/tensor.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/grouped_order.h"

namespace interlace {

// G independent GEMMs of one shape bound, as a mixture of experts runs its experts on the tokens
// each received: group g multiplies the first rows[g] rows of a[g] by b[g].
struct GroupedGemmProblem {
  int64_t groups = 0;    // G
  int64_t capacity = 0;  // C: rows per group in a and out (a group uses its first rows[g] of them)
  int64_t n = 0, k = 0;
  GemmDtype dtype = GemmDtype::kBf16;
  bool b_k_major = false;  // b[g] is [K, N] with K contiguous (Linear weights [G, N, K] passed as w.transpose(1, 2))
  int64_t lda = 0, ldb = 0, ldc = 0;                    // row strides, elements
  int64_t group_a = 0, group_b = 0, group_out = 0;      // group strides, elements
};

// 0 means automatic (resolved_grouped_gemm_tuning: 128 x 256 tiles without pairs where C <= 384,
// else 128 x 128 tiles in pairs, or on a GPU lean on HBM 128 x 256 ones in pairs).
struct GroupedGemmTuning {
  int cluster_m = 0;  // CTAs per cluster along M, 1 or 2 (2: a group's tile-row pairs share B through
                      // multicast)
  int tile_n = 0;     // 128: 128 x 128 tiles, ping-pong (a warpgroup's epilogue beside the other's math);
                      // 256: 128 x 256, cooperative (both warpgroups on one tile: half the loads of B
                      // per flop)
  int swap = 0;       // 1: the swapped problem (swapped_tile_rows), -1: never, 0: automatic; with 1,
                      // cluster_m and tile_n stay 0
};

// The swapped problem's tile width: a group's rows across the tiles' 160-wide side (one 160-wide wgmma),
// against 128 of b's N on their rows; two such tiles side by side are one cluster, which multicasts
// each slice of b[g] to both, so that at C <= 320 each is read once. (One 320-wide tile would do that
// in one CTA, but a TMA box spans at most 256 rows.)
constexpr int kSwappedGroupedRows = 160;
constexpr int kSwappedGroupedClusterN = 2;
static_assert(kSwappedGroupedClusterN == 1 || kSwappedGroupedClusterN == 2,
              "SwappedGroupedOrder's apart runs take clusters of one or two row tiles");

// The tiles' width where grouped_gemm runs the swapped problem (SwappedGroupedOrder), else 0.
// Automatically where b is K-major (Linear weights) and 128 < C <= 320: there the unswapped problem
// has two or three 128-row tiles per column, whose CTAs each read b[g] from HBM, where one cluster of
// two swapped tiles covers C and reads it once. Measured against the unswapped problem
// (bench/results/NOTES.md): at G 128, C 320, K 7168 > N 4096, 1.42x at full groups, 1.17x at 0.8 C
// (sixteenth session), 0.89-0.91x at C / 8, where most groups fill one row tile and the cluster's
// CTAs work apart (seventeenth; the host cannot see the counts to choose); at G 256, C 151 (the moe
// bench's DeepSeek-like layer on one rank) 1.40-1.46x (nineteenth); at K 2048 < N 7168 (the second
// FFN matmul), where the cooperative swapped tiles had lost, 1.4-1.8x on ping-pong ones (1 x H100,
// twenty-second). At C 512 and at decode (C 16) it lost, hence the range. Raises where swap is 1 and
// the problem cannot (b not K-major, or cluster_m or tile_n set).
constexpr int kSwappedGroupedMinRows = 128;
int swapped_tile_rows(const GroupedGemmTuning& tuning, bool b_k_major, int64_t capacity,
                      const char* op = "grouped_gemm");

// Raises unless every setting is one grouped_gemm has (op: the name errors give).
void check_grouped_gemm_tuning(const GroupedGemmTuning& tuning, const char* op = "grouped_gemm");

// The settings a launch with C = capacity rows per group takes on a GPU of hbm_bytes_per_sm
// (hbm_bytes_per_sm in base/cuda.h; 0: unknown): tuning's, automatic ones filled in.
GroupedGemmTuning resolved_grouped_gemm_tuning(GroupedGemmTuning tuning, int64_t capacity, double hbm_bytes_per_sm,
                                               const char* op = "grouped_gemm");

// Calls f(b_k_major, cluster_m, tile_n), each a std::integral_constant, for resolved settings: the
// kernel variants grouped_gemm and the fused ops on it compile.
template <class F>
void with_grouped_tiling(bool b_k_major, const GroupedGemmTuning& resolved, F&& f) {
  auto by_tile = [&](auto k_major, auto cluster) {
    resolved.tile_n == 256 ? f(k_major, cluster, std::integral_constant<int, 256>{})
                           : f(k_major, cluster, std::integral_constant<int, 128>{});
  };
  auto by_cluster = [&](auto k_major) {
    resolved.cluster_m == 2 ? by_tile(k_major, std::integral_constant<int, 2>{})
                            : by_tile(k_major, std::integral_constant<int, 1>{});
  };
  b_k_major ? by_cluster(std::true_type{}) : by_cluster(std::false_type{});
}

// a: [G, C, K], rows K-contiguous; b: [G, K, N], N-contiguous or K-contiguous (w.transpose(1, 2) of
// Linear weights [G, N, K]); out: [G, C, N], rows N-contiguous; rows: int32 [G], contiguous, read on
// the GPU (a row count per group, any int32: the kernel clamps it to [0, C]). bf16
// or fp16, a, b and out alike, all on CUDA `device`. TMA's rules: every base address and every
// stride but the contiguous one 16-byte aligned (group strides only where G > 1: one group's is
// never used, and comes back 0). Dimensions up to kMaxGemmDim, strides below kMaxGemmRowStride. out
// may not overlap a, b or rows. Raises interlace::Error naming the tensor.
GroupedGemmProblem check_grouped_gemm_args(const TensorView& a, const TensorView& b, const TensorView& out,
                                           const TensorView& rows, int device);

// The tile order of a launch of problem p with resolved settings, over the counts `rows` on the GPU;
// raises where the tiles are more than kMaxGemmTiles.
GroupedOrder::Params checked_grouped_order(const GroupedGemmProblem& p, const GroupedGemmTuning& resolved,
                                           const int32_t* rows, const char* op = "grouped_gemm");

// The swapped problem's order (swapped_rows: swapped_tile_rows' nonzero width) over the counts `rows`
// on the GPU, and in `tiles` the positions a launch may have (every group's cluster tiles); raises
// where its row tiles are more than kMaxGemmTiles.
SwappedGroupedOrder::Params checked_swapped_order(const GroupedGemmProblem& p, int swapped_rows, const int32_t* rows,
                                                  int32_t* tiles);

// The same checks for a fused op named `op` whose epilogue stores elsewhere (out_or_null null: no out).
GroupedGemmProblem check_grouped_gemm_operands(const char* op, const TensorView& a, const TensorView& b,
                                               const TensorView* out_or_null, const TensorView& rows, int device);

}  // namespace interlace
