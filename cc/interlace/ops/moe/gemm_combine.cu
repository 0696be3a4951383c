#include <algorithm>

#include "interlace/base/cuda.h"
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

// grouped_gemm's kernel (its tiles: 128 x 128 ping-pong or 128 x 256 cooperative) with the
// combine's epilogue and phases.
template <bool kBKMajor, int kClusterM, int kTileN>
struct Variant {
  using Element = cutlass::bfloat16_t;
  using Config = gemm_engine::Sm90GemmConfig<Element, kBKMajor, kTileN, kClusterM, /*kPingpong=*/kTileN == 128>;
  static_assert(Config::kTileM == GroupedOrder::kTileM, "the order counts the engine's tiles");
  using Params =
      gemm_engine::GemmParams<Config, GroupedOrder, gemm_engine::NoInputWait, CombineEpilogue<Element>, CombinePhases>;
  static auto kernel() {
    return gemm_engine::sm90_gemm_kernel<Config, GroupedOrder, gemm_engine::NoInputWait, CombineEpilogue<Element>,
                                         CombinePhases>;
  }
  static_assert(sizeof(Params) <= 32764, "moe_gemm_combine's kernel parameters outgrew CUDA's limit");
};

template <class F>
void with_variant(bool b_k_major, const GroupedGemmTuning& tuning, F&& f) {
  with_grouped_tiling(b_k_major, tuning,
                      [&](auto k_major, auto cluster, auto tile_n) { f(Variant<k_major, cluster, tile_n>{}); });
}

}  // namespace

void moe_gemm_combine(Group& group, MoeHandle& handle, const TensorView& act, const TensorView& w,
                      const TensorView& out, cudaStream_t stream, GroupedGemmTuning tuning) {
  OpCall call(group, OpId::kMoeCombine, stream);
  const MoePlan& plan = handle.plan();
  GroupedGemmProblem p;
  GroupedOrder::Params order;
  int ctas = 0;
  const TensorView rows = handle.expert_rows();
  const uint64_t signature = call.agree([&] {
    check_one_node(group, "moe_gemm_combine");
    IL_CHECK(handle.tokens() >= 0,
             "moe_gemm_combine: the handle has not dispatched yet; call moe_dispatch with it first");
    p = check_moe_gemm_combine_args(act, w, out, rows, plan, handle.tokens(), group.device());
    handle.check_apart("moe_gemm_combine", "act", act, out);
    require_hopper(group.device(), "moe_gemm_combine");
    IL_CHECK(tuning.swap != 1, "moe_gemm_combine: its epilogue sends rows home, which the swapped problem's "
             "transposed tiles do not hold; swap must stay 0");
    tuning = resolved_grouped_gemm_tuning(tuning, p.capacity, hbm_bytes_per_sm(group.device()),
                                          "moe_gemm_combine");
    order = checked_grouped_order(p, tuning, static_cast<const int32_t*>(rows.data), "moe_gemm_combine");
    // Every CTA waits for the others in its last phase: no more than fit at once, and one barrier
    // word each. Not part of the signature: ranks may differ (another process's SMs), harmlessly.
    with_variant(p.b_k_major, tuning, [&](auto v) {
      ctas = gemm_engine::resident_ctas_of<decltype(v)>(group.device(), group.num_sms());
    });
    ctas = std::min<int>(ctas, kMoeBarrierWords) / tuning.cluster_m * tuning.cluster_m;
    IL_CHECK(ctas > 0, "moe_gemm_combine: no CTA of the kernel fits on this GPU");
    return concat("moe_gemm_combine(experts=", plan.experts, ", topk=", plan.topk, ", hidden=", p.n,
                  ", ffn=", p.k, ", max_tokens=", plan.tokens, ", capacity=", plan.capacity,
                  ", workspace=", handle.workspace(), ", cluster_m=", tuning.cluster_m, ", tile_n=", tuning.tile_n,
                  ")");
  });
  call.launch([&](cudaStream_t s) {
    with_variant(p.b_k_major, tuning, [&](auto v) {
      using V = decltype(v);
      using Config = typename V::Config;
      typename V::Params params{};
      gemm_engine::set_grouped_problem<Config>(params, p, act.data, w.data, order);  // C rows of F, times [F, H]
      MoeGemmCombineParams& e = params.epilogue;
      e.combine.c = moe_common_params(group, call, signature, handle, handle.tokens());
      e.combine.out = static_cast<char*>(out.data);
      e.slots = reinterpret_cast<const MoeSlot*>(e.combine.c.workspace_here + plan.slots_offset);
      e.order = order;
      params.phases = e;
      params.copy_ctas = 0;
      gemm_engine::launch_kernel<Config>(V::kernel(), params, ctas, s);
    });
  });
}

}  // namespace interlace
