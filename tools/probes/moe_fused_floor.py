"""moe_dispatch_gemm against its own floor: the fused op over copy_ctas and tilings, next to
grouped_gemm alone on the same rows with the same tiling (the floor) and moe_dispatch then
grouped_gemm, all timed interleaved (CUDA events, medians; at world size 2 or more, the slower rank's).
The moe bench's configs and routing; the expert matmul is GEMM1 (N = 2 x FFN). Run on the GPU machine:

    python3 tools/probes/moe_fused_floor.py [--world_size N] [config ...]   (default: 1; deepseek mixtral)
"""
import os
import sys

import torch

import interlace
from interlace.bench import common
from interlace.bench.moe import CONFIGS, FFN

from moe_probe import exit_with_ranks, no_drop_inputs  # tools/probes/, beside this file

COPY_CTAS = (4, 8, 16, 24)
TILINGS = {"auto": {}, "swap": {"swap": True}, "noswap": {"swap": False}}


def probe(group, name, rank, world):
    tokens, hidden, experts, topk = CONFIGS[name]
    local, n = experts // world, 2 * FFN[name]
    x, idx, weights, handle = no_drop_inputs(group, name, rank)
    capacity = handle.capacity
    g = torch.Generator(device="cuda").manual_seed(1007 + rank)
    w = (torch.randn(local, n, hidden, generator=g, device="cuda") / hidden ** 0.5).to(torch.bfloat16)
    b = w.transpose(1, 2)
    out = torch.empty(handle.recv_rows, n, device="cuda", dtype=torch.bfloat16)
    interlace.moe_dispatch(x, idx, weights, group, handle=handle)
    expert_x = torch.from_dlpack(handle.expert_x).view(local, capacity, hidden)
    rows = torch.from_dlpack(handle.expert_rows)
    out_groups = out.view(local, capacity, n)
    fns = {}
    for label, tiling in TILINGS.items():
        try:  # a tiling this shape does not take (the swapped problem's limits) is left out
            interlace.grouped_gemm(expert_x, b, out_groups, rows, **tiling)
            interlace.moe_dispatch_gemm(x, idx, weights, b, group, out=out, handle=handle, **tiling)
        except (ValueError, RuntimeError) as e:
            if rank == 0:
                print(f"{name} {label}: {e}")
            continue
        fns[f"gemm_{label}"] = lambda t=tiling: interlace.grouped_gemm(expert_x, b, out_groups, rows, **t)
        fns[f"unfused_{label}"] = lambda t=tiling: (interlace.moe_dispatch(x, idx, weights, group, handle=handle),
                                                    interlace.grouped_gemm(expert_x, b, out_groups, rows, **t))
        for c in COPY_CTAS:
            fns[f"fused_{label}_c{c}"] = lambda t=tiling, c=c: interlace.moe_dispatch_gemm(
                x, idx, weights, b, group, out=out, handle=handle, copy_ctas=c, **t)
    torch.cuda.synchronize()
    group.check()
    ms = common.time_collective(fns, warmup=3, iters=20)
    if rank == 0:
        print(f"{name} (world {world}, E {experts} k {topk} H {hidden} T {tokens} N {n} C {capacity}), us:")
        for label, t in ms.items():
            print(f"  {label:>20} {t * 1e3:8.1f}", flush=True)


def main(args):
    world = 1
    if args[:1] == ["--world_size"]:
        world, args = int(args[1]), args[2:]
    if "RANK" not in os.environ:  # the launcher: one process per rank, each running main again
        exit_with_ranks(__file__, args, world)
    rank, world = common.init_rank()
    group = interlace.init(heap_bytes=8 << 30, timeout_s=10)
    for name in args or ["deepseek", "mixtral"]:
        probe(group, name, rank, world)


if __name__ == "__main__":
    main(sys.argv[1:])
