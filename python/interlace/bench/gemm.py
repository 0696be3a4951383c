"""GEMM benchmark on one GPU. Started by `python -m interlace.bench gemm`.

First a correctness sweep (fresh random data, >= 30 shapes with tails, poisoned outputs, relative
error against an fp32 reference), then every timed shape is checked again and timed against
torch.matmul (cuBLAS) in the same run. b is a Linear weight [N, K] passed as weight.t() (the
tensor-parallel case); the square shapes are also timed with b as [K, N] row-major."""
import os

import torch
from absl import app, flags

import interlace
from interlace.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_integer("warmup", 10, "")
flags.DEFINE_integer("iters", 100, "")
flags.DEFINE_string("command", "", "")
flags.DEFINE_list("sizes", [], "unused by gemm")
flags.DEFINE_list("tunings", ["0:0:0"], "gemm settings to time, as band_m:tile_n:cluster_m[:pingpong] (0:0:0 = automatic)")

TP_KN = [(8192, 7168), (8192, 4096), (4096, 14336), (7168, 8192)]
TIMED = ([(8192, 8192, 8192, "kn"), (4096, 4096, 4096, "kn"), (8192, 8192, 8192, "nk"), (4096, 4096, 4096, "nk")] +
         [(m, n, k, "nk") for m in (512, 2048, 8192, 16384) for k, n in TP_KN])
SWEEP = [(m, n, k) for m in (1, 77, 128, 200, 1000, 3001) for n, k in ((8, 8), (264, 72), (776, 1032), (2056, 136),
                                                                       (1000, 4096))]


def make(m, n, k, layout, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    if layout == "kn":
        b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
    else:
        b = torch.randn(n, k, device="cuda", dtype=dtype, generator=g).t()
    return a, b


def relative_error(m, n, k, layout, dtype=torch.bfloat16, seed=0, **tuning):
    a, b = make(m, n, k, layout, dtype, seed)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    interlace.gemm(a, b, out, **tuning)
    ref = a.float() @ b.float()
    unwritten = int(out.isnan().sum())
    return ((out.float() - ref).norm() / ref.norm()).item(), unwritten


def main(_):
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    common.warm_up_gpu()
    sweep = []
    for i, (m, n, k) in enumerate(SWEEP):
        layout, dtype = ("kn", "nk")[i % 2], (torch.bfloat16, torch.float16)[(i // 2) % 2]
        err, unwritten = relative_error(m, n, k, layout, dtype, seed=i)
        sweep.append({"m": m, "n": n, "k": k, "b": layout, "dtype": str(dtype), "rel_err": err, "unwritten": unwritten})
        if err > 1e-2 or unwritten:
            raise SystemExit(f"gemm wrong at {m}x{n}x{k} {layout} {dtype}: rel err {err:.2e}, {unwritten} unwritten")
    print(f"correctness sweep: {len(sweep)} shapes, max relative error {max(s['rel_err'] for s in sweep):.2e}")

    rows = []
    for m, n, k, layout in TIMED:
        err, unwritten = relative_error(m, n, k, layout, seed=m + n + k)
        if err > 1e-2 or unwritten:
            raise SystemExit(f"gemm wrong at {m}x{n}x{k} {layout}: rel err {err:.2e}, {unwritten} unwritten")
        a, b = make(m, n, k, layout, seed=1)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        flop = 2.0 * m * n * k
        row = {"m": m, "n": n, "k": k, "b": layout, "rel_err": err}
        methods = {"cublas": lambda: torch.matmul(a, b, out=out)}
        for tuning in FLAGS.tunings:
            band, tile, cluster, pingpong = (int(x) for x in (tuning + ":0:0:0").split(":")[:4])
            if (band, tile, cluster, pingpong) == (0, 0, 0, 0):
                methods["interlace"] = lambda: interlace.gemm(a, b, out)
                continue
            kwargs = {"band_m": band, "tile_n": tile, "cluster_m": cluster, "pingpong": bool(pingpong)}
            err_t, unwritten_t = relative_error(m, n, k, layout, seed=7, **kwargs)
            if err_t > 1e-2 or unwritten_t:
                raise SystemExit(f"gemm {kwargs} wrong at {m}x{n}x{k}: rel err {err_t:.2e}, {unwritten_t} unwritten")
            methods[f"interlace[{tuning}]"] = lambda kw=kwargs: interlace.gemm(a, b, out, **kw)
        for label, ms in common.time_interleaved(methods, FLAGS.warmup, FLAGS.iters).items():
            row[label] = {"ms": ms, "tflops": flop / ms / 1e9}
        row["ratio"] = row["interlace"]["tflops"] / row["cublas"]["tflops"]
        rows.append(row)
        extra = "  ".join(f"{k[10:]} {v['tflops']:.0f}" for k, v in row.items() if k.startswith("interlace["))
        print(f"{m:6} {n:6} {k:6} {layout}  interlace {row['interlace']['tflops']:6.1f}  cublas "
              f"{row['cublas']['tflops']:6.1f}  ratio {row['ratio']:.3f}  err {err:.1e}  {extra}", flush=True)
    report(rows, sweep)


def report(rows, sweep):
    env = common.environment(FLAGS.command, distributed=False)
    name = f"gemm_{env['gpu'].replace(' ', '_')}"

    def plot(path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        labels = [f"{r['m']}x{r['n']}x{r['k']} {r['b']}" for r in rows]
        x = range(len(rows))
        fig, ax = plt.subplots(figsize=(11, 4.5))
        ax.bar([i - 0.2 for i in x], [r["interlace"]["tflops"] for r in rows], width=0.4, label="interlace")
        ax.bar([i + 0.2 for i in x], [r["cublas"]["tflops"] for r in rows], width=0.4, label="cuBLAS (torch.matmul)")
        ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s (bf16)")
        ax.set_title(f"gemm M x N x K, {env['gpu']}, {env['date'][:10]}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    payload = {"op": "gemm", "env": env, "rows": rows, "correctness_sweep": sweep}
    print("wrote", common.write_results(FLAGS.out_dir, name, payload, plot))


if __name__ == "__main__":
    app.run(main)
