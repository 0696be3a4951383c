"""Probe, world size 1 on one GPU: ring_attention at shapes chosen by how many query tiles each compute
CTA gets, each in its own process under a timeout, so that a hang is reported as one and the next
shape still runs. Against fp32 SDPA, out poisoned first. Written for branch wip/persistent-ring,
whose persistent compute CTAs hung on a CTA's second tile (bench/results/NOTES.md, thirteenth
session): at S = 600 there are 5 query tiles per head, so 1 head gives 5 tiles (one per CTA) and 26
or 27 heads 130 or 135 (over 132 SMs: some CTAs take two). Run on the GPU machine:
PYTHONPATH=<wheel dir> python3 tools/probes/ring_attention_tiles.py [S:heads:causal ...]"""
import os
import subprocess
import sys
import time

SHAPES = ["128:1:0", "600:1:0", "600:26:0", "600:27:0", "600:32:1", "8192:32:1"]
TIMEOUT_S = 20


def run_one(s, heads, causal):
    import torch
    import interlace
    group = interlace.init(rank=0, world_size=1, master_addr="127.0.0.1", master_port=29543, heap_bytes=64 << 20)
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
        try:
            result = subprocess.run([sys.executable, __file__, "--one", shape], capture_output=True, text=True,
                                    timeout=TIMEOUT_S)
            lines = (result.stdout + result.stderr).strip().splitlines()
            print(f"{shape}: exit {result.returncode}: {lines[-1] if lines else ''}", flush=True)
            failed |= result.returncode != 0
        except subprocess.TimeoutExpired:
            print(f"{shape}: HUNG (no result in {TIMEOUT_S} s)", flush=True)
            failed = 1
    return failed


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        s, heads, causal = (int(x) for x in sys.argv[2].split(":"))
        sys.exit(run_one(s, heads, bool(causal)))
    sys.exit(main(sys.argv[1:] or SHAPES))
