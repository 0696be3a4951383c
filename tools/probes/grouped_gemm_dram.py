"""Probe: how many bytes grouped_gemm reads from HBM at the DeepSeek-like expert shape (128 experts of
C = 320 rows, K = 7168, N = 4096: 7.5 GB of weights), against torch.bmm on the same padded rows and the
dense GEMM. One launch per process, for ncu (bench/results/NOTES.md, fifteenth session: a weight tile
read by CTAs of separate clusters comes from HBM about once per CTA; only TMA multicast within a
cluster shares it). Run on the GPU machine, one method at a time:
  PYTHONPATH=<wheel dir> ncu --metrics dram__bytes_read.sum,gpu__time_duration.sum -k regex:'gemm|nvjet' \\
      -s 1 -c 1 python3 tools/probes/grouped_gemm_dram.py METHOD [SHAPE]
SHAPE: gemm1 (the default, above) or gemm2 (the second FFN matmul: K = 2048, N = 7168, 3.8 GB of weights).
METHOD: auto (grouped_gemm's automatic tiles), swap or noswap (swap=True / False), bmm, dense (interlace.gemm on 8192 rows), or
x<rows>:<cluster_m>:<tile_n> (every group using <rows> rows, with that tiling)."""
import sys

import torch

import interlace

SHAPES = {"gemm1": (128, 320, 7168, 4096), "gemm2": (128, 320, 2048, 7168)}


def main(method, shape):
    G, C, K, N = SHAPES[shape]
    torch.manual_seed(0)
    a = torch.randn(G, C, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(G, C, N, device="cuda", dtype=torch.bfloat16)
    rows = torch.full((G,), C, device="cuda", dtype=torch.int32)
    for _ in range(2):  # ncu -s 1 skips the first
        if method in ("auto", "swap", "noswap"):
            interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, swap={"auto": None, "swap": True}.get(method, False))
        elif method.startswith("x"):
            r, cluster_m, tile_n = map(int, method[1:].split(":"))
            interlace.grouped_gemm(a, w.transpose(1, 2), out, torch.full_like(rows, r), cluster_m=cluster_m,
                                   tile_n=tile_n)
        elif method == "bmm":
            torch.bmm(a, w.transpose(1, 2), out=out)
        elif method == "dense":
            interlace.gemm(a.view(-1, K)[:8192], w[0].t(), out.view(-1, N)[:8192])
        else:
            sys.exit(f"unknown method {method!r}")
    torch.cuda.synchronize()
    print(method, "done")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "gemm1")
