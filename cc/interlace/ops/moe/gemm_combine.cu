#include <type_traits>

#include "interlace/base/cuda.h"
#include "interlace/gemm/grouped_store.cuh"
#include "interlace/gemm/launch.cuh"
#include "interlace/gemm/sm90_gemm_tma_warpspecialized.cuh"
#include "interlace/ops/moe/args.h"
#include "interlace/ops/moe/common_params.h"
#include "interlace/ops/moe/gemm_combine.cuh"
#include "interlace/ops/moe/launch.h"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

using detail::concat;

using Element = cutlass::bfloat16_t;

// grouped_gemm's kernels (its tiles: 128 x 128 ping-pong or 128 x 256 cooperative, or the swapped
// problem's) with the combine's epilogue and phases.
template <class Config_, class Order_, class Epilogue>
struct Variant {
  using Config = Config_;
  using Order = Order_;
  static_assert(Config::kTileM == Order::kTileM, "the order counts the engine's tiles");
  using Params = gemm_engine::GemmParams<Config, Order, gemm_engine::NoInputWait, Epilogue, CombinePhases<Order>>;
  static auto kernel() {
    return gemm_engine::sm90_gemm_kernel<Config, Order, gemm_engine::NoInputWait, Epilogue, CombinePhases<Order>>;
  }
  static_assert(sizeof(Params) <= 32764, "moe_gemm_combine's kernel parameters outgrew CUDA's limit");
};

template <bool kBKMajor, int kClusterM, int kTileN>
using Tiled =
    Variant<gemm_engine::GroupedConfig<Element, kBKMajor, kClusterM, kTileN, CombineEpilogue<Element, GroupedOrder>>,
            GroupedOrder, CombineEpilogue<Element, GroupedOrder>>;
using Swapped = Variant<gemm_engine::SwappedGroupedConfig<Element>, SwappedGroupedOrder,
                        CombineEpilogue<Element, SwappedGroupedOrder>>;

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

void moe_gemm_combine(Group& group, MoeHandle& handle, const TensorView& act, const TensorView& w,
                      const TensorView& out, cudaStream_t stream, GroupedGemmTuning tuning) {
  OpCall call(group, OpId::kMoeCombine, stream);
  const MoePlan& plan = handle.plan();
  GroupedGemmProblem p;
  GroupedOrder::Params order;
  SwappedGroupedOrder::Params swapped_order;
  int32_t swapped_tiles = 0;
  bool swapped = false;
  int ctas = 0;
  const TensorView rows = handle.expert_rows();
  const uint64_t signature = call.agree([&] {
    check_one_node(group, "moe_gemm_combine");
    IL_CHECK(handle.tokens() >= 0,
             "moe_gemm_combine: the handle has not dispatched yet; call moe_dispatch with it first");
    p = check_moe_gemm_combine_args(act, w, out, rows, plan, handle.tokens(), group.device());
    handle.check_apart("moe_gemm_combine", "act", act, out);
    require_hopper(group.device(), "moe_gemm_combine");
    // Swapped where grouped_gemm would swap (swapped_tile_rows), so that the two agree bit for bit.
    swapped = swapped_tile_rows(tuning, p.b_k_major, p.capacity, "moe_gemm_combine") != 0;
    tuning = resolved_grouped_gemm_tuning(tuning, p.capacity, hbm_bytes_per_sm(group.device()),
                                          "moe_gemm_combine");
    const int32_t* counts = static_cast<const int32_t*>(rows.data);
    if (swapped) {
      swapped_order = checked_swapped_order(p, kSwappedGroupedRows, counts, &swapped_tiles);
    } else {
      order = checked_grouped_order(p, tuning, counts, "moe_gemm_combine");
    }
    // Every CTA waits for the others in its last phase: no more than fit at once, and one barrier
    // word each. Not part of the signature: ranks may differ (another process's SMs), harmlessly.
    int cluster = 1;
    with_variant(p.b_k_major, swapped, tuning, [&](auto v) {
      using V = decltype(v);
      ctas = gemm_engine::resident_ctas_of<V>(group.device(), group.num_sms());
      cluster = V::Config::kClusterSize;
    });
    ctas = ctas / cluster * cluster;
    IL_CHECK(ctas > 0, "moe_gemm_combine: no CTA of the kernel fits on this GPU");
    return concat("moe_gemm_combine(experts=", plan.experts, ", topk=", plan.topk, ", hidden=", p.n,
                  ", ffn=", p.k, ", max_tokens=", plan.tokens, ", capacity=", plan.capacity,
                  ", workspace=", handle.workspace(), ", cluster_m=", tuning.cluster_m, ", tile_n=", tuning.tile_n,
                  ", swapped=", swapped, ")");
  });
  call.launch([&](cudaStream_t s) {
    with_variant(p.b_k_major, swapped, tuning, [&](auto v) {
      using V = decltype(v);
      using Config = typename V::Config;
      typename V::Params params{};
      auto& e = params.epilogue;
      if constexpr (std::is_same_v<typename V::Order, SwappedGroupedOrder>) {
        gemm_engine::set_swapped_grouped_problem<Config>(params, p, act.data, w.data, swapped_order, swapped_tiles);
        e.order = swapped_order;
      } else {
        gemm_engine::set_grouped_problem<Config>(params, p, act.data, w.data, order);  // C rows of F, times [F, H]
        e.order = order;
      }
      e.combine.c = moe_common_params(group, call, signature, handle, handle.tokens());
      e.combine.out = static_cast<char*>(out.data);
      e.slots = reinterpret_cast<const MoeSlot*>(e.combine.c.workspace_here + plan.slots_offset);
      params.phases = e;
      params.copy_ctas = 0;
      gemm_engine::launch_kernel<Config>(V::kernel(), params, ctas, s);
    });
  });
}

}  // namespace interlace
