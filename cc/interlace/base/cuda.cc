#include "interlace/base/cuda.h"

#include <atomic>
#include <mutex>
#include <string>

namespace interlace {
namespace detail {

void raise_cuda(const char* file, int line, const char* expr, cudaError_t err) {
  raise(file, line, concat(expr, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

void raise_cu(const char* file, int line, const char* expr, CUresult err) {
  const char* text = "unknown driver error";
  if (driver().cuGetErrorString) driver().cuGetErrorString(err, &text);
  raise(file, line, concat(expr, " failed: CUresult ", static_cast<int>(err), " (", text, ")"));
}

}  // namespace detail

int require_gpus() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || count == 0) {
    cudaGetLastError();
    IL_FAIL("no CUDA GPU is present on this machine (", cudaGetErrorString(err),
            "); interlace's groups and ops need NVIDIA GPUs");
  }
  IL_CUDA_CHECK(err);
  return count;
}

double hbm_bytes_per_sm(int device) {
  constexpr int kCachedDevices = 64;
  static std::atomic<double> known[kCachedDevices] = {};  // racing first calls store the same value
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    const double bytes = known[device].load(std::memory_order_relaxed);
    if (bytes > 0) return bytes;
  }
  int clock_khz = 0, bus_bits = 0, sms = 0;
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (clock_khz <= 0 || bus_bits <= 0 || sms <= 0) return 0;
  const double bytes = 2.0 * clock_khz * 1e3 * bus_bits / 8 / sms;
  if (cached) known[device].store(bytes, std::memory_order_relaxed);
  return bytes;
}

void require_hopper(int device, const char* op) {
  int major = 0, minor = 0;
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  IL_CHECK(major == 9 && minor == 0, op, ": the engine needs a Hopper GPU (sm_90), this is sm_", major, minor);
}

namespace {

template <typename Fn>
void resolve(const char* name, Fn& fn) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &found);
  IL_CHECK(err == cudaSuccess && found == cudaDriverEntryPointSuccess && ptr != nullptr,
           "CUDA driver function ", name, " is unavailable (", cudaGetErrorString(err),
           "): is an NVIDIA driver (libcuda.so.1, CUDA 12 or newer) installed?");
  fn = reinterpret_cast<Fn>(ptr);
}

}  // namespace

const DriverApi& driver() {
  static DriverApi api{};
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    try {
      require_gpus();
      resolve("cuGetErrorString", api.cuGetErrorString);
      resolve("cuMemCreate", api.cuMemCreate);
      resolve("cuMemRelease", api.cuMemRelease);
      resolve("cuMemExportToShareableHandle", api.cuMemExportToShareableHandle);
      resolve("cuMemImportFromShareableHandle", api.cuMemImportFromShareableHandle);
      resolve("cuMemAddressReserve", api.cuMemAddressReserve);
      resolve("cuMemAddressFree", api.cuMemAddressFree);
      resolve("cuMemMap", api.cuMemMap);
      resolve("cuMemUnmap", api.cuMemUnmap);
      resolve("cuMemSetAccess", api.cuMemSetAccess);
      resolve("cuMemGetAllocationGranularity", api.cuMemGetAllocationGranularity);
      resolve("cuDeviceGetAttribute", api.cuDeviceGetAttribute);
      resolve("cuMemGetHandleForAddressRange", api.cuMemGetHandleForAddressRange);
      resolve("cuStreamWaitValue32", api.cuStreamWaitValue32);
      resolve("cuStreamWriteValue32", api.cuStreamWriteValue32);
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw Error(failure);
  return api;
}

}  // namespace interlace

namespace interlace {

DeviceGuard::DeviceGuard(int device) {
  IL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) IL_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace interlace
