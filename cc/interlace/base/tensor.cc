#include "interlace/base/tensor.h"

#include <cstdint>

#include "interlace/base/error.h"

namespace interlace {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorView::contiguous() const {
  if (strides.empty() || numel() == 0) return true;  // an empty tensor's strides say nothing
  int64_t expected = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

bool bytes_overlap(const TensorView& a, const TensorView& b) {
  const auto lo_a = reinterpret_cast<uintptr_t>(a.data), lo_b = reinterpret_cast<uintptr_t>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && lo_a < lo_b + b.nbytes() && lo_b < lo_a + a.nbytes();
}

void check_placed(const char* op, const char* name, const TensorView& t, int device, size_t align, const char* gpu) {
  IL_CHECK(t.contiguous(), op, ": ", name, " must be contiguous (C order), its strides are not");
  IL_CHECK(t.device.device_type == kDLCUDA && t.device.device_id == device, op, ": ", name, " is on ",
           t.device_string(), " but ", gpu, " is cuda:", device);
  const size_t misaligned = reinterpret_cast<uintptr_t>(t.data) % align;
  IL_CHECK(misaligned == 0 || t.numel() == 0, op, ": ", name, " must start ", align, "-byte aligned; it starts at byte ",
           misaligned, " of ", align);
}

std::string TensorView::dtype_name() const {
  std::string base;
  switch (dtype.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case 6: return "bool";  // kDLBool, newer than the DLPack 0.6 header Debian ships
    case kDLComplex: base = "complex"; break;
    default: base = "dtype(code=" + std::to_string(dtype.code) + ")";
  }
  std::string name = base + std::to_string(dtype.bits);
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string TensorView::device_string() const {
  switch (device.device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda:" + std::to_string(device.device_id);
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    default: return "device_type " + std::to_string(device.device_type);
  }
}

}  // namespace interlace
