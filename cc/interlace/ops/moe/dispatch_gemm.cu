#include <type_traits>

#include "interlace/base/cuda.h"
#include "interlace/gemm/grouped_store.cuh"
#include "interlace/gemm/launch.cuh"
#include "interlace/gemm/sm90_gemm_tma_warpspecialized.cuh"
#include "interlace/ops/moe/args.h"
#include "interlace/ops/moe/common_params.h"
#include "interlace/ops/moe/dispatch_gemm.cuh"
#include "interlace/ops/moe/launch.h"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

using detail::concat;
using Element = cutlass::bfloat16_t;

// grouped_gemm's kernels (its tiles, or the swapped problem's) with the dispatch's input wait and phases.
template <class Config_, class Order_, class Store>
struct Variant {
  using Config = Config_;
  using Order = Order_;
  using Params =
      gemm_engine::GemmParams<Config, Order, DispatchInputWait<Order>, Store, DispatchGemmPhases<Order>>;
  static auto kernel() {
    return gemm_engine::sm90_gemm_kernel<Config, Order, DispatchInputWait<Order>, Store, DispatchGemmPhases<Order>>;
  }
  static_assert(sizeof(Params) <= 32764, "moe_dispatch_gemm's kernel parameters outgrew CUDA's limit");
};

template <int kTileN>
using TiledStore = gemm_engine::GroupedTileStore<Element, kTileN>;  // grouped_gemm's
template <bool kBKMajor, int kClusterM, int kTileN>
using Tiled = Variant<gemm_engine::GroupedConfig<Element, kBKMajor, kClusterM, kTileN, TiledStore<kTileN>>,
                      GroupedOrder, TiledStore<kTileN>>;
using Swapped =
    Variant<gemm_engine::SwappedGroupedConfig<Element>, SwappedGroupedOrder, gemm_engine::SwappedGroupedStore<Element>>;

template <class F>
void with_variant(bool b_k_major, bool swapped, const GroupedGemmTuning& tuning, F&& f) {
  if (swapped) {  // b K-major: swapped_tile_rows checked it
    f(Swapped{});
    return;
  }
  with_grouped_tiling(b_k_major, tuning,
                      [&](auto k_major, auto cluster, auto tile_n) { f(Tiled<k_major, cluster, tile_n>{}); });
}

}  // namespace

void moe_dispatch_gemm(Group& group, MoeHandle& handle, const TensorView& x, const TensorView& topk_idx,
                       const TensorView& topk_weights, const TensorView& w, const TensorView& out,
                       cudaStream_t stream, GroupedGemmTuning tuning, int copy_ctas) {
  const char* op = "moe_dispatch_gemm";
  OpCall call(group, OpId::kMoeDispatch, stream);
  const MoePlan& plan = handle.plan();
  const MoeDispatchScratch at = moe_dispatch_scratch(plan, /*ctas=*/0, /*lists=*/true);
  const TensorView expert_x = handle.expert_x(), rows = handle.expert_rows();
  GroupedGemmProblem p;
  GroupedOrder::Params order;
  SwappedGroupedOrder::Params swapped_order;
  int32_t swapped_tiles = 0;
  bool swapped = false;
  int ctas = 0;
  size_t scratch = 0;
  const uint64_t signature = call.agree([&] {
    check_one_node(group, op);
    const MoeShape shape = check_dispatch_for_handle(op, group, handle, x, topk_idx, topk_weights);
    p = check_moe_dispatch_gemm_args(w, out, expert_x, rows, plan, group.device());
    handle.check_apart(op, "w", w, out);
    handle.check_apart(op, "x", x, out);
    IL_CHECK(!bytes_overlap(w, expert_x) && !bytes_overlap(x, expert_x), op,
             ": x or w lies in the handle's receive rows, which the dispatch overwrites; they must be separate memory");
    IL_CHECK(!bytes_overlap(x, out) && !bytes_overlap(topk_idx, out) && !bytes_overlap(topk_weights, out), op,
             ": out overlaps x, topk_idx or topk_weights, which the copiers read while the GEMM writes out; they "
             "must be separate memory");
    require_hopper(group.device(), op);
    swapped = swapped_tile_rows(tuning, p.b_k_major, p.capacity, op) != 0;
    tuning = resolved_grouped_gemm_tuning(tuning, p.capacity, hbm_bytes_per_sm(group.device()), op);
    const int32_t* counts = static_cast<const int32_t*>(rows.data);
    if (swapped) {
      swapped_order = checked_swapped_order(p, kSwappedGroupedRows, counts, &swapped_tiles);
    } else {
      order = checked_grouped_order(p, tuning, counts, op);
    }
    const int cluster = swapped ? kSwappedGroupedClusterN : tuning.cluster_m;
    // Every CTA must be resident: the GEMM CTAs wait for the copiers, and the copiers for each other.
    with_variant(p.b_k_major, swapped, tuning, [&](auto v) {
      ctas = gemm_engine::resident_ctas_of<decltype(v)>(group.device(), group.num_sms());
    });
    if (copy_ctas == 0) copy_ctas = default_moe_copy_ctas(p.n, cluster, ctas);
    IL_CHECK(copy_ctas > 0 && copy_ctas % cluster == 0, op,
             ": copy_ctas must be a positive multiple of the tiles' cluster size ", cluster, ", got ", copy_ctas);
    IL_CHECK(ctas - copy_ctas >= cluster, op, ": copy_ctas = ", copy_ctas, " leaves no SM for the GEMM (", ctas,
             " CTAs of the kernel fit on this GPU)");
    scratch = group.scratch(at.bytes, "moe_dispatch_gemm's slot numbers, runs and lists", call.capturing());
    return concat(op, "(", describe_moe_shape(shape), ", index_bits=", static_cast<int>(topk_idx.dtype.bits),
                  ", n=", p.n, ", workspace=", handle.workspace(), ", scratch=", scratch, ", swap=", swapped,
                  ", cluster_m=", tuning.cluster_m, ", tile_n=", tuning.tile_n, ", copy_ctas=", copy_ctas, ")");
  });
  const MoeDispatchParams dispatch =
      moe_dispatch_params(group, call, signature, handle, x, topk_idx, topk_weights, scratch, at);
  char* base = group.heap().local_base() + scratch;
  // Before the launch, as moe_dispatch's: the combine must see this dispatch's token count.
  handle.tokens_ = x.shape[0];
  call.launch([&](cudaStream_t s) {
    with_variant(p.b_k_major, swapped, tuning, [&](auto v) {
      using V = decltype(v);
      using Config = typename V::Config;
      typename V::Params params{};
      if constexpr (std::is_same_v<typename V::Order, SwappedGroupedOrder>) {
        gemm_engine::set_swapped_grouped_problem<Config>(params, p, expert_x.data, w.data, swapped_order,
                                                         swapped_tiles);
      } else {
        gemm_engine::set_grouped_problem<Config>(params, p, expert_x.data, w.data, order);
      }
      MoeDispatchGemmParams<typename V::Order> e{};
      e.dispatch = dispatch;
      e.slot_start = reinterpret_cast<int32_t*>(base + at.slot_start);
      e.slot_list = reinterpret_cast<int32_t*>(base + at.slot_list);
      e.chunks = reinterpret_cast<uint32_t*>(base + at.chunks);
      e.order = params.order;
      e.wide = topk_idx.dtype.bits == 64;
      params.input_wait = e;
      params.phases = e;
      params.epilogue = {static_cast<Element*>(out.data), p.ldc, p.group_out, params.order};
      params.copy_ctas = copy_ctas;
      gemm_engine::launch_kernel<Config>(V::kernel(), params, ctas, s);
    });
  });
}

}  // namespace interlace
