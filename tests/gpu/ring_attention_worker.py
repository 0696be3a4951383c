"""One rank of a ring_attention GPU test scenario (see test_ring_attention.py). Exits non-zero on failure.

Every rank builds the same global q, k, v from a seed, takes its zigzag shard with
interlace.ring_attention_shard, and checks its shard of out and lse against fp32 attention over the
whole sequence computed on its own GPU, so the reference needs no communication."""
import math
import os
import sys

import torch

import interlace
from interlace.bench.launch import expect_error

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.backends.cuda.matmul.allow_tf32 = False  # the reference is true fp32
TIMEOUT_S = 20.0
HEAP = 1 << 30

# (S global, batch, Hq, Hkv, D, causal). S: 0 (every shard empty), 1 (one rank's empty), multiples of
# 2W and not (seq_len passed), shorter than 2W (empty chunks), chunks not a multiple of the 128-row
# tile, one tile, many tiles.
CASES = [
    (0, 1, 2, 1, 64, True), (1, 1, 2, 1, 128, False), (4, 1, 1, 1, 64, True), (3, 1, 2, 1, 128, True), (7, 1, 2, 2, 128, False), (256, 1, 4, 4, 128, True),
    (256, 2, 4, 1, 64, False), (300, 1, 8, 2, 128, True), (513, 1, 4, 4, 64, True), (1000, 1, 8, 8, 128, False),
    (1024, 1, 8, 1, 128, True), (1030, 2, 4, 2, 128, True), (2048, 1, 16, 4, 64, False), (2500, 1, 8, 8, 128, True),
    (4096, 1, 8, 2, 128, True), (4096, 1, 8, 8, 128, False), (5000, 1, 4, 1, 64, True), (8192, 1, 8, 8, 128, True),
    (3001, 1, 8, 1, 128, False), (6000, 1, 8, 2, 64, True), (129, 3, 4, 4, 128, True),
]


def global_inputs(s, b, hq, hkv, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def reference(q, k, v, causal, scale):
    """fp32 attention over the global sequence, a head at a time: (out [B, S, Hq, D], lse [B, Hq, S])."""
    b, s, hq, d = q.shape
    group = hq // k.shape[2]
    out = torch.empty(b, s, hq, d, device="cuda")
    lse = torch.empty(b, hq, s, device="cuda")
    mask = torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1) if causal else None
    for i in range(b):
        for h in range(hq):
            scores = (q[i, :, h].float() @ k[i, :, h // group].float().t()) * scale
            if causal:
                scores.masked_fill_(mask, float("-inf"))
            lse[i, h] = torch.logsumexp(scores, dim=-1)
            out[i, :, h] = torch.softmax(scores, dim=-1) @ v[i, :, h // group].float()
    return out, lse


class Case:
    def __init__(self, s, b, hq, hkv, d, causal, dtype, seed):
        self.s, self.causal, self.scale = s, causal, 1 / math.sqrt(d)
        self.global_qkv = global_inputs(s, b, hq, hkv, d, dtype, seed)
        self.q, self.k, self.v = (interlace.ring_attention_shard(t, RANK, WORLD, dim=1).contiguous()
                                  for t in self.global_qkv)
        self.out = torch.empty_like(self.q)
        self.lse = torch.empty(b, hq, self.q.shape[1], device="cuda")
        self.ref_out = self.ref_lse = None

    def describe(self):
        b, sl, hq, d = self.q.shape
        return f"S={self.s} B={b} Hq={hq} Hkv={self.k.shape[2]} D={d} causal={self.causal} {self.q.dtype}"

    def poison(self):
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))

    def call(self, group, **kwargs):
        seq_len = None if self.s % (2 * WORLD) == 0 else self.s
        interlace.ring_attention(self.q, self.k, self.v, self.out, group, causal=self.causal, lse=self.lse,
                                 seq_len=seq_len, **kwargs)

    def verify(self, what):
        if self.ref_out is None:
            out, lse = reference(*self.global_qkv, self.causal, self.scale)
            self.ref_out = interlace.ring_attention_shard(out, RANK, WORLD, dim=1)
            self.ref_lse = interlace.ring_attention_shard(lse, RANK, WORLD, dim=2)
        if self.out.isnan().any() or self.lse.isnan().any():
            raise AssertionError(f"rank {RANK}: {what}: {int(self.out.isnan().sum())} elements of out and "
                                 f"{int(self.lse.isnan().sum())} of lse never written")
        if self.out.numel() == 0:
            return 0.0
        err = ((self.out.float() - self.ref_out).norm() / self.ref_out.norm().clamp_min(1e-30)).item()
        worst = (self.out.float() - self.ref_out).abs().max().item()
        lse_err = (self.lse - self.ref_lse).abs().max().item()
        if err > 1e-2 or worst > 3e-2 or lse_err > 2e-3:
            raise AssertionError(f"rank {RANK}: {what}: out relative error {err:.2e}, largest {worst:.2e}, "
                                 f"lse error {lse_err:.2e}")
        return err


def scenario_shapes():
    group = interlace.init(heap_bytes=HEAP, timeout_s=TIMEOUT_S)
    worst = 0.0
    for i, (s, b, hq, hkv, d, causal) in enumerate(CASES):
        c = Case(s, b, hq, hkv, d, causal, (torch.bfloat16, torch.float16)[i % 2], seed=i)
        print(f"rank {RANK}: case {i}: {c.describe()}", flush=True)
        c.poison()
        c.call(group)
        torch.cuda.synchronize()
        group.check()
        worst = max(worst, c.verify(f"case {i}: {c.describe()}"))
        first = c.out.clone(), c.lse.clone()
        c.poison()
        c.call(group)
        torch.cuda.synchronize()
        if not (torch.equal(c.out, first[0]) and torch.equal(c.lse, first[1])):
            raise AssertionError(f"rank {RANK}: case {i}: {c.describe()}: a second run differs (a race)")
    print(f"rank {RANK}: {len(CASES)} cases correct, twice each; worst relative error {worst:.2e}")


def scenario_senders():
    """Other sender CTA counts (a tuning) give the same result as the automatic one: one sender
    forwarding every piece, a count that does not divide the pieces, and more senders than pieces."""
    group = interlace.init(heap_bytes=HEAP, timeout_s=TIMEOUT_S)
    for i, (s, b, hq, hkv, d, causal) in enumerate([(4096, 1, 8, 2, 128, True), (3000, 2, 4, 4, 64, False)]):
        c = Case(s, b, hq, hkv, d, causal, torch.bfloat16, seed=100 + i)
        c.call(group)
        torch.cuda.synchronize()
        group.check()
        automatic = c.out.clone(), c.lse.clone()
        for senders in (1, 3, 128):
            c.poison()
            c.call(group, sender_ctas=senders)
            torch.cuda.synchronize()
            group.check()
            if not (torch.equal(c.out, automatic[0]) and torch.equal(c.lse, automatic[1])):
                raise AssertionError(f"rank {RANK}: {c.describe()}: {senders} senders differ from the automatic count")
        c.verify(c.describe())
    print(f"rank {RANK}: 1, 3 and 128 sender CTAs give the automatic count's bits")


def scenario_stale_scratch():
    """The receive slots live in the group's scratch, which other ops fill too: shards that differ in
    length leave slot rows no block fills, and a key tile's box can run over them. Fill the scratch
    with NaN through an all_reduce's staging first: ring_attention must not read it."""
    group = interlace.init(heap_bytes=HEAP, timeout_s=TIMEOUT_S)
    for i, (s, b, hq, hkv, d, causal) in enumerate([(7, 1, 2, 2, 128, False), (3, 1, 2, 1, 128, True),
                                                    (1030, 2, 4, 2, 128, True), (2501, 1, 8, 8, 64, False)]):
        nan = torch.full((64 << 20,), float("nan"), device="cuda")  # 256 MiB of fp32 staging
        interlace.all_reduce(torch.empty_like(nan), nan, group)
        c = Case(s, b, hq, hkv, d, causal, torch.bfloat16, seed=300 + i)
        c.poison()
        c.call(group)
        torch.cuda.synchronize()
        group.check()
        c.verify(f"after a NaN all_reduce: {c.describe()}")
    print(f"rank {RANK}: no stale slot rows read")


def scenario_streams():
    """Calls back to back on two streams with no synchronization between them, and all_reduces among
    them: a group's ops run one after another whichever stream issues them."""
    group = interlace.init(heap_bytes=HEAP, timeout_s=TIMEOUT_S)
    cases = [Case(*CASES[j % len(CASES)], dtype=torch.bfloat16, seed=50 + j) for j in (3, 5, 8, 9, 12, 13)]
    x = torch.randn(1 << 16, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))  # alike on all
    sums = [torch.empty_like(x) for _ in cases]
    for c in cases:
        c.poison()
    torch.cuda.synchronize()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for j, c in enumerate(cases):
        with torch.cuda.stream((s1, s2)[j % 2]):
            c.call(group)
            interlace.all_reduce(sums[j], x, group)
    torch.cuda.synchronize()
    group.check()
    for j, c in enumerate(cases):
        c.verify(f"call {j} on stream {j % 2 + 1}: {c.describe()}")
        torch.testing.assert_close(sums[j], x * WORLD)
    print(f"rank {RANK}: {len(cases)} calls on two streams correct")


def scenario_graph():
    """A CUDA graph of two calls, replayed with fresh inputs copied in, eager calls around it."""
    group = interlace.init(heap_bytes=HEAP, timeout_s=TIMEOUT_S)
    a = Case(1030, 2, 4, 2, 128, True, torch.bfloat16, seed=70)
    b = Case(2048, 1, 8, 8, 64, False, torch.bfloat16, seed=71)
    a.call(group)  # eager, before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        a.call(group)
        b.call(group)
    for seed in range(3):
        for c, base in ((a, 80), (b, 90)):
            fresh = Case(c.s, c.q.shape[0], c.q.shape[2], c.k.shape[2], c.q.shape[3], c.causal, torch.bfloat16,
                         seed=base + seed)
            for dst, src in ((c.q, fresh.q), (c.k, fresh.k), (c.v, fresh.v)):
                dst.copy_(src)
            c.global_qkv, c.ref_out = fresh.global_qkv, None
            c.poison()
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        a.verify(f"replay {seed}: {a.describe()}")
        b.verify(f"replay {seed}: {b.describe()}")
        b.call(group)  # eager between replays
        torch.cuda.synchronize()
        b.verify(f"eager after replay {seed}")
    print(f"rank {RANK}: graph replays correct")


def scenario_validation():
    group = interlace.init(heap_bytes=HEAP, timeout_s=TIMEOUT_S)
    c = Case(1024, 1, 4, 2, 128, True, torch.bfloat16, seed=3)
    before = c.out.fill_(7.0).clone()
    q, k, v, out = c.q, c.k, c.v, c.out
    expect_error(lambda: interlace.ring_attention(q, k, v, out, group, seq_len=1025), "shard", "rows")
    expect_error(lambda: interlace.ring_attention(q, k[:, :-1].contiguous(), v[:, :-1].contiguous(), out, group),
                 "rows")
    expect_error(lambda: interlace.ring_attention(q.half(), k, v, out, group), "dtype")
    expect_error(lambda: interlace.ring_attention(q, k, v, out, group, lse=torch.empty(1, 4, 3, device="cuda")), "lse")
    expect_error(lambda: interlace.ring_attention(q, k, v, q, group), "overlap")
    expect_error(lambda: interlace.ring_attention(q, k, v, out, group, sender_ctas=-1), "sender_ctas")
    # Arguments that differ across ranks: every rank raises, none hangs (one rank has no other).
    if WORLD > 1:
        expect_error(lambda: interlace.ring_attention(q, k, v, out, group, causal=RANK == 0), "")
    torch.cuda.synchronize()
    if not torch.equal(out, before):
        raise AssertionError(f"rank {RANK}: a call that raised wrote to out")
    c.poison()
    c.call(group)  # the group is still usable
    torch.cuda.synchronize()
    group.check()
    c.verify("a call after the errors")
    print(f"rank {RANK}: bad arguments raise before any GPU work; the group stays usable")


if __name__ == "__main__":
    globals()[f"scenario_{sys.argv[1]}"]()
