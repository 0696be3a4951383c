// ag_gemm over NVLink: out = all_gather(a_shard) @ b in one launch of the GEMM engine.
//
// The engine (gemm/sm90_gemm_tma_warpspecialized.cuh) runs as for a plain GEMM on the gathered A,
// a symmetric buffer at the same heap offset on every rank, with three hooks filled in:
//   Phases::begin    the op handshake (device/op_sequence.cuh): peers run the same call, and their
//                    previous op is done with the gathered buffer this rank is about to write;
//   the transfer     (AgGemmTransfer) one of:
//                    - copy engines (launch.cu): the helper warps of every CTA stage this
//                      rank's shard in its landing buffer (a copy within one GPU runs on SMs,
//                      which the GEMM holds, so it cannot be left to the copy engines) and CTA 0
//                      tells the peers; a side stream pulls each peer's shard from its landing
//                      buffer as soon as it is staged, chunk by chunk, raising a flag per chunk
//                      with stream writes. Peer copies run on the copy engines: the GEMM keeps
//                      every SM.
//                    - SM pushes (Phases::copy, on copy_ctas CTAs set aside from the GEMM): this
//                      rank's shard goes chunk by chunk into every rank's gathered buffer (rank + 1,
//                      rank + 2, ...: the order in which they need it; its own last), each chunk's
//                      flag raised there once its stores are visible;
//                    either way the kernel then waits for every chunk (Phases::helpers, or the
//                    copier CTAs), so that `gathered` is whole and the side stream done waiting
//                    when it ends; with the copy engines it also waits until every peer has pulled
//                    this rank's shard (finish_pulls), whose landing buffer is free once it ends;
//   InputWait        before the producer loads a tile's A rows, it waits for the flags of the chunks
//                    that hold them, then fence.proxy.async so that TMA (the async proxy) sees what
//                    the peers' SM stores (the generic proxy) wrote.
// The tile order (AgGemmOrder) starts with this rank's own shard, whose tiles read it in place (a
// second TMA descriptor for A, with no wait), and follows the order in which the others arrive, so
// the tensor cores have work while the network is busy.
#pragma once

#include <cstdint>

#include "cutlass/arch/barrier.h"
#include "interlace/device/op_sequence.cuh"
#include "interlace/device/transport.cuh"
#include "interlace/ops/ag_gemm/flags.h"
#include "interlace/ops/ag_gemm/plan.h"

namespace interlace {

// What the hooks share: where the shards are and go, and how they are cut.
struct AgGemmShared {
  device::NvlinkTransport transport;
  device::WaitContext wait;
  uint64_t signature;       // the call's, for the op handshake
  AgGemmRows rows;          // tile_m: the GEMM's tile rows (128)
  const char* shard;        // this rank's rows, [rows of this rank, K]
  uint64_t gathered;        // heap offset of the gathered A ([M, K]) on every rank
  int64_t row_bytes;        // K * element size, a multiple of 16
  int64_t chunk_rows;
  int32_t copy_ctas;        // CTAs set aside to push (Phases::copy)
  bool copy_engine;         // the copy engines move the shards; else copy_ctas CTAs push them
  bool own_in_place;        // tiles of this rank's rows alone load them from shard (mainloop_alt)
};

namespace ag_gemm_detail {

__device__ __forceinline__ AgGemmFlags& flags(const device::NvlinkTransport& t) {
  return *op_flags<AgGemmFlags, OpId::kAgGemm>(t.my_pad());
}

// What a chunk flag is raised to (AgGemmFlags says why a constant).
constexpr uint64_t kArrived = 1;

// Copy engines: lets the side stream past every wait of this call (a call that stops early).
__device__ __forceinline__ void release_side_stream(const AgGemmShared& p) {
  AgGemmFlags& f = flags(p.transport);
  for (int q = 0; q < p.transport.local_size; ++q) device::store_release_sys(&f.staged[q], 1);
}

// Per CTA, in shared memory: chunks 0 .. verified[q] - 1 of rank q have landed (the producer has
// seen their flags). Tiles visit a shard's rows in ascending bands, so one count per shard lets
// most tiles skip their flags and the proxy fence altogether.
__device__ __forceinline__ int32_t* verified_chunks() {
  __shared__ int32_t verified[kMaxLocalRanks];
  return verified;
}

__device__ __forceinline__ int64_t chunks_of(const AgGemmShared& s, int q) {
  return (s.rows.start[q + 1] - s.rows.start[q] + s.chunk_rows - 1) / s.chunk_rows;
}

// Copies bytes (a multiple of 16, both ends 16-byte aligned) with `threads` threads, kUnroll vectors
// in flight per thread (what keeps NVLink stores streaming).
template <int kUnroll>
__device__ __forceinline__ void copy_vectors(char* dst, const char* src, uint64_t bytes, int thread, int threads) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  const uint64_t n = bytes / 16;
  const uint64_t step = static_cast<uint64_t>(threads) * kUnroll;
  uint64_t i = thread;
  for (; i + (kUnroll - 1) * threads < n; i += step) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * threads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * threads] = v[u];
  }
  for (; i < n; i += threads) d[i] = s[i];
}

// SM pushes: pusher `worker` of `workers` (threads thread of threads, which share named barrier 0)
// pushes chunks worker, worker + workers, ... of this rank's shard to every rank, peers first,
// rank + 1 first (the order in which they need it); this rank's own copy last, since its own tiles
// read the shard in place (own_in_place): only tiles that span shards, which come later, and
// `gathered` need it.
template <int kUnroll>
__device__ __forceinline__ void push(const AgGemmShared& p, int worker, int workers, int thread, int threads) {
  const device::NvlinkTransport& t = p.transport;
  const int me = t.local_rank;
  const int64_t chunks = chunks_of(p, me);
  const int64_t my_rows = p.rows.start[me + 1] - p.rows.start[me];
  AgGemmFlags& f = flags(t);
  for (int k = 1; k <= t.local_size; ++k) {
    const int q = (me + k) % t.local_size;
    for (int64_t c = worker; c < chunks; c += workers) {
      const int64_t first = c * p.chunk_rows;
      const int64_t rows = min(p.chunk_rows, my_rows - first);
      const uint64_t at = p.gathered + static_cast<uint64_t>((p.rows.start[me] + first) * p.row_bytes);
      copy_vectors<kUnroll>(t.heaps[q] + at, p.shard + first * p.row_bytes, static_cast<uint64_t>(rows * p.row_bytes),
                            thread, threads);
      cutlass::arch::NamedBarrier::sync(threads, 0);  // the chunk's stores are all issued
      if (thread == 0) t.signal(q, &f.arrived[me][c], kArrived);
    }
  }
}

// Waits for chunks worker, worker + workers, ... of every peer's shard, so that gathered is whole
// when the kernel ends, even where no tile needed them (N = 0).
__device__ __forceinline__ void settle(const AgGemmShared& p, int worker, int workers, int thread, int threads) {
  const device::NvlinkTransport& t = p.transport;
  AgGemmFlags& f = flags(t);
  int i = 0;
  for (int q = 0; q < t.local_size; ++q) {
    if (q == t.local_rank) continue;
    for (int64_t c = worker; c < chunks_of(p, q); c += workers, ++i) {
      if (i % threads == thread) t.wait(&f.arrived[q][c], kArrived, p.wait, FlagId::kChunk, q);
    }
  }
}

// Copy engines: stages this rank's shard in its landing buffer with the helper warps of every CTA
// (thread `thread` of `threads` per CTA, the same count in each), then, in CTA 0, raises this rank's
// chunk flags here and tells every peer that the shard may be pulled.
__device__ __forceinline__ void stage(const AgGemmShared& p, int thread, int threads) {
  const device::NvlinkTransport& t = p.transport;
  const int me = t.local_rank;
  AgGemmFlags& f = flags(t);
  const int64_t bytes = (p.rows.start[me + 1] - p.rows.start[me]) * p.row_bytes;
  char* landing = t.heaps[me] + p.gathered + static_cast<uint64_t>(p.rows.start[me] * p.row_bytes);
  copy_vectors<2>(landing, p.shard, static_cast<uint64_t>(bytes), static_cast<int>(blockIdx.x) * threads + thread,
                  static_cast<int>(gridDim.x) * threads);
  // Each warp counts itself once its lanes' stores are done (__syncwarp orders them before lane 0's
  // fence), so no barrier beyond the warp is needed.
  __syncwarp();
  if (thread % 32 == 0) {
    __threadfence_system();
    atomicAdd(reinterpret_cast<unsigned long long*>(&f.own_staged), 1ull);
  }
  if (blockIdx.x != 0 || thread != 0) return;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (threads / 32);
  if (t.wait(&f.own_staged, warps, p.wait, FlagId::kChunk, me) == 0) return;  // end() releases the side stream
  __threadfence_system();  // what the other warps staged (acquired above) before the flags below
  for (int64_t c = 0; c < chunks_of(p, me); ++c) device::store_release_gpu(&f.arrived[me][c], kArrived);
  for (int q = 0; q < t.local_size; ++q) {
    if (q != me) t.signal(q, &f.staged[me], 1);
  }
}

// Copy engines, CTA 0's first helper thread, after its settle: once every chunk of a peer's shard
// has landed here (its pulls are done), tells that peer; then waits until every peer has pulled this
// rank's shard, so that the landing buffer is not reused (or overwritten by the caller) under a pull.
__device__ __forceinline__ void finish_pulls(const AgGemmShared& p) {
  const device::NvlinkTransport& t = p.transport;
  const int me = t.local_rank;
  AgGemmFlags& f = flags(t);
  for (int q = 0; q < t.local_size; ++q) {
    if (q == me) continue;
    for (int64_t c = 0; c < chunks_of(p, q); ++c) {
      if (t.wait(&f.arrived[q][c], kArrived, p.wait, FlagId::kChunk, q) == 0) return;
    }
    t.signal(q, &f.pulled[me], 1);
  }
  for (int q = 0; q < t.local_size; ++q) {
    if (q != me && t.wait(&f.pulled[q], 1, p.wait, FlagId::kChunk, q) == 0) return;
  }
}

}  // namespace ag_gemm_detail

struct AgGemmPhases {
  using Params = AgGemmShared;
  static constexpr bool kEndRegisters = false;

  __device__ static bool begin(const Params& p) {
    // Zeroed before op_begin, whose __syncthreads orders it before the producer reads it.
    for (int q = threadIdx.x; q < kMaxLocalRanks; q += blockDim.x) ag_gemm_detail::verified_chunks()[q] = 0;
    const bool run = device::op_enter(p.transport, p.wait, p.signature);
    if (p.copy_engine && !run && blockIdx.x == 0 && threadIdx.x == 0) ag_gemm_detail::release_side_stream(p);
    return run;
  }

  // With the copy engines, the producer warpgroup's idle warps of every CTA stage this rank's
  // shard, then wait for the chunks of their CTA's share of the peers' shards; CTA 0 then trades
  // "pulled" with every peer (finish_pulls).
  __device__ static void helpers(const Params& p, int thread, int threads) {
    using namespace ag_gemm_detail;
    if (!p.copy_engine) return;
    stage(p, thread, threads);
    settle(p, blockIdx.x, gridDim.x, thread, threads);
    if (blockIdx.x == 0 && thread == 0) finish_pulls(p);
  }

  __device__ static void copy(const Params& p, int cta, int ctas) {
    ag_gemm_detail::push<8>(p, cta, ctas, threadIdx.x, blockDim.x);
    ag_gemm_detail::settle(p, cta, ctas, threadIdx.x, blockDim.x);
  }

  // A call that failed anywhere on this rank (every failed wait marks the pad aborted) may leave
  // the side stream waiting for a peer that will never stage its shard: release it. A call that
  // succeeded has waited for every chunk, so its side stream is past its waits already.
  __device__ static void end(const Params& p) {
    if (p.copy_engine && threadIdx.x == 0 && device::device_aborted(p.transport.my_pad())) {
      ag_gemm_detail::release_side_stream(p);
    }
    device::op_end(p.transport);
  }
};

// Before a tile's A rows are loaded: the flags of every chunk that holds them and that this CTA has
// not seen land yet, with the chunks before them in their shard (the lanes of the producer warp
// share the waits), then a proxy fence if any was new. A failed wait (the group aborted, or the
// last-resort timeout) has recorded why and returns: the producer then loads whatever is there, so
// the consumers never wait forever, and the call raises afterwards.
struct AgGemmInputWait {
  using Params = AgGemmShared;

  __device__ static bool wait(const Params& p, int m_idx, int /*n_idx*/) {
    using namespace ag_gemm_detail;
    const device::NvlinkTransport& t = p.transport;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int me = t.local_rank;
    const int64_t lo = static_cast<int64_t>(m_idx) * p.rows.tile_m;
    const int64_t hi = min(lo + p.rows.tile_m, p.rows.m());
    if (lo >= hi) return false;
    if (p.own_in_place && lo >= p.rows.start[me] && hi <= p.rows.start[me + 1]) return true;
    int32_t* verified = verified_chunks();
    AgGemmFlags& f = flags(t);
    bool fresh = false;
    for (int q = p.rows.owner_of_row(lo); q <= p.rows.owner_of_row(hi - 1); ++q) {
      const int64_t last = min(hi, p.rows.start[q + 1]) - p.rows.start[q];  // rows of q in the tile end here
      if (last <= 0 || lo >= p.rows.start[q + 1]) continue;
      const int32_t need = static_cast<int32_t>((last + p.chunk_rows - 1) / p.chunk_rows);  // chunks 0 .. need - 1
      const int32_t from = verified[q];
      if (need <= from) continue;
      for (int32_t c = from + lane; c < need; c += 32) t.wait(&f.arrived[q][c], kArrived, p.wait, FlagId::kChunk, q);
      fresh = true;
      __syncwarp();
      if (lane == 0) verified[q] = need;
      __syncwarp();
    }
    // TMA (the async proxy) must see what the flags' writers stored through the generic proxy.
    if (fresh) asm volatile("fence.proxy.async.global;" ::: "memory");
    return false;
  }
};

}  // namespace interlace
