// Keeps device/proxy_transport.h compiling for the GPU: no kernel uses ProxyTransport yet, and the
// CPU tests compile it for the host only. Nothing launches or links this kernel.
#include "interlace/device/proxy_transport.h"

namespace interlace {

__global__ void proxy_transport_device_check(const __grid_constant__ device::ProxyTransport params,
                                             const __grid_constant__ device::WaitContext wait, uint64_t* flag,
                                             int32_t* result) {
  device::ProxyTransport t = params;  // each posting thread holds its own copy (the held put lives there)
  const device::ProxySend put = t.put(1, 0, t.heap + 64, 128);
  const device::ProxySend sent = t.signal(1, flag, 1);
  const device::ProxySend pair = t.put_signal(1, 0, t.heap, 16, flag, 1);
  const uint64_t seen = t.wait(flag, 2, wait, FlagId::kDone, 1);
  result[threadIdx.x] = static_cast<int32_t>(put) + static_cast<int32_t>(sent) + static_cast<int32_t>(pair) +
                        static_cast<int32_t>(seen);
}

}  // namespace interlace
