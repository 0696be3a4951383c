"""One rank of a gemm_ar GPU test scenario (see test_gemm_ar.py). Exits non-zero on failure.

interlace.gemm_ar(a, b, out, group) computes out[M, N] = sum over ranks q of a_q @ b_q on every rank
(K split across ranks, possibly unevenly). The inputs and the reference are gemm_rs_worker's (every
rank recomputes every rank's inputs from (case seed, rank)); out is checked against it, bit for bit
between two runs, and bit for bit between ranks (all_gather of out)."""
import os
import sys
import time

import torch

import interlace
from interlace.bench.launch import expect_error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_rs_worker import (CASES, PATHS, RANK, TIMEOUT_S, WORLD, expect_bits, expect_sum, inputs,  # noqa: E402
                            per_rank, poison)


def scratch_bytes(m, n):
    """gemm_ar's heap scratch, as gemm_ar sizes it, the larger of its two paths and two tile widths:
    throughput, the fp32 partials of the busiest owner's whole tile rows from every rank and a landing
    tile of 2-byte elements for every output tile; one-shot, every rank's fp32 partials of every tile
    (the decode variant's run tiles, at most one per SM, fit in heap_bytes' extra)."""
    tiles_m = -(-m // 128)
    most = -(-tiles_m // WORLD)
    return max(max(WORLD * most * -(-n // w) * 128 * w * 4 + tiles_m * -(-n // w) * 128 * w * 2 + 256,
                   WORLD * tiles_m * -(-n // w) * 128 * w * 4) for w in (128, 256))


def heap_bytes(shapes, extra=256 << 20):
    return max(scratch_bytes(m, n) for m, n in shapes) + extra


class Case:
    """One gemm_ar problem on this rank: inputs, a poisoned out, the reference."""

    def __init__(self, seed, m, k, n, dtype, layout):
        self.m, self.ks, self.n, self.dtype = m, per_rank(k), n, dtype
        self.layout = "nk" if n % 8 else layout  # b row-major needs N a multiple of 8
        self.seed = seed
        self.a, self.b = inputs(RANK, m, self.ks[RANK], n, dtype, self.layout, seed)
        self.ref = self.reference()
        if n % 8:  # out's rows must start 16-byte aligned: a view of a wider tensor
            self.out = torch.empty(m, n + 8 - n % 8 + 8, device="cuda", dtype=dtype)[:, :n]
        else:
            self.out = torch.empty(m, n, device="cuda", dtype=dtype)
        poison(self.out)

    def reference(self):
        total = torch.zeros(self.m, self.n, device="cuda")
        for q in range(WORLD):
            a, b = inputs(q, self.m, self.ks[q], self.n, self.dtype, self.layout, self.seed)
            total += a.float() @ b.float()
        return total

    def refresh(self, seed):
        self.seed = seed
        a, b = inputs(RANK, self.m, self.ks[RANK], self.n, self.dtype, self.layout, seed)
        self.a.copy_(a)
        self.b.copy_(b)
        self.ref = self.reference()
        poison(self.out)

    def call(self, group, path=None, **kwargs):
        kwargs.update(path or {})
        interlace.gemm_ar(self.a, self.b, self.out, group, **kwargs)

    def describe(self):
        return f"M {self.m} K {self.ks} N {self.n} {str(self.dtype)[6:]} b {self.layout}"

    def verify(self, group, what):
        rel = expect_sum(self.out, self.ref, what)
        # Every rank holds the same bits: one owner rounded each tile and sent it to all.
        mine = self.out.contiguous().view(torch.int16).view(-1)
        every = torch.empty(WORLD * mine.numel(), device="cuda", dtype=torch.int16)
        if mine.numel():
            interlace.all_gather(every, mine, group)
            torch.cuda.synchronize()
            for q in range(WORLD):
                expect_bits(every[q * mine.numel():(q + 1) * mine.numel()], mine, f"{what}: rank {q}'s out")
        return rel


def shapes_of(cases):
    return [(sum(per_rank(c[0])), c[2]) for c in cases]


def scenario_shapes():
    """Every case (M the sum of its rows), every path, fresh random data, poisoned outputs; the
    automatic path twice, bit for bit; every rank's out bit for bit."""
    group = interlace.init(heap_bytes=heap_bytes(shapes_of(CASES)), timeout_s=TIMEOUT_S)
    worst, calls = 0.0, 0
    for i, (rows, k, n, *tuning) in enumerate(CASES):
        tuning = tuning[0] if tuning else {}
        c = Case(seed=i, m=sum(per_rank(rows)), k=k, n=n, dtype=(torch.bfloat16, torch.float16)[i % 2],
                 layout=("kn", "nk")[(i // 2) % 2])
        first = None
        for path in PATHS + (PATHS[0],):
            poison(c.out)
            c.call(group, path=path, **tuning)
            torch.cuda.synchronize()
            group.check()
            worst = max(worst, c.verify(group, f"case {i}: {c.describe()} path {path} {tuning}"))
            calls += 1
            if path is PATHS[0]:
                if first is None:
                    first = c.out.clone()
                else:
                    expect_bits(c.out, first, f"case {i}: {c.describe()}: a second run")
    print(f"rank {RANK}: {len(CASES)} cases x {len(PATHS) + 1} calls = {calls} calls correct, worst relative error "
          f"{worst:.2e}")


def scenario_graph():
    """Two gemm_ar calls on two streams, then a CUDA graph of both replayed with fresh inputs."""
    specs = [(1024, 1032, 776, torch.bfloat16, "nk", PATHS[1]), (513, 72, 264, torch.float16, "kn", PATHS[0])]
    group = interlace.init(heap_bytes=heap_bytes([(s[0], s[2]) for s in specs]), timeout_s=TIMEOUT_S)
    cases = [Case(seed=400 + i, m=m, k=k, n=n, dtype=dt, layout=lay) for i, (m, k, n, dt, lay, _) in enumerate(specs)]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for j, (c, spec) in enumerate(zip(cases, specs)):
        with torch.cuda.stream((s1, s2)[j % 2]):
            c.call(group, path=spec[-1])
    torch.cuda.synchronize()
    for c in cases:
        c.verify(group, f"eager call on two streams: {c.describe()}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s1):
        for c, spec in zip(cases, specs):
            c.call(group, path=spec[-1])
    for step in range(10):
        for i, c in enumerate(cases):
            c.refresh(1000 + step * 10 + i)
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        for i, c in enumerate(cases):
            c.verify(group, f"replay {step}, call {i}: {c.describe()}")
    print(f"rank {RANK}: 10 replays of 2 captured calls correct, and eager calls on two streams")


def scenario_validation():
    """Bad arguments raise interlace.Error on every rank before any GPU work; the group stays usable."""
    group = interlace.init(heap_bytes=64 << 20, timeout_s=TIMEOUT_S)
    bf16 = torch.bfloat16
    m, k, n = 256, 64, 136
    gemm_ar = interlace.gemm_ar

    def t(*shape, dtype=bf16):
        return torch.randn(*shape, device="cuda").to(dtype)

    a, b, out = t(m, k), t(k, n), t(m, n)
    poison(out)
    before = [x.clone() for x in (a, b, out)]
    cases = [
        (lambda: gemm_ar(a, b.half(), out, group), ["dtype"]),
        (lambda: gemm_ar(a, b, out[:-1], group), [("shape", "chain")]),
        (lambda: gemm_ar(a, t(k, 12), t(m, 12), group), [("16-byte", "multiple of 8")]),
        (lambda: gemm_ar(a, b, out, group, reduce_ctas=3), ["reduce_ctas"]),
        (lambda: gemm_ar(a, b, out, group, tile_n=96), ["tile_n"]),
        (lambda: gemm_ar(a, t(k, n + 8 * RANK), t(m, n + 8 * RANK), group), ["differ"]),
        (lambda: gemm_ar(t(m, k * (RANK % 2)), t(k * (RANK % 2), n), out, group), ["differ"]),
    ]
    for i, (fn, needles) in enumerate(cases):
        try:
            expect_error(fn, *needles)
        except AssertionError as e:
            raise AssertionError(f"bad-argument case {i}: {e}") from None
    torch.cuda.synchronize()
    for name, x, y in zip(("a", "b", "out"), (a, b, out), before):
        expect_bits(x, y, f"{name} after the rejected calls")
    group.check()
    c = Case(seed=77, m=m, k=k, n=n, dtype=bf16, layout="nk")
    c.call(group)
    torch.cuda.synchronize()
    group.check()
    c.verify(group, "a good call after the rejected ones")
    print(f"rank {RANK}: {len(cases)} kinds of bad arguments rejected before GPU work")


def scenario_abort():
    """Calls queued behind a GPU sleep on every rank, then rank 0 aborts the group: their GEMM CTAs,
    whose handshake runs beside the mainloop, store nothing (out stays poisoned), and every rank
    raises naming the abort. The decode (swapped) path and the throughput path."""
    group = interlace.init(heap_bytes=256 << 20, timeout_s=TIMEOUT_S)
    shapes = [(1, 4096, 8192), (2048, 1024, 2048)]
    calls = []
    for i, (m, k, n) in enumerate(shapes):
        g = torch.Generator(device="cuda").manual_seed(i * 100 + RANK)
        a = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        b = torch.randn(n, k, generator=g, device="cuda").to(torch.bfloat16).t()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        interlace.gemm_ar(a, b, out, group)  # the signature is known: later calls launch without waiting
        calls.append((a, b, out))
    torch.cuda.synchronize()
    group.check()
    for _, _, out in calls:
        poison(out)
    torch.cuda.synchronize()
    group.barrier()
    began = time.monotonic()
    torch.cuda._sleep(int(2e9))  # about a second at H200's clocks: the calls below queue behind it
    queued = []
    for a, b, out in calls:
        interlace.gemm_ar(a, b, out, group)
        queued.append(time.monotonic() - began)
    group.barrier()
    if RANK == 0:
        group.abort("test: rank 0 aborts with gemm_ar queued")
    aborted = time.monotonic() - began
    torch.cuda.synchronize()
    drained = time.monotonic() - began
    timeline = f"calls queued at {[round(t, 3) for t in queued]} s, abort at {aborted:.3f}, drained at {drained:.3f}"
    if drained - aborted < 0.1:  # the sleep ended before the abort: the test would prove nothing
        raise AssertionError(f"rank {RANK}: the GPU was idle before the abort ({timeline})")
    expect_error(group.check, "test: rank 0 aborts")
    for i, (_, _, out) in enumerate(calls):
        if not torch.isnan(out.float()).all():
            raise AssertionError(f"rank {RANK}: call {i} stored into out after the abort ({timeline})")
    print(f"rank {RANK}: queued gemm_ar calls stored nothing after the abort, and raised ({timeline})")


SCENARIOS = {
    "shapes": scenario_shapes,
    "graph": scenario_graph,
    "validation": scenario_validation,
    "abort": scenario_abort,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
