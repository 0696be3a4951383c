"""moe_dispatch_gemm at world size 1, one case at a time with a short wait timeout, so that a stuck
flag comes back as the group's fault (rank, op, flag, block) within seconds: the first thing to run
on the GPU after a change to ops/moe/dispatch_gemm.cuh. Prints each case's time and whether out is
bit for bit moe_dispatch + grouped_gemm's.

    python3 tools/probes/moe_dispatch_gemm.py [experts topk hidden tokens n]...  (defaults: a set)
"""
import sys
import time

import torch

import interlace


def run(group, experts, topk, hidden, tokens, n, **tuning):
    g = torch.Generator(device="cuda").manual_seed(experts * 7 + tokens)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.stack([torch.randperm(experts, generator=g, device="cuda")[:topk] for _ in range(tokens)]).int() \
        if tokens else torch.empty(0, topk, dtype=torch.int32, device="cuda")
    wts = torch.rand(tokens, topk, generator=g, device="cuda")
    capacity = max(int(torch.bincount(idx.view(-1).long(), minlength=experts).max()) if tokens else 1, 1)
    w = (torch.randn(experts, n, hidden, generator=g, device="cuda") / hidden ** 0.5).to(torch.bfloat16)
    b = w.transpose(1, 2)
    handle = interlace.MoeHandle(group, num_experts=experts, topk=topk, hidden=hidden, max_tokens=max(tokens, 1),
                                 capacity=capacity)
    out = torch.full((handle.recv_rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    interlace.moe_dispatch_gemm(x, idx, wts, b, group, out=out, handle=handle, **tuning)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    group.check()
    expert_x = torch.from_dlpack(handle.expert_x)
    rows = torch.from_dlpack(handle.expert_rows)
    want = torch.full_like(out, float("nan"))
    interlace.grouped_gemm(expert_x.view(experts, capacity, hidden), b, want.view(experts, capacity, n), rows,
                           **{k: v for k, v in tuning.items() if k != "copy_ctas"})
    torch.cuda.synchronize()
    same = all(torch.equal(out[l * capacity:l * capacity + r], want[l * capacity:l * capacity + r])
               for l, r in enumerate(rows.tolist()))
    print(f"E {experts} k {topk} H {hidden} T {tokens} N {n} C {capacity} {tuning}: {ms:.2f} ms, "
          f"{'same bits' if same else 'DIFFERS'}", flush=True)
    return same


def main():
    group = interlace.init(rank=0, world_size=1, master_addr="127.0.0.1", master_port=29518, heap_bytes=4 << 30,
                           timeout_s=10)
    cases = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or [
        (8, 2, 256, 64, 64), (8, 2, 256, 64, 64, 2), (4, 1, 128, 1, 64), (8, 2, 256, 0, 64),
        (16, 4, 512, 300, 256), (8, 2, 4096, 512, 1024), (128, 8, 7168, 256, 512)]
    ok = True
    for c in cases:
        experts, topk, hidden, tokens, n = c[:5]
        tuning = {"copy_ctas": c[5]} if len(c) > 5 else {}
        ok &= run(group, experts, topk, hidden, tokens, n, **tuning)
    for tuning in ({"cluster_m": 2, "tile_n": 128}, {"cluster_m": 1, "tile_n": 128}, {"swap": True}):
        ok &= run(group, 16, 4, 512, 300, 256, **tuning)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
