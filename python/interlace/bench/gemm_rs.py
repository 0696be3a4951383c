"""gemm_rs / gemm_ar (fused GEMM + ReduceScatter / AllReduce) benchmark, one rank. Started by
`python -m interlace.bench gemm_rs` (or gemm_ar).

The tensor-parallel row linear: shapes are global (M, K, N); each rank holds a [M, K / W] and its own
weight [N, K / W] (passed as weight.t()), and the output is the sum over ranks of a @ b: this rank's
M / W rows of it (gemm_rs) or all of it (gemm_ar). At each shape, first the checks: interlace against
torch.matmul + NCCL (relative error < 1e-2) and two interlace calls bit for bit; then the timing, on
the same GPUs in one run (CUDA events, medians, the slower rank's median; methods alternate in
blocks):
  interlace        interlace.gemm_rs / gemm_ar; interlace_graph: the same call replayed from a graph
  nccl_cublas      torch.matmul (cuBLAS) into an [M, N] partial, then dist.reduce_scatter_tensor /
                   dist.all_reduce
  torch_fused      gemm_rs: torch.ops.symm_mem.fused_matmul_reduce_scatter; None, with the reason,
                   where it does not run (gemm_ar: torch has no fused op)
  gemm_alone       interlace.gemm of the local partial: the floor for a fused op
Rows: the issue's headline shapes, then M from 1024 to 32768 at K = N = 8192; gemm_ar adds the
decode rows, M = 1 to 256 at K = N = 8192, where every method (interlace, nccl_cublas, gemm_alone) is
timed as a CUDA-graph replay of one call, and the row says "graph": true. --sizes=MxKxN,... (or plain
M) replaces them all."""
import os

from interlace.bench import launch

# NVLink multicast can take shared GPUs down: torch's symmetric memory must not use it.
os.environ.update(launch.SAFE_ENV)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from absl import app, flags  # noqa: E402

import interlace  # noqa: E402
from interlace.bench import common  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_list("sizes", [], "global shapes MxKxN, M (the sweep's K and N), or decode (gemm_ar's decode rows); "
                  "default: headline + sweep (+ decode)")
flags.DEFINE_integer("warmup", 10, "")
flags.DEFINE_integer("iters", 50, "at most; big shapes get fewer (about 0.3 s of timed launches per method)")
flags.DEFINE_list("tunings", [], "interlace settings to time besides the automatic ones, "
                  "reduce_ctas:tile_n:band_m:pingpong[:round_m] (0 = automatic; pingpong 1 or 0; round_m gemm_rs's)")
flags.DEFINE_string("command", "", "")

KIND = "rs"  # gemm_ar.py sets "ar" before running main
HEADLINE = {"rs": [(8192, 14336, 8192), (4096, 8192, 8192)],
            "ar": [(8192, 8192, 8192), (4096, 8192, 8192), (2048, 8192, 8192)]}
SWEEP_KN = (8192, 8192)
SWEEP_M = [1024 << i for i in range(6)]  # 1024 ... 32768
DECODE_M = [1, 16, 64, 128, 256]  # gemm_ar only: timed under graph replay on both sides
DTYPE = torch.bfloat16
METHODS = ("interlace", "nccl_cublas", "torch_fused", "gemm_alone")


def op_name():
    return f"gemm_{KIND}"


def shapes_from_flags():
    """[(m, k, n, series)]."""
    k, n = SWEEP_KN
    decode = [(m, k, n, "decode") for m in DECODE_M] if KIND == "ar" else []
    if not FLAGS.sizes:
        return [(*s, "headline") for s in HEADLINE[KIND]] + [(m, k, n, f"K={k}, N={n}") for m in SWEEP_M] + decode
    sizes = [s for s in FLAGS.sizes if s != "decode"]
    return common.shapes_from_sizes(sizes, [SWEEP_KN]) + (decode if "decode" in FLAGS.sizes else [])


def tunings_from_flags():
    tunings = [(0, 0, 0, 1, 0)]  # the automatic settings, timed as "interlace"
    for t in FLAGS.tunings:
        given = [int(f or 0) for f in t.split(":")[:5]]
        tuning = tuple(given + [0, 0, 0, 1, 0][len(given):])
        if tuning not in tunings:
            tunings.append(tuning)
    return tunings


def call_interlace(a, b, out, group, kw):
    if KIND == "rs":
        interlace.gemm_rs(a, b, out, group, **kw)
    else:
        interlace.gemm_ar(a, b, out, group, **kw)


def main(_):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    shapes = shapes_from_flags()
    for m, k, n, _ in shapes:
        # gemm_rs splits M over the ranks; gemm_ar's out is whole everywhere, so any M.
        if (KIND == "rs" and m % world) or k % (8 * world) or n % 8 or m <= 0 or k <= 0 or n <= 0:
            raise SystemExit(f"shape M={m} K={k} N={n}: K must be a multiple of 8 x the {world} ranks, N of 8 "
                             "and, for gemm_rs, M of the ranks")
    tunings = tunings_from_flags()
    # Staging: the fp32 partials of this rank's rows from every rank (M x N x 4, about); gemm_ar also
    # lands every reduced tile (M x N x 2). Each shape is also captured in a CUDA graph, and scratch
    # that a graph may use is kept while the group lives: room for every shape's.
    heap = sum(m * n for m, _, n, _ in shapes) * 6 + (256 << 20)
    group = interlace.init(heap_bytes=heap, timeout_s=60.0)
    fused = common.SymmMemBaseline() if KIND == "rs" else None
    common.warm_up_gpu()
    rows = []
    for m, k, n, series in shapes:
        rows.append(measure(group, fused, m, k, n, series, rank, world, tunings))
        if rank == 0:
            r = rows[-1]
            print(f"M={m} K={k} N={n}: " + "  ".join(f"{label} {ms:.3f}" if ms is not None else f"{label} -"
                                                     for label, ms in r["ms"].items()) + " ms", flush=True)
    group.check()
    if rank == 0:
        report(rows, world)
    dist.destroy_process_group()


def measure(group, fused, m, k, n, series, rank, world, tunings):
    """Checks and times every method at one global shape; all tensors are freed on return."""
    k_local, m_out = k // world, (m // world if KIND == "rs" else m)
    g = torch.Generator(device="cuda").manual_seed(m * 31 + k * 7 + n + rank)
    a = torch.randn(m, k_local, device="cuda", dtype=DTYPE, generator=g)
    b = torch.randn(n, k_local, device="cuda", dtype=DTYPE, generator=g).t()  # a Linear weight, as weight.t()
    partial = torch.empty(m, n, device="cuda", dtype=DTYPE)
    out_ref = torch.empty(m_out, n, device="cuda", dtype=DTYPE)

    def nccl_cublas():
        torch.matmul(a, b, out=partial)
        if KIND == "rs":
            dist.reduce_scatter_tensor(out_ref, partial)
        else:
            dist.all_reduce(partial)
            out_ref.copy_(partial)  # (a copy the fused op does not need; small beside the GEMM)

    nccl_cublas()
    torch.cuda.synchronize()
    row = {"m": m, "k": k, "n": n, "series": series, "k_local": k_local, "b": "weight.t()", "dtype": "bfloat16",
           "check": {}}
    methods = {}
    out = torch.empty(m_out, n, device="cuda", dtype=DTYPE)
    first = torch.empty_like(out)
    for reduce_ctas, tile_n, band_m, pingpong, round_m in tunings:
        automatic = (reduce_ctas, tile_n, band_m, pingpong, round_m) == (0, 0, 0, 1, 0)
        label = "interlace" if automatic else f"interlace[{reduce_ctas}:{tile_n}:{band_m}:{pingpong}:{round_m}]"
        kw = {"reduce_ctas": reduce_ctas, "tile_n": tile_n, "band_m": band_m, "pingpong": bool(pingpong)}
        if round_m:
            kw["round_m"] = round_m
        problem = None
        for attempt in range(2):
            out.fill_(float("nan"))
            call_interlace(a, b, out, group, kw)
            torch.cuda.synchronize()
            group.check()
            if attempt == 0:
                first.copy_(out)
        err = common.relative_error(out, out_ref)
        if not err < 2e-2:  # also NaN: rows never written (bf16 partials round differently from fp32 ones)
            problem = (f"{label} wrong at M={m} K={k} N={n}: relative error {err:.2e} against cuBLAS + NCCL, "
                       f"{int(out.isnan().sum())} elements unwritten")
        elif not torch.equal(out.view(torch.int16), first.view(torch.int16)):
            problem = f"{label} at M={m} K={k} N={n}: two calls differ in bits"
        if not common.all_ranks(problem is None):
            raise SystemExit(f"rank {rank}: {problem or 'another rank found a wrong result'}")
        row["check"][label] = err
        methods[label] = lambda kw=kw: call_interlace(a, b, out, group, kw)
    methods["interlace_graph"] = common.graph_of(lambda: call_interlace(a, b, out, group, {}), 1)
    methods["nccl_cublas"] = nccl_cublas

    row["torch_fused_error"] = "torch has no fused matmul + all_reduce" if KIND == "ar" else None
    if fused is not None:
        def make_fused():
            if fused.reason:
                raise RuntimeError(fused.reason)
            a_symm = fused.symmetric_copy(a)

            def call():
                return torch.ops.symm_mem.fused_matmul_reduce_scatter(a_symm, b, "sum", 0, fused.group_name)

            result = call()
            torch.cuda.synchronize()
            err = common.relative_error(result, out_ref)
            if not err < 2e-2:
                raise RuntimeError(f"wrong result: relative error {err:.2e} against cuBLAS + NCCL")
            row["check"]["torch_fused"] = err
            return call

        fn, row["torch_fused_error"] = common.agreed(make_fused, "torch_fused")
        if fn is not None:
            methods["torch_fused"] = fn

    methods["gemm_alone"] = lambda: interlace.gemm(a, b, partial)
    row["graph"] = series == "decode"
    if row["graph"]:  # decode: what a serving loop runs, a replay of a captured step, on every side
        del methods["interlace_graph"]  # "interlace" is that replay here
        methods = {label: common.graph_of(fn, 1) for label, fn in methods.items()}

    iters = common.gemm_iters(2.0 * m * k_local * n, FLAGS.iters)
    medians = common.time_collective(methods, FLAGS.warmup, iters)
    group.check()
    row["iters"] = iters
    row["ms"] = {label: medians.get(label) for label in METHODS}
    row["ms"].update({label: ms for label, ms in medians.items() if label not in METHODS})
    ms = row["ms"]
    row["speedup_vs_nccl_cublas"] = ms["nccl_cublas"] / ms["interlace"]
    row["speedup_vs_torch_fused"] = ms["torch_fused"] / ms["interlace"] if ms["torch_fused"] else None
    row["ratio_to_gemm_alone"] = ms["interlace"] / ms["gemm_alone"]
    return row


def report(rows, world):
    env = common.environment(FLAGS.command)
    name = f"{op_name()}_{world}x{env['gpu'].replace(' ', '_')}"
    sweep = [r for r in rows if r["series"] not in ("headline", "decode")]

    def plot(path):
        if len(sweep) < 2:
            return
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        ms = [r["m"] for r in sweep]
        ax.plot(ms, [r["speedup_vs_nccl_cublas"] for r in sweep], marker="o", label="vs cuBLAS + NCCL")
        torch_rows = [(r["m"], r["speedup_vs_torch_fused"]) for r in sweep if r["speedup_vs_torch_fused"]]
        if torch_rows:
            ax.plot(*zip(*torch_rows), marker="s", label="vs torch fused_matmul_reduce_scatter")
        ax.plot(ms, [1 / r["ratio_to_gemm_alone"] for r in sweep], marker="^", linestyle="--",
                label="vs interlace.gemm alone (the floor)")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (global rows)")
        ax.set_ylabel(f"speedup of interlace.{op_name()}")
        ax.set_title(f"{op_name()}, {world} x {env['gpu']}, bf16, {sweep[0]['series']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    payload = {"op": op_name(), "gpu": env["gpu"], "date": env["date"], "command": env["command"], "env": env,
               "dtype": "bfloat16", "layout": "a [M, K/W] per rank; b [K/W, N] per rank as weight.t()", "rows": rows}
    path = common.write_results(FLAGS.out_dir, name, payload, plot)
    print(f"wrote {path}")
    print("median ms; speedup = baseline / interlace; floor = interlace / gemm_alone")
    print(f"{'M':>6} {'K':>6} {'N':>6} {'interlace':>10} {'graph':>8} {'nccl_cublas':>11} {'torch_fused':>11} "
          f"{'gemm_alone':>10} {'vs nccl':>8} {'floor':>6}")
    for r in rows:
        ms = r["ms"]
        fused = f"{ms['torch_fused']:11.3f}" if ms["torch_fused"] else f"{'-':>11}"
        graph = ms["interlace"] if r["graph"] else ms["interlace_graph"]
        print(f"{r['m']:6} {r['k']:6} {r['n']:6} {ms['interlace']:10.3f} {graph:8.3f} "
              f"{ms['nccl_cublas']:11.3f} {fused} {ms['gemm_alone']:10.3f} {r['speedup_vs_nccl_cublas']:8.2f} "
              f"{r['ratio_to_gemm_alone']:6.2f}")
    for reason in sorted({r["torch_fused_error"] for r in rows if r["torch_fused_error"]}):
        print(f"torch_fused did not run: {reason}")


if __name__ == "__main__":
    app.run(main)
