"""Probe, world size 1 on one GPU: ring_attention at shapes chosen by how many query tiles each compute
CTA gets, each in its own process under a timeout (run_ranks: a hang shows as "killed after 20 s"),
so that the next shape still runs. Against fp32 SDPA, out poisoned first. Written when the persistent
compute CTAs (causal calls since the fourteenth session) hung on a CTA's second tile
(bench/results/NOTES.md, thirteenth session). Under the causal mask S = 600 is two zigzag halves of
300 rows, 3 query tiles each: 6 tiles per head, so 22 heads give 132 (one per CTA on 132 SMs) and 23
give 138 (some CTAs take two). Without the mask 5 tiles per head: 27 heads give 135.
Run on the GPU machine:
PYTHONPATH=<wheel dir> python3 tools/probes/ring_attention_tiles.py [S:heads:causal ...]"""
import sys
import time

from interlace.bench.launch import run_ranks

SHAPES = ["128:1:0", "600:27:0", "600:1:1", "600:22:1", "600:23:1", "600:32:1", "8192:32:1"]
TIMEOUT_S = 20


def run_one(s, heads, causal):
    import torch
    import interlace
    group = interlace.init(heap_bytes=64 << 20)
    q, k, v = (torch.randn(1, s, heads, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    began = time.monotonic()
    interlace.ring_attention(q, k, v, out, group, causal=causal)
    torch.cuda.synchronize()
    group.check()
    took = time.monotonic() - began
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2).float() for t in (q, k, v)), is_causal=causal).transpose(1, 2)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    unwritten = int(out.isnan().sum())
    print(f"S={s} heads={heads} causal={causal}: {took:.3f} s, relative error {err:.2e}, {unwritten} unwritten")
    return 0 if err < 2e-2 and unwritten == 0 else 1


def main(shapes):
    failed = 0
    for shape in shapes:
        # One rank; run_ranks kills it past the timeout and says so in its output.
        [(rc, out)] = run_ranks([__file__, "--one", shape], 1, TIMEOUT_S)
        lines = out.strip().splitlines()
        print(f"{shape}: exit {rc}: {lines[-1] if lines else ''}", flush=True)
        failed |= rc != 0
    return failed


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        s, heads, causal = (int(x) for x in sys.argv[2].split(":"))
        sys.exit(run_one(s, heads, bool(causal)))
    sys.exit(main(sys.argv[1:] or SHAPES))
