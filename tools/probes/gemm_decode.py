"""Probe: interlace.gemm against cuBLAS at decode shapes (issue 9's gemm_ar decode rows: M = 1 to 256,
this rank's K = 4096, N = 8192, b a Linear weight passed transposed), every method replayed from a
CUDA graph and timed in alternating blocks. Each tuning is checked against torch.matmul first.
Run on the GPU machine: PYTHONPATH=<wheel dir> python3 tools/probes/gemm_decode.py"""
import sys

import torch

import interlace
from interlace.bench import common

MS = (1, 16, 64, 128, 256)
K, N = 4096, 8192
CALLS = 20  # per graph replay
TUNINGS = {
    "auto": {},
    "pp_c2": {"cluster_m": 2},
    "pp_c1": {"cluster_m": 1},
    "coop128_c2": {"pingpong": False, "tile_n": 128, "cluster_m": 2},
    "coop128_c1": {"pingpong": False, "tile_n": 128, "cluster_m": 1},
}


def main():
    common.warm_up_gpu()
    g = torch.Generator(device="cuda").manual_seed(0)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g).t()
    print(f"K {K}, N {N}, b = weight.t(); us per call, graph replay of {CALLS} calls", flush=True)
    for m in MS + MS[::-1]:  # both ways: a clock still ramping up would show as a trend along M
        a = torch.randn(m, K, device="cuda", dtype=torch.bfloat16, generator=g)
        ref = torch.matmul(a.float(), b.float())
        methods = {}
        for name, kw in TUNINGS.items():
            out = torch.full((m, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            interlace.gemm(a, b, out, **kw)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                sys.exit(f"{name} wrong at m={m}: {err}")
            methods[name] = common.graph_of(lambda kw=kw, out=out: interlace.gemm(a, b, out, **kw), CALLS)
        out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
        methods["cublas"] = common.graph_of(lambda: torch.matmul(a, b, out=out), CALLS)
        # b row-major [K, N]: a stage's loads are 256 contiguous bytes of each K row, not 128 bytes of
        # each of 128 N rows (does B's access pattern set the speed?).
        b_kn = b.contiguous()
        out_kn = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
        methods["auto_kn"] = common.graph_of(lambda: interlace.gemm(a, b_kn, out_kn), CALLS)
        methods["cublas_kn"] = common.graph_of(lambda: torch.matmul(a, b_kn, out=out_kn), CALLS)
        ms = common.time_interleaved(methods, 3, 50)
        cells = "  ".join(f"{name} {t / CALLS * 1e3:6.1f}" for name, t in ms.items())
        print(f"m={m:4d}: {cells}", flush=True)


if __name__ == "__main__":
    main()
