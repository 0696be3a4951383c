"""One rank of the torch.library ops on GPUs (see test_torch_ops_gpu.py): all_gather, gemm, ag_gemm,
gemm_rs, gemm_ar, reduce_scatter, all_reduce, a MoE layer (moe_dispatch, moe_combine, moe_gemm_combine
and moe_dispatch_gemm), attention and ring_attention, eager,
compiled with fullgraph=True, and compiled with mode="reduce-overhead" (CUDA graphs), each against a
reference."""
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


def row_parallel_block(a, w):
    return itorch.gemm_rs(a, w.t(), group).relu(), itorch.gemm_ar(a, w.t(), group)


def reduction_block(x):
    return itorch.reduce_scatter(x, group), itorch.all_reduce(x, group)


def k_shard(rank, m, seed):
    """Rank `rank`'s [m, 128] slice of A and [384, 128] slice of a Linear weight: K split over ranks."""
    g = torch.Generator(device="cuda").manual_seed(seed * 100 + rank + 7)
    return (torch.randn(m, 128, generator=g, device="cuda").to(torch.bfloat16),
            torch.randn(384, 128, generator=g, device="cuda").to(torch.bfloat16))


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
    compiled = {"eager": lambda f: f, "fullgraph": lambda f: torch.compile(f, fullgraph=True),
                "reduce_overhead": lambda f: torch.compile(f, fullgraph=True, mode="reduce-overhead"),
                "from_process_group": lambda f: f}[mode]
    row_parallel, reductions = compiled(row_parallel_block), compiled(reduction_block)
    for m in (256 * WORLD, 192 * WORLD):  # blocks of 256 rows (owners sum in the epilogue), of 192 (reducers)
        for step in range(3):
            a, w_k = k_shard(RANK, m, 40 + step)
            total = sum(p.float() @ q.float().t() for p, q in (k_shard(r, m, 40 + step) for r in range(WORLD)))
            rows = slice(RANK * m // WORLD, (RANK + 1) * m // WORLD)
            rs, ar = row_parallel(a, w_k)
            torch.cuda.synchronize()
            group.check()
            check(rs, total[rows].relu(), f"{mode} gemm_rs m={m} step {step}")
            check(ar, total, f"{mode} gemm_ar m={m} step {step}")
            x = shard(RANK, 4 * WORLD, 60 + step)
            parts = [shard(r, 4 * WORLD, 60 + step).float() for r in range(WORLD)]
            summed = parts[0]
            for p in parts[1:]:  # fp32 in rank order, rounded once: interlace's bits
                summed = summed + p
            scattered, reduced = reductions(x)
            torch.cuda.synchronize()
            want = summed.to(torch.bfloat16)
            assert torch.equal(reduced, want), f"rank {RANK}: {mode} all_reduce step {step}"
            assert torch.equal(scattered, want[RANK * 4:(RANK + 1) * 4]), \
                f"rank {RANK}: {mode} reduce_scatter step {step}"
    # A MoE layer: dispatch, a stand-in expert (x 2, exact in bf16), combine. Routing changes every
    # step; the buffers stay put, so graphs replay with it.
    moe = itorch.MoeBuffers(group, num_experts=4 * WORLD, topk=2, hidden=256, max_tokens=64, capacity=64 * WORLD)
    moe_layer = compiled(lambda x, idx, w: itorch.moe_combine(itorch.moe_dispatch(x, idx, w, moe) * 2, moe,
                                                              tokens=x.shape[0]))

    def moe_inputs(step):
        """This rank's x [64, 256], top-2 of 4 x WORLD experts and their weights for step `step`."""
        g = torch.Generator(device="cuda").manual_seed(80 + step + 1000 * RANK)
        x = torch.randn(64, 256, generator=g, device="cuda").to(torch.bfloat16)
        idx = torch.rand(64, 4 * WORLD, generator=g, device="cuda").argsort(dim=1)[:, :2].to(torch.int32)
        return x, idx, torch.rand(64, 2, generator=g, device="cuda")

    for step in range(3):
        x, idx, w = moe_inputs(step)
        y = moe_layer(x, idx, w)
        torch.cuda.synchronize()
        group.check()
        twice = (x.float() * 2).to(torch.bfloat16).float()  # each token's experts all return 2x
        want = (w[:, :1] * twice + w[:, 1:] * twice).to(torch.bfloat16)  # fp32, top-k order, rounded once
        assert torch.equal(y, want), f"rank {RANK}: {mode} moe step {step}: {(y.float() - want.float()).abs().max()}"
    # The experts' second matmul fused with the combine: act from the received rows (their first F
    # columns x 2, exact), Linear weights [L, H, F] passed as w2.transpose(1, 2), a strided view the op
    # must take as it is. The same bits as interlace.moe_gemm_combine called directly, after the
    # layer, on the same act and the handle's same dispatch.
    F = 128
    w2 = (torch.randn(4, 256, F, device="cuda") / 16).to(torch.bfloat16)
    fused_layer = compiled(lambda x, idx, w, w2: itorch.moe_gemm_combine(
        itorch.moe_dispatch(x, idx, w, moe)[:, :F] * 2, w2.transpose(1, 2), moe, tokens=x.shape[0]))
    for step in range(3):
        y = fused_layer(*moe_inputs(10 + step), w2).clone()  # a copy: reduce-overhead's out is the graph's
        torch.cuda.synchronize()
        group.check()
        want = torch.full_like(y, float("nan"))
        interlace.moe_gemm_combine(moe.expert_x[:, :F] * 2, w2.transpose(1, 2), moe.native, group, out=want)
        torch.cuda.synchronize()
        group.check()
        assert y.shape == (64, 256) and not y.isnan().any(), f"rank {RANK}: {mode} moe_gemm_combine step {step}"
        assert torch.equal(y, want), \
            f"rank {RANK}: {mode} moe_gemm_combine step {step}: {(y.float() - want.float()).abs().max()}"
    # The whole layer fused: moe_dispatch_gemm (Linear weights w1 [L, F, H], passed transposed), relu,
    # moe_gemm_combine. The same bits as the two ops called directly, after the layer, on its inputs.
    w1 = (torch.randn(4, F, 256, device="cuda") / 16).to(torch.bfloat16)
    whole_layer = compiled(lambda x, idx, w, w1, w2: itorch.moe_gemm_combine(
        torch.relu(itorch.moe_dispatch_gemm(x, idx, w, w1.transpose(1, 2), moe)), w2.transpose(1, 2), moe,
        tokens=x.shape[0]))
    for step in range(3):
        inputs = moe_inputs(20 + step)
        y = whole_layer(*inputs, w1, w2).clone()
        torch.cuda.synchronize()
        group.check()
        h = torch.empty(moe.expert_x.shape[0], F, dtype=torch.bfloat16, device="cuda")
        interlace.moe_dispatch_gemm(*inputs, w1.transpose(1, 2), group, out=h, handle=moe.native)
        want = torch.full_like(y, float("nan"))
        interlace.moe_gemm_combine(torch.relu(h), w2.transpose(1, 2), moe.native, group, out=want)
        torch.cuda.synchronize()
        group.check()
        assert y.shape == (64, 256) and not y.isnan().any(), f"rank {RANK}: {mode} moe layer step {step}"
        assert torch.equal(y, want), \
            f"rank {RANK}: {mode} moe_dispatch_gemm layer step {step}: {(y.float() - want.float()).abs().max()}"
    # Attention on this GPU and over the ring: the ring's shard of out equals the shard of attention
    # over the whole sequence (the same engine, the same blocks in another order: close, not equal).
    attend = compiled(lambda q, k, v, qs, ks, vs: (itorch.attention(q, k, v, causal=True),
                                                   itorch.ring_attention(qs, ks, vs, group, causal=True)))
    for step in range(3):
        g = torch.Generator(device="cuda").manual_seed(90 + step)  # alike on every rank: the whole sequence
        q, k, v = (torch.randn(1, 300 * WORLD, heads, 64, generator=g, device="cuda").to(torch.bfloat16)
                   for heads in (4, 2, 2))
        shards = [interlace.ring_attention_shard(t, RANK, WORLD).contiguous() for t in (q, k, v)]
        (out, lse), (ring_out, ring_lse) = attend(q, k, v, *shards)
        torch.cuda.synchronize()
        group.check()
        check(ring_out, interlace.ring_attention_shard(out, RANK, WORLD).float(), f"{mode} ring_attention step {step}")
        lse_err = (ring_lse - interlace.ring_attention_shard(lse, RANK, WORLD, dim=2)).abs().max().item()
        assert lse_err < 1e-3, f"rank {RANK}: {mode} ring_attention lse step {step}: {lse_err}"
    buf = torch.full((WORLD * 129, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    itorch.all_gather(shard(RANK, 129, 9), group, out=buf)
    torch.cuda.synchronize()
    assert torch.equal(buf, torch.cat([shard(q, 129, 9) for q in range(WORLD)])), "out= form"
    group.barrier()
    print(f"rank {RANK}: torch ops correct ({mode})")


if __name__ == "__main__":
    main(sys.argv[1])
