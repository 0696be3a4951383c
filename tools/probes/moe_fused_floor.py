"""moe_dispatch_gemm against its own floor at world size 1: the fused op over copy_ctas and tilings,
next to grouped_gemm alone on the same rows with the same tiling (the floor) and moe_dispatch then
grouped_gemm, all timed interleaved (CUDA events, medians). The moe bench's configs and routing; the
expert matmul is GEMM1 (N = 2 x FFN). Run on the GPU machine:

    python3 tools/probes/moe_fused_floor.py [config ...]   (default: deepseek mixtral)
"""
import sys

import torch

import interlace
from interlace.bench import common
from interlace.bench.moe import CONFIGS, FFN
from interlace.bench.moe_baseline import routing

COPY_CTAS = (4, 8, 16, 24)
TILINGS = {"auto": {}, "swap": {"swap": True}, "noswap": {"swap": False}}


def probe(group, name):
    tokens, hidden, experts, topk = CONFIGS[name]
    n = 2 * FFN[name]
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(torch.bfloat16)
    idx, weights = routing(0, tokens, experts, topk, seed=len(name))
    capacity = int(torch.bincount(idx.view(-1).long(), minlength=experts).max())
    handle = interlace.MoeHandle(group, num_experts=experts, topk=topk, hidden=hidden, max_tokens=tokens,
                                 capacity=capacity)
    w = (torch.randn(experts, n, hidden, generator=g, device="cuda") / hidden ** 0.5).to(torch.bfloat16)
    b = w.transpose(1, 2)
    out = torch.empty(handle.recv_rows, n, device="cuda", dtype=torch.bfloat16)
    interlace.moe_dispatch(x, idx, weights, group, handle=handle)
    expert_x = torch.from_dlpack(handle.expert_x).view(experts, capacity, hidden)
    rows = torch.from_dlpack(handle.expert_rows)
    fns = {}
    for label, tiling in TILINGS.items():
        try:  # a tiling this shape does not take (the swapped problem's limits) is left out
            interlace.grouped_gemm(expert_x, b, out.view(experts, capacity, n), rows, **tiling)
            interlace.moe_dispatch_gemm(x, idx, weights, b, group, out=out, handle=handle, **tiling)
        except (ValueError, RuntimeError) as e:
            print(f"{name} {label}: {e}")
            continue
        fns[f"gemm_{label}"] = lambda t=tiling: interlace.grouped_gemm(expert_x, b, out.view(experts, capacity, n),
                                                                        rows, **t)
        fns[f"unfused_{label}"] = lambda t=tiling: (
            interlace.moe_dispatch(x, idx, weights, group, handle=handle),
            interlace.grouped_gemm(expert_x, b, out.view(experts, capacity, n), rows, **t))
        for c in COPY_CTAS:
            fns[f"fused_{label}_c{c}"] = lambda t=tiling, c=c: interlace.moe_dispatch_gemm(
                x, idx, weights, b, group, out=out, handle=handle, copy_ctas=c, **t)
    torch.cuda.synchronize()
    group.check()
    ms = common.time_interleaved(fns, warmup=3, iters=20)
    print(f"{name} (E {experts} k {topk} H {hidden} T {tokens} N {n} C {capacity}), us:")
    for label, t in ms.items():
        print(f"  {label:>20} {t * 1e3:8.1f}", flush=True)


def main():
    group = interlace.init(rank=0, world_size=1, master_addr="127.0.0.1", master_port=29519, heap_bytes=8 << 30,
                           timeout_s=10)
    for name in sys.argv[1:] or ["deepseek", "mixtral"]:
        probe(group, name)


if __name__ == "__main__":
    main()
