#include "interlace/gemm/args.h"

#include "interlace/base/error.h"

namespace interlace {
namespace {

bool is(const DLDataType& t, uint8_t code) { return t.code == code && t.bits == 16 && t.lanes == 1; }

// Stride of dim i in elements (C-contiguous when strides are not given).
int64_t stride_of(const TensorView& t, int i) {
  if (!t.strides.empty()) return t.strides[i];
  int64_t s = 1;
  for (int j = static_cast<int>(t.shape.size()) - 1; j > i; --j) s *= t.shape[j];
  return s;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
  IL_CHECK(stride_of(a, 1) == 1 || p.k == 1, "gemm: a must be row-major (K contiguous)");
  IL_CHECK(stride_of(out, 1) == 1 || p.n == 1, "gemm: out must be row-major (N contiguous)");
  p.lda = stride_of(a, 0);
  p.ldc = stride_of(out, 0);
  // An empty product needs no layout: the launcher writes zeros or nothing.
  const bool empty = p.m == 0 || p.n == 0 || p.k == 0;
  if (!empty) {
    if (stride_of(b, 1) == 1 && p.n > 1) {
      p.b_k_major = false;
      p.ldb = stride_of(b, 0);
    } else if (stride_of(b, 0) == 1) {
      p.b_k_major = true;  // e.g. weight.t()
      p.ldb = stride_of(b, 1);
    } else {
      IL_FAIL("gemm: b must be row-major [K, N] or column-major (weight.t() of a [N, K] weight); its strides are neither");
    }
    IL_CHECK(p.lda >= p.k && p.ldc >= p.n && p.ldb >= (p.b_k_major ? p.k : p.n), "gemm: overlapping rows");
    // TMA reads rows that start on 16-byte boundaries; the epilogue stores pairs of elements.
    IL_CHECK(p.lda % 8 == 0 && aligned16(a.data), "gemm: a's rows must be 16-byte aligned (K a multiple of 8); K = ", p.k);
    IL_CHECK(p.ldb % 8 == 0 && aligned16(b.data), "gemm: b's rows must be 16-byte aligned (",
             p.b_k_major ? "K" : "N", " a multiple of 8)");
    IL_CHECK(p.ldc % 8 == 0 && aligned16(out.data), "gemm: out's rows must be 16-byte aligned (N a multiple of 8); N = ",
             p.n);
  }
  for (const TensorView* t : {&a, &b, &out}) {
    IL_CHECK(t->device.device_type == kDLCUDA && t->device.device_id == device, "gemm: a tensor is on ",
             t->device_string(), " but the GPU is cuda:", device);
  }
  return p;
}

}  // namespace interlace
