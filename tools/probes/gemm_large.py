"""Probe: the engine's schedules against cuBLAS on large GEMMs (issue 8's weak spot: M and N of 8k and
more, bench/results/NOTES.md), one GPU, the methods timed in alternating blocks, each checked first,
with the SM clock and power at each block's end (a kernel held back by the power cap shows there).
Run on the GPU machine: PYTHONPATH=<wheel dir> python3 tools/probes/gemm_large.py"""
import statistics
import sys

import torch

import interlace
from interlace.bench import common

# Issue 8's M sweeps at (K, N) = (4096, 14336) and (8192, 28672), and square-ish shapes.
SHAPES = ([(m, 14336, 4096) for m in (2048, 4096, 8192, 16384, 32768)] +
          [(m, 28672, 8192) for m in (2048, 4096, 8192, 16384)] +
          [(16384, 4096, 8192), (8192, 8192, 8192), (4096, 8192, 8192), (16384, 16384, 12288)])
# The automatic schedule (automatic_gemm_schedule) beside the ones it picks from: ping-pong 128 x 128
# in bands of 8 cluster-tile rows (the schedule on GPUs well fed by HBM) and of 2, cooperative 128 x 256.
TUNINGS = {"auto": {}, **{f"pp_band{b}": {"band_m": b} for b in (2, 8)},
           **{f"coop256_band{b}": {"pingpong": False, "tile_n": 256, "band_m": b} for b in (8, 16)}}


def gpu_state():
    """(SM clock MHz, power W) now."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return (pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), pynvml.nvmlDeviceGetPowerUsage(h) / 1000)
    except Exception:  # no NVML: the timings still stand
        return (float("nan"), float("nan"))


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
        per_block = max(2, min(20, int(0.2 / (2.0 * m * n * k / 6.5e14))))  # about 0.2 s a block
        states = {name: [] for name in methods}
        ms = common.time_interleaved(methods, 1, 5 * per_block, rounds=5,
                                     after_block=lambda name: states[name].append(gpu_state()))
        flop = 2.0 * m * n * k
        print(f"{m}x{n}x{k}: TFLOP/s, SM MHz, W at each block's end (medians)", flush=True)
        best = min(t for name, t in ms.items() if name != "cublas")
        for name, t in ms.items():
            clock = statistics.median(s[0] for s in states[name])
            watts = statistics.median(s[1] for s in states[name])
            mark = " <" if t == best and name != "cublas" else ""
            print(f"  {name:14} {flop / t / 1e9:5.0f}  {clock:5.0f} MHz  {watts:4.0f} W{mark}", flush=True)


if __name__ == "__main__":
    main()
