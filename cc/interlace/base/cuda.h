// CUDA runtime and driver access that works on machines without a GPU.
//
// cudart is linked statically and loads libcuda.so.1 only when first used, so importing the
// library needs no driver. Driver functions (the cuMem* VMM calls, stream memory operations) are
// resolved at run time through cudaGetDriverEntryPointByVersion; a missing driver or GPU becomes a
// clear interlace::Error.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "interlace/base/error.h"

namespace interlace {

// Driver entry points the runtime uses, resolved once.
struct DriverApi {
  decltype(&::cuMemCreate) cuMemCreate;
  decltype(&::cuMemRelease) cuMemRelease;
  decltype(&::cuMemExportToShareableHandle) cuMemExportToShareableHandle;
  decltype(&::cuMemImportFromShareableHandle) cuMemImportFromShareableHandle;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve;
  decltype(&::cuMemAddressFree) cuMemAddressFree;
  decltype(&::cuMemMap) cuMemMap;
  decltype(&::cuMemUnmap) cuMemUnmap;
  decltype(&::cuMemSetAccess) cuMemSetAccess;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity;
  decltype(&::cuGetErrorString) cuGetErrorString;
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute;
  // A dmabuf of heap memory, for RDMA registration (ibv_reg_dmabuf_mr) across nodes.
  decltype(&::cuMemGetHandleForAddressRange) cuMemGetHandleForAddressRange;
  // Stream memory operations: copy-engine work that waits for and raises flags (ag_gemm).
  decltype(&::cuStreamWaitValue32) cuStreamWaitValue32;
  decltype(&::cuStreamWriteValue32) cuStreamWriteValue32;
};

// Raises when there is no driver or no GPU, saying so.
const DriverApi& driver();

// Number of visible CUDA devices; raises "no CUDA GPU is present" when there are none.
int require_gpus();

// Raises unless `device` is a Hopper GPU (sm_90), which the GEMM engine's wgmma, TMA and register
// reallocation need; op names the caller.
void require_hopper(int device, const char* op);

// The GPU's peak HBM bandwidth per SM, bytes per second (memory clock x bus width, two transfers a
// clock, over the SMs); 0 where the GPU does not say. Asked once per device: the memory clock is a
// slow attribute (asked on every gemm call, it held small GEMMs to 52-320 TFLOP/s on an H100, the GPU
// idle between launches; bench/results/NOTES.md, twenty-second session).
double hbm_bytes_per_sm(int device);

// Makes `device` current for its lifetime and then restores the caller's current device: library
// calls never leave the caller on another GPU.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

namespace detail {
[[noreturn]] void raise_cuda(const char* file, int line, const char* expr, cudaError_t err);
[[noreturn]] void raise_cu(const char* file, int line, const char* expr, CUresult err);
}  // namespace detail
}  // namespace interlace

#define IL_CUDA_CHECK(expr)                                                       \
  do {                                                                            \
    cudaError_t il_err_ = (expr);                                                 \
    if (il_err_ != cudaSuccess) ::interlace::detail::raise_cuda(__FILE__, __LINE__, #expr, il_err_); \
  } while (0)

#define IL_CU_CHECK(expr)                                                         \
  do {                                                                            \
    CUresult il_res_ = (expr);                                                    \
    if (il_res_ != CUDA_SUCCESS) ::interlace::detail::raise_cu(__FILE__, __LINE__, #expr, il_res_); \
  } while (0)
