"""Grouped GEMM benchmark on one GPU (a mixture of experts' expert FFN matmuls). Started by
`python -m interlace.bench grouped_gemm`.

Each config is G experts of capacity C rows, a [G, C, K] with expert g's tokens in its first r_g rows,
b the experts' Linear weights [G, N, K] passed as w.transpose(1, 2), bf16. Row counts are random
around 0.8 C ("random") or all C ("full"). interlace.grouped_gemm (counts read on the GPU) is first
checked against an fp32 reference (rows below r_g; rows past it must stay untouched), then timed in
the same run against:
  grouped_mm  torch._grouped_mm on the valid rows packed into [sum r_g, K] with offs the cumulative
              int32 row ends (the packing is not timed), where this torch has it;
  bmm_padded  torch.bmm on the padded [G, C, K] x [G, K, N]: computes all C rows of every group;
  host_loop   one torch.matmul per group on its valid rows: needs the counts on the host (read once,
              not timed).
TFLOP/s count useful work only, 2 * sum(r_g) * N * K, for every method. --sizes picks configs by name."""
import os

import torch
from absl import app, flags

import interlace
from interlace.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_integer("warmup", 3, "")
flags.DEFINE_integer("iters", 10, "")
flags.DEFINE_string("command", "", "")
flags.DEFINE_list("sizes", [], "config names (default: all of them)")
flags.DEFINE_list("tunings", [], "cluster_m:tile_n settings to time besides the automatic ones (0:0); "
                  "a bare cluster_m keeps the automatic tile_n; 'swap' and 'noswap' force swap=True or False")

# (name, G, C, K, N): GEMM1 is the gate and up projections side by side (N = 2 x the FFN width),
# GEMM2 the down projection.
CONFIGS = [
    ("dsv3_gemm1", 32, 512, 7168, 4096),     # DeepSeek-V3-like: 32 local experts, FFN width 2048
    ("dsv3_gemm2", 32, 512, 2048, 7168),
    ("mixtral_gemm1", 4, 4096, 4096, 28672),  # Mixtral-like: 4 local experts, FFN width 14336
    ("mixtral_gemm2", 4, 4096, 14336, 4096),
    ("decode", 32, 16, 7168, 4096),          # decode: a few tokens per expert
    # The moe bench's layers over 2 ranks, C about 1.25x the mean count, as a no-drop capacity makes it:
    # DeepSeek-V3-like 128 local experts of about 256 rows (the last tile row mostly empty), and
    # Mixtral-like 4 of about 2048.
    ("dsv3_ep2_gemm1", 128, 320, 7168, 4096),
    ("dsv3_ep2_gemm2", 128, 320, 2048, 7168),
    ("mixtral_ep2_gemm1", 4, 2560, 4096, 28672),
    ("mixtral_ep2_gemm2", 4, 2560, 14336, 4096),
]
# random: about 0.8 C per group; full: C; sparse: about C / 8, as when C is sized for the worst
# routing and most experts get far fewer tokens.
COUNTS = ("random", "full", "sparse")
BASELINES = ("grouped_mm", "bmm_padded", "host_loop")
DTYPE = torch.bfloat16
NOTES = {
    "interlace": "interlace.grouped_gemm(a [G, C, K], w.transpose(1, 2), out [G, C, N], rows int32 [G] on the GPU)",
    "grouped_mm": "torch._grouped_mm(a_packed [sum r_g, K], w.transpose(1, 2), offs=cumsum(r_g) int32); packing a's "
                  "valid rows into a_packed is NOT timed; allocates its output on every call",
    "bmm_padded": "torch.bmm(a [G, C, K], w.transpose(1, 2), out=[G, C, N]): all C rows of every group",
    "host_loop": "torch.matmul(a[g, :r_g], w[g].t(), out=out[g, :r_g]) for each group with r_g > 0; the counts are "
                 "read to the host once, outside the timing, and the views are made beforehand",
    "tflops": "2 * sum(r_g) * N * K / time, for every method (useful work only)",
}


def row_counts(kind, g, c, seed):
    if kind == "full":
        return [c] * g
    gen = torch.Generator().manual_seed(seed)
    mean = 0.125 if kind == "sparse" else 0.8
    counts = torch.normal(mean * c, 0.1 * mean * c, (g,), generator=gen).round().clamp(0, c)
    return [int(x) for x in counts]


def poison(out):
    out.view(torch.int16).fill_(-1)  # all bits set: NaN in bf16


def tunings():
    """{label: grouped_gemm keyword arguments}: the automatic settings as "interlace", then each
    cluster_m:tile_n of --tunings as "interlace[cluster_m=..,tile_n=..]" ("0:0", what the launcher
    always passes first, is the automatic one)."""
    out = {"interlace": {}}
    for t in FLAGS.tunings:
        if t in ("swap", "noswap"):
            out[f"interlace[swap={t == 'swap'}]"] = {"swap": t == "swap"}
            continue
        fields = [int(v) for v in t.split(":")] + [0]
        kwargs = {k: v for k, v in zip(("cluster_m", "tile_n"), fields[:2]) if v}
        if kwargs:
            out["interlace[" + ",".join(f"{k}={v}" for k, v in kwargs.items()) + "]"] = kwargs
    return out


def check_interlace(a, b, out, rows, counts, ref, what, tuning):
    """Runs interlace once into a poisoned out; raises SystemExit unless rows below r_g match ref and
    rows past it are untouched. Returns the relative error on the valid rows."""
    poison(out)
    interlace.grouped_gemm(a, b, out, rows, **tuning)
    torch.cuda.synchronize()
    valid = valid_mask(counts, out.shape[1])
    touched = int((~(out.view(torch.int16) == -1).all(dim=2) & ~valid).sum())
    unwritten = int(out[valid].isnan().sum())
    err = common.relative_error(out[valid], ref[valid])
    if touched or unwritten or not err <= 1e-2:
        raise SystemExit(f"grouped_gemm wrong at {what}: relative error {err:.2e}, {unwritten} elements of valid rows "
                         f"unwritten, {touched} rows past the counts written")
    return err


def valid_mask(counts, c):
    r = torch.tensor(counts, device="cuda")
    return torch.arange(c, device="cuda")[None, :] < r[:, None]


def grouped_mm_baseline(a, b, counts):
    """(call, None) for torch._grouped_mm on the packed valid rows, or (None, why) where this torch
    lacks it or it rejects the arguments (its signature has changed between releases)."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return None, f"torch {torch.__version__} has no torch._grouped_mm"
    try:
        packed = torch.cat([a[g, :r] for g, r in enumerate(counts)]).contiguous()
        ends = torch.tensor(counts, dtype=torch.int64).cumsum(0)
        offs = ends.to(device="cuda", dtype=torch.int32)

        def call():
            return fn(packed, b, offs=offs)
        y = call()
        torch.cuda.synchronize()
        if tuple(y.shape) != (sum(counts), b.shape[2]):
            return None, f"torch._grouped_mm returned shape {tuple(y.shape)}, expected {(sum(counts), b.shape[2])}"
    except Exception as e:  # noqa: BLE001 (any failure of a baseline is recorded, never raised)
        return None, f"torch._grouped_mm(a [sum r, K], b [G, K, N], offs=...): {type(e).__name__}: {e}"[:500]
    return call, None


def run_config(name, g, c, k, n, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(g, c, k, device="cuda", dtype=DTYPE, generator=gen)
    w = torch.randn(g, n, k, device="cuda", dtype=DTYPE, generator=gen)
    b = w.transpose(1, 2)
    ref = torch.bmm(a.float(), b.float())  # fp32 (TF32 is off for matmuls by default)
    out = torch.empty(g, c, n, device="cuda", dtype=DTYPE)
    out_bmm = torch.empty_like(out)
    out_loop = torch.empty_like(out)
    rows_out, skipped = [], {}
    for kind in COUNTS:
        counts = row_counts(kind, g, c, seed + len(kind))
        rows = torch.tensor(counts, dtype=torch.int32, device="cuda")
        useful = sum(counts)
        flop = 2.0 * useful * n * k
        what = f"{name} ({kind} counts)"
        variants = tunings()
        errors = {label: check_interlace(a, b, out, rows, counts, ref, f"{what} {label}", tuning)
                  for label, tuning in variants.items()}
        valid = valid_mask(counts, c)
        ref_valid = ref[valid]  # [sum r_g, N], groups in order

        loop_views = [(a[i, :r], b[i], out_loop[i, :r]) for i, r in enumerate(counts) if r > 0]

        def host_loop():
            for x, y, o in loop_views:
                torch.matmul(x, y, out=o)

        methods = {label: (lambda t=tuning: interlace.grouped_gemm(a, b, out, rows, **t))
                   for label, tuning in variants.items()}
        methods.update({"bmm_padded": lambda: torch.bmm(a, b, out=out_bmm), "host_loop": host_loop})
        gmm, why = grouped_mm_baseline(a, b, counts)
        if gmm is not None:
            errors["grouped_mm"] = common.relative_error(gmm(), ref_valid)
            methods["grouped_mm"] = gmm
        else:
            skipped["grouped_mm"] = why
        methods["bmm_padded"]()
        host_loop()
        torch.cuda.synchronize()
        errors["bmm_padded"] = common.relative_error(out_bmm[valid], ref_valid)
        errors["host_loop"] = common.relative_error(out_loop[valid], ref_valid)
        for label in [m for m in methods if m in BASELINES and not errors[m] <= 1e-2]:
            skipped[label] = f"{what}: relative error {errors[label]:.2e} against fp32, not timed"
            del methods[label]

        row = {"config": name, "counts": kind, "g": g, "c": c, "k": k, "n": n, "useful_rows": useful,
               "row_counts": counts, "rel_err": errors}
        order = {m: methods[m] for m in list(variants) + list(BASELINES) if m in methods}
        for label, ms in common.time_interleaved(order, FLAGS.warmup, FLAGS.iters).items():
            row[label] = {"ms": ms, "tflops": flop / ms / 1e9}
        baselines = [row[m]["tflops"] for m in BASELINES if m in row]
        if baselines:
            row["interlace_vs_best_baseline"] = row["interlace"]["tflops"] / max(baselines)
        rows_out.append(row)
        print(f"{name:14} {kind:6} " + "  ".join(f"{m} {row[m]['ms']:.3f} ms {row[m]['tflops']:.0f} TF/s"
                                                for m in order if m in row), flush=True)
    return rows_out, skipped


def main(_):
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    names = [c[0] for c in CONFIGS]
    unknown = [s for s in FLAGS.sizes if s not in names]
    if unknown:
        raise SystemExit(f"--sizes: unknown configs {unknown}; there are {names}")
    configs = [c for c in CONFIGS if not FLAGS.sizes or c[0] in FLAGS.sizes]
    common.warm_up_gpu()
    rows, skipped = [], {}
    for i, (name, g, c, k, n) in enumerate(configs):
        r, s = run_config(name, g, c, k, n, seed=1000 * i + 7)
        rows += r
        for label, why in s.items():
            skipped.setdefault(label, why)
        torch.cuda.empty_cache()
    report(rows, skipped)


def report(rows, skipped):
    env = common.environment(FLAGS.command, distributed=False)
    name = f"grouped_gemm_{env['gpu'].replace(' ', '_')}"
    methods = list(tunings()) + [m for m in BASELINES if any(m in r for r in rows)]

    def plot(path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        labels = [f"{r['config']}\n{r['counts']} ({r['useful_rows']} rows)" for r in rows]
        width = 0.8 / len(methods)
        fig, ax = plt.subplots(figsize=(12, 4.8))
        for j, m in enumerate(methods):
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(rows))]
            ax.bar(xs, [r[m]["tflops"] if m in r else 0.0 for r in rows], width=width, label=m)
        ax.set_xticks(list(range(len(rows))), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s on useful rows (bf16)")
        ax.set_title(f"grouped GEMM (MoE experts), {env['gpu']}, {env['date'][:10]}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    payload = {"op": "grouped_gemm", "env": env, "dtype": "bfloat16", "warmup": FLAGS.warmup, "iters": FLAGS.iters,
               "b_layout": "Linear weights [G, N, K] passed as w.transpose(1, 2)", "notes": NOTES,
               "skipped": skipped, "rows": rows}
    print("wrote", common.write_results(FLAGS.out_dir, name, payload, plot))
    for label, why in skipped.items():
        print(f"skipped {label}: {why}")
    header = f"{'config':14} {'counts':6} {'G':>3} {'C':>5} {'K':>6} {'N':>6} {'rows':>6}"
    print(header + "".join(f"  {m + ' ms (TF/s)':>22}" for m in methods))
    def cell(r, m):
        return f"{r[m]['ms']:.3f} ({r[m]['tflops']:.0f})" if m in r else "-"

    for r in rows:
        cells = "".join(f"  {cell(r, m):>22}" for m in methods)
        print(f"{r['config']:14} {r['counts']:6} {r['g']:>3} {r['c']:>5} {r['k']:>6} {r['n']:>6} "
              f"{r['useful_rows']:>6}" + cells)


if __name__ == "__main__":
    app.run(main)
