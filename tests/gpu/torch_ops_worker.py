"""One rank of the torch.library ops on GPUs (see test_torch_ops_gpu.py): eager, compiled with
fullgraph=True, and compiled with mode="reduce-overhead" (CUDA graphs), each against a reference."""
import os
import sys

import torch

import interlace
import interlace.torch as itorch

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
if sys.argv[1] == "from_process_group":  # set up through torch.distributed's store, nothing else
    import torch.distributed as dist
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    group = itorch.init(heap_bytes=256 << 20)
else:
    group = interlace.init(heap_bytes=256 << 20)


def shard(rank, rows, seed):
    g = torch.Generator(device="cuda").manual_seed(seed * 100 + rank)
    return torch.randn(rows, 256, generator=g, device="cuda").to(torch.bfloat16)


def block(x, w):
    return itorch.gemm(itorch.all_gather(x, group), w.t()).relu()


def fused_block(x, w):
    y, full = itorch.ag_gemm(x, w.t(), group, return_gathered=True)
    return y.relu(), full


def reference(rows, seed, w):
    full = torch.cat([shard(q, rows, seed) for q in range(WORLD)])
    return (full.float() @ w.float().t()).relu()


def check(out, ref, what):
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"rank {RANK}: {what}: relative error {err}"


def main(mode):
    w = torch.randn(384, 256, device="cuda").to(torch.bfloat16)
    fn = {"eager": block,
          "fullgraph": torch.compile(block, fullgraph=True),
          "reduce_overhead": torch.compile(block, fullgraph=True, mode="reduce-overhead"),
          "from_process_group": block}[mode]
    for step in range(5):  # fresh inputs every step; graphs replay with them
        x = shard(RANK, 129, step)
        out = fn(x, w)
        torch.cuda.synchronize()
        group.check()
        check(out, reference(129, step, w), f"{mode} step {step}")
    fused = {"eager": fused_block, "fullgraph": torch.compile(fused_block, fullgraph=True),
             "reduce_overhead": torch.compile(fused_block, fullgraph=True, mode="reduce-overhead"),
             "from_process_group": fused_block}[mode]
    for step in range(5):
        x = shard(RANK, 128, 20 + step)
        out, full = fused(x, w)
        torch.cuda.synchronize()
        group.check()
        check(out, reference(128, 20 + step, w), f"{mode} ag_gemm step {step}")
        assert torch.equal(full, torch.cat([shard(q, 128, 20 + step) for q in range(WORLD)])), "gathered A"
    buf = torch.full((WORLD * 129, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    itorch.all_gather(shard(RANK, 129, 9), group, out=buf)
    torch.cuda.synchronize()
    assert torch.equal(buf, torch.cat([shard(q, 129, 9) for q in range(WORLD)])), "out= form"
    group.barrier()
    print(f"rank {RANK}: torch ops correct ({mode})")


if __name__ == "__main__":
    main(sys.argv[1])
