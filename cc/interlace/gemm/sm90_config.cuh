// Compile-time configuration of the Hopper GEMM engine: tile shape, pipeline depth and the CuTe/CUTLASS
// mainloop (TMA loads into swizzled shared memory, wgmma from shared memory, fp32 accumulators).
#pragma once

#include <type_traits>

#include "cute/tensor.hpp"
// The extended wgmma shapes (WideAtom), without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, which would
// change the builder's choices for every other tile.
#include "cute/arch/mma_sm90_gmma_ext.hpp"
#include "cute/atom/mma_traits_sm90_gmma_ext.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/layout/matrix.h"
#include "cutlass/pipeline/pipeline.hpp"

namespace interlace::gemm_engine {

// How the two consumer warpgroups share the CTA's tiles. The consumer loop (one for both schedules)
// asks it: which of the CTA's tiles a warpgroup takes (walker kWalkers of them, starting with
// walker(group)), hence how far its pipeline state moves per tile (its own stages and the other
// walkers'), and whether the warpgroups take turns at the mainloop and epilogue through MathOrder.
//
// Cooperative: both warpgroups work on every tile, 64 rows each, and release each stage together.
struct CooperativeSchedule {
  using Cutlass = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  static constexpr int kWalkers = 1;
  static constexpr int kStageConsumers = 256;  // threads that release a pipeline stage
  static constexpr bool kTakeTurns = false;
  __device__ static constexpr int walker(int /*consumer_group*/) { return 0; }
};

// Ping-pong: each warpgroup takes every other tile, whole (128 rows), and they alternate at the
// mainloop and at the epilogue, so that one warpgroup's epilogue runs while the other's wgmma keeps
// the tensor cores busy.
struct PingpongSchedule {
  using Cutlass = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  static constexpr int kWalkers = 2;
  static constexpr int kStageConsumers = 128;
  static constexpr bool kTakeTurns = true;
  __device__ static constexpr int walker(int consumer_group) { return consumer_group; }
};

// The wgmma of a tile kTileN wide where the builder's choice is not the best: 160 (the swapped grouped
// GEMM's, grouped_gemm.cu), which the builder, without CUTLASS's extended shapes, cuts into 32-wide
// wgmmas that each read the A slice again from shared memory; one 160-wide one instead. Both
// operands K-major (b K-major is what that tile takes). void: the builder's.
template <class Element, int kTileN>
struct WideAtom {
  using type = void;
};
template <>
struct WideAtom<cutlass::bfloat16_t, 160> {
  using type = cute::SM90::GMMA::MMA_64x160x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};
template <>
struct WideAtom<cutlass::half_t, 160> {
  using type = cute::SM90::GMMA::MMA_64x160x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};

// The builder's mainloop with another TiledMma (the same stages, copies and shared-memory layouts).
template <class Built, class Atom, class AtomLayout>
struct WithAtom {
  using type = cutlass::gemm::collective::CollectiveMma<
      typename Built::DispatchPolicy, typename Built::TileShape, typename Built::ElementA, typename Built::StrideA,
      typename Built::ElementB, typename Built::StrideB, decltype(cute::make_tiled_mma(Atom{}, AtomLayout{})),
      typename Built::GmemTiledCopyA, typename Built::SmemLayoutAtomA, typename Built::SmemCopyAtomA,
      typename Built::TransformA, typename Built::GmemTiledCopyB, typename Built::SmemLayoutAtomB,
      typename Built::SmemCopyAtomB, typename Built::TransformB>;
};
template <class Built, class AtomLayout>
struct WithAtom<Built, void, AtomLayout> {
  using type = Built;
};

// Element: cutlass::bfloat16_t or cutlass::half_t. kBKMajor: B is stored K-contiguous (a Linear
// weight [N, K]); otherwise N-contiguous ([K, N] row-major). kTileN_: 256, or 128 where 256-wide
// tiles would leave much of the last wave idle (choose_tile_n).
// kClusterM_: CTAs per cluster along M; with 2, the pair shares each B slice through TMA multicast.
// kPingpong_: the two consumer warpgroups take alternate tiles (each a whole kTileM x kTileN tile), so
// one stores its tile while the other computes; otherwise they share each tile (cooperative).
// kTileM_: 128, or 64 for ping-pong (one warpgroup's m64 wgmmas: the swapped decode GEMM, gemm.cu).
// kClusterN_: CTAs per cluster along N; with 2, the pair shares each A slice through TMA multicast
// (the swapped grouped GEMM's two row tiles of one weight tile, grouped_gemm.cu).
// kEpilogueBytes_: shared memory, carved out of the stages, that the epilogue stages a finished tile
// in (its kSharedBytes; hooks.cuh). One area serves both warpgroups: cooperative ones store the same
// tile, and ping-pong ones take turns at the epilogue.
template <class Element_, bool kBKMajor_, int kTileN_ = 256, int kClusterM_ = 1, bool kPingpong_ = false,
          int kTileM_ = 128, int kClusterN_ = 1, int kEpilogueBytes_ = 0>
struct Sm90GemmConfig {
  using Element = Element_;
  static constexpr bool kBKMajor = kBKMajor_;
  static_assert(kTileM_ == 128 || (kTileM_ == 64 && kPingpong_), "64-row tiles are ping-pong's only");
  // CuTe makes one TMA box of a tile's rows, and a box spans at most 256: past that the descriptor
  // fails to encode, which CUTLASS only prints, and the kernel waits forever for its loads.
  static_assert(kTileN_ <= 256, "a tile wider than 256 needs TMA boxes CuTe does not make");

  // kTileM x kTileN output tiles (cooperative: shared by two consumer warpgroups, 64 rows each),
  // 64-deep K slices.
  using TileShape = cute::Shape<cute::Int<kTileM_>, cute::Int<kTileN_>, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM_>, cute::Int<kClusterN_>, cute::_1>;
  static constexpr int kClusterM = kClusterM_;
  static constexpr int kClusterN = kClusterN_;
  // CTAs per cluster, rank r at (r % kClusterM, r / kClusterM), as CUTLASS's multicast masks take them.
  static constexpr int kClusterSize = kClusterM_ * kClusterN_;
  // The cluster as launched (launch.cuh): all its CTAs along x, so %cluster_ctaid is (rank, 0, 0)
  // whether it spans M or N. CUTLASS's PipelineTmaAsync reads that coordinate against the shape it is
  // given to pick the CTAs whose stages a consumer releases; with ClusterShape (1, 2) CTA 1 took itself
  // for (1, 0), released none of its own stages, and its producer waited forever once the stages
  // wrapped. In a one-row cluster every CTA writes every CTA's stages (multicast), so each releases
  // to all: this shape says so, with the same arrival count.
  static_assert(kClusterM_ == 1 || kClusterN_ == 1, "clusters along M or along N, not both (launched flat in x)");
  using PipelineClusterShape = cute::Shape<cute::Int<kClusterSize>, cute::_1, cute::_1>;
  static constexpr bool kPingpong = kPingpong_;
  using Schedule = std::conditional_t<kPingpong_, PingpongSchedule, CooperativeSchedule>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = std::conditional_t<kBKMajor, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;

  static constexpr int kEpilogueBytes = kEpilogueBytes_;
  // The epilogue writes from registers or its own area, so the mainloop takes the rest for stages
  // (the area's 128-byte alignment may cost up to 128 bytes more).
  static constexpr int kCarveout = static_cast<int>(sizeof(cutlass::OrderedSequenceBarrier<2, 2>::SharedStorage)) +
                                   (kEpilogueBytes_ > 0 ? kEpilogueBytes_ + 128 : 0);
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, 8, Element, LayoutB, 8, float, TileShape,
      ClusterShape, cutlass::gemm::collective::StageCountAutoCarveout<kCarveout>,
      typename Schedule::Cutlass>::CollectiveOp;
  static_assert(std::is_void_v<typename WideAtom<Element, kTileN_>::type> || kBKMajor_,
                "the wide wgmmas are SS with both operands K-major");
  // The warpgroups one wgmma spans: both on a cooperative tile, one on a ping-pong tile (as the builder's).
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kPingpong_ ? 1 : 2>, cute::_1, cute::_1>>;
  using Mainloop = typename WithAtom<BuiltMainloop, typename WideAtom<Element, kTileN_>::type, AtomLayout>::type;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
  // Threads that consume one pipeline stage: both consumer warpgroups, or one in ping-pong.
  static constexpr int kConsumerThreads = Schedule::kStageConsumers;
  // Ping-pong: the warpgroups take turns at the mainloop and at the epilogue.
  using MathOrder = cutlass::OrderedSequenceBarrier<2, 2>;
  // Registers moved from the producer (which only issues TMA) to the consumers (accumulators).
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  // Every warpgroup's share at launch (the kernel's 168): what Phases::end runs with, once the roles
  // hand the moved registers back.
  static constexpr int kEvenRegisters = (kProducerRegisters + 2 * kConsumerRegisters) / 3;
  static_assert(kEvenRegisters % 8 == 0, "setmaxnreg takes multiples of 8");
  static_assert(kEvenRegisters * kThreads <= 65536, "the split must fit the SM's register file");

  struct PipelineStorage {
    typename Mainloop::SharedStorage mainloop;
    alignas(16) typename MathOrder::SharedStorage math_order;
  };
  template <int kBytes>
  struct StagedStorage : PipelineStorage {
    alignas(128) char epilogue[kBytes];
  };
  using SharedStorage = std::conditional_t<kEpilogueBytes_ == 0, PipelineStorage, StagedStorage<kEpilogueBytes_>>;
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "the stages and the epilogue's area outgrew shared memory");
};

}  // namespace interlace::gemm_engine
