// Block-wide memory copy for any byte count and alignment, with 16-byte stores whatever the alignment.
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

// The 16 bytes that start 4 * kWord + shift / 8 bytes into lo and run on into hi. kWord is a template
// argument so that the words are picked by constant indices, in registers.
template <int kWord>
__device__ __forceinline__ uint4 bytes_across(const uint4& lo, const uint4& hi, uint32_t shift) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  return make_uint4(__funnelshift_r(w[kWord], w[kWord + 1], shift), __funnelshift_r(w[kWord + 1], w[kWord + 2], shift),
                    __funnelshift_r(w[kWord + 2], w[kWord + 3], shift), __funnelshift_r(w[kWord + 3], w[kWord + 4], shift));
}

// dst[i] = the 16 bytes at offset 4 * kWord + shift / 8 of src[i], src[i + 1], for i < n, with the whole
// CTA (of full warps): src is aligned and lags the wanted bytes, so each store needs two adjacent
// loaded vectors. Each warp takes kUnroll runs of 32 consecutive vectors, one after the other, so the
// vector a lane needs besides its own is its right neighbour's, fetched by a shuffle; the last lane's
// comes from lane 0's next run, and after the last run from one extra load by lane 0. A vector is
// loaded only if i <= n: src[n] still holds wanted bytes (the offset is not 0), nothing past it is.
// Loop bounds are uniform across the CTA, so every lane of a warp reaches each shuffle.
template <int kWord, int kUnroll>
__device__ __forceinline__ void block_copy_shifted(uint4* __restrict__ dst, const uint4* __restrict__ src, uint64_t n,
                                                   uint32_t shift) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t right = (lane + 1) % 32;
  const uint32_t step = blockDim.x * kUnroll;
  const uint32_t own = (threadIdx.x - lane) * kUnroll + lane;  // this lane's first vector in each step
  const uint32_t next = own - lane + 32 * kUnroll;              // the vector after this warp's runs
  // 32-bit indices within a step, and runs of a constant 32, keep this within all_gather's register
  // budget (40 at 3 CTAs of 512 threads).
  for (uint64_t left = n; left > 0; left -= min(left, static_cast<uint64_t>(step)), src += step, dst += step) {
    const uint32_t end = static_cast<uint32_t>(min(left, static_cast<uint64_t>(step)));
    uint4 v[kUnroll + 1] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (own + 32 * u <= end) v[u] = src[own + 32 * u];
    }
    if (lane == 0 && next <= end) v[kUnroll] = src[next];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint4 give = lane == 0 ? v[u + 1] : v[u];  // lane 0 feeds the last lane of run u
      const uint4 hi = make_uint4(__shfl_sync(~0u, give.x, right), __shfl_sync(~0u, give.y, right),
                                  __shfl_sync(~0u, give.z, right), __shfl_sync(~0u, give.w, right));
      if (own + 32 * u < end) dst[own + 32 * u] = bytes_across<kWord>(v[u], hi, shift);
    }
  }
}

// Copies with the whole CTA (every thread must call it, with the same arguments; blockDim is 1-D).
// Peels bytes until dst is 16-byte aligned, stores the body as 16-byte vectors, then the tail bytes.
// When src is then not aligned too, the body loads the aligned 16-byte words around the source bytes
// and shifts them into place: narrower accesses are several times slower over NVLink. Only aligned
// words holding at least one source byte are read, so no read crosses into another page.
__device__ __forceinline__ void block_copy(char* dst, const char* src, uint64_t bytes) {
  constexpr int kUnroll = 4;
  uint64_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
  if (head > bytes) head = bytes;
  block_copy_bytes(dst, src, head);
  uint64_t n = (bytes - head) / 16;
  uint4* body = reinterpret_cast<uint4*>(dst + head);
  const uint32_t offset = reinterpret_cast<uintptr_t>(src + head) % 16;
  const uint4* words = reinterpret_cast<const uint4*>(src + head - offset);
  const uint32_t shift = offset % 4 * 8;
  if (offset == 0) {
    block_copy_vectors<uint4, kUnroll>(body, words, n);
  } else if (blockDim.x % 32 != 0) {
    n = 0;  // the shifted body trades words within full warps; the tail bytes take it all
  } else if (offset < 4) {
    block_copy_shifted<0, kUnroll>(body, words, n, shift);
  } else if (offset < 8) {
    block_copy_shifted<1, kUnroll>(body, words, n, shift);
  } else if (offset < 12) {
    block_copy_shifted<2, kUnroll>(body, words, n, shift);
  } else {
    block_copy_shifted<3, kUnroll>(body, words, n, shift);
  }
  const uint64_t done = head + n * 16;
  block_copy_bytes(dst + done, src + done, bytes - done);
}

}  // namespace interlace::device
