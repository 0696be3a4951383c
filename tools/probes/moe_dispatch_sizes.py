"""moe_dispatch alone over token counts, for A/B runs of its numbering: at each count the expert rows
are checked bit for bit against the host-driven baseline's, then the dispatch is timed eager and
under CUDA-graph replay (8 calls a graph; CUDA events, interleaved blocks, medians; at world size 2
or more, the slower rank's). The moe bench's DeepSeek-like and Mixtral-like shapes and routing at
other token counts: 128 (a decode), then past the 1024 top-k entries up to which CTA 0 numbers
alone. Run on the GPU machine:

    python3 tools/probes/moe_dispatch_sizes.py [--world_size N] [--tokens 128,256,...] [config ...]
"""
import os
import sys

import torch

import interlace
from interlace.bench import common
from interlace.bench.moe import CALLS_PER_GRAPH, CONFIGS, expert_rows_of
from interlace.bench.moe_baseline import Baseline

from moe_probe import exit_with_ranks, no_drop_inputs  # tools/probes/, beside this file

TOKENS = (128, 256, 512, 1024, 4096)


def probe(group, name, tokens, rank, world):
    x, idx, weights, handle = no_drop_inputs(group, name, rank, tokens)
    _, _, experts, topk = CONFIGS[name]
    base = Baseline(idx, weights, experts, world, handle.capacity)
    expert_x = torch.from_dlpack(interlace.moe_dispatch(x, idx, weights, group, handle=handle)[0])
    want = base.dispatch(x)
    torch.cuda.synchronize()
    group.check()
    if not torch.equal(expert_rows_of(handle, expert_x), want):
        raise SystemExit(f"rank {rank}: {name} at {tokens} tokens: moe_dispatch's rows differ from the baseline's")
    dispatch = lambda: interlace.moe_dispatch(x, idx, weights, group, handle=handle)  # noqa: E731
    fns = {"eager": dispatch, "graph": common.graph_of(dispatch, CALLS_PER_GRAPH)}
    ms = common.time_collective(fns, warmup=5, iters=60)
    if rank == 0:
        print(f"{name:>9} T {tokens:5d} entries {tokens * topk:6d}: eager {ms['eager'] * 1e3:7.1f} us, "
              f"graph {ms['graph'] * 1e3 / CALLS_PER_GRAPH:7.1f} us a call", flush=True)


def main(args):
    world, tokens = 1, TOKENS
    while args[:1] and args[0] in ("--world_size", "--tokens"):
        if args[0] == "--world_size":
            world = int(args[1])
        else:
            tokens = tuple(int(t) for t in args[1].split(","))
        args = args[2:]
    if "RANK" not in os.environ:  # the launcher: one process per rank, each running main again
        exit_with_ranks(__file__, ["--tokens", ",".join(map(str, tokens)), *args], world)
    rank, world = common.init_rank()
    group = interlace.init(heap_bytes=8 << 30, timeout_s=10)
    for name in args or ["deepseek", "mixtral"]:
        for t in tokens:
            probe(group, name, t, rank, world)


if __name__ == "__main__":
    main(sys.argv[1:])
