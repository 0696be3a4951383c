#include "interlace/ops/ag_gemm/launch.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <numeric>
#include <type_traits>

#include "interlace/base/cuda.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/launch.cuh"
#include "interlace/gemm/sm90_gemm_tma_warpspecialized.cuh"
#include "interlace/gemm/tile_plan.h"
#include "interlace/ops/ag_gemm/kernel.cuh"
#include "interlace/ops/ag_gemm/plan.h"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

using detail::concat;

// 2-CTA clusters: the pair shares B through TMA multicast.
constexpr int kClusterM = 2;

struct Launch {
  GemmProblem problem;  // of the gathered A [M, K] @ b
  const void* gathered = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  AgGemmShared shared;
  AgGemmOrder::Params order;
  int32_t num_tiles = 0;
  int ctas = 0;                    // every cluster the GPU runs at once
  const void* dummy = nullptr;     // 16-byte aligned device memory of at least 128 bytes
  const void* own_base = nullptr;  // where row 0 would be if this rank's shard were row start[me] of A
};

// One compiled kernel: element type, b's layout, tile width and consumer schedule.
template <class Element, bool kBKMajor, int kTileN, bool kPingpong>
struct Variant {
  using Config = gemm_engine::Sm90GemmConfig<Element, kBKMajor, kTileN, kClusterM, kPingpong>;
  using Epilogue = gemm_engine::StoreTile<Element>;
  using Params = gemm_engine::GemmParams<Config, AgGemmOrder, AgGemmInputWait, Epilogue, AgGemmPhases>;
  static auto kernel() {
    return gemm_engine::sm90_gemm_kernel<Config, AgGemmOrder, AgGemmInputWait, Epilogue, AgGemmPhases>;
  }
};

// Calls f(Variant<...>{}) for the variant these settings select.
template <class F>
void with_variant(bool bf16, bool b_k_major, int tile_n, bool pingpong, F&& f) {
  auto by_tile = [&](auto element, auto k_major) {
    using E = decltype(element);
    constexpr bool kK = decltype(k_major)::value;
    if (pingpong) {
      f(Variant<E, kK, 128, true>{});
    } else if (tile_n == 256) {
      f(Variant<E, kK, 256, false>{});
    } else {
      f(Variant<E, kK, 128, false>{});
    }
  };
  auto by_layout = [&](auto element) {
    b_k_major ? by_tile(element, std::true_type{}) : by_tile(element, std::false_type{});
  };
  bf16 ? by_layout(cutlass::bfloat16_t{}) : by_layout(cutlass::half_t{});
}

template <class V>
void launch(const Launch& l, cudaStream_t stream) {
  using Config = typename V::Config;
  typename V::Params params{};
  if (l.num_tiles > 0) {
    params.mainloop = gemm_engine::mainloop_params<Config>(l.problem, l.gathered, l.b);
    // This rank's rows in place: a descriptor of the same [M, K] whose row start[me] is the shard's
    // first. Only tiles within the shard load through it, so no row outside the shard is read.
    params.mainloop_alt = l.shared.own_in_place
                              ? gemm_engine::mainloop_params<Config>(l.problem, l.own_base, l.b)
                              : params.mainloop;
  } else {
    // Nothing to load (M, N or K is 0), but the kernel still runs for the handshake and the
    // transfers: TMA descriptors of a tiny problem on memory that exists (never read).
    GemmProblem tiny = l.problem;
    tiny.m = tiny.n = tiny.k = tiny.lda = tiny.ldb = tiny.ldc = 8;
    params.mainloop = params.mainloop_alt = gemm_engine::mainloop_params<Config>(tiny, l.dummy, l.dummy);
  }
  params.m = static_cast<int32_t>(l.problem.m);
  params.n = static_cast<int32_t>(l.problem.n);
  params.k = static_cast<int32_t>(l.problem.k);
  params.order = l.order;
  params.num_tiles = l.num_tiles;
  params.input_wait = l.shared;
  params.epilogue = {static_cast<typename Config::Element*>(l.out), l.problem.ldc};
  params.phases = l.shared;
  params.copy_ctas = l.shared.copy_ctas;
  gemm_engine::launch_kernel<Config>(V::kernel(), params, l.ctas, stream);
}

// Copy engines: the side stream's part of one call (AgGemmFlags says what each flag means). Pull
// each peer's shard from its landing buffer, in the order the tile order expects them (rank - 1
// first), as soon as that peer's kernel has staged it, chunk by chunk, raising each chunk's flag with
// a stream write. Pulling, not pushing: a call that some rank skips or aborts still writes only this
// rank's memory. Copies from a peer run on the copy engines; a copy within one GPU runs on the SMs,
// which the GEMM holds (measured: it waits for the kernel), so the kernel stages this rank's own
// shard. (cudaMemcpyAsync, not cuMemcpyBatchAsync: the latter cannot be captured in a CUDA graph.) Every wait here is released by the kernel
// if the call stops early.
void queue_transfers(SymmetricHeap& heap, const AgGemmShared& s, cudaStream_t stream) {
  const DriverApi& cu = driver();
  const CUstream c = reinterpret_cast<CUstream>(stream);
  const int me = s.transport.local_rank, world = s.transport.local_size;
  auto word = [](const uint64_t* flag) { return reinterpret_cast<CUdeviceptr>(flag); };  // its low half
  AgGemmFlags* mine = op_flags<AgGemmFlags, OpId::kAgGemm>(heap.pad(me));
  for (int k = 1; k < world; ++k) {
    const int q = (me - k + world) % world;
    IL_CU_CHECK(cu.cuStreamWaitValue32(c, word(&mine->staged[q]), 1, CU_STREAM_WAIT_VALUE_GEQ));
    const uint64_t at = s.gathered + static_cast<uint64_t>(s.rows.start[q] * s.row_bytes);
    const int64_t rows = s.rows.rows_of(q);
    for (int64_t first = 0, chunk = 0; first < rows; first += s.chunk_rows, ++chunk) {
      const uint64_t offset = static_cast<uint64_t>(first * s.row_bytes);
      const size_t bytes = static_cast<size_t>(std::min(s.chunk_rows, rows - first) * s.row_bytes);
      IL_CUDA_CHECK(cudaMemcpyAsync(heap.base(me) + at + offset, heap.base(q) + at + offset, bytes,
                                    cudaMemcpyDeviceToDevice, stream));
      IL_CU_CHECK(cu.cuStreamWriteValue32(c, word(&mine->arrived[q][chunk]), 1, CU_STREAM_WRITE_VALUE_DEFAULT));
    }
  }
}

bool same_dtype(const TensorView& a, const TensorView& b) {
  return a.dtype.code == b.dtype.code && a.dtype.bits == b.dtype.bits && a.dtype.lanes == b.dtype.lanes;
}

// Every rank's rows, from shard_rows or even shards of out's M; checked against this rank's shard.
std::vector<int64_t> rows_per_rank(const std::vector<int64_t>& shard_rows, int64_t m, int64_t mine, int rank,
                                   int world) {
  if (shard_rows.empty()) {
    IL_CHECK(m % world == 0, "ag_gemm: out has ", m, " rows, not a multiple of the ", world,
             " ranks; pass shard_rows (every rank's rows) for uneven shards");
    IL_CHECK(mine == m / world, "ag_gemm: a_shard has ", mine, " rows but out's ", m, " rows over ", world,
             " ranks make ", m / world, " per rank; pass shard_rows for uneven shards");
    return std::vector<int64_t>(world, m / world);
  }
  IL_CHECK(static_cast<int>(shard_rows.size()) == world, "ag_gemm: shard_rows has ", shard_rows.size(),
           " entries for ", world, " ranks");
  IL_CHECK(shard_rows[rank] == mine, "ag_gemm: shard_rows[", rank, "] is ", shard_rows[rank], " but a_shard has ",
           mine, " rows");
  IL_CHECK(std::accumulate(shard_rows.begin(), shard_rows.end(), int64_t{0}) == m, "ag_gemm: shard_rows sum to ",
           std::accumulate(shard_rows.begin(), shard_rows.end(), int64_t{0}), " but out has ", m, " rows");
  return shard_rows;
}

}  // namespace

void ag_gemm(Group& group, const TensorView& a_shard, const TensorView& b, const TensorView& out,
             const TensorView* gathered, const std::vector<int64_t>& shard_rows, cudaStream_t stream,
             AgGemmTuning tuning) {
  OpCall call(group, OpId::kAgGemm, stream);
  const Topology& topo = group.topology();
  SymmetricHeap& heap = group.heap();
  Launch l;
  int tile_n = 0;
  bool copy_out = false;
  AgGemmTransfer transfer = AgGemmTransfer::kAuto;
  const uint64_t signature = call.agree([&] {
    // Everything that can fail is checked here, before any GPU work, so that every rank raises.
    check_one_node(group, "ag_gemm");
    require_hopper(group.device(), "ag_gemm");
    IL_CHECK(a_shard.shape.size() == 2, "ag_gemm: a_shard must be 2-D [rows, K], got ", a_shard.shape_string());
    IL_CHECK(out.shape.size() == 2, "ag_gemm: out must be 2-D [M, N], got ", out.shape_string());
    IL_CHECK(a_shard.contiguous(), "ag_gemm: a_shard must be contiguous (row-major)");
    IL_CHECK(a_shard.device.device_type == kDLCUDA && a_shard.device.device_id == group.device(),
             "ag_gemm: a_shard is on ", a_shard.device_string(), " but the group's GPU is cuda:", group.device());
    IL_CHECK((a_shard.dtype.code == kDLBfloat || a_shard.dtype.code == kDLFloat) && a_shard.itemsize() == 2,
             "ag_gemm: a_shard must be bfloat16 or float16, got ", a_shard.dtype_name());
    const int64_t k = a_shard.shape[1];
    IL_CHECK(k <= kMaxGemmDim, "ag_gemm: K = ", k, " is past the engine's limit of 2^31 - 1024");
    const int64_t row_bytes = k * 2;
    IL_CHECK(row_bytes % 16 == 0, "ag_gemm: a_shard's rows are ", row_bytes,
             " bytes; they must be a multiple of 16 (K a multiple of 8)");
    IL_CHECK(reinterpret_cast<uintptr_t>(a_shard.data) % 16 == 0 || a_shard.nbytes() == 0,
             "ag_gemm: a_shard's data must be 16-byte aligned");
    IL_CHECK(topo.world_size <= kAgGemmMaxRanks, "ag_gemm: at most ", kAgGemmMaxRanks, " ranks");
    const std::vector<int64_t> rows =
        rows_per_rank(shard_rows, out.shape[0], a_shard.shape[0], topo.rank, topo.world_size);
    const int64_t m = out.shape[0];
    if (gathered) {
      IL_CHECK(gathered->shape.size() == 2 && gathered->shape[0] == m && gathered->shape[1] == k,
               "ag_gemm: gathered must be [", m, ", ", k, "], got ", gathered->shape_string());
      IL_CHECK(gathered->contiguous(), "ag_gemm: gathered must be contiguous (row-major)");
      IL_CHECK(same_dtype(*gathered, a_shard), "ag_gemm: gathered has dtype ", gathered->dtype_name(),
               " but a_shard has ", a_shard.dtype_name());
      IL_CHECK(gathered->device.device_type == kDLCUDA && gathered->device.device_id == group.device(),
               "ag_gemm: gathered is on ", gathered->device_string(), " but the group's GPU is cuda:", group.device());
    }
    IL_CHECK(tuning.tile_n == 0 || tuning.tile_n == 128 || tuning.tile_n == 256,
             "ag_gemm: tile_n must be 0 (automatic), 128 or 256, got ", tuning.tile_n);
    IL_CHECK(!tuning.pingpong || tuning.tile_n == 0 || tuning.tile_n == 128,
             "ag_gemm: ping-pong tiles are 128 wide; tile_n=", tuning.tile_n, " needs pingpong=False");
    IL_CHECK(tuning.chunk_rows >= 0, "ag_gemm: chunk_rows must be >= 0 (0: automatic), got ", tuning.chunk_rows);
    IL_CHECK(tuning.transfer >= AgGemmTransfer::kAuto && tuning.transfer <= AgGemmTransfer::kCopyCtas,
             "ag_gemm: unknown transfer ", static_cast<int>(tuning.transfer));
    IL_CHECK(tuning.copy_ctas == 0 || tuning.transfer == AgGemmTransfer::kCopyCtas,
             "ag_gemm: copy_ctas is for transfer='ctas' (CTAs set aside to push)");
    AgGemmShared& s = l.shared;
    s.rows = make_ag_gemm_rows(rows, topo.local_rank, 128);

    // Where the shards land: gathered itself when it is symmetric, else heap scratch. (Scratch grown
    // here is rolled back if a check below fails, here or on any rank: OpCall::agree.)
    const long long gathered_offset = gathered ? heap.offset_of(gathered->data, gathered->nbytes()) : -1;
    const uint64_t a_bytes = static_cast<uint64_t>(m) * row_bytes;
    const size_t landing = gathered_offset >= 0 ? static_cast<size_t>(gathered_offset)
                           : a_bytes == 0       ? 0
                                                : group.scratch(a_bytes, "ag_gemm's gathered A (M x K; or pass a "
                                                                "symmetric gathered= from group.empty)",
                                                                call.capturing());
    copy_out = gathered && gathered_offset < 0 && a_bytes > 0;
    TensorView a_full;
    a_full.data = heap.local_base() + landing;
    a_full.device = a_shard.device;
    a_full.dtype = a_shard.dtype;
    a_full.shape = {m, k};
    l.problem = check_gemm_args(a_full, b, out, group.device());  // b and out against the gathered A
    // Strides included: out or b may be views with row strides past their widths.
    IL_CHECK(!overlap_2d(out, a_shard), "ag_gemm: out and a_shard overlap; they must be separate memory");
    if (gathered) {
      IL_CHECK(!overlap_2d(*gathered, a_shard) && !overlap_2d(*gathered, out) && !overlap_2d(*gathered, b),
               "ag_gemm: gathered overlaps a_shard, b or out; they must be separate memory");
    }

    tile_n = tuning.pingpong ? 128
             : tuning.tile_n ? tuning.tile_n
                             : choose_tile_n(m, l.problem.n, group.num_sms(), kClusterM);
    const AgGemmRows cluster_rows = make_ag_gemm_rows(rows, topo.local_rank, 128 * kClusterM);
    const int band_m = ag_gemm_band_m(cluster_rows, tile_n == 256 ? 16 : 8, tuning.band_m);
    const TileGrid grid = tile_grid(m, l.problem.n, 128 * kClusterM, tile_n);
    with_variant(l.problem.dtype == GemmDtype::kBf16, l.problem.b_k_major, tile_n, tuning.pingpong,
                 [&](auto v) {
                   l.ctas = gemm_engine::resident_ctas_of<decltype(v)>(group.device(), group.num_sms());
                 });
    IL_CHECK(l.ctas >= kClusterM, "ag_gemm: no cluster of the kernel fits on the GPU");
    transfer = ag_gemm_transfer(tuning.transfer);
    s.copy_engine = transfer == AgGemmTransfer::kCopyEngine;
    s.copy_ctas = transfer == AgGemmTransfer::kCopyCtas ? ag_gemm_copy_ctas(l.ctas, kClusterM, tuning.copy_ctas) : 0;
    s.chunk_rows = ag_gemm_chunk_rows(s.rows, row_bytes, transfer, s.copy_ctas ? s.copy_ctas : l.ctas,
                                      tuning.chunk_rows);
    if (s.copy_engine) driver();  // stream memory operations: raises here, before any GPU work, without a driver
    l.num_tiles = l.problem.k == 0 ? 0 : grid.num_tiles();
    l.order = AgGemmOrder::make(cluster_rows, grid.tiles_n, band_m);
    s.transport = call.nvlink();
    s.wait = call.wait_context();
    s.shard = static_cast<const char*>(a_shard.data);
    s.gathered = landing;
    s.row_bytes = row_bytes;
    // The in-place descriptor's base lies before the shard (never read there); it must not wrap.
    const uintptr_t shard_address = reinterpret_cast<uintptr_t>(a_shard.data);
    const uint64_t before = static_cast<uint64_t>(s.rows.start[topo.local_rank]) * row_bytes;
    s.own_in_place = a_shard.nbytes() > 0 && shard_address >= before;
    l.own_base = reinterpret_cast<const void*>(shard_address - (s.own_in_place ? before : 0));
    l.dummy = heap.local_base();  // the signal pad
    l.gathered = a_full.data;
    l.b = b.data;
    l.out = out.data;
    std::string shards;
    for (int64_t r : rows) shards += concat(shards.empty() ? "" : ",", r);
    return concat("ag_gemm(m=", m, ", k=", k, ", n=", l.problem.n, ", shards=[", shards, "], dtype=",
                  a_shard.dtype_name(), ", b=", l.problem.b_k_major ? "k-major" : "n-major", ", landing=", landing,
                  ", gathered=", gathered ? (copy_out ? "ordinary" : "symmetric") : "none", ", chunk_rows=",
                  s.chunk_rows, ", transfer=", static_cast<int>(transfer), ", copy_ctas=", s.copy_ctas, ", tile_n=", tile_n, ", band_m=", band_m, ", pingpong=", tuning.pingpong, ")");
  });
  l.shared.signature = signature;
  call.launch([&](cudaStream_t s) {
    // K = 0: an empty sum; the kernel still runs, for its place in the op sequence (no tiles).
    if (l.problem.k == 0 && l.problem.m > 0 && l.problem.n > 0) {
      IL_CUDA_CHECK(cudaMemset2DAsync(l.out, l.problem.ldc * 2, 0, l.problem.n * 2, l.problem.m, s));
    }
    // The flags start at zero (AgGemmFlags): the header and the ranks' rows of arrived.
    AgGemmFlags* flags = op_flags<AgGemmFlags, OpId::kAgGemm>(heap.pad(topo.local_rank));
    const size_t flag_bytes = offsetof(AgGemmFlags, arrived) + topo.local_size() * sizeof(flags->arrived[0]);
    IL_CUDA_CHECK(cudaMemsetAsync(flags, 0, flag_bytes, s));
    // The side stream forks here, after the flags are zeroed and before the kernel it feeds.
    const Group::SideStream* side = l.shared.copy_engine ? &group.side_stream(s) : nullptr;
    if (side) IL_CUDA_CHECK(cudaEventRecord(side->fork, s));
    with_variant(l.problem.dtype == GemmDtype::kBf16, l.problem.b_k_major, tile_n, tuning.pingpong,
                 [&](auto v) { launch<decltype(v)>(l, s); });
    if (side) {
      IL_CUDA_CHECK(cudaStreamWaitEvent(side->stream, side->fork, 0));
      queue_transfers(heap, l.shared, side->stream);
      IL_CUDA_CHECK(cudaEventRecord(side->join, side->stream));
      IL_CUDA_CHECK(cudaStreamWaitEvent(s, side->join, 0));
    }
    if (copy_out) {
      IL_CUDA_CHECK(cudaMemcpyAsync(gathered->data, l.gathered, gathered->nbytes(), cudaMemcpyDeviceToDevice, s));
    }
  });
}

}  // namespace interlace
