#include "interlace/gemm/grouped_args.h"

#include <utility>

#include "interlace/base/error.h"
#include "interlace/gemm/operand.h"
#include "interlace/gemm/tile_plan.h"

namespace interlace {
namespace {

using gemm_operand::aligned16;
using gemm_operand::ByteRange;
using gemm_operand::stride_of;

using gemm_operand::is_dtype;

// The two strides of a 16-bit operand that TMA takes from memory (rows and groups), checked alike:
// `rows` rows of `row_len` elements `ld` apart, groups `group` apart. TMA takes strides below 2^40
// bytes and multiples of 16 bytes; rows and groups must not overlap, or a GEMM's operand would be
// another group's (and two CTAs would store the same bytes of out). The group bound counts whole
// strided rows (rows * ld), padding included. A single group's stride is never used (the kernel then
// gets 0, as the plain GEMM's batch stride), so it is not checked: w.t().unsqueeze(0) passes.
void check_strides(const char* op, const char* name, int64_t ld, int64_t row_len, const char* row_len_name,
                   int64_t group, int64_t groups, int64_t rows, const char* rows_name) {
  IL_CHECK(ld >= row_len, op, ": ", name, "'s rows overlap (row stride ", ld, " < ", row_len_name, " = ",
           row_len, ")");
  IL_CHECK(ld < kMaxGemmRowStride, op, ": ", name, "'s row stride ", ld, " is beyond TMA's 2^40-byte limit");
  IL_CHECK(ld % 8 == 0, op, ": ", name, "'s rows must be 16-byte aligned (", row_len_name,
           " a multiple of 8); row stride ", ld);
  if (groups == 1) return;
  IL_CHECK(group < kMaxGemmRowStride, op, ": ", name, "'s group stride ", group,
           " is beyond TMA's 2^40-byte limit");
  // rows * ld is below 2^70 here (ld < 2^39, rows <= kMaxGemmDim): in 128 bits.
  IL_CHECK(static_cast<__int128>(group) >= static_cast<__int128>(rows) * ld, op, ": ", name,
           "'s groups overlap (group stride ", group, " < ", rows_name, " = ", rows, " rows of stride ", ld, ")");
  IL_CHECK(group % 8 == 0, op, ": ", name, "'s group stride ", group,
           " must be 16-byte aligned (a multiple of 8 elements)");
}

}  // namespace

void check_grouped_gemm_tuning(const GroupedGemmTuning& tuning, const char* op) {
  IL_CHECK(tuning.cluster_m == 0 || tuning.cluster_m == 1 || tuning.cluster_m == 2, op,
           ": cluster_m must be 0 (automatic), 1 or 2, got ", tuning.cluster_m);
  IL_CHECK(tuning.tile_n == 0 || tuning.tile_n == 128 || tuning.tile_n == 256, op,
           ": tile_n must be 0 (automatic), 128 or 256, got ", tuning.tile_n);
  IL_CHECK(tuning.swap >= -1 && tuning.swap <= 1, op, ": swap must be 0 (automatic), 1 or -1 (never), got ",
           tuning.swap);
  IL_CHECK(tuning.swap != 1 || (tuning.cluster_m == 0 && tuning.tile_n == 0), op,
           ": the swapped problem chooses its own tiles; cluster_m and tile_n must stay 0 (got ",
           tuning.cluster_m, " and ", tuning.tile_n, ")");
}

int swapped_tile_rows(const GroupedGemmTuning& tuning, bool b_k_major, int64_t capacity, const char* op) {
  check_grouped_gemm_tuning(tuning, op);
  if (tuning.swap == 1) {
    IL_CHECK(b_k_major, op, ": the swapped problem takes b K-major (Linear weights w [G, N, K] passed as "
             "w.transpose(1, 2)); this b is N-contiguous");
    return kSwappedGroupedRows;
  }
  const bool automatic = tuning.swap == 0 && tuning.cluster_m == 0 && tuning.tile_n == 0;
  return automatic && b_k_major && capacity > kSwappedGroupedMinRows && capacity <= 2 * kSwappedGroupedRows
             ? kSwappedGroupedRows
             : 0;
}

GroupedGemmTuning resolved_grouped_gemm_tuning(GroupedGemmTuning tuning, int64_t capacity, double hbm_bytes_per_sm,
                                               const char* op) {
  check_grouped_gemm_tuning(tuning, op);
  // On a GPU lean on memory (an H100 at its power cap), pairs of 128 x 128 tiles fall behind where
  // groups have more than three tile rows, as the plain GEMM's ping-pong tiles do: pairs of 128 x
  // 256 cooperative ones ran the Mixtral-like shapes 1.0-1.6x faster at 0.8 C and full groups
  // (0.84-1.06x at C / 8; two runs on 1 x H100, bench/results/NOTES.md, twenty-second session).
  if (lean_hbm(hbm_bytes_per_sm) && capacity > 3 * 128 && tuning.tile_n == 0 && tuning.cluster_m == 0) {
    tuning.tile_n = 256;
    tuning.cluster_m = 2;
    return tuning;
  }
  // Elsewhere, measured on H200 (bench/results/NOTES.md). With many tile rows per group, pairs of
  // them sharing each load of b[g] (128 x 128 tiles) took the MoE shapes from 0.65-0.8x to about
  // parity with cuBLAS. With at most three (C <= 384: decode, many experts of a few hundred rows), a
  // pair's second CTA often gets a tile row past the rows and multiplies zeros; 128 x 256 tiles
  // without pairs, which load half the b per flop, were 1.2-1.4x faster there (C = 320, 16).
  if (tuning.tile_n == 0) tuning.tile_n = capacity <= 3 * 128 ? 256 : 128;
  if (tuning.cluster_m == 0) tuning.cluster_m = tuning.tile_n == 128 && capacity > 128 ? 2 : 1;
  return tuning;
}

GroupedOrder::Params checked_grouped_order(const GroupedGemmProblem& p, const GroupedGemmTuning& resolved,
                                           const int32_t* rows, const char* op) {
  const GroupedOrder::Params order = GroupedOrder::make(rows, p.capacity, p.n, resolved.cluster_m, resolved.tile_n);
  IL_CHECK(p.groups * order.tile_rows * order.tiles_n <= kMaxGemmTiles, op, ": ", p.groups, " groups of ",
           order.tile_rows, " x ", order.tiles_n, " tiles are more than the ", kMaxGemmTiles, " supported");
  return order;
}

SwappedGroupedOrder::Params checked_swapped_order(const GroupedGemmProblem& p, int swapped_rows, const int32_t* rows,
                                                  int32_t* tiles) {
  const SwappedGroupedOrder::Params order =
      SwappedGroupedOrder::make(rows, p.capacity, p.n, swapped_rows, kSwappedGroupedClusterN);
  const int64_t row_tiles = (p.capacity + swapped_rows - 1) / swapped_rows;
  IL_CHECK(p.groups * order.tiles_m * row_tiles <= kMaxGemmTiles, "grouped_gemm: ", p.groups, " groups of ",
           order.tiles_m, " x ", row_tiles, " swapped tiles are more than the ", kMaxGemmTiles, " supported");
  // A position is a cluster tile: cluster_n row tiles side by side.
  const int64_t cluster_rows = int64_t{swapped_rows} * order.cluster_n;
  *tiles = static_cast<int32_t>(p.groups * order.tiles_m * ((p.capacity + cluster_rows - 1) / cluster_rows));
  return order;
}

GroupedGemmProblem check_grouped_gemm_operands(const char* op, const TensorView& a, const TensorView& b,
                                               const TensorView* out_or_null, const TensorView& rows, int device) {
  // Without an out (a fused op's epilogue stores elsewhere) its checks are those of a as out would be.
  const TensorView& out = out_or_null ? *out_or_null : a;
  GroupedGemmProblem p;
  IL_CHECK(is_dtype(a.dtype, kDLBfloat, 16) || is_dtype(a.dtype, kDLFloat, 16), op, ": a has dtype ", a.dtype_name(),
           "; supported are bfloat16 and float16");
  IL_CHECK(b.dtype.code == a.dtype.code && b.dtype.bits == a.dtype.bits && out.dtype.code == a.dtype.code &&
               out.dtype.bits == a.dtype.bits,
           op, ": a, b and out must share a dtype; got ", a.dtype_name(), ", ", b.dtype_name(), ", ",
           out.dtype_name());
  p.dtype = is_dtype(a.dtype, kDLBfloat, 16) ? GemmDtype::kBf16 : GemmDtype::kF16;
  IL_CHECK(is_dtype(rows.dtype, kDLInt, 32), op, ": rows has dtype ", rows.dtype_name(),
           "; it must be int32 (a row count per group)");
  IL_CHECK(a.shape.size() == 3 && b.shape.size() == 3 && (!out_or_null || out.shape.size() == 3),
           op, ": a, b and out must be 3-D ([G, C, K], [G, K, N], [G, C, N]); got ", a.shape_string(), ", ",
           b.shape_string(), ", ", out.shape_string());
  IL_CHECK(rows.shape.size() == 1, op, ": rows must be 1-D (a row count per group); got ",
           rows.shape_string());
  p.groups = a.shape[0];
  p.capacity = a.shape[1];
  p.k = a.shape[2];
  p.n = b.shape[2];
  IL_CHECK(b.shape[0] == p.groups && b.shape[1] == p.k &&
               (!out_or_null || (out.shape[0] == p.groups && out.shape[1] == p.capacity && out.shape[2] == p.n)),
           op, ": shapes do not chain: a ", a.shape_string(), " @ b ", b.shape_string(), " -> out ",
           out.shape_string(), " (a is [G, C, K], b [G, K, N], out [G, C, N]; for Linear weights w [G, N, K] pass ",
           "w.transpose(1, 2))");
  IL_CHECK(rows.shape[0] == p.groups, op, ": rows has ", rows.shape[0], " counts but a has G = ", p.groups,
           " groups");
  IL_CHECK(p.groups <= kMaxGemmDim && p.capacity <= kMaxGemmDim && p.n <= kMaxGemmDim && p.k <= kMaxGemmDim,
           op, ": G, C, N and K must be at most 2^31 - 1024; got G = ", p.groups, ", C = ", p.capacity,
           ", N = ", p.n, ", K = ", p.k);

  // As in gemm, an operand without elements is neither read nor written, so its strides do not
  // matter: G = 0 leaves nothing at all, C = 0 no a or out, N = 0 no b or out, K = 0 no a or b (out's
  // first rows[g] rows of each group are then zeros).
  const bool a_has = p.groups > 0 && p.capacity > 0 && p.k > 0;
  const bool b_has = p.groups > 0 && p.k > 0 && p.n > 0;
  const bool out_has = out_or_null && p.groups > 0 && p.capacity > 0 && p.n > 0;
  if (a_has) {
    IL_CHECK(stride_of(a, 2) == 1 || p.k == 1, op, ": a's rows must be K-contiguous (a[g] row-major)");
    p.lda = stride_of(a, 1);
    p.group_a = p.groups == 1 ? 0 : stride_of(a, 0);
    check_strides(op, "a", p.lda, p.k, "K", p.group_a, p.groups, p.capacity, "C");
    // TMA reads rows that start on 16-byte boundaries: the base, and the strides checked above.
    IL_CHECK(aligned16(a.data), op, ": a must start 16-byte aligned");
  }
  if (b_has) {
    if (stride_of(b, 2) == 1 && p.n > 1) {
      p.b_k_major = false;
      p.ldb = stride_of(b, 1);
    } else if (stride_of(b, 1) == 1) {
      p.b_k_major = true;  // e.g. w.transpose(1, 2) of Linear weights [G, N, K]
      p.ldb = stride_of(b, 2);
    } else {
      IL_FAIL(op, ": b must be [G, K, N] with N or K contiguous (w.transpose(1, 2) of Linear weights ",
              "[G, N, K]); its strides are neither");
    }
    p.group_b = p.groups == 1 ? 0 : stride_of(b, 0);
    if (p.b_k_major) {
      check_strides(op, "b", p.ldb, p.k, "K", p.group_b, p.groups, p.n, "N");
    } else {
      check_strides(op, "b", p.ldb, p.n, "N", p.group_b, p.groups, p.k, "K");
    }
    IL_CHECK(aligned16(b.data), op, ": b must start 16-byte aligned");
  }
  if (out_has) {
    IL_CHECK(stride_of(out, 2) == 1 || p.n == 1, op, ": out's rows must be N-contiguous (out[g] row-major)");
    p.ldc = stride_of(out, 1);
    p.group_out = p.groups == 1 ? 0 : stride_of(out, 0);
    // The epilogue stores pairs of elements and TMA-aligned rows; the zeros for K = 0 too.
    check_strides(op, "out", p.ldc, p.n, "N", p.group_out, p.groups, p.capacity, "C");
    IL_CHECK(aligned16(out.data), op, ": out must start 16-byte aligned");
  }
  if (p.groups > 0) {
    // Every CTA reads its group's count straight from rows: one int32 per group, side by side.
    IL_CHECK(stride_of(rows, 0) == 1 || p.groups == 1, op, ": rows must be contiguous; its stride is ",
             stride_of(rows, 0));
    IL_CHECK(reinterpret_cast<uintptr_t>(rows.data) % 4 == 0, op, ": rows must start 4-byte aligned (int32)");
  }

  // The kernel reads a, b and rows while other CTAs already store out: any shared byte is a race (and
  // a count overwritten by a product would change which rows a group computes).
  // Without an out, an empty range: it overlaps nothing.
  const ByteRange out_bytes = out_or_null ? gemm_operand::byte_range(out, op, "out") : ByteRange{};
  IL_CHECK(!out_bytes.overlaps(gemm_operand::byte_range(a, op, "a")),
           op, ": out overlaps a in memory; write the product to a separate tensor");
  IL_CHECK(!out_bytes.overlaps(gemm_operand::byte_range(b, op, "b")),
           op, ": out overlaps b in memory; write the product to a separate tensor");
  IL_CHECK(!out_bytes.overlaps(gemm_operand::byte_range(rows, op, "rows")),
           op, ": out overlaps rows in memory; write the product to a separate tensor");

  // Last, so that tests on the CPU reach every other check.
  const std::pair<const char*, const TensorView*> named[] = {{"a", &a}, {"b", &b}, {"out", &out}, {"rows", &rows}};
  for (const auto& [name, t] : named) {
    IL_CHECK(t->device.device_type == kDLCUDA && t->device.device_id == device, op, ": ", name, " is on ",
             t->device_string(), " but the GPU is cuda:", device);
  }
  return p;
}

GroupedGemmProblem check_grouped_gemm_args(const TensorView& a, const TensorView& b, const TensorView& out,
                                           const TensorView& rows, int device) {
  return check_grouped_gemm_operands("grouped_gemm", a, b, &out, rows, device);
}

}  // namespace interlace
