// A framework-neutral view of a tensor: what DLPack describes, without ownership.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

namespace interlace {

struct TensorView {
  void* data = nullptr;
  DLDevice device{kDLCPU, 0};
  DLDataType dtype{kDLFloat, 32, 1};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty means C-contiguous

  int64_t numel() const;
  size_t itemsize() const { return (static_cast<size_t>(dtype.bits) * dtype.lanes + 7) / 8; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  bool contiguous() const;
  std::string dtype_name() const;
  std::string shape_string() const;
  std::string device_string() const;
};

// Whether two dense (C-contiguous) tensors share a byte; a tensor without elements shares none.
bool bytes_overlap(const TensorView& a, const TensorView& b);

// What an op requires of a tensor its kernels move as dense rows: C-contiguous, on CUDA GPU `device`
// (`gpu` says whose, in the message), starting `align`-byte aligned. Raises interlace::Error naming
// op and tensor. A tensor without elements has no address to check.
void check_placed(const char* op, const char* name, const TensorView& t, int device, size_t align,
                  const char* gpu = "the group's GPU");

}  // namespace interlace
