#include "interlace/ops/gemm_rs/launch.h"

#include <numeric>
#include <string>

#include "interlace/base/cuda.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/tile_plan.h"
#include "interlace/ops/gemm_rs/engine.cuh"
#include "interlace/ops/gemm_rs/plan.h"
#include "interlace/runtime/op_call.h"

namespace interlace {
namespace {

using detail::concat;
using namespace gemm_rs_launch;

// Every rank's output rows, from shard_rows or even blocks of a's M; checked against out's rows here.
std::vector<int64_t> rows_per_rank(const std::vector<int64_t>& shard_rows, int64_t m, int64_t mine, int rank,
                                   int world) {
  if (shard_rows.empty()) {
    IL_CHECK(m % world == 0, "gemm_rs: a has ", m, " rows, not a multiple of the ", world,
             " ranks; pass shard_rows (every rank's output rows) for uneven blocks");
    IL_CHECK(mine == m / world, "gemm_rs: out has ", mine, " rows but a's ", m, " rows over ", world, " ranks make ",
             m / world, " per rank; pass shard_rows for uneven blocks");
    return std::vector<int64_t>(world, m / world);
  }
  IL_CHECK(static_cast<int>(shard_rows.size()) == world, "gemm_rs: shard_rows has ", shard_rows.size(),
           " entries for ", world, " ranks");
  for (int64_t r : shard_rows) IL_CHECK(r >= 0, "gemm_rs: shard_rows has a negative entry, ", r);
  IL_CHECK(shard_rows[rank] == mine, "gemm_rs: shard_rows[", rank, "] is ", shard_rows[rank], " but out has ", mine,
           " rows");
  const int64_t sum = std::accumulate(shard_rows.begin(), shard_rows.end(), int64_t{0});
  IL_CHECK(sum == m, "gemm_rs: shard_rows sum to ", sum, " but a has ", m, " rows");
  return shard_rows;
}

// a's own layout: check_gemm_args below sees only the rows this rank owns (none, on a rank without).
int64_t checked_lda(const TensorView& a) {
  const int64_t m = a.shape[0], k = a.shape[1];
  IL_CHECK(m <= kMaxGemmDim && k <= kMaxGemmDim, "gemm_rs: a is ", a.shape_string(),
           "; M and K must be at most 2^31 - 1024");
  if (m == 0 || k == 0) return 0;
  const int64_t lda = a.strides.empty() ? k : a.strides[0];
  const int64_t inner = a.strides.empty() ? 1 : a.strides[1];
  IL_CHECK(inner == 1 || k == 1, "gemm_rs: a must be row-major (K contiguous)");
  IL_CHECK(lda >= k, "gemm_rs: a's rows overlap (row stride ", lda, " < K = ", k, ")");
  IL_CHECK(lda < kMaxGemmRowStride, "gemm_rs: a's row stride ", lda, " is beyond TMA's 2^40-byte limit");
  IL_CHECK(lda % 8 == 0 && reinterpret_cast<uintptr_t>(a.data) % 16 == 0,
           "gemm_rs: a's rows must be 16-byte aligned (K a multiple of 8); K = ", k);
  return lda;
}

}  // namespace

void gemm_rs(Group& group, const TensorView& a, const TensorView& b, const TensorView& out,
             const std::vector<int64_t>& shard_rows, cudaStream_t stream, GemmRsTuning tuning) {
  OpCall call(group, OpId::kGemmRs, stream);
  const Topology& topo = group.topology();
  SymmetricHeap& heap = group.heap();
  Launch l;
  int tile_n = 0;
  const uint64_t signature = call.agree([&] {
    // Everything that can fail is checked here, before any GPU work, so that every rank raises.
    check_one_node(group, "gemm_rs");
    require_hopper(group.device(), "gemm_rs");
    IL_CHECK(a.shape.size() == 2 && b.shape.size() == 2 && out.shape.size() == 2,
             "gemm_rs: a, b and out must be 2-D ([M, K_r], [K_r, N], [rows of this rank, N]); got ", a.shape_string(),
             ", ", b.shape_string(), ", ", out.shape_string());
    IL_CHECK(a.device.device_type == kDLCUDA && a.device.device_id == group.device(), "gemm_rs: a is on ",
             a.device_string(), " but the group's GPU is cuda:", group.device());
    IL_CHECK(topo.world_size <= kGemmRsMaxRanks, "gemm_rs: at most ", kGemmRsMaxRanks, " ranks");
    const int me = topo.local_rank;
    const int64_t m = a.shape[0], k = a.shape[1];
    const std::vector<int64_t> rows = rows_per_rank(shard_rows, m, out.shape[0], topo.rank, topo.world_size);
    IL_CHECK(out.shape[1] == b.shape[1], "gemm_rs: out has ", out.shape[1], " columns but b has ", b.shape[1],
             " (b is [K_r, N]; for a Linear weight [N, K_r] pass weight.t())");
    const int64_t lda = checked_lda(a);
    // dtypes, b's layout, out's layout, shapes, devices and overlap of out with b: the plain GEMM's
    // checks on the rows this rank owns, which is what out holds.
    TensorView a_mine = a;
    a_mine.shape = {rows[me], k};
    l.problem = check_gemm_args(a_mine, b, out, group.device());
    IL_CHECK(!overlap_2d(out, a), "gemm_rs: out and a overlap; they must be separate memory");
    const int64_t ldo = l.problem.ldc;
    l.problem.m = m;
    l.problem.lda = lda;
    const int64_t n = l.problem.n;

    tile_n = checked_tile_n("gemm_rs", tuning, m, n, group.num_sms());
    const int band_m = band_m_for(tuning, tile_n);
    const GemmRsRows tile_rows = make_gemm_rs_rows(rows, me, kGemmRsTileM);
    const GemmRsRows cluster_rows = make_gemm_rs_rows(rows, me, kGemmRsClusterTileM);
    // fp32 partials only (the input dtype's are the plan's, not yet the kernel's). gemm_rs's one-shot
    // path is the same protocol as its throughput path (owners receive the partials either way; only
    // when the sums run differs, and the reducers run as soon as partials land), so it takes this one.
    GemmRsShared& s = l.shared;
    // The reducers' bands match the GEMM's, counted in 128-row tiles (a cluster tile row is two).
    s.plan = make_gemm_rs_plan(tile_rows, n, tile_n, GemmRsKind::kReduceScatter, GemmRsPath::kThroughput,
                               GemmRsPartials::kFp32, 2 * band_m);
    const TileGrid grid = tile_grid(m, n, kGemmRsClusterTileM, tile_n);
    with_variant<OpId::kGemmRs>(l.problem.dtype == GemmDtype::kBf16, l.problem.b_k_major, tile_n, tuning.pingpong,
                                /*decode=*/false, /*swap_tile_n=*/0, [&](auto v) {
                                  l.ctas = gemm_engine::resident_ctas_of<decltype(v)>(group.device(), group.num_sms());
                                });
    const bool on_grid = gemm_rs_sums_in_epilogue(tile_rows);
    s.sum_in_epilogue = tuning.reduce_ctas == 0 && on_grid;
    l.reduce_ctas = s.sum_in_epilogue ? 0 : gemm_rs_reduce_ctas(l.ctas, kClusterM, tuning.reduce_ctas);
    l.num_tiles = k == 0 ? 0 : grid.num_tiles();
    int round_m = 0;
    l.order = tile_order(tuning, cluster_rows, grid.tiles_n, band_m, on_grid, &round_m);

    // Staging (GemmRsPlan::staging_bytes, the same on every rank) at the same heap offset everywhere:
    // the offset is part of the signature, so ranks whose scratch differs raise rather than run.
    const size_t staging = s.plan.staging_bytes == 0 ? 0
                           : group.scratch(s.plan.staging_bytes,
                                           "gemm_rs's staging (fp32 partials of every tile this rank owns, from every "
                                           "rank; grow the heap, or split the call along M or N)",
                                           call.capturing());
    s.transport = call.nvlink();
    s.wait = call.wait_context();
    s.staging = staging;
    s.out = out.data;
    s.ldo = ldo;
    s.out_first_row = tile_rows.start[me];
    s.landing = 0;  // gemm_ar's
    s.landing_tiles = 0;
    s.n = static_cast<int32_t>(n);
    s.reduce_tiles = k == 0 || s.sum_in_epilogue ? 0 : s.plan.reduced_rows(me) * s.plan.tiles_n;
    l.a = a.data;
    l.b = b.data;
    l.dummy = heap.local_base();  // the signal pad
    std::string blocks;
    for (int64_t r : rows) blocks += concat(blocks.empty() ? "" : ",", r);
    // K_r is this rank's own (ranks may split K unevenly); only whether it is 0 must agree, since a
    // rank with K_r = 0 computes nothing and sends no partials.
    return concat("gemm_rs(m=", m, ", n=", n, ", k_r>0=", k > 0, ", rows=[", blocks, "], dtype=", a.dtype_name(),
                  ", staging=", staging, ", tile_n=", tile_n, ", band_m=", band_m, ", pingpong=", tuning.pingpong,
                  ", reduce_ctas=", l.reduce_ctas, ", round_m=", round_m, ")");
  });
  l.shared.signature = signature;
  call.launch([&](cudaStream_t s) {
    // K = 0 everywhere: an empty sum; the kernel still runs, for its place in the op sequence.
    const int64_t my_rows = out.shape[0];
    if (l.problem.k == 0 && my_rows > 0 && l.problem.n > 0) {
      IL_CUDA_CHECK(cudaMemset2DAsync(out.data, l.shared.ldo * 2, 0, l.problem.n * 2, my_rows, s));
    }
    with_variant<OpId::kGemmRs>(l.problem.dtype == GemmDtype::kBf16, l.problem.b_k_major, tile_n, tuning.pingpong,
                                /*decode=*/false, /*swap_tile_n=*/0, [&](auto v) { launch<decltype(v)>(l, s); });
  });
}

}  // namespace interlace
