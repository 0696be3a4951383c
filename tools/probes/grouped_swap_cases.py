"""Probe: the swapped grouped GEMM (grouped_gemm(..., swap=True): clusters of two 160-wide row tiles
along N) on the row counts that decide how a cluster works: groups of 0 rows, of at most 160 (one
row tile: the pair's second CTA is empty, or on branch wip/grouped-pairs-apart the two CTAs take a
weight-tile row each) and of 161-320 (a pair), with an even and an odd number of 128-row weight
tiles (N 256 and 384; N 8 and 640). Each case against fp32 bmm on the rows the counts give, out
poisoned with NaN first; rows past the counts must stay NaN. A hang here would cost a whole device
call, so run it first and under a timeout, on the GPU machine:
  PYTHONPATH=<wheel dir> timeout 60 python3 tools/probes/grouped_swap_cases.py
Exits non-zero on a wrong or unwritten element."""
import sys

import torch

import interlace

# (name, G, C, K, N, rows per group)
CASES = [
    ("one small group, N 8", 1, 300, 1000, 8, [100]),
    ("small groups, N 640 (5 tile rows)", 3, 320, 1000, 640, [150, 150, 150]),
    ("mixed, N 256", 6, 320, 512, 256, [0, 100, 250, 320, 1, 160]),
    ("mixed, N 384", 6, 320, 512, 384, [250, 0, 100, 161, 40, 0]),
    ("C 160", 4, 160, 256, 384, [160, 7, 0, 90]),
    ("DeepSeek-like, C / 8", 128, 320, 7168, 4096, [40] * 128),
]


def run_case(name, g, c, k, n, counts):
    torch.manual_seed(0)
    a = torch.randn(g, c, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((g, c, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    rows = torch.tensor(counts, device="cuda", dtype=torch.int32)
    interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, swap=True)
    torch.cuda.synchronize()
    worst, bad = 0.0, 0
    for i, r in enumerate(counts):
        if r > 0:
            ref = a[i, :r].float() @ w[i].float().t()
            got = out[i, :r].float()
            bad += int(got.isnan().sum())
            worst = max(worst, float((got - ref).norm() / ref.norm()))
        bad += int((~out[i, r:].isnan()).sum())  # past the count: left as it was
    ok = bad == 0 and worst < 1e-2
    print(f"{name}: relative error {worst:.2e}, {bad} wrong or unwritten elements: {'ok' if ok else 'FAIL'}",
          flush=True)
    return ok


def main():
    results = [run_case(*case) for case in CASES]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
