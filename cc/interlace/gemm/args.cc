#include "interlace/gemm/args.h"

#include "interlace/base/error.h"
#include "interlace/gemm/operand.h"

namespace interlace {
namespace {

using gemm_operand::aligned16;
using gemm_operand::ByteRange;
using gemm_operand::stride_of;

bool is(const DLDataType& t, uint8_t code) { return gemm_operand::is_dtype(t, code, 16); }

}  // namespace

GemmProblem check_gemm_args(const TensorView& a, const TensorView& b, const TensorView& out, int device) {
  GemmProblem p;
  IL_CHECK(is(a.dtype, kDLBfloat) || is(a.dtype, kDLFloat), "gemm: a has dtype ", a.dtype_name(),
           "; supported are bfloat16 and float16");
  IL_CHECK(b.dtype.code == a.dtype.code && b.dtype.bits == a.dtype.bits && out.dtype.code == a.dtype.code &&
               out.dtype.bits == a.dtype.bits,
           "gemm: a, b and out must share a dtype; got ", a.dtype_name(), ", ", b.dtype_name(), ", ", out.dtype_name());
  p.dtype = is(a.dtype, kDLBfloat) ? GemmDtype::kBf16 : GemmDtype::kF16;
  IL_CHECK(a.shape.size() == 2 && b.shape.size() == 2 && out.shape.size() == 2, "gemm: a, b and out must be 2-D; got ",
           a.shape_string(), ", ", b.shape_string(), ", ", out.shape_string());
  p.m = a.shape[0];
  p.k = a.shape[1];
  p.n = b.shape[1];
  IL_CHECK(b.shape[0] == p.k && out.shape[0] == p.m && out.shape[1] == p.n, "gemm: shapes do not chain: a ",
           a.shape_string(), " @ b ", b.shape_string(), " -> out ", out.shape_string(),
           " (b is [K, N]; for a Linear weight [N, K] pass weight.t())");
  IL_CHECK(p.m <= kMaxGemmDim && p.n <= kMaxGemmDim && p.k <= kMaxGemmDim,
           "gemm: M, N and K must be at most 2^31 - 1024; got M = ", p.m, ", N = ", p.n, ", K = ", p.k);

  // An operand without elements is neither read nor written: the launcher writes zeros (K = 0) or
  // nothing (M or N = 0), so its strides do not matter.
  if (p.m > 0 && p.k > 0) {
    IL_CHECK(stride_of(a, 1) == 1 || p.k == 1, "gemm: a must be row-major (K contiguous)");
    p.lda = stride_of(a, 0);
    IL_CHECK(p.lda >= p.k, "gemm: a's rows overlap (row stride ", p.lda, " < K = ", p.k, ")");
    IL_CHECK(p.lda < kMaxGemmRowStride, "gemm: a's row stride ", p.lda, " is beyond TMA's 2^40-byte limit");
    // TMA reads rows that start on 16-byte boundaries.
    IL_CHECK(p.lda % 8 == 0 && aligned16(a.data), "gemm: a's rows must be 16-byte aligned (K a multiple of 8); K = ",
             p.k);
  }
  if (p.k > 0 && p.n > 0) {
    if (stride_of(b, 1) == 1 && p.n > 1) {
      p.b_k_major = false;
      p.ldb = stride_of(b, 0);
    } else if (stride_of(b, 0) == 1) {
      p.b_k_major = true;  // e.g. weight.t()
      p.ldb = stride_of(b, 1);
    } else {
      IL_FAIL("gemm: b must be row-major [K, N] or column-major (weight.t() of a [N, K] weight); its strides are",
              " neither");
    }
    IL_CHECK(p.ldb >= (p.b_k_major ? p.k : p.n), "gemm: b's rows overlap (stride ", p.ldb, ")");
    IL_CHECK(p.ldb < kMaxGemmRowStride, "gemm: b's stride ", p.ldb, " is beyond TMA's 2^40-byte limit");
    IL_CHECK(p.ldb % 8 == 0 && aligned16(b.data), "gemm: b's rows must be 16-byte aligned (",
             p.b_k_major ? "K" : "N", " a multiple of 8)");
  }
  if (p.m > 0 && p.n > 0) {
    IL_CHECK(stride_of(out, 1) == 1 || p.n == 1, "gemm: out must be row-major (N contiguous)");
    p.ldc = stride_of(out, 0);
    IL_CHECK(p.ldc >= p.n, "gemm: out's rows overlap (row stride ", p.ldc, " < N = ", p.n, ")");
    IL_CHECK(p.ldc < kMaxGemmRowStride, "gemm: out's row stride ", p.ldc, " is beyond 2^39 elements");
    // The epilogue stores pairs of elements; the zeros for K = 0 are a 2-D memset of whole rows.
    IL_CHECK(p.ldc % 8 == 0 && aligned16(out.data),
             "gemm: out's rows must be 16-byte aligned (N a multiple of 8); N = ", p.n);
  }

  // The kernel reads a and b while other CTAs already store out: any shared byte is a race.
  const ByteRange out_bytes = gemm_operand::byte_range(out, "gemm", "out");
  IL_CHECK(!out_bytes.overlaps(gemm_operand::byte_range(a, "gemm", "a")),
           "gemm: out overlaps a in memory; write the product to a separate tensor");
  IL_CHECK(!out_bytes.overlaps(gemm_operand::byte_range(b, "gemm", "b")),
           "gemm: out overlaps b in memory; write the product to a separate tensor");

  for (const TensorView* t : {&a, &b, &out}) {
    IL_CHECK(t->device.device_type == kDLCUDA && t->device.device_id == device, "gemm: a tensor is on ",
             t->device_string(), " but the GPU is cuda:", device);
  }
  return p;
}

bool overlap_2d(const TensorView& a, const TensorView& b) {
  return gemm_operand::byte_range(a, "gemm", "a tensor").overlaps(gemm_operand::byte_range(b, "gemm", "a tensor"));
}

}  // namespace interlace
