"""What the moe probes share: a config's inputs with a handle that drops nothing, and the launcher
that runs a probe as ranks. Here rather than in interlace.bench, so that a probe runs with the
wheels of older revisions too (tools/ab_wheels): it needs only what those have."""
import os
import sys

import torch
import torch.distributed as dist

import interlace
from interlace.bench import launch
from interlace.bench.moe import CONFIGS
from interlace.bench.moe_baseline import routing


def no_drop_inputs(group, name, rank, tokens=None):
    """Config name's tokens on this rank (or `tokens` of them, its shape and routing otherwise), their
    top-k experts and weights, and a handle whose per_expert capacity drops nothing (every rank's
    counts, as in the moe bench): (x, idx, weights, handle)."""
    default_tokens, hidden, experts, topk = CONFIGS[name]
    tokens = tokens or default_tokens
    g = torch.Generator(device="cuda").manual_seed(7 + rank)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(torch.bfloat16)
    idx, weights = routing(rank, tokens, experts, topk, seed=len(name))
    counts = torch.bincount(idx.view(-1).long(), minlength=experts)
    dist.all_reduce(counts)
    handle = interlace.MoeHandle(group, num_experts=experts, topk=topk, hidden=hidden, max_tokens=tokens,
                                 capacity=int(counts.max()))
    return x, idx, weights, handle


def exit_with_ranks(script, args, world_size, timeout_s=600):
    """The launcher: runs `python script args...` as ranks, prints rank 0's output and every failed
    rank's, and exits with the highest return code."""
    results = launch.run_ranks([os.path.abspath(script), *args], world_size, timeout_s=timeout_s)
    for rank, (rc, out) in enumerate(results):
        if rank == 0 or rc != 0:
            print(f"----- rank {rank} (exit {rc}) -----\n{out}")
    sys.exit(max(rc for rc, _ in results))
