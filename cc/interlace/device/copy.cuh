// Block-wide memory copy for any byte count and alignment, as wide as the two pointers allow.
#pragma once

#include <cstdint>

namespace interlace::device {

// Copies n vectors of type V with the whole CTA. kUnroll independent loads per thread are in flight
// before their stores, which is what keeps a remote (NVLink) read stream busy.
template <typename V, int kUnroll>
__device__ __forceinline__ void block_copy_vectors(V* __restrict__ dst, const V* __restrict__ src, uint64_t n) {
  const uint64_t step = static_cast<uint64_t>(blockDim.x) * kUnroll;
  uint64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * blockDim.x < n; i += step) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * blockDim.x];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * blockDim.x] = v[u];
  }
  for (; i < n; i += blockDim.x) dst[i] = src[i];
}

__device__ __forceinline__ void block_copy_bytes(char* dst, const char* src, uint64_t n) {
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Peels bytes until dst is V-aligned (src then is too, since their distance is a multiple of V),
// copies the body as V, then the tail bytes.
template <typename V>
__device__ __forceinline__ void block_copy_as(char* dst, const char* src, uint64_t bytes) {
  constexpr uint64_t kV = sizeof(V);
  uint64_t head = (kV - reinterpret_cast<uintptr_t>(dst) % kV) % kV;
  if (head > bytes) head = bytes;
  block_copy_bytes(dst, src, head);
  const uint64_t body = (bytes - head) / kV;
  block_copy_vectors<V, 4>(reinterpret_cast<V*>(dst + head), reinterpret_cast<const V*>(src + head), body);
  const uint64_t done = head + body * kV;
  block_copy_bytes(dst + done, src + done, bytes - done);
}

__device__ __forceinline__ void block_copy(char* dst, const char* src, uint64_t bytes) {
  const uintptr_t distance = reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src);
  if (distance % 16 == 0) {
    block_copy_as<uint4>(dst, src, bytes);
  } else if (distance % 8 == 0) {
    block_copy_as<uint2>(dst, src, bytes);
  } else if (distance % 4 == 0) {
    block_copy_as<uint32_t>(dst, src, bytes);
  } else if (distance % 2 == 0) {
    block_copy_as<uint16_t>(dst, src, bytes);
  } else {
    block_copy_bytes(dst, src, bytes);
  }
}

}  // namespace interlace::device
