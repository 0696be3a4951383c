#include "interlace/gemm/operand.h"

#include "interlace/base/error.h"

namespace interlace::gemm_operand {

int64_t stride_of(const TensorView& t, int i) {
  if (!t.strides.empty()) return t.strides[i];
  int64_t s = 1;
  for (int j = static_cast<int>(t.shape.size()) - 1; j > i; --j) s *= t.shape[j];
  return s;
}

ByteRange byte_range(const TensorView& t, const char* op, const char* name) {
  ByteRange r;
  for (int64_t d : t.shape) {
    if (d == 0) return r;
  }
  __int128 low = 0, high = 0;  // element offsets of the lowest and highest elements
  for (int i = 0; i < static_cast<int>(t.shape.size()); ++i) {
    const __int128 reach = static_cast<__int128>(stride_of(t, i)) * (t.shape[i] - 1);
    (reach < 0 ? low : high) += reach;
  }
  const auto base = static_cast<__int128>(reinterpret_cast<uintptr_t>(t.data));
  const auto item = static_cast<__int128>(t.itemsize());
  r.lo = base + low * item;
  r.hi = base + (high + 1) * item;
  IL_CHECK(r.lo >= 0 && r.hi <= (static_cast<__int128>(1) << 64), op, ": ", name, " (", t.shape_string(),
           ") has strides that reach outside the address space");
  return r;
}

}  // namespace interlace::gemm_operand
