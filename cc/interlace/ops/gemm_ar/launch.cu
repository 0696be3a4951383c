// gemm_ar: gemm_rs's kernel (ops/gemm_rs/kernel.cuh) on one of two paths (choose_gemm_rs_path):
//   throughput  owners of whole 256-row cluster-tile rows (gemm_ar_rows_per_rank) sum their tiles in
//               the epilogue and also store each sum into every peer's landing tile for it; each
//               rank's CTAs copy the other owners' landed tiles into out after their GEMM tiles
//               (with a given reduce_ctas, reducer CTAs sum, push and copy instead);
//   one-shot    (decode: small M, one wave of tiles, a small push) every rank's epilogue pushes every
//               tile's partial to every peer, then sums the tile itself: no second hop (with a given
//               reduce_ctas, every rank's reducers sum all of out instead).
// Every path sums the ranks' partials in rank order, so out has the same bits on every rank. The
// decode variant's runs of K add partial sums of each rank's K first, so its bits differ from the
// other paths' (each deterministic).
#include "interlace/ops/gemm_ar/launch.h"

#include <string>

#include "interlace/base/cuda.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/tile_plan.h"
#include "interlace/ops/gemm_rs/engine.cuh"
#include "interlace/ops/gemm_rs/plan.h"
#include "interlace/runtime/op_call.h"

namespace interlace {

using detail::concat;
using namespace gemm_rs_launch;

void gemm_ar(Group& group, const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream,
             GemmRsTuning tuning) {
  OpCall call(group, OpId::kGemmAr, stream);
  const Topology& topo = group.topology();
  SymmetricHeap& heap = group.heap();
  Launch l;
  GemmProblem problem;  // out = a @ b, as the caller sees it; l.problem is what the engine computes
  int tile_n = 0;
  bool decode = false;
  int swap_tile_n = 0;
  const uint64_t signature = call.agree([&] {
    // Everything that can fail is checked here, before any GPU work, so that every rank raises.
    check_one_node(group, "gemm_ar");
    require_hopper(group.device(), "gemm_ar");
    IL_CHECK(topo.world_size <= kGemmRsMaxRanks, "gemm_ar: at most ", kGemmRsMaxRanks, " ranks");
    // out is the whole [M, N], so the plain GEMM's checks apply as they are.
    problem = check_gemm_args(a, b, out, group.device());
    const int me = topo.local_rank;
    const int64_t m = problem.m, n = problem.n, k = problem.k;
    tile_n = checked_tile_n("gemm_ar", tuning, m, n, group.num_sms());
    const int band_m = band_m_for(tuning, tile_n);
    GemmRsShared& s = l.shared;
    // fp32 partials only, as gemm_rs.
    const GemmRsPath path = choose_gemm_rs_path(m, n, k, topo.world_size, GemmRsKind::kAllReduce,
                                                GemmRsPartials::kFp32, group.num_sms(), tile_n);
    const bool one_shot = path == GemmRsPath::kOneShot;
    // Decode (the one-shot path at one tile row, automatic tiling): cooperative tiles without
    // clusters, and runs of K, so that a few tiles still fill the SMs (gemm_ar_k_runs). With a Linear
    // weight, the swapped problem instead, as interlace.gemm's at these sizes (decode_swap_tile_n):
    // the engine computes out^T = b^T a^T in 64-row ping-pong tiles of N, swap_tile_n wide.
    decode = one_shot && m <= kGemmRsTileM && tuning.pingpong && tuning.tile_n == 0 && tuning.reduce_ctas == 0;
    // b's layout then decides the staging's tiles, so it must be the same on every rank: swap_tile_n
    // is part of the signature, and ranks that differ raise (mismatched arguments).
    swap_tile_n = decode && problem.b_k_major ? decode_swap_tile_n(m, n, group.num_sms()) : 0;
    l.problem = swap_tile_n != 0 ? transposed(problem) : problem;
    const int64_t engine_m = l.problem.m, engine_n = l.problem.n;
    const int tile_m = swap_tile_n != 0 ? 64 : kGemmRsTileM;
    const int engine_tile_n = swap_tile_n != 0 ? swap_tile_n : tile_n;
    const int cluster = decode ? 1 : kClusterM;
    // Who reduces what is the plan's choice: whole, balanced cluster-tile rows, one owner per tile, so
    // that the owners sum in the epilogue (gemm_rs_sums_in_epilogue). Rows of the engine's problem
    // (the swapped one's are out's columns; on the one-shot path every rank sums every tile anyway).
    const std::vector<int64_t> rows = gemm_ar_rows_per_rank(engine_m, topo.world_size, tile_m * kClusterM);
    const GemmRsRows tile_rows = make_gemm_rs_rows(rows, me, tile_m);
    with_variant<OpId::kGemmAr>(problem.dtype == GemmDtype::kBf16, problem.b_k_major, tile_n, tuning.pingpong, decode,
                                swap_tile_n, [&](auto v) {
                                  l.ctas = gemm_engine::resident_ctas_of<decltype(v)>(group.device(), group.num_sms());
                                });
    const TileGrid grid = tile_grid(engine_m, engine_n, tile_m * cluster, engine_tile_n);
    l.k_runs = decode ? gemm_ar_k_runs(grid.num_tiles(), l.ctas) : 1;
    s.plan = make_gemm_rs_plan(tile_rows, engine_n, engine_tile_n, GemmRsKind::kAllReduce, path, GemmRsPartials::kFp32,
                               2 * band_m, l.k_runs);
    // The throughput path: owners sum their tiles in the epilogue and store them into every peer's
    // landing tiles, which each CTA's consumers copy into out after its GEMM tiles; no reducers (32
    // of them measured 1.92 ms at 8192^3 against 1.09). The one-shot path: every rank pushes every
    // tile's partial to its peers and sums the tile itself in the epilogue. A given reduce_ctas keeps
    // the reducers on either path.
    s.sum_in_epilogue = tuning.reduce_ctas == 0 && (one_shot || gemm_rs_sums_in_epilogue(tile_rows));
    l.reduce_ctas = s.sum_in_epilogue ? 0 : gemm_rs_reduce_ctas(l.ctas, kClusterM, tuning.reduce_ctas);
    l.num_tiles = k == 0 ? 0 : grid.num_tiles() * l.k_runs;
    // Rounds, as gemm_rs: the owners' sums, and so the landing tiles, then come all along the GEMM.
    // One-shot: every rank walks the same order (that of the last rank, whose owners' slots come in
    // rank order), so that a tile's partials are computed at the same position everywhere; whole
    // blocks, since every tile goes to every rank anyway (rounds' slots made each position's lookup
    // a loop of 32 steps at N = 8192, under ncu).
    int round_m = 0;
    const GemmRsRows order_rows = make_gemm_rs_rows(rows, one_shot ? topo.world_size - 1 : me, tile_m * cluster);
    l.order = tile_order(tuning, order_rows, grid.tiles_n, band_m, s.sum_in_epilogue && !one_shot, &round_m);

    // Scratch, at the same heap offset on every rank (part of the signature): the partials' staging,
    // then, on the throughput path, a landing tile of the output type for every output tile.
    const uint64_t staging_bytes = (s.plan.staging_bytes + 255) / 256 * 256;
    const int32_t all_tiles = tile_rows.tiles_m() * s.plan.tiles_n;
    const int32_t landing_tiles = s.plan.broadcast ? all_tiles : 0;
    const uint64_t landing_bytes = landing_offset(s.plan, 0, landing_tiles, 2);  // where a tile past the last would go
    const size_t scratch = staging_bytes + landing_bytes == 0
                               ? 0
                               : group.scratch(staging_bytes + landing_bytes,
                                               "gemm_ar's staging (fp32 partials of the tiles this rank owns, from "
                                               "every rank) and landing tiles (all of out); grow the heap, or split "
                                               "the call along M or N",
                                               call.capturing());
    s.transport = call.nvlink();
    s.wait = call.wait_context();
    s.staging = scratch;
    s.landing = scratch + staging_bytes;
    s.out = out.data;
    s.ldo = problem.ldc;
    s.out_first_row = 0;
    s.n = static_cast<int32_t>(engine_n);
    s.reduce_tiles = k == 0 || s.sum_in_epilogue ? 0 : s.plan.reduced_rows(me) * s.plan.tiles_n;
    s.landing_tiles = k == 0 ? 0 : landing_tiles;
    l.a = swap_tile_n != 0 ? b.data : a.data;
    l.b = swap_tile_n != 0 ? a.data : b.data;
    l.dummy = heap.local_base();  // the signal pad
    // K_r is this rank's own; only whether it is 0 must agree (a rank with none sends no partials).
    return concat("gemm_ar(m=", m, ", n=", n, ", k_r>0=", k > 0, ", dtype=", a.dtype_name(), ", path=",
                  static_cast<int>(path), ", scratch=", scratch,
                  ", tile_n=", tile_n, ", band_m=", band_m, ", pingpong=", tuning.pingpong,
                  ", reduce_ctas=", l.reduce_ctas, ", round_m=", round_m, ", decode=", decode, ", swap_tile_n=", swap_tile_n, ", k_runs=", l.k_runs,
                  ")");
  });
  l.shared.signature = signature;
  call.launch([&](cudaStream_t s) {
    // K = 0 everywhere: an empty sum; the kernel still runs, for its place in the op sequence.
    if (problem.k == 0 && problem.m > 0 && problem.n > 0) {
      IL_CUDA_CHECK(cudaMemset2DAsync(out.data, problem.ldc * 2, 0, problem.n * 2, problem.m, s));
    }
    with_variant<OpId::kGemmAr>(problem.dtype == GemmDtype::kBf16, problem.b_k_major, tile_n, tuning.pingpong, decode,
                                swap_tile_n, [&](auto v) { launch<decltype(v)>(l, s); });
  });
}

}  // namespace interlace
