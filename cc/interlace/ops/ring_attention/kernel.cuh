// Ring attention in one launch: every rank's K/V block travels around the ring over NVLink while the
// attention engine (attention/sm90_attention.cuh) computes on the blocks that have landed.
//
// The grid is a few sender CTAs plus the compute CTAs, up to one per SM, each taking query tiles from
// a queue. CTAs take their role from a ticket in the order they start, senders first: a sender must
// be running before anyone waits for it, and the compute CTAs behind the senders start only once
// they finish. Per launch:
//   1. every CTA makes the op handshake (device/op_sequence.cuh): every peer runs this call, and has
//      finished the previous one, so nothing still reads the receive slots stores land in;
//   2. sender c, for each step s < W - 1, forwards piece c, c + senders, ... of step s's block (its
//      own K/V at step 0, then what rank - 1 sent) into rank + 1's receive slot for step s + 1, and
//      raises the piece's landing flag there; from step 1 on it first waits for the piece to land here;
//   3. a compute CTA takes query tiles (tile, head, batch) from the queue in the plan's order
//      (heaviest first) and runs each against step 0's block (its own K/V), then each later step's,
//      its waiter warp waiting for the pieces of a key tile to land before the producer (after a
//      proxy fence, for TMA) loads it. Under the causal mask with the zigzag sharding, the plan names
//      the (query half, key half) pairs a step computes, full or on the diagonal (ring_attention/plan.h).
// All flags grow across calls (op number x 128 + step), so a captured graph replays correctly; the
// role and tile counters are zeroed by each call's last CTA.
#pragma once

#include <cstdint>

#include "interlace/attention/sm90_attention.cuh"
#include "interlace/device/op_sequence.cuh"
#include "interlace/device/transport.cuh"
#include "interlace/ops/ring_attention/plan.h"

namespace interlace {

template <class Config>
struct RingAttentionParams {
  attention_engine::Params<Config> attn;  // tma_k_recv, tma_v_recv: the receive slots
  device::NvlinkTransport transport;
  device::WaitContext wait;
  uint64_t signature;
  RingAttentionPlan plan;
  const char* k;        // this rank's K and V, [B, rows_k, Hkv, D]
  const char* v;
  uint64_t recv;        // heap offset of the receive slots, [W - 1][K, V][B, rows_recv, Hkv, D]
  int32_t senders;      // CTAs that forward blocks (0 for one rank); the rest compute plan.query_tile()s
};

namespace ring_attention_detail {

// The next number from a counter: 0, 1, ... in the order callers get here (CTAs' roles, compute
// CTAs' tiles). One atomicAdd: a compare-and-swap loop, which all CTAs of a launch enter at once, let
// one CTA through per round trip, and the last of 132 got its role about 0.1 ms late, twice over
// (seventeenth session). The counters are zero at a call's start: its last CTA out resets them.
__device__ inline int take_ticket(unsigned int* counter) { return static_cast<int>(atomicAdd(counter, 1u)); }

// The keys a compute CTA visits: per step, its own K/V first, then the blocks of ranks r-1, r-2, ...
// as they land; per step up to two segments, the halves of the block the plan pairs with the CTA's
// query half.
struct RingSchedule {
  static constexpr bool kWaits = true;  // wait_keys waits on other GPUs' flags: a waiter warp
  const RingAttentionPlan& plan;
  int32_t query_half;  // 0 or 1 (causal); without the mask query tiles span the shard whole
  const device::NvlinkTransport& transport;
  const device::WaitContext& wait;
  const uint64_t& op;  // in shared memory (ring_attention_kernel): no register holds it

  __device__ int segments() const { return 2 * plan.world; }

  __device__ attention_engine::KeySegment segment(int g, const attention_engine::QueryTile&) const {
    const int s = g / 2, half = g % 2;
    const int origin = plan.kv_origin(plan.rank, s);
    const int slot = s == 0 ? -1 : RingAttentionPlan::slot_of_step(s);
    if (!plan.causal) {  // the whole block at once
      return attention_engine::KeySegment{slot, 0, half == 0 ? static_cast<int32_t>(plan.local_rows(origin)) : 0, 0, s};
    }
    const RingBlockKind kind = plan.kind(plan.rank, query_half, origin, half);
    const int rows = kind == RingBlockKind::kMasked ? 0 : static_cast<int>(plan.chunk_rows(plan.chunk_of(origin, half)));
    const int row0 = half == 0 ? 0 : static_cast<int>(plan.chunk_rows(origin));
    return attention_engine::KeySegment{slot, row0, rows, kind == RingBlockKind::kDiagonal ? 1 : 0, s};
  }

  // The waiter thread (attention_tiles), before the producer loads the box of keys [lo, hi) of
  // (batch, KV head): from step 1 on, the pieces under it must have landed, those past the segment
  // too (their rows are masked, but must not be stale: see send). `seen` is the piece last seen
  // landed, as step x kRingAttentionMaxPieces + piece (-1: none), which it returns updated: the
  // waiter goes down a segment's tiles and each tile's pieces, so a tile's first piece is the next
  // one's last. A failed wait (a dead peer, an abort) is recorded and the loads go ahead on whatever
  // is there: the consumers never hang, and the host raises the fault. On the producer warpgroup's
  // 24 registers (56 at D = 64): the flags come from the transport (kernel parameters) at each use.
  __device__ int wait_keys(const attention_engine::KeySegment& seg, int batch, int head_kv, int lo, int hi,
                           int seen) const {
    hi = min(hi, static_cast<int>(plan.max_local_rows()));  // past the slot, TMA reads zeros
    if (seg.step == 0 || hi <= lo) return seen;
    const int first = plan.piece_of(batch, head_kv, lo), last = plan.piece_of(batch, head_kv, hi - 1);
    for (int piece = last; piece >= first; --piece) {  // one or two pieces (a tile is within flag_rows)
      const int key = seg.step * kRingAttentionMaxPieces + piece;
      if (key == seen) continue;
      RingAttentionFlags* flags = op_flags<RingAttentionFlags, OpId::kRingAttention>(transport.my_pad());
      transport.wait(&flags->landed[piece], RingAttentionPlan::landed_value(op, seg.step), wait, FlagId::kLanded,
                     plan.recv_from());
      seen = key;
    }
    return seen;  // the producer fences the async proxy before its TMA reads what landed
  }
};

// A persistent compute CTA's tiles (attention_engine's Source): the next query tile of the queue, in
// the plan's order, until none is left.
struct RingSource {
  static constexpr bool kOneTile = false;
  const RingAttentionPlan& plan;
  const device::NvlinkTransport& transport;
  const device::WaitContext& wait;
  const uint64_t& op;  // in shared memory (ring_attention_kernel)

  // The producer thread's, on 24 registers (56 at D = 64): the flags come from the transport.
  __device__ attention_engine::QueryTile next() {
    const int x = take_ticket(&op_flags<RingAttentionFlags, OpId::kRingAttention>(transport.my_pad())->tiles);
    return x < plan.work_tiles() ? engine_tile(plan.query_tile(x)) : attention_engine::QueryTile{};
  }
  __device__ static attention_engine::QueryTile engine_tile(const RingAttentionPlan::QueryTile& q) {
    return attention_engine::QueryTile{q.batch, q.head, q.row0, q.rows, q.offset, q.half};
  }
  __device__ RingSchedule schedule(const attention_engine::QueryTile& tile) const {
    return RingSchedule{plan, tile.part, transport, wait, op};
  }
};

// Rows [r0, r1) of (batch, KV head) of one K or V tensor into another, 16 bytes a thread at a time;
// rows are kRowBytes apart in neither (heads interleave), so each is its own run.
template <int kRowBytes>
__device__ __forceinline__ void copy_rows(char* dst, int64_t dst_row_stride, const char* src, int64_t src_row_stride,
                                          int r0, int r1) {
  constexpr int kVectors = kRowBytes / 16;
  constexpr int kUnroll = 4;
  const int vec = threadIdx.x % kVectors;
  const int rows_per_pass = blockDim.x / kVectors;
  for (int row = r0 + static_cast<int>(threadIdx.x) / kVectors; row < r1; row += rows_per_pass * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row + u * rows_per_pass;
      if (r < r1) v[u] = reinterpret_cast<const uint4*>(src + r * src_row_stride)[vec];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int r = row + u * rows_per_pass;
      if (r < r1) reinterpret_cast<uint4*>(dst + r * dst_row_stride)[vec] = v[u];
    }
  }
}

template <int kRowBytes>
__device__ __forceinline__ void zero_rows(char* dst, int64_t row_stride, int r0, int r1) {
  constexpr int kVectors = kRowBytes / 16;
  for (int i = static_cast<int>(threadIdx.x); i < (r1 - r0) * kVectors; i += blockDim.x) {
    reinterpret_cast<uint4*>(dst + (r0 + i / kVectors) * row_stride)[i % kVectors] = make_uint4(0, 0, 0, 0);
  }
}

// Sender `sender`: forwards its pieces of every step's block to rank + 1.
template <class Config>
__device__ void send(const RingAttentionParams<Config>& p, RingAttentionFlags& flags, uint64_t op, int sender) {
  using Element = typename Config::Element;
  constexpr int kRowBytes = Config::kHeadDim * sizeof(Element);
  const RingAttentionPlan& plan = p.plan;
  const device::NvlinkTransport& t = p.transport;
  const int next = plan.send_to();
  const int64_t heads = plan.heads_kv;
  const int64_t row_stride = heads * kRowBytes;
  const int64_t slot_rows = p.attn.rows_recv;
  const int64_t tensor_bytes = static_cast<int64_t>(plan.batch) * slot_rows * row_stride;  // one K or V in a slot
  char* mine = t.heaps[t.local_rank] + p.recv;
  char* theirs = t.heaps[next] + p.recv;
  __shared__ int failed;
  for (int s = 0; s + 1 < plan.world; ++s) {
    const int rows = static_cast<int>(plan.local_rows(plan.kv_origin(plan.rank, s)));
    const int64_t src_rows = s == 0 ? p.attn.rows_k : slot_rows;
    for (int piece = sender; piece < plan.pieces(); piece += p.senders) {
      const int per_head = plan.pieces_per_head();
      const int bh = piece / per_head, part = piece % per_head;
      const int b = bh / plan.heads_kv, h = bh % plan.heads_kv;
      const int r0 = part * plan.flag_rows, r1 = min(r0 + plan.flag_rows, rows);
      if (threadIdx.x == 0) {
        failed = 0;
        if (s > 0 && t.wait(&flags.landed[piece], RingAttentionPlan::landed_value(op, s), p.wait, FlagId::kLanded,
                            plan.recv_from()) == 0) {
          failed = 1;
        }
      }
      __syncthreads();
      if (failed) return;  // recorded: the group is aborted, and every waiter stops
      // The piece's rows of a slot: the block's, then zeros up to the slot's end (shards differ by up
      // to 2 rows), so that a key tile's box, which may run past the block, reads nothing stale: its
      // scores are masked, but 0 x NaN in P V is still NaN.
      const int64_t head_offset = h * static_cast<int64_t>(kRowBytes);
      const int64_t dst_offset = (2 * RingAttentionPlan::slot_of_step(s + 1)) * tensor_bytes + b * slot_rows * row_stride +
                                 head_offset;
      if (r0 < r1) {
        const int64_t src_offset = b * src_rows * row_stride + head_offset;
        const char* src_k = s == 0 ? p.k : mine + (2 * RingAttentionPlan::slot_of_step(s)) * tensor_bytes;
        const char* src_v = s == 0 ? p.v : src_k + tensor_bytes;
        copy_rows<kRowBytes>(theirs + dst_offset, row_stride, src_k + src_offset, row_stride, r0, r1);
        copy_rows<kRowBytes>(theirs + dst_offset + tensor_bytes, row_stride, src_v + src_offset, row_stride, r0, r1);
      }
      const int z0 = max(r0, rows), z1 = min(part * plan.flag_rows + plan.flag_rows, static_cast<int>(slot_rows));
      zero_rows<kRowBytes>(theirs + dst_offset, row_stride, z0, z1);
      zero_rows<kRowBytes>(theirs + dst_offset + tensor_bytes, row_stride, z0, z1);
      __syncthreads();
      if (threadIdx.x == 0) t.signal(next, &flags.landed[piece], RingAttentionPlan::landed_value(op, s + 1));
    }
  }
}

}  // namespace ring_attention_detail

// The compute CTAs, one per SM or fewer where there are fewer query tiles, take query tiles from a
// queue (RingSource): a CTA per tile paid its start and end (the op handshake, the role ticket,
// op_end: a chain of global memory round trips) on every tile. The queue made the causal ring 0.5-4%
// faster on one GPU (fourteenth session) and, once its tickets were one atomicAdd, the ring without
// the mask 0.5-1.5% (seventeenth). bench/results/NOTES.md.
template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    ring_attention_kernel(const __grid_constant__ RingAttentionParams<Config> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace ring_attention_detail;
  const device::NvlinkTransport& t = p.transport;
  if (!device::op_enter(t, p.wait, p.signature)) return;
  RingAttentionFlags& flags = *op_flags<RingAttentionFlags, OpId::kRingAttention>(t.my_pad());
  // The op's number, as op_begin read it: ops of a group run one at a time, so it is completed + 1.
  // In shared memory, where the compute CTAs' producer and waiter read it at each use: a register
  // holding it across their setmaxnreg.dec to 24 would be spilled.
  __shared__ uint64_t op;
  __shared__ int ticket;
  if (threadIdx.x == 0) {
    op = *reinterpret_cast<volatile uint64_t*>(&t.my_pad()->ops.completed) + 1;
    ticket = take_ticket(&flags.ticket);
  }
  __syncthreads();
  const int role = ticket;
  if (role < p.senders) {
    send(p, flags, op, role);
  } else {
    extern __shared__ __align__(1024) char smem[];
    auto& shared = *reinterpret_cast<typename Config::SharedStorage*>(smem);
    RingSource source{p.plan, t, p.wait, op};
    // 192-key tiles need 240 consumer registers, which leaves the producer warpgroup 24: enough
    // since its flag waits run in a warp of their own (attention_tiles' waiter).
    constexpr bool kWide = Config::kTileK > 128;
    attention_engine::attention_tiles<Config, RingSource, kWide ? 24 : 56, kWide ? 240 : 224>(p.attn, source, shared);
    // The producer's warp comes back diverged (one lane issued the loads): reconverge it before the
    // __syncthreads below, aligned barriers every lane of a warp must reach together.
    __syncwarp();
  }
  // Every CTA took its tickets before it got here: the last one zeroes the counters for the next call
  // (an aborted call's are never read again: every later call stops at op_enter).
  if (device::last_cta_to_arrive(&flags.arrived) && threadIdx.x == 0) {
    flags.ticket = 0;
    flags.tiles = 0;
  }
  device::op_end(t);
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a GPU without sm_90a: stop rather than leave out unwritten
#endif
}

}  // namespace interlace
