// Host side of launching the gemm_rs kernel (kernel.cuh), shared by gemm_rs and gemm_ar: the compiled
// variants, their resident CTAs and the launch. Each op's .cu file instantiates its own variants
// (the OpId is part of them).
#pragma once

#include <type_traits>

#include "interlace/base/cuda.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/launch.cuh"
#include "interlace/gemm/sm90_gemm_tma_warpspecialized.cuh"
#include "interlace/gemm/tile_plan.h"
#include "interlace/ops/gemm_rs/kernel.cuh"
#include "interlace/ops/gemm_rs/launch.h"
#include "interlace/ops/gemm_rs/plan.h"

namespace interlace::gemm_rs_launch {

// 2-CTA clusters: the pair shares B through TMA multicast (as gemm and ag_gemm). gemm_ar's decode
// variant runs without (its one tile row would leave every partner CTA computing rows past M).
constexpr int kClusterM = 2;

struct Launch {
  GemmProblem problem;  // [M, K_r] @ [K_r, N]: this rank's partial of the whole output (m: M)
  const void* a = nullptr;
  const void* b = nullptr;
  GemmRsShared shared;
  GemmRsOrder::Params order;
  int32_t num_tiles = 0;  // positions: cluster tiles x k_runs
  int32_t k_runs = 1;     // GemmParams::k_runs
  int32_t reduce_ctas = 0;
  int ctas = 0;                 // every cluster the GPU runs at once
  const void* dummy = nullptr;  // 16-byte aligned device memory of at least 128 bytes
};

// One compiled kernel: the op, element type, b's layout, tile width, consumer schedule, cluster, tile
// height, and whether the engine computes out^T (the swapped decode GEMM: its operands are b^T and a^T).
template <OpId kOp, class Element, bool kBKMajor, int kTileN, bool kPingpong, int kCluster = kClusterM,
          int kTileM = 128, bool kTransposed = false>
struct Variant {
  using Config = gemm_engine::Sm90GemmConfig<Element, kBKMajor, kTileN, kCluster, kPingpong, kTileM>;
  using Epilogue = GemmRsEpilogue<Element, kOp, kTransposed>;
  using Phases = GemmRsPhases<Element, kOp, Config, kTransposed>;
  using Params = gemm_engine::GemmParams<Config, GemmRsOrder, gemm_engine::NoInputWait, Epilogue, Phases>;
  static auto kernel() {
    return gemm_engine::sm90_gemm_kernel<Config, GemmRsOrder, gemm_engine::NoInputWait, Epilogue, Phases>;
  }
  // The largest kernel parameters CUDA takes (12.1 and later, Volta and later).
  static_assert(sizeof(Params) <= 32764, "gemm_rs's kernel parameters outgrew CUDA's limit");
};

// Calls f(Variant<kOp, ...>{}) for the variant these settings select. decode: gemm_ar's cooperative
// 128 x 128 tiles without clusters (a CTA has one tile there, which both warpgroups then share);
// swap_tile_n (decode with b K-major, decode_swap_tile_n): the swapped problem's 64-row ping-pong
// tiles, swap_tile_n wide.
template <OpId kOp, class F>
inline void with_variant(bool bf16, bool b_k_major, int tile_n, bool pingpong, bool decode, int swap_tile_n, F&& f) {
  auto by_tile = [&](auto element, auto k_major) {
    using E = decltype(element);
    constexpr bool kK = decltype(k_major)::value;
    if constexpr (kOp == OpId::kGemmAr && kK) {
      if (swap_tile_n == 64) return f(Variant<kOp, E, true, 64, true, 1, 64, true>{});
      if (swap_tile_n == 128) return f(Variant<kOp, E, true, 128, true, 1, 64, true>{});
    }
    if constexpr (kOp == OpId::kGemmAr) {
      if (decode) return f(Variant<kOp, E, kK, 128, false, 1>{});
    }
    if (pingpong) {
      f(Variant<kOp, E, kK, 128, true>{});
    } else if (tile_n == 256) {
      f(Variant<kOp, E, kK, 256, false>{});
    } else {
      f(Variant<kOp, E, kK, 128, false>{});
    }
  };
  auto by_layout = [&](auto element) {
    b_k_major ? by_tile(element, std::true_type{}) : by_tile(element, std::false_type{});
  };
  bf16 ? by_layout(cutlass::bfloat16_t{}) : by_layout(cutlass::half_t{});
}

template <class V>
inline void launch(const Launch& l, cudaStream_t stream) {
  using Config = typename V::Config;
  typename V::Params params{};
  if (l.num_tiles > 0) {
    params.mainloop = gemm_engine::mainloop_params<Config>(l.problem, l.a, l.b);
  } else {
    // Nothing to compute (M, N or K is 0), but the kernel still runs for the handshake: TMA
    // descriptors of a tiny problem on memory that exists (never read).
    GemmProblem tiny = l.problem;
    tiny.m = tiny.n = tiny.k = tiny.lda = tiny.ldb = tiny.ldc = 8;
    params.mainloop = gemm_engine::mainloop_params<Config>(tiny, l.dummy, l.dummy);
  }
  params.mainloop_alt = params.mainloop;  // NoInputWait never asks for it
  params.m = static_cast<int32_t>(l.problem.m);
  params.n = static_cast<int32_t>(l.problem.n);
  params.k = static_cast<int32_t>(l.problem.k);
  params.order = l.order;
  params.num_tiles = l.num_tiles;
  params.k_runs = l.k_runs;
  params.epilogue = l.shared;
  params.epilogue.copiers = l.reduce_ctas;
  params.phases = params.epilogue;
  params.copy_ctas = l.reduce_ctas;
  gemm_engine::launch_kernel<Config>(V::kernel(), params, l.ctas, stream);
}

// The output tile width these settings select, after checking them (round_m too) (op names the caller in errors):
// 128 for ping-pong, else tile_n or choose_tile_n's.
inline int checked_tile_n(const char* op, const GemmRsTuning& tuning, int64_t m, int64_t n, int num_sms) {
  IL_CHECK(tuning.tile_n == 0 || tuning.tile_n == 128 || tuning.tile_n == 256, op,
           ": tile_n must be 0 (automatic), 128 or 256, got ", tuning.tile_n);
  IL_CHECK(!tuning.pingpong || tuning.tile_n == 0 || tuning.tile_n == 128, op,
           ": ping-pong tiles are 128 wide; tile_n=", tuning.tile_n, " needs pingpong=False");
  IL_CHECK(tuning.band_m >= 0, op, ": band_m must be >= 0 (0: automatic), got ", tuning.band_m);
  IL_CHECK(tuning.round_m >= 0, op, ": round_m must be >= 0 (0: automatic), got ", tuning.round_m);
  return tuning.pingpong ? 128 : tuning.tile_n ? tuning.tile_n : choose_tile_n(m, n, num_sms, kClusterM);
}

// Cluster-tile rows per band of the GEMM's order: as gemm's, 8 (16 for 256-wide tiles).
inline int band_m_for(const GemmRsTuning& tuning, int tile_n) {
  return tuning.band_m ? tuning.band_m : tile_n == 256 ? 16 : 8;
}

// The tile order: rounds of round_m cluster-tile rows per owner (GemmRsOrder::make_rounds), with the
// given round_m or, where `rounds`, the thinnest that fit; else each owner's block whole. Rounds of
// the thinnest bands measured faster than whole blocks at every shape tried (gemm_rs: 1.646 against
// 1.673 ms at 8192 x 14336 x 8192, 0.540 against 0.601 at 4096 x 8192 x 8192). *round_m: the one
// taken, 0 for whole blocks.
inline GemmRsOrder::Params tile_order(const GemmRsTuning& tuning, const GemmRsRows& cluster_rows, int32_t tiles_n,
                                      int band_m, bool rounds, int* round_m) {
  *round_m = tuning.round_m != 0 ? tuning.round_m : rounds ? gemm_rs_min_round_m(cluster_rows) : 0;
  return *round_m ? GemmRsOrder::make_rounds(cluster_rows, tiles_n, band_m, *round_m)
                  : GemmRsOrder::make(cluster_rows, tiles_n, band_m);
}

}  // namespace interlace::gemm_rs_launch
