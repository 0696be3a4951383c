"""What the reduce_scatter and all_reduce benchmarks share: inputs every rank can recompute, the exact
reference (fp32 sum in rank order, rounded once: what interlace promises bit for bit), baselines
that may fail without stopping the run, per-call times from CUDA graphs, and the report."""
import torch
from absl import flags

from interlace.bench import common

# The flags both benchmarks take (defined once: absl refuses a second definition).
flags.DEFINE_string("out_dir", "bench/results", "where the JSON and the plot go")
flags.DEFINE_list("sizes", [], "bytes per rank (4K, 1M, ...); default: DEFAULT_SIZES")
flags.DEFINE_integer("warmup", 5, "untimed calls per method first")
flags.DEFINE_integer("iters", 30, "timed calls per method")
flags.DEFINE_list("tunings", ["0:0"], "interlace settings to time, num_blocks:chunk_bytes (0:0 = automatic)")
flags.DEFINE_string("command", "", "the command line, recorded in the JSON")

DEFAULT_SIZES = ["4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M", "256M"]
GRAPH_MAX_BYTES = 1 << 20  # per-call latency under graph replay is timed up to this size


def inputs_of(rank, numel, dtype, seed):
    """Rank `rank`'s input for case `seed`, computable on any rank, so the reference needs no
    communication."""
    g = torch.Generator(device="cuda").manual_seed(seed * 1009 + rank)
    return torch.randn(numel, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def rank_order_sum(parts, dtype):
    acc = parts[0].to(torch.float32, copy=True)  # a copy even for fp32 parts, which += would change
    for p in parts[1:]:
        acc += p.float()
    return acc.to(dtype)


def expect_exact(out, want, what, rank):
    """Exits (every rank checks) unless out equals want bit for bit."""
    a, b = out.reshape(-1).view(torch.int16), want.reshape(-1).view(torch.int16)
    if not torch.equal(a, b):
        bad = (a != b).nonzero().flatten()
        i = bad[0].item() // (1 if out.element_size() == 2 else 2)
        raise SystemExit(f"rank {rank}: {what}: {bad.numel()} 16-bit words differ from the rank-order fp32 sum, first "
                         f"element {i}: got {out.reshape(-1)[i].item()!r}, expected {want.reshape(-1)[i].item()!r}")


CALLS_PER_GRAPH = 16


def graph_of(fn):
    """fn's call CALLS_PER_GRAPH times in one CUDA graph; time its replay and divide by
    CALLS_PER_GRAPH for the per-call GPU time without the host's share."""
    return common.graph_of(fn, CALLS_PER_GRAPH)


def time_methods(methods, graphed, warmup, iters):
    """Microseconds per call of each method (interleaved; the slower rank's median); a graphed
    method's replay holds CALLS_PER_GRAPH calls."""
    ms = common.time_collective(methods, warmup, iters)
    return {label: t * 1e3 / (CALLS_PER_GRAPH if label in graphed else 1) for label, t in ms.items()}


def report(op, rows, skipped, world, busbw_factor, out_dir, command):
    """Writes <op>_<world>x<gpu>.json (rows: bytes, us and busbw_gbs per method) and a PNG of bus
    bandwidth and latency; prints a table. busbw_factor * bytes / time is the bus bandwidth."""
    env = common.environment(command)
    labels = list(dict.fromkeys(label for r in rows for label in r["us"]))
    name = f"{op}_{world}x{env['gpu'].replace(' ', '_')}"

    def plot(path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (bw, lat) = plt.subplots(1, 2, figsize=(13, 4.8))
        for label in labels:
            xs = [r["bytes"] for r in rows if label in r["us"]]
            bw.plot(xs, [r["busbw_gbs"][label] for r in rows if label in r["us"]], marker="o", label=label)
            lat.plot(xs, [r["us"][label] for r in rows if label in r["us"]], marker="o", label=label)
        for ax in (bw, lat):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("bytes per rank")
            ax.grid(True, alpha=0.3)
        lat.set_yscale("log")
        bw.set_ylabel("bus bandwidth (GB/s)")
        lat.set_ylabel("time per call (us)")
        bw.legend(fontsize=7)
        fig.suptitle(f"{op}, {world} x {env['gpu']}, {env['date'][:10]}")
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    path = common.write_results(out_dir, name, {"op": op, "env": env, "busbw_factor": busbw_factor, "rows": rows,
                                                "skipped": skipped}, plot)
    print(f"wrote {path}")
    for label, why in skipped.items():
        print(f"skipped {label}: {why}")
    print("us per call (bus bandwidth GB/s)")
    print(f"{'bytes':>10} " + " ".join(f"{l[:24]:>24}" for l in labels) + f" {'nccl/ours':>9}")
    for r in rows:
        cells = " ".join(f"{r['us'][l]:10.2f} ({r['busbw_gbs'][l]:8.1f}) " if l in r["us"] else f"{'-':>24}"
                         for l in labels)
        print(f"{common.human_bytes(r['bytes']):>10} {cells} {r['us']['nccl'] / r['us']['interlace']:9.2f}")


def row(size, us, busbw_factor):
    return {"bytes": size, "us": us, "busbw_gbs": {k: busbw_factor * size / (v * 1e-6) / 1e9 for k, v in us.items()}}
