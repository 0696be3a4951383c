"""Probe: why does torch's fused all-gather + matmul beat interlace.gemm on the gathered A at large M
(bench/results/NOTES.md, fourth session)? Times, on one GPU and in alternating blocks, the engine's
schedules and cuBLAS on the whole problem and on row halves and quarters (what torch's fused op runs).
Run on the GPU machine: PYTHONPATH=<wheel dir> python3 tools/probes/gemm_large.py"""
import sys

import torch

import interlace
from interlace.bench import common

SHAPES = [(32768, 14336, 8192), (16384, 14336, 8192), (8192, 14336, 8192), (16384, 4096, 8192)]
# First run (NOTES.md): ping-pong without clusters is far behind and cooperative 256-wide tiles lose
# except at 32768 rows; now the band height (cluster-tile rows, default 8) for both.
TUNINGS = {"pp": {}, **{f"pp_band{b}": {"band_m": b} for b in (1, 2, 4, 16, 32)},
           "coop256": {"pingpong": False, "tile_n": 256},
           **{f"coop256_band{b}": {"pingpong": False, "tile_n": 256, "band_m": b} for b in (2, 4, 8)}}


def main():
    common.warm_up_gpu()
    for m, n, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g).t()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a, b)
        methods = {}
        for name, kw in TUNINGS.items():
            out.fill_(float("nan"))
            interlace.gemm(a, b, out, **kw)
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            if not err < 1e-2:
                sys.exit(f"{name} wrong at {m}x{n}x{k}: {err}")
            methods[name] = lambda kw=kw: interlace.gemm(a, b, out, **kw)
        methods["cublas"] = lambda: torch.matmul(a, b, out=out)
        for parts in (2,):
            rows = m // parts
            chunks = [(a[i * rows:(i + 1) * rows], out[i * rows:(i + 1) * rows]) for i in range(parts)]
            methods[f"cublas_{parts}parts"] = lambda c=chunks: [torch.matmul(x, b, out=o) for x, o in c]
        iters = max(10, min(100, int(400 / (2.0 * m * n * k / 6.5e11))))
        ms = common.time_interleaved(methods, 3, iters)
        flop = 2.0 * m * n * k
        cells = "  ".join(f"{name} {flop / t / 1e9:5.0f}" for name, t in ms.items())
        print(f"{m}x{n}x{k} TFLOP/s: {cells}", flush=True)


if __name__ == "__main__":
    main()
