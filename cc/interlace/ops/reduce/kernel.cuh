// reduce_scatter and all_reduce (sum) over NVLink: one kernel, in three algorithms (ops/reduce/plan.h).
//
// Senders push with SM stores (stores beat loads over NVLink: bench/results/NOTES.md), in rounds of
// chunks as all_gather: CTA b moves chunk b, b + num_blocks, ... of every share, one per round, and
// talks only to CTA b of the other ranks. Per launch, CTA b:
//   1. makes the op handshake (device/op_sequence.cuh): every peer has started this op, so its
//      previous op no longer reads the staging this rank's stores land in, and runs the same call;
//   2. step s < rounds: pushes chunk s of share q into owner q's staging slot for this rank, for every
//      peer q, then raises partial[b][me] = seq + s + 1 on every peer (seq: the CTA's steps over all
//      launches, the same on every rank);
//   3. step s >= 1: once partial[b][*] >= seq + s on this rank, sums chunk s - 1 of its own share in
//      rank order (its own partial read in place from inp), in fp32, rounds once, writes it to out;
//      two-shot: pushes that reduced chunk to every peer (into the peer's landing slot for this rank,
//      or into its out when out is symmetric) and raises reduced[b][me] = seq + rounds + s;
//   4. two-shot into a landing buffer, step s >= 2: once reduced[b][*] >= seq + rounds + s - 1, copies
//      chunk s - 2 of every peer's reduced share from the landing buffer into out.
// Each stage runs a round behind the one before, so NVLink stays busy while this CTA sums or copies.
// All counters live in device memory and only grow, so a captured CUDA graph replays correctly.
//
// In place (all_reduce with out == inp) is safe: every byte of inp is read by the CTA whose chunk
// holds it, in the step that pushes that chunk (or, for the own share, by the very thread that then
// writes the sum there), before anything writes that chunk of out: the own share's sum comes a step
// later, peers' reduced chunks only after those peers summed this rank's pushed partials.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "interlace/device/copy.cuh"
#include "interlace/device/op_sequence.cuh"
#include "interlace/device/transport.cuh"
#include "interlace/ops/reduce/flags.h"
#include "interlace/ops/reduce/plan.h"

namespace interlace {

template <class Transport>
struct ReduceParams {
  Transport transport;
  device::WaitContext wait;
  uint64_t signature;
  ReducePlan plan;             // plan.rank is this rank (a single node: global rank == local rank)
  const char* inp;             // the whole message (reduce_scatter: world shares, share q at q * share_bytes)
  char* out;                   // reduce_scatter: this rank's share; all_reduce: the whole message
  uint64_t staging;            // heap offset of the partials' slots, the same on every rank
  const char* staging_here;    // this rank's staging as mapped here
  uint64_t landing;            // two-shot: heap offset of the landing slots, or of out when it is symmetric
  const char* landing_here;    // two-shot into landing slots: this rank's as mapped here; else null
};

constexpr int kReduceThreads = 512;
// Two CTAs per SM (64 registers each thread): the sums and three copy paths spill at all_gather's
// three (40 registers); still 264 CTAs on an H200 keep many NVLink stores in flight.
constexpr int kReduceMinBlocksPerSm = 2;

namespace reduce_detail {

// 16 bytes of T <-> kPerVec floats, in registers: bit operations on the 32-bit words, never an
// array of T in memory.
template <class T>
struct Elements;

template <>
struct Elements<float> {
  static constexpr int kPerVec = 4;
  __device__ static void unpack(const uint4& v, float (&f)[4]) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
  }
  __device__ static uint4 pack(const float (&f)[4]) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
  __device__ static float load(const char* p) { return *reinterpret_cast<const float*>(p); }
  __device__ static void store(char* p, float f) { *reinterpret_cast<float*>(p) = f; }
};

// Two 16-bit elements per word, the lower one first (little-endian, as in memory).
template <class Bits>
struct Elements16 {
  static constexpr int kPerVec = 8;
  __device__ static void unpack(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = Bits::to_float(static_cast<uint16_t>(w[i] & 0xffff));
      f[2 * i + 1] = Bits::to_float(static_cast<uint16_t>(w[i] >> 16));
    }
  }
  __device__ static uint4 pack(const float (&f)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = uint32_t{Bits::from_float(f[2 * i])} | uint32_t{Bits::from_float(f[2 * i + 1])} << 16;
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
  __device__ static float load(const char* p) { return Bits::to_float(*reinterpret_cast<const uint16_t*>(p)); }
  __device__ static void store(char* p, float f) { *reinterpret_cast<uint16_t*>(p) = Bits::from_float(f); }
};

struct HalfBits {  // round to nearest even, once
  __device__ static float to_float(uint16_t b) { return __half2float(__ushort_as_half(b)); }
  __device__ static uint16_t from_float(float f) { return __half_as_ushort(__float2half_rn(f)); }
};
struct Bfloat16Bits {
  __device__ static float to_float(uint16_t b) { return __uint_as_float(uint32_t{b} << 16); }
  __device__ static uint16_t from_float(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};

template <>
struct Elements<__half> : Elements16<HalfBits> {};
template <>
struct Elements<__nv_bfloat16> : Elements16<Bfloat16Bits> {};

// Thread q < world, q != rank, speaks for peer q: it raises that peer's flags and waits on the ones
// that peer raises here.
template <class P>
__device__ __forceinline__ bool speaks_for_peer(const P& p) {
  return threadIdx.x < p.plan.world && threadIdx.x != p.plan.rank;
}

// Waits until every peer's counter in row[] (this CTA's row of partial or reduced) reaches value.
// Callers __syncthreads after and then read *failed.
template <class P>
__device__ __forceinline__ void wait_peers(const P& p, const uint64_t* row, uint64_t value, FlagId id, int* failed) {
  if (!speaks_for_peer(p)) return;
  const int q = threadIdx.x;
  if (p.transport.wait(&row[q], value, p.wait, id, q) == 0) *failed = 1;
}

// The bytes of share q that chunk `round` of this CTA covers: [lo, lo + n), n possibly 0.
template <class P>
__device__ __forceinline__ uint64_t chunk_size(const P& p, int32_t q, uint64_t lo) {
  const uint64_t size = p.plan.share_size(q);
  return lo < size ? min(p.plan.chunk_bytes, size - lo) : 0;
}

// Sender s's partial: `own` for this rank, else its staging slot.
__device__ __forceinline__ const char* partial(const char* own, const char* slots, uint64_t stride, int32_t s,
                                               int32_t me) {
  return s == me ? own : slots + ReducePlan::slot(s, me) * stride;
}

// dst[0, n) = the world's partials summed in rank order in fp32, rounded once (sum_in_rank_order):
// partial s is `own` for s == rank, else slot(s, rank) of `slots`. 16-byte vectors, kUnroll of them
// in flight per thread (8 elements); a tail of fewer than 16 bytes (only at the end of an all_reduce message) in
// scalars. The same thread reads element i of `own` and writes element i of dst, so own may be dst.
template <class T, class P>
__device__ __forceinline__ void reduce_range(const P& p, const char* own, const char* slots, char* dst, uint64_t n) {
  using E = Elements<T>;
  constexpr int kUnroll = 8 / E::kPerVec;  // 8 fp32 sums per thread: more spill out of 64 registers
  const int32_t world = p.plan.world, me = p.plan.rank;
  const uint64_t stride = p.plan.share_bytes;
  const uint64_t vectors = n / 16;
  uint4* out = reinterpret_cast<uint4*>(dst);
  for (uint64_t i = threadIdx.x; i < vectors; i += kUnroll * blockDim.x) {
    float sum[kUnroll][E::kPerVec];
    for (int32_t s = 0; s < world; ++s) {
      const uint4* src = reinterpret_cast<const uint4*>(partial(own, slots, stride, s, me));
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint64_t j = i + u * blockDim.x;
        v[u] = j < vectors ? src[j] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float f[E::kPerVec];
        E::unpack(v[u], f);
#pragma unroll
        for (int e = 0; e < E::kPerVec; ++e) sum[u][e] = s == 0 ? f[e] : sum[u][e] + f[e];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t j = i + u * blockDim.x;
      if (j < vectors) out[j] = E::pack(sum[u]);
    }
  }
  const uint64_t body = vectors * 16;
  for (uint64_t at = body + threadIdx.x * sizeof(T); at < n; at += blockDim.x * sizeof(T)) {
    E::store(dst + at, sum_in_rank_order(world, [=](int32_t s) { return E::load(partial(own, slots, stride, s, me) + at); }));
  }
}

// A local copy between 16-byte aligned addresses (shares and chunks start at multiples of 16, the
// tensors are checked aligned): device::block_copy without its shifting paths, which cost registers.
__device__ __forceinline__ void copy_aligned(char* dst, const char* src, uint64_t bytes) {
  const uint64_t body = bytes / 16 * 16;
  device::block_copy_vectors<uint4, 4>(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), body / 16);
  device::block_copy_bytes(dst + body, src + body, bytes - body);
}

// Step 2 for round r: this rank's copy of chunk r of every peer's share, into that peer's staging.
template <class P>
__device__ __forceinline__ void push_partials(const P& p, ReduceFlags& flags, uint64_t seq, int32_t r) {
  const ReducePlan& plan = p.plan;
  const int32_t me = plan.rank;
  const uint64_t lo = plan.chunk_begin(r, blockIdx.x);
  for (int32_t k = 1; k < plan.world; ++k) {  // start at the next rank so that peers spread their writes
    const int32_t q = (me + k) % plan.world;
    p.transport.put(q, p.staging + ReducePlan::slot(me, q) * plan.share_bytes + lo, p.inp + plan.share_begin(q) + lo,
                    chunk_size(p, q, lo));
  }
  __syncthreads();
  if (speaks_for_peer(p)) p.transport.signal(threadIdx.x, &flags.partial[blockIdx.x][me], seq + r + 1);
}

// Step 3 for round r: sum chunk r of this rank's share; two-shot: push it to every peer. Returns
// false if a wait failed (the group is aborted; the host raises).
template <class T, class P>
__device__ __forceinline__ bool reduce_round(const P& p, ReduceFlags& flags, uint64_t seq, int32_t r, int* failed) {
  const ReducePlan& plan = p.plan;
  const int32_t me = plan.rank;
  wait_peers(p, flags.partial[blockIdx.x], seq + r + 1, FlagId::kPartial, failed);
  __syncthreads();
  if (*failed) return false;
  const uint64_t lo = plan.chunk_begin(r, blockIdx.x);
  const uint64_t n = chunk_size(p, me, lo);
  // reduce_scatter's out is the share itself; all_reduce's out is the whole message.
  const uint64_t at = (plan.algorithm == ReduceAlgorithm::kReduceScatter ? 0 : plan.share_begin(me)) + lo;
  char* dst = p.out + at;
  reduce_range<T>(p, p.inp + plan.share_begin(me) + lo, p.staging_here + lo, dst, n);
  if (plan.algorithm != ReduceAlgorithm::kTwoShot) return true;
  __syncthreads();  // the whole chunk's sum is in out, for every thread to push
  for (int32_t k = 1; k < plan.world; ++k) {
    const int32_t q = (me + k) % plan.world;
    const uint64_t landing = p.landing_here ? p.landing + ReducePlan::slot(me, q) * plan.share_bytes + lo : p.landing + at;
    p.transport.put(q, landing, dst, n);
  }
  __syncthreads();
  if (speaks_for_peer(p)) p.transport.signal(threadIdx.x, &flags.reduced[blockIdx.x][me], seq + plan.rounds + r + 1);
  return true;
}

// Step 4 for round r: copy chunk r of every peer's reduced share from the landing slots into out.
template <class P>
__device__ __forceinline__ bool copy_reduced(const P& p, ReduceFlags& flags, uint64_t seq, int32_t r, int* failed) {
  const ReducePlan& plan = p.plan;
  const int32_t me = plan.rank;
  wait_peers(p, flags.reduced[blockIdx.x], seq + plan.rounds + r + 1, FlagId::kReduced, failed);
  __syncthreads();
  if (*failed) return false;
  const uint64_t lo = plan.chunk_begin(r, blockIdx.x);
  for (int32_t k = 1; k < plan.world; ++k) {
    const int32_t q = (me + k) % plan.world;
    copy_aligned(p.out + plan.share_begin(q) + lo, p.landing_here + ReducePlan::slot(q, me) * plan.share_bytes + lo,
                 chunk_size(p, q, lo));
  }
  return true;
}

}  // namespace reduce_detail

// T: __half, __nv_bfloat16 or float; kOp: kReduceScatter or kAllReduce (whose flag region it uses).
template <class Transport, class T, OpId kOp>
__global__ void __launch_bounds__(kReduceThreads, kReduceMinBlocksPerSm)
    reduce_kernel(const __grid_constant__ ReduceParams<Transport> p) {
  using namespace reduce_detail;
  const Transport& t = p.transport;
  if (!device::op_enter(t, p.wait, p.signature)) return;
  ReduceFlags& flags = *op_flags<ReduceFlags, kOp>(t.my_pad());
  __shared__ uint64_t seq;
  __shared__ int failed;
  if (threadIdx.x == 0) {
    seq = flags.steps[blockIdx.x];
    failed = 0;
  }
  __syncthreads();

  const ReducePlan& plan = p.plan;
  const bool two_shot = plan.algorithm == ReduceAlgorithm::kTwoShot;
  const bool staged = two_shot && p.landing_here != nullptr;
  const int32_t lag = staged ? 2 : 1;  // how many steps the last stage runs behind the pushes
  for (int32_t s = 0; s < plan.rounds + lag; ++s) {
    if (s < plan.rounds) push_partials(p, flags, seq, s);
    if (s >= 1 && s - 1 < plan.rounds && !reduce_round<T>(p, flags, seq, s - 1, &failed)) return;
    if (staged && s >= 2 && !copy_reduced(p, flags, seq, s - 2, &failed)) return;
  }
  if (two_shot && !staged) {  // owners stored into out itself: it is whole once all their chunks landed
    wait_peers(p, flags.reduced[blockIdx.x], seq + 2 * static_cast<uint64_t>(plan.rounds), FlagId::kReduced, &failed);
    __syncthreads();
    if (failed) return;
  }
  if (threadIdx.x == 0) flags.steps[blockIdx.x] = seq + plan.steps();
  device::op_end(t);
}

}  // namespace interlace
