// Host side of launching the engine, shared by the plain GEMM and the fused ops: the mainloop's
// parameters (TMA descriptors) for a problem, and a cluster launch of a persistent kernel.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "interlace/base/cuda.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/grouped_args.h"

namespace interlace::gemm_engine {

// A TMA box of kRows rows instead of the tile's, for A (kB false) or a K-major B without multicast
// (kB true), for a problem of fewer rows (A) or columns (B) than a tile: a box mostly past the
// problem costs the mainloop most of its time (1 x 4096 @ 4096 x 8192: 43 us against 25 for 128 rows
// of A, 1 x H200, tools/probes/gemm_decode.py). The tile's other rows in shared memory keep whatever
// they held; they only feed output rows (columns) past the problem, which no epilogue stores into
// out or combines into valid elements. The descriptor comes from CuTe's own construction over the same tensor with a
// kRows-row box (so that its rank and strides are those the kernel's copy expects), and each stage
// then expects that many bytes.
template <class Config, bool kB, int kRows>
void shrink_box(typename Config::Mainloop::Params& params, const GemmProblem& p, const void* data) {
  using namespace cute;
  using Mainloop = typename Config::Mainloop;
  static_assert(kRows % 8 == 0 && kRows < (kB ? Config::kTileN : Config::kTileM),
                "a box of whole 8-row swizzle atoms, smaller than the tile");
  const uint32_t box_bytes = kRows * Config::kTileK * sizeof(typename Config::Element);
  if constexpr (!kB) {
    using SmemLayout = decltype(tile_to_shape(typename Mainloop::SmemLayoutAtomA{},
                                              make_shape(Int<kRows>{}, Int<Config::kTileK>{})));
    typename Mainloop::StrideA stride{};
    get<0>(stride) = p.lda;
    Tensor tensor = make_tensor(static_cast<const typename Mainloop::InternalElementA*>(data),
                                make_layout(make_shape(static_cast<int>(p.m), static_cast<int>(p.k), 1), stride));
    auto donor = make_tma_copy_A_sm90(typename Mainloop::GmemTiledCopyA{}, tensor, SmemLayout{},
                                      make_shape(Int<kRows>{}, Int<Config::kTileN>{}, Int<Config::kTileK>{}),
                                      typename Config::ClusterShape{});
    params.tma_load_a.tma_desc_ = donor.tma_desc_;
    params.tma_transaction_bytes_mk = box_bytes;
  } else {
    static_assert(Config::kBKMajor && Config::kClusterM == 1, "B's box shrinks where B is K-major, not multicast");
    using SmemLayout = decltype(tile_to_shape(typename Mainloop::SmemLayoutAtomB{},
                                              make_shape(Int<kRows>{}, Int<Config::kTileK>{})));
    typename Mainloop::StrideB stride{};
    get<0>(stride) = p.ldb;  // (N, K): N steps by ldb, K contiguous
    Tensor tensor = make_tensor(static_cast<const typename Mainloop::InternalElementB*>(data),
                                make_layout(make_shape(static_cast<int>(p.n), static_cast<int>(p.k), 1), stride));
    auto donor = make_tma_copy_B_sm90(typename Mainloop::GmemTiledCopyB{}, tensor, SmemLayout{},
                                      make_shape(Int<Config::kTileM>{}, Int<kRows>{}, Int<Config::kTileK>{}),
                                      typename Config::ClusterShape{});
    params.tma_load_b.tma_desc_ = donor.tma_desc_;
    params.tma_transaction_bytes_nk = box_bytes;
  }
  params.tma_transaction_bytes = params.tma_transaction_bytes_mk + params.tma_transaction_bytes_nk;
}

// shrink_box to the smallest of 8, 16, 32 and 64 rows (below the tile's) that holds `rows`, if any.
template <class Config, bool kB, int kRows = 8>
void shrink_box_to(typename Config::Mainloop::Params& params, const GemmProblem& p, const void* data,
                   int64_t rows) {
  if constexpr (kRows < (kB ? Config::kTileN : Config::kTileM)) {
    if (rows <= kRows) {
      shrink_box<Config, kB, kRows>(params, p, data);
    } else if constexpr (kRows < 64) {
      shrink_box_to<Config, kB, 2 * kRows>(params, p, data, rows);
    }
  }
}

// a: [M, K] row-major with row stride p.lda; b: [K, N] as p.b_k_major and p.ldb say. Several groups
// (grouped_gemm): `groups` such problems, a's and b's group g at g * group_a and g * group_b elements.
// For at most 64 rows (one group), A's box shrinks to the rows there are; so does a K-major B's,
// without multicast, for at most 64 columns (shrink_box).
template <class Config>
typename Config::Mainloop::Params mainloop_params(const GemmProblem& p, const void* a, const void* b, int groups = 1,
                                                  int64_t group_a = 0, int64_t group_b = 0) {
  using Mainloop = typename Config::Mainloop;
  using Element = typename Config::Element;
  typename Mainloop::StrideA stride_a{};
  cute::get<0>(stride_a) = p.lda;
  cute::get<2>(stride_a) = group_a;
  typename Mainloop::StrideB stride_b{};
  if constexpr (Config::kBKMajor) {
    cute::get<0>(stride_b) = p.ldb;  // (N, K): N steps by ldb, K contiguous
  } else {
    cute::get<1>(stride_b) = p.ldb;  // (N, K): N contiguous, K steps by ldb
  }
  cute::get<2>(stride_b) = group_b;
  typename Mainloop::Arguments args{static_cast<const Element*>(a), stride_a, static_cast<const Element*>(b),
                                    stride_b};
  const auto problem =
      cute::make_shape(static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), groups);
  typename Mainloop::Params params = Mainloop::to_underlying_arguments(problem, args, nullptr);
  if (groups == 1) {
    if constexpr (Config::kClusterN == 1) shrink_box_to<Config, false>(params, p, a, p.m);  // A not multicast
    if constexpr (Config::kBKMajor && Config::kClusterM == 1) shrink_box_to<Config, true>(params, p, b, p.n);
  }
  return params;
}

// A grouped launch's problem in the engine's parameters: the mainloop over a [G, C, K] and b [G, K, N]
// (group strides from p), the sizes, the order and its positions (every cluster tile the groups could
// have; the walk stops at the counts' own).
template <class Config, class Params>
void set_grouped_problem(Params& params, const GroupedGemmProblem& p, const void* a, const void* b,
                         const GroupedOrder::Params& order) {
  GemmProblem one;  // one group's problem: C rows
  one.m = p.capacity;
  one.n = p.n;
  one.k = p.k;
  one.lda = p.lda;
  one.ldb = p.ldb;
  params.mainloop = mainloop_params<Config>(one, a, b, static_cast<int>(p.groups), p.group_a, p.group_b);
  params.m = static_cast<int32_t>(p.capacity);
  params.n = static_cast<int32_t>(p.n);
  params.k = static_cast<int32_t>(p.k);
  params.groups = static_cast<int32_t>(p.groups);
  params.order = order;
  params.num_tiles = static_cast<int32_t>(p.groups * order.tile_rows / Config::kClusterM * order.tiles_n);
}

// The swapped grouped problem (out[g]^T = b[g]^T a[g]^T, grouped_gemm.cu) in the engine's parameters:
// b[g] (K-major) is the engine's A, N rows; a[g] its B, C columns; the order and its positions
// (checked_swapped_order's tiles).
template <class Config, class Params>
void set_swapped_grouped_problem(Params& params, const GroupedGemmProblem& p, const void* a, const void* b,
                                 const SwappedGroupedOrder::Params& order, int32_t tiles) {
  GemmProblem one;  // one group's swapped problem: N rows, C columns
  one.m = p.n;
  one.n = p.capacity;
  one.k = p.k;
  one.lda = p.ldb;  // b[g] K-major: n's row of K is ldb apart
  one.ldb = p.lda;  // a[g]'s rows, K-major
  params.mainloop = mainloop_params<Config>(one, b, a, static_cast<int>(p.groups), p.group_b, p.group_a);
  params.m = static_cast<int32_t>(p.n);
  params.n = static_cast<int32_t>(p.capacity);
  params.k = static_cast<int32_t>(p.k);
  params.groups = static_cast<int32_t>(p.groups);
  params.order = order;
  params.num_tiles = tiles;
}

// The launch of `ctas` CTAs (a multiple of Config::kClusterSize) of the engine's kernel with all the
// shared memory its stages take. Raises where the build has no kernel image for this GPU.
template <class Config, class Params>
cudaLaunchConfig_t launch_config(void (*kernel)(Params), int ctas, cudaStream_t stream, cudaLaunchAttribute* cluster) {
  const int smem = static_cast<int>(sizeof(typename Config::SharedStorage));
  IL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t launch_config{};
  launch_config.gridDim = dim3(ctas);
  launch_config.blockDim = dim3(Config::kThreads);
  launch_config.dynamicSmemBytes = smem;
  launch_config.stream = stream;
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = Config::kClusterSize;  // rank r is (r % kClusterM, r / kClusterM)
  cluster->val.clusterDim.y = 1;
  cluster->val.clusterDim.z = 1;
  launch_config.attrs = cluster;
  launch_config.numAttrs = 1;
  return launch_config;
}

template <class Config, class Params>
void launch_kernel(void (*kernel)(Params), const Params& params, int ctas, cudaStream_t stream) {
  // Whole clusters, copiers included: a cluster's CTAs wait for each other (the kernel's votes and
  // barriers), so one split between roles would hang. The ops size both; this catches a new one's slip.
  IL_CHECK(ctas % Config::kClusterSize == 0 && params.copy_ctas % Config::kClusterSize == 0,
           "gemm engine: ", ctas, " CTAs with ", params.copy_ctas, " copiers are not whole clusters of ",
           Config::kClusterSize);
  cudaLaunchAttribute cluster{};
  const cudaLaunchConfig_t config = launch_config<Config>(kernel, ctas, stream, &cluster);
  IL_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
}

// CTAs of the kernel that `device` (the current one) runs at once, in whole clusters (with 2-CTA
// clusters, GPCs with an odd number of free SMs leave one idle). A kernel whose CTAs wait on each
// other, across GPUs too, must not launch more. Asked once per kernel and device: the occupancy
// query would otherwise cost every call host time.
template <class Config, class Params>
int resident_ctas(void (*kernel)(Params), int device, int num_sms) {
  static std::atomic<int> known[64] = {};
  const bool cached = device >= 0 && device < 64;
  if (cached && known[device].load() > 0) return known[device].load();
  cudaLaunchAttribute cluster{};
  const cudaLaunchConfig_t config = launch_config<Config>(kernel, num_sms / Config::kClusterSize * Config::kClusterSize,
                                                          nullptr, &cluster);
  int clusters = 0;
  IL_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  if (cached) known[device].store(clusters * Config::kClusterSize);
  return clusters * Config::kClusterSize;
}

// The same for an op's compiled variant V (V::Config, V::kernel()).
template <class V>
int resident_ctas_of(int device, int num_sms) {
  return resident_ctas<typename V::Config>(V::kernel(), device, num_sms);
}

}  // namespace interlace::gemm_engine
