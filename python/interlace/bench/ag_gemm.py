"""ag_gemm (fused AllGather + GEMM) benchmark, one rank. Started by `python -m interlace.bench ag_gemm`.

The tensor-parallel column linear: shapes are global (M, K, N); each rank holds M / W rows of A and
its own b of [K, N / W] (a Linear weight [N / W, K] passed as weight.t()), and computes
out = A_full @ b, [M, N / W]. At each shape, first the check: interlace.ag_gemm against NCCL's
all-gather + torch.matmul (relative error < 1e-2, the gathered A bit for bit), then the timing, on the
same GPUs in one run (CUDA events, medians, the slower rank's median; methods alternate in blocks so
that all see the same clocks):
  interlace    interlace.ag_gemm, writing the gathered A too (as both baselines do)
  nccl_cublas  dist.all_gather_into_tensor, then torch.matmul (cuBLAS)
  torch_fused  torch.ops.symm_mem.fused_all_gather_matmul (torch's micro-pipelined AG + matmul);
               None, with the reason, where it does not run
  gemm_alone   interlace.gemm on the already gathered A: the floor for a fused op
Rows: three headline shapes, then M from 512 to 32768 at (K, N) = (4096, 14336) and (8192, 28672).
--sizes=MxKxN,... (or plain M: both sweeps) replaces them."""
import os

from interlace.bench import launch

# NVLink multicast can take shared GPUs down: torch's symmetric memory must not use it, even when this
# worker is started by something other than the launcher (which sets the same variables).
os.environ.update(launch.SAFE_ENV)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from absl import app, flags  # noqa: E402

import interlace  # noqa: E402
import interlace.torch as itorch  # noqa: E402
from interlace.bench import common  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_list("sizes", [], "global shapes MxKxN, or M (both sweeps' K and N); default: headline + sweeps")
flags.DEFINE_integer("warmup", 10, "")
flags.DEFINE_integer("iters", 50, "at most; big shapes get fewer (about 0.3 s of timed launches per method)")
flags.DEFINE_list("tunings", [], "interlace settings to time besides the automatic ones, "
                  "chunk_rows:tile_n:band_m:pingpong:transfer (0 = automatic; pingpong 1 or 0; transfer "
                  "copy_engine, or ctasN: N SMs set aside to push)")
flags.DEFINE_string("command", "", "")

HEADLINE = [(8192, 8192, 14336), (4096, 8192, 8192), (16384, 8192, 8192)]
SWEEP_KN = [(4096, 14336), (8192, 28672)]
SWEEP_M = [512 << i for i in range(7)]  # 512 ... 32768
DTYPE = torch.bfloat16
METHODS = ("interlace", "nccl_cublas", "torch_fused", "gemm_alone")


def shapes_from_flags():
    """[(m, k, n, series)]; series names the sweep a row belongs to (the plot draws one line each)."""
    if not FLAGS.sizes:
        return ([(m, k, n, "headline") for m, k, n in HEADLINE] +
                [(m, k, n, f"K={k}, N={n}") for k, n in SWEEP_KN for m in SWEEP_M])
    return common.shapes_from_sizes(FLAGS.sizes, SWEEP_KN)


def check_or_exit(problem, rank):
    """Every rank exits if any rank found a problem (its own reason printed where it was found)."""
    if not common.all_ranks(problem is None):
        raise SystemExit(f"rank {rank}: {problem or 'another rank found a wrong result'}")


class TorchFused(common.SymmMemBaseline):
    """torch.ops.symm_mem.fused_all_gather_matmul, or why it cannot run here. Every failure is
    recorded, never raised: a baseline that does not run must not stop the benchmark."""

    def prepare(self, a_shard, b):
        """A zero-argument function timing one call, and the out it returns on a first call (or None
        and the reason). Collective: every rank must call it, and rank failures are agreed on."""
        out, reason, a_symm = None, self.reason, None

        def call():
            # return_A=True: the gathered A is an output here as in the other methods, and torch then
            # never takes its multicast (NVLS) path.
            return torch.ops.symm_mem.fused_all_gather_matmul(a_symm, [b], 0, self.group_name, return_A=True)

        if reason is None:
            try:
                a_symm = self.symmetric_copy(a_shard)
                out = call()[1][0]
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                reason = f"{type(e).__name__}: {e}".strip()[:500]
        # A baseline that fails on one rank is dropped on all, so that no rank waits in it alone.
        if not common.all_ranks(reason is None):
            return None, None, reason or "failed on another rank"
        return call, out, None


def main(_):
    rank, world = common.init_rank()
    shapes = shapes_from_flags()
    for m, k, n, _ in shapes:
        if m % world or n % world or m <= 0 or k <= 0 or n <= 0:
            raise SystemExit(f"shape M={m} K={k} N={n}: M and N must be positive multiples of the {world} ranks")
    tunings = [(0, 0, 0, 1, "auto")]  # the automatic settings are always timed, as "interlace"
    for t in FLAGS.tunings:
        given = t.split(":")
        fields = [int(f or 0) for f in given[:4]] + [0, 0, 0, 1][len(given[:4]):] + [given[4] if len(given) > 4 else "auto"]
        tuning = tuple(fields)
        if tuning not in tunings:
            tunings.append(tuning)
    # Room for the largest gathered A twice (op scratch: receive buffer and more) and flags.
    heap = 2 * max(m * k for m, k, _, _ in shapes) * DTYPE.itemsize + (256 << 20)
    group = interlace.init(heap_bytes=heap, timeout_s=60.0)
    torch_fused = TorchFused()
    common.warm_up_gpu()
    rows = []
    for m, k, n, series in shapes:
        rows.append(measure(group, torch_fused, m, k, n, series, rank, world, tunings))
        if rank == 0:
            r = rows[-1]
            print(f"M={m} K={k} N={n}: " + "  ".join(f"{label} {ms:.3f}" if ms is not None else f"{label} -"
                                                     for label, ms in r["ms"].items()) + " ms", flush=True)
    group.check()
    if rank == 0:
        report(rows, world)
    dist.destroy_process_group()


def measure(group, torch_fused, m, k, n, series, rank, world, tunings):
    """Checks and times every method at one global shape; all tensors are freed on return."""
    m_local, n_local = m // world, n // world
    g = torch.Generator(device="cuda").manual_seed(m * 31 + k * 7 + n + rank)
    a_shard = torch.randn(m_local, k, device="cuda", dtype=DTYPE, generator=g)
    b = torch.randn(n_local, k, device="cuda", dtype=DTYPE, generator=g).t()  # a Linear weight, as weight.t()
    a_full = torch.empty(m, k, device="cuda", dtype=DTYPE)
    out_ref = torch.empty(m, n_local, device="cuda", dtype=DTYPE)

    def nccl_cublas():
        dist.all_gather_into_tensor(a_full, a_shard)
        torch.matmul(a_full, b, out=out_ref)

    nccl_cublas()
    torch.cuda.synchronize()
    row = {"m": m, "k": k, "n": n, "series": series, "n_local": n_local, "b": "weight.t()", "dtype": "bfloat16",
           "check": {}}
    methods = {}

    # interlace: the result against NCCL + cuBLAS, the gathered A bit for bit; outputs poisoned first.
    out = torch.empty(m, n_local, device="cuda", dtype=DTYPE)
    # Symmetric (group.empty): the shards land in it directly, as they do in NCCL's output.
    gathered = itorch.empty(group, (m, k), DTYPE)
    for chunk, tile_n, band_m, pingpong, transfer in tunings:
        automatic = (chunk, tile_n, band_m, pingpong, transfer) == (0, 0, 0, 1, "auto")
        label = "interlace" if automatic else f"interlace[{chunk}:{tile_n}:{band_m}:{pingpong}:{transfer}]"
        kwargs = {"chunk_rows": chunk, "tile_n": tile_n, "band_m": band_m, "pingpong": bool(pingpong),
                  "transfer": "ctas" if transfer.startswith("ctas") else transfer,
                  "copy_ctas": int(transfer[4:] or 0) if transfer.startswith("ctas") else 0}
        out.fill_(float("nan"))
        gathered.fill_(float("nan"))
        interlace.ag_gemm(a_shard, b, out, group, gathered=gathered, **kwargs)
        torch.cuda.synchronize()
        group.check()
        err = common.relative_error(out, out_ref)
        problem = None
        if not err < 1e-2:  # also NaN: rows never written
            problem = (f"{label} wrong at M={m} K={k} N={n}: relative error {err:.2e} against NCCL + cuBLAS, "
                       f"{int(out.isnan().sum())} elements unwritten")
        elif not torch.equal(gathered.view(torch.int16), a_full.view(torch.int16)):
            problem = (f"{label} at M={m} K={k} N={n}: the gathered A differs from NCCL's in "
                       f"{int((gathered.view(torch.int16) != a_full.view(torch.int16)).sum())} elements")
        check_or_exit(problem, rank)
        row["check"][label] = err
        methods[label] = lambda kw=kwargs: interlace.ag_gemm(a_shard, b, out, group, gathered=gathered, **kw)
    # The same call replayed from a CUDA graph: the GPU time without the host's share of a call.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        interlace.ag_gemm(a_shard, b, out, group, gathered=gathered)
    methods["interlace_graph"] = graph.replay
    methods["nccl_cublas"] = nccl_cublas

    fused_fn, fused_out, row["torch_fused_error"] = torch_fused.prepare(a_shard, b)
    if fused_fn is not None:
        err = common.relative_error(fused_out, out_ref)
        row["check"]["torch_fused"] = err
        if common.all_ranks(err < 1e-2):
            methods["torch_fused"] = fused_fn
        else:
            row["torch_fused_error"] = f"wrong result: relative error {err:.2e} against NCCL + cuBLAS (on some rank)"
    del fused_out

    out_alone = torch.empty(m, n_local, device="cuda", dtype=DTYPE)
    interlace.gemm(a_full, b, out_alone)
    torch.cuda.synchronize()
    row["check"]["gemm_alone"] = err = common.relative_error(out_alone, out_ref)
    check_or_exit(None if err < 1e-2 else f"interlace.gemm wrong at M={m} K={k} N={n_local}: relative error {err:.2e}",
                  rank)
    methods["gemm_alone"] = lambda: interlace.gemm(a_full, b, out_alone)

    iters = common.gemm_iters(2.0 * m * k * n_local, FLAGS.iters)
    medians = common.time_collective(methods, FLAGS.warmup, iters)
    group.check()
    row["iters"] = iters
    row["ms"] = {label: medians.get(label) for label in METHODS}
    row["ms"].update({label: ms for label, ms in medians.items() if label not in METHODS})
    row["tflops"] = {label: 2.0 * m * k * n_local / ms / 1e9 for label, ms in row["ms"].items() if ms}
    ms = row["ms"]
    row["speedup_vs_nccl_cublas"] = ms["nccl_cublas"] / ms["interlace"]
    row["speedup_vs_torch_fused"] = ms["torch_fused"] / ms["interlace"] if ms["torch_fused"] else None
    row["ratio_to_gemm_alone"] = ms["interlace"] / ms["gemm_alone"]
    return row


def report(rows, world):
    env = common.environment(FLAGS.command)
    name = f"ag_gemm_{world}x{env['gpu'].replace(' ', '_')}"
    sweeps = {}
    for r in rows:
        sweeps.setdefault(r["series"], []).append(r)
    sweeps = {s: rs for s, rs in sweeps.items() if s != "headline" and len(rs) > 1}

    def plot(path):
        if not sweeps:
            return
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.5), squeeze=False)
        for ax, (series, rs) in zip(axes[0], sweeps.items()):
            ms = [r["m"] for r in rs]
            ax.plot(ms, [r["speedup_vs_nccl_cublas"] for r in rs], marker="o", label="vs NCCL + cuBLAS")
            fused = [(r["m"], r["speedup_vs_torch_fused"]) for r in rs if r["speedup_vs_torch_fused"]]
            if fused:
                ax.plot(*zip(*fused), marker="s", label="vs torch fused_all_gather_matmul")
            ax.plot(ms, [1 / r["ratio_to_gemm_alone"] for r in rs], marker="^", linestyle="--",
                    label="vs interlace.gemm alone (the floor)")
            ax.axhline(1.0, color="gray", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("M (global rows)")
            ax.set_ylabel("speedup of interlace.ag_gemm")
            ax.set_title(f"{series} (per rank N/{world})")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"ag_gemm, {world} x {env['gpu']}, bf16, {env['date'][:10]}")
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    payload = {"op": "ag_gemm", "gpu": env["gpu"], "date": env["date"], "command": env["command"], "env": env,
               "dtype": "bfloat16", "layout": "A shard [M/W, K] per rank; b [K, N/W] per rank as weight.t()",
               "rows": rows}
    path = common.write_results(FLAGS.out_dir, name, payload, plot)
    print(f"wrote {path}")
    print("median ms; speedup = baseline / interlace; floor = interlace / gemm_alone")
    print(f"{'M':>6} {'K':>6} {'N':>6} {'interlace':>10} {'nccl_cublas':>11} {'torch_fused':>11} {'gemm_alone':>10} "
          f"{'vs nccl':>8} {'vs torch':>8} {'floor':>6}")
    for r in rows:
        ms = r["ms"]
        fused = f"{ms['torch_fused']:11.3f}" if ms["torch_fused"] else f"{'-':>11}"
        vs_torch = f"{r['speedup_vs_torch_fused']:8.2f}" if r["speedup_vs_torch_fused"] else f"{'-':>8}"
        print(f"{r['m']:6} {r['k']:6} {r['n']:6} {ms['interlace']:10.3f} {ms['nccl_cublas']:11.3f} {fused} "
              f"{ms['gemm_alone']:10.3f} {r['speedup_vs_nccl_cublas']:8.2f} {vs_torch} {r['ratio_to_gemm_alone']:6.2f}")
    failed = {r["torch_fused_error"] for r in rows if r["torch_fused_error"]}
    for reason in sorted(failed):
        print(f"torch_fused did not run: {reason}")


if __name__ == "__main__":
    app.run(main)
