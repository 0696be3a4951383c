// What the GEMMs' argument checks (args.cc, grouped_args.cc) ask of a tensor's layout in memory.
#pragma once

#include <cstdint>

#include "interlace/base/tensor.h"

namespace interlace::gemm_operand {

// Stride of dim i in elements (C-contiguous when strides are not given).
int64_t stride_of(const TensorView& t, int i);

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether t is the scalar type (code, bits): kDLBfloat / kDLFloat 16, kDLInt 32.
inline bool is_dtype(const DLDataType& t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

// The bytes from a tensor's lowest element to the end of its highest; empty without elements.
// In 128 bits: a DLPack view may claim any strides, and this runs before anything bounds them.
struct ByteRange {
  __int128 lo = 0, hi = 0;
  bool empty() const { return lo == hi; }
  bool overlaps(const ByteRange& o) const { return !empty() && !o.empty() && lo < o.hi && o.lo < hi; }
};

// Raises, naming op and the tensor, where the strides reach outside the address space.
ByteRange byte_range(const TensorView& t, const char* op, const char* name);

}  // namespace interlace::gemm_operand
