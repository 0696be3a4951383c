#include "interlace/gemm/gemm.h"

#include <algorithm>
#include <type_traits>

#include "interlace/base/cuda.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/launch.cuh"
#include "interlace/gemm/row_staging.cuh"
#include "interlace/gemm/sm90_gemm_tma_warpspecialized.cuh"
#include "interlace/gemm/tile_plan.h"

namespace interlace {
namespace {

// One launch of the engine with Config and Epilogue on problem p, whose operands' data are a and b.
template <class Config, class Epilogue>
void launch_engine(const GemmProblem& p, const void* a, const void* b, const typename Epilogue::Params& epilogue,
                   int band_m, cudaStream_t stream, int num_sms) {
  using Params = gemm_engine::GemmParams<Config, BandedOrder, gemm_engine::NoInputWait, Epilogue>;
  // The order is over cluster tiles: kClusterM tile rows that run together.
  const TileGrid grid = tile_grid(p.m, p.n, Config::kTileM * Config::kClusterM, Config::kTileN);
  Params params{};
  params.mainloop = gemm_engine::mainloop_params<Config>(p, a, b);
  params.m = static_cast<int32_t>(p.m);
  params.n = static_cast<int32_t>(p.n);
  params.k = static_cast<int32_t>(p.k);
  params.order = BandedOrder::make(grid, band_m);
  params.num_tiles = grid.num_tiles();
  params.epilogue = epilogue;
  const int ctas = std::min(grid.num_tiles(), num_sms / Config::kClusterM) * Config::kClusterM;
  gemm_engine::launch_kernel<Config>(
      gemm_engine::sm90_gemm_kernel<Config, BandedOrder, gemm_engine::NoInputWait, Epilogue>, params, ctas, stream);
}

template <class Element, bool kBKMajor, int kTileN, int kClusterM, bool kPingpong>
void launch(const GemmProblem& p, const TensorView& a, const TensorView& b, const TensorView& out,
            cudaStream_t stream, const GemmTuning& tuning, int num_sms) {
  using Epilogue = gemm_engine::TileStore<Element, kPingpong>;
  using Config = gemm_engine::Sm90GemmConfig<Element, kBKMajor, kTileN, kClusterM, kPingpong, /*kTileM=*/128,
                                             /*kClusterN=*/1, gemm_engine::EpilogueSharedBytes<Epilogue>::value>;
  launch_engine<Config, Epilogue>(p, a.data, b.data, {static_cast<Element*>(out.data), p.ldc}, tuning.band_m, stream,
                                  num_sms);
}

// Decode sizes (decode_swap_tile_n) with a Linear weight (b K-major): out^T = b^T a^T on the engine,
// so that N fills 64-row tiles, one per CTA on up to every SM, and M is the wgmmas' narrow side
// (kTileN: 64 for M <= 64, else 128). With M as the tiles' rows, 64 CTAs computed
// 128 x 128 tiles and streamed B at 2.1 TB/s (ncu's clocks) where cuBLAS's swapped kernel streamed
// 3.2 (bench/results/ncu_gemm_decode_1xH200.log).
template <class Element, int kTileN>
void launch_swapped(const GemmProblem& p, const TensorView& a, const TensorView& b, const TensorView& out,
                    cudaStream_t stream, int num_sms) {
  using Config = gemm_engine::Sm90GemmConfig<Element, /*kBKMajor=*/true, kTileN, /*kClusterM=*/1,
                                             /*kPingpong=*/true, /*kTileM=*/64>;
  launch_engine<Config, gemm_engine::StoreTransposedTile<Element>>(transposed(p), b.data, a.data,
                                                      {static_cast<Element*>(out.data), p.ldc}, /*band_m=*/1, stream,
                                                      num_sms);
}

}  // namespace

void gemm(const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream, GemmTuning tuning) {
  int device = 0;
  require_gpus();
  IL_CUDA_CHECK(cudaGetDevice(&device));
  if (a.device.device_type == kDLCUDA) device = a.device.device_id;
  const GemmProblem p = check_gemm_args(a, b, out, device);
  // The tuning is checked for every shape, empty ones included, so that a call that works for K = 0
  // works for any K.
  IL_CHECK(tuning.band_m >= 0, "gemm: band_m must be >= 0 (0: automatic)");
  IL_CHECK(tuning.cluster_m == 0 || tuning.cluster_m == 1 || tuning.cluster_m == 2,
           "gemm: cluster_m must be 0 (automatic), 1 or 2, got ", tuning.cluster_m);
  IL_CHECK(tuning.tile_n == 0 || tuning.tile_n == 128 || tuning.tile_n == 256,
           "gemm: tile_n must be 0 (automatic), 128 or 256, got ", tuning.tile_n);
  IL_CHECK(!tuning.pingpong || tuning.tile_n == 0 || tuning.tile_n == 128,
           "gemm: ping-pong tiles are 128 wide; tile_n=", tuning.tile_n, " needs pingpong=False");
  require_hopper(device, "gemm");
  int num_sms = 0;
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  // Decode sizes with a Linear weight, on the automatic tuning: the swapped problem (launch_swapped).
  const int swap_tile_n = p.b_k_major && tuning.band_m == 0 && tuning.tile_n == 0 && tuning.cluster_m == 0 &&
                                  tuning.pingpong
                              ? decode_swap_tile_n(p.m, p.n, num_sms)
                              : 0;
  // One tile row: a cluster partner would only compute rows past M (35 against 25 us at
  // 128 x 4096 @ 4096 x 8192, 1 x H200, tools/probes/gemm_decode.py).
  if (tuning.cluster_m == 0) tuning.cluster_m = p.m <= 128 ? 1 : 2;
  // Schedule and bands left automatic: the GPU's (automatic_gemm_schedule).
  if (swap_tile_n == 0 && tuning.band_m == 0 && tuning.tile_n == 0 && tuning.pingpong) {
    const GemmSchedule schedule = automatic_gemm_schedule(p.m, p.n, p.k, hbm_bytes_per_sm(device));
    tuning.pingpong = schedule.pingpong;
    tuning.band_m = schedule.band_m;
  }
  const int tile_n = tuning.pingpong ? 128
                     : tuning.tile_n ? tuning.tile_n
                                     : choose_tile_n(p.m, p.n, num_sms, tuning.cluster_m);
  if (tuning.band_m == 0) tuning.band_m = tile_n == 256 ? 16 : 8;
  // Raises past kMaxGemmTiles for every K, not only where a kernel runs.
  tile_grid(p.m, p.n, 128 * tuning.cluster_m, tile_n);

  DeviceGuard guard(device);
  if (p.m == 0 || p.n == 0) return;
  if (p.k == 0) {  // an empty sum
    IL_CUDA_CHECK(cudaMemset2DAsync(out.data, p.ldc * 2, 0, p.n * 2, p.m, stream));
    return;
  }
  if (swap_tile_n != 0) {
    auto run = [&](auto element) {
      using E = decltype(element);
      swap_tile_n == 64 ? launch_swapped<E, 64>(p, a, b, out, stream, num_sms)
                        : launch_swapped<E, 128>(p, a, b, out, stream, num_sms);
    };
    p.dtype == GemmDtype::kBf16 ? run(cutlass::bfloat16_t{}) : run(cutlass::half_t{});
    return;
  }
  // Ping-pong tiles are 128 x 128 (one warpgroup's accumulators); cooperative ones 128 x tile_n.
  auto run = [&](auto element, auto b_k_major, auto tile, auto cluster, auto pingpong) {
    launch<decltype(element), decltype(b_k_major)::value, decltype(tile)::value, decltype(cluster)::value,
           decltype(pingpong)::value>(p, a, b, out, stream, tuning, num_sms);
  };
  auto by_cluster = [&](auto element, auto b_k_major, auto tile, auto pingpong) {
    tuning.cluster_m == 2 ? run(element, b_k_major, tile, std::integral_constant<int, 2>{}, pingpong)
                          : run(element, b_k_major, tile, std::integral_constant<int, 1>{}, pingpong);
  };
  auto by_tile = [&](auto element, auto b_k_major) {
    if (tuning.pingpong) {
      by_cluster(element, b_k_major, std::integral_constant<int, 128>{}, std::true_type{});
    } else if (tile_n == 256) {
      by_cluster(element, b_k_major, std::integral_constant<int, 256>{}, std::false_type{});
    } else {
      by_cluster(element, b_k_major, std::integral_constant<int, 128>{}, std::false_type{});
    }
  };
  auto by_layout = [&](auto element) {
    p.b_k_major ? by_tile(element, std::true_type{}) : by_tile(element, std::false_type{});
  };
  p.dtype == GemmDtype::kBf16 ? by_layout(cutlass::bfloat16_t{}) : by_layout(cutlass::half_t{});
}

}  // namespace interlace
