#include "interlace/gemm/grouped_gemm.h"

#include <algorithm>

#include "interlace/base/cuda.h"
#include "interlace/gemm/grouped_args.h"
#include "interlace/gemm/grouped_order.h"
#include "interlace/gemm/grouped_store.cuh"
#include "interlace/gemm/launch.cuh"
#include "interlace/gemm/sm90_gemm_tma_warpspecialized.cuh"

namespace interlace {
namespace {

// K = 0: each group's rows are an empty sum. Block (g, y) zeroes rows y, y + gridDim.y, ... of group g.
template <class Element>
__global__ void zero_rows_kernel(Element* out, int64_t ldc, int64_t group_stride, GroupedOrder::Params order,
                                 int32_t n) {
  const int32_t rows = GroupedOrder::rows_of(order, blockIdx.x);
  for (int32_t r = blockIdx.y; r < rows; r += gridDim.y) {
    Element* row = out + blockIdx.x * group_stride + r * ldc;
    for (int32_t c = threadIdx.x; c < n; c += blockDim.x) row[c] = Element(0.0f);
  }
}

// 128 x 128 tiles with ping-pong consumers (the plain GEMM's default), or 128 x 256 cooperative.
template <class Element, bool kBKMajor, int kClusterM, int kTileN>
void launch(const GroupedGemmProblem& p, const TensorView& a, const TensorView& b, const TensorView& out,
            const GroupedOrder::Params& order, cudaStream_t stream, int num_sms) {
  using Epilogue = gemm_engine::GroupedTileStore<Element, kTileN>;
  using Config = gemm_engine::GroupedConfig<Element, kBKMajor, kClusterM, kTileN, Epilogue>;
  static_assert(Config::kTileM == GroupedOrder::kTileM, "the order counts the engine's tiles");
  using Params = gemm_engine::GemmParams<Config, GroupedOrder, gemm_engine::NoInputWait, Epilogue>;
  constexpr auto kernel = gemm_engine::sm90_gemm_kernel<Config, GroupedOrder, gemm_engine::NoInputWait, Epilogue>;
  Params params{};
  gemm_engine::set_grouped_problem<Config>(params, p, a.data, b.data, order);
  params.epilogue = {static_cast<Element*>(out.data), p.ldc, p.group_out, order};
  // Every SM (no CTA waits for another, so more than fit would only queue): which positions hold
  // tiles is known only on the GPU.
  const int ctas = std::min(params.num_tiles, num_sms / kClusterM) * kClusterM;
  gemm_engine::launch_kernel<Config>(kernel, params, ctas, stream);
}

// out[g]^T = b[g]^T a[g]^T: b[g] (K-major, so [N, K] row-major) is the engine's A, 128 of N per tile
// row; a[g] its B, a group's rows across kSwappedGroupedRows-wide tiles (SwappedGroupedOrder),
// kSwappedGroupedClusterN of them one cluster, which multicasts each slice of b[g] to all. Ping-pong:
// each consumer warpgroup holds a whole tile and stores it while the other's wgmmas run (at K 2048
// the cooperative tile's epilogue, which nothing overlapped, cost 10-15%: bench/results/NOTES.md,
// twenty-second session).
template <class Element>
void launch_swapped(const GroupedGemmProblem& p, const TensorView& a, const TensorView& b, const TensorView& out,
                    const SwappedGroupedOrder::Params& order, int32_t tiles, cudaStream_t stream, int num_sms) {
  using Config = gemm_engine::SwappedGroupedConfig<Element>;
  using Epilogue = gemm_engine::SwappedGroupedStore<Element>;
  using Params = gemm_engine::GemmParams<Config, SwappedGroupedOrder, gemm_engine::NoInputWait, Epilogue>;
  constexpr auto kernel = gemm_engine::sm90_gemm_kernel<Config, SwappedGroupedOrder, gemm_engine::NoInputWait, Epilogue>;
  Params params{};
  gemm_engine::set_swapped_grouped_problem<Config>(params, p, a.data, b.data, order, tiles);
  params.epilogue = {static_cast<Element*>(out.data), p.ldc, p.group_out, order};
  const int ctas = std::min(params.num_tiles, num_sms / Config::kClusterN) * Config::kClusterN;
  gemm_engine::launch_kernel<Config>(kernel, params, ctas, stream);
}

}  // namespace

void grouped_gemm(const TensorView& a, const TensorView& b, const TensorView& out, const TensorView& rows,
                  cudaStream_t stream, GroupedGemmTuning tuning) {
  int device = 0;
  require_gpus();
  IL_CUDA_CHECK(cudaGetDevice(&device));
  if (a.device.device_type == kDLCUDA) device = a.device.device_id;
  const GroupedGemmProblem p = check_grouped_gemm_args(a, b, out, rows, device);
  // An empty problem runs nothing, whatever b's layout (its strides may not say one).
  const bool empty = p.groups == 0 || p.capacity == 0 || p.n == 0 || p.k == 0;
  const int swapped_rows = swapped_tile_rows(tuning, p.b_k_major || empty, p.capacity);
  tuning = resolved_grouped_gemm_tuning(tuning, p.capacity, hbm_bytes_per_sm(device));
  require_hopper(device, "grouped_gemm");
  const GroupedOrder::Params order = checked_grouped_order(p, tuning, static_cast<const int32_t*>(rows.data));
  int32_t swapped_tiles = 0;
  const SwappedGroupedOrder::Params swapped_order =
      swapped_rows != 0 ? checked_swapped_order(p, swapped_rows, static_cast<const int32_t*>(rows.data), &swapped_tiles)
                        : SwappedGroupedOrder::Params{};

  DeviceGuard guard(device);
  if (p.groups == 0 || p.capacity == 0 || p.n == 0) return;
  int num_sms = 0;
  IL_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  auto by_layout = [&](auto element) {
    using Element = decltype(element);
    if (p.k == 0) {
      const dim3 grid(static_cast<unsigned>(p.groups), static_cast<unsigned>(std::min<int64_t>(p.capacity, 64)));
      zero_rows_kernel<Element><<<grid, 256, 0, stream>>>(static_cast<Element*>(out.data), p.ldc, p.group_out, order,
                                                          static_cast<int32_t>(p.n));
      IL_CUDA_CHECK(cudaGetLastError());
    } else if (swapped_rows != 0) {
      launch_swapped<Element>(p, a, b, out, swapped_order, swapped_tiles, stream, num_sms);
    } else {
      with_grouped_tiling(p.b_k_major, tuning, [&](auto b_k_major, auto cluster, auto tile_n) {
        launch<Element, b_k_major, cluster, tile_n>(p, a, b, out, order, stream, num_sms);
      });
    }
  };
  p.dtype == GemmDtype::kBf16 ? by_layout(cutlass::bfloat16_t{}) : by_layout(cutlass::half_t{});
}

}  // namespace interlace
