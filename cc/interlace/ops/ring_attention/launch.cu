#include "interlace/ops/ring_attention/launch.h"

#include <algorithm>
#include <cmath>

#include "interlace/attention/args.h"
#include "interlace/base/cuda.h"
#include "interlace/ops/ring_attention/kernel.cuh"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

using detail::concat;

// CTAs that forward blocks, by default: enough to keep NVLink busy (each pushes its pieces with
// 16-byte stores), few enough that the SMs they hold while the blocks travel cost little compute.
constexpr int kSenders = 16;
constexpr int kMaxSenders = 128;

// The launch's shape: sender CTAs, then the compute CTAs, one per SM or fewer where there are fewer
// query tiles, which take the tiles from a queue. At least one CTA, so that an empty call still takes
// its place in the op sequence. The compute CTAs behind the senders start as these finish.
struct RingGrid {
  int32_t senders = 0;
  int64_t ctas = 1;
};

// Keys per tile: 192 at D = 128, whose consumers get 240 registers (ring_attention_kernel), 128 at
// D = 64. The plan's tile_k must be the kernel's, which by_dim picks by head size, as here.
int key_tile(const AttentionProblem& a) { return a.head_dim == 128 ? 192 : 128; }

RingGrid ring_grid(const RingAttentionPlan& plan, int sender_ctas, int num_sms) {
  RingGrid g;
  g.senders = plan.world > 1 ? std::min(sender_ctas > 0 ? sender_ctas : kSenders, plan.pieces()) : 0;
  g.ctas = std::max<int64_t>(1, g.senders + std::min<int64_t>(plan.work_tiles(), num_sms));
  return g;
}

template <class Element, int kHeadDim, int kTileK>
void launch(OpCall& call, Group& group, const AttentionProblem& a, const RingAttentionPlan& plan, const RingGrid& grid,
            uint64_t signature, uint64_t recv, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
            const TensorView* lse) {
  using Config = attention_engine::Config<Element, kHeadDim, kTileK>;
  RingAttentionParams<Config> p{};
  attention_engine::Params<Config>& attn = p.attn;
  const int64_t slot_rows = plan.max_local_rows();
  const int64_t slots = std::max(plan.world - 1, 1);
  const auto* recv_k = reinterpret_cast<const Element*>(group.heap().local_base() + recv);
  const auto* recv_v = recv_k + a.batch * slot_rows * a.heads_kv * kHeadDim;
  // An empty shard is never read, but its descriptors need an address.
  const auto address = [&](const TensorView& t) { return static_cast<const Element*>(a.seq_q > 0 ? t.data : recv_k); };
  attn.tma_q = Config::tma_q(address(q), a.batch, a.seq_q, a.heads_q);
  attn.tma_k = Config::tma_k(address(k), a.batch, a.seq_k, a.heads_kv, 1);
  attn.tma_v = Config::tma_v(address(v), a.batch, a.seq_k, a.heads_kv, 1);
  // A slot holds a block's K, then its V: both views step two tensors from slot to slot.
  const int64_t slot_stride = 2 * a.batch * slot_rows * a.heads_kv * kHeadDim;
  attn.tma_k_recv = Config::tma_k(recv_k, a.batch, slot_rows, a.heads_kv, slots, slot_stride);
  attn.tma_v_recv = Config::tma_v(recv_v, a.batch, slot_rows, a.heads_kv, slots, slot_stride);
  attn.out = static_cast<Element*>(out.data);
  attn.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  attn.batch = static_cast<int32_t>(a.batch);
  attn.rows_q = static_cast<int32_t>(a.seq_q);
  attn.rows_k = static_cast<int32_t>(a.seq_k);
  attn.rows_recv = static_cast<int32_t>(slot_rows);
  attn.slots = static_cast<int32_t>(slots);
  attn.heads_q = static_cast<int32_t>(a.heads_q);
  attn.heads_kv = static_cast<int32_t>(a.heads_kv);
  attn.scale = a.softmax_scale;
  attn.scale_log2 = static_cast<float>(a.softmax_scale * M_LOG2E);
  p.transport = call.nvlink();
  p.wait = call.wait_context();
  p.signature = signature;
  p.plan = plan;
  p.k = static_cast<const char*>(k.data);
  p.v = static_cast<const char*>(v.data);
  p.recv = recv;
  static_assert(Config::kTileQ == 128, "the plan's tile_q");
  p.senders = grid.senders;
  call.launch([&](cudaStream_t s) {  // within launch: a failure here aborts the group, as peers run
    auto kernel = ring_attention_kernel<Config>;
    const int smem = static_cast<int>(sizeof(typename Config::SharedStorage));
    IL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<static_cast<unsigned>(grid.ctas), Config::kThreads, smem, s>>>(p);
  });
}

}  // namespace

void ring_attention(Group& group, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView* lse, bool causal, double softmax_scale, int64_t seq_len, cudaStream_t stream,
                    int sender_ctas) {
  OpCall call(group, OpId::kRingAttention, stream);
  const Topology& topo = group.topology();
  AttentionProblem a;
  RingAttentionPlan plan;
  RingGrid grid;
  uint64_t recv = 0;
  const uint64_t signature = call.agree([&] {
    check_one_node(group, "ring_attention");
    // The local shard's checks are the plain attention's (causal there means S_q == S_k, which a
    // shard of q and of k satisfy), with the global mask decided below.
    a = check_attention_args(q, k, v, out, lse, false, softmax_scale, group.device());
    require_hopper(group.device(), "ring_attention");
    IL_CHECK(a.seq_q == a.seq_k, "ring_attention: q's shard has ", a.seq_q, " rows but k's ", a.seq_k,
             "; every rank holds the same rows of q, k and v");
    IL_CHECK(seq_len >= 0, "ring_attention: seq_len ", seq_len, " is negative (0 or None: world_size x S_local)");
    const int64_t seq = seq_len > 0 ? seq_len : a.seq_q * topo.world_size;
    plan = make_ring_attention_plan(topo.world_size, topo.rank, seq, causal, static_cast<int>(a.heads_q),
                                    static_cast<int>(a.heads_kv), 128, key_tile(a), static_cast<int>(a.batch));
    IL_CHECK(plan.local_rows(topo.rank) == a.seq_q, "ring_attention: rank ", topo.rank, "'s shard of a sequence of ",
             seq, " rows over ", topo.world_size, " ranks has ", plan.local_rows(topo.rank), " rows, but q has ",
             a.seq_q, seq_len > 0 ? "" : " (pass seq_len, the global length, where 2 x world_size does not divide it)");
    IL_CHECK(sender_ctas >= 0 && sender_ctas <= kMaxSenders, "ring_attention: sender_ctas ", sender_ctas,
             " is out of range: 0 (automatic, ", kSenders, ") to ", kMaxSenders);
    // The queue's tickets are ints, and every compute CTA takes one past the last tile: keep them all
    // far below 2^31.
    IL_CHECK(plan.work_tiles() < (int64_t{1} << 30), "ring_attention: ", plan.work_tiles(),
             " query tiles (128 rows of one head and batch each) are more than one call takes");
    grid = ring_grid(plan, sender_ctas, group.num_sms());
    const int64_t elem = 2;
    const uint64_t bytes = static_cast<uint64_t>(std::max(topo.world_size - 1, 0)) * 2 * a.batch *
                           plan.max_local_rows() * a.heads_kv * a.head_dim * elem;
    recv = bytes == 0 ? 0 : group.scratch(bytes, "ring_attention's receive slots ((world_size - 1) K/V blocks)",
                                          call.capturing());
    return concat("ring_attention(seq=", seq, ", batch=", a.batch, ", heads_q=", a.heads_q, ", heads_kv=", a.heads_kv,
                  ", head_dim=", a.head_dim, ", dtype=", q.dtype_name(), ", causal=", causal ? 1 : 0,
                  ", scale=", a.softmax_scale, ", lse=", lse != nullptr ? 1 : 0, ", recv=", recv, ", senders=", grid.senders, ")");
  });
  // An empty call still runs its kernel (the handshake alone): every call takes its place in the op
  // sequence on every rank.
  // One kernel per head size, with key_tile's tiles.
  auto by_dim = [&](auto element) {
    using E = decltype(element);
    if (a.head_dim == 64) return launch<E, 64, 128>(call, group, a, plan, grid, signature, recv, q, k, v, out, lse);
    launch<E, 128, 192>(call, group, a, plan, grid, signature, recv, q, k, v, out, lse);
  };
  a.dtype == AttentionDtype::kBf16 ? by_dim(cutlass::bfloat16_t{}) : by_dim(cutlass::half_t{});
}

}  // namespace interlace
