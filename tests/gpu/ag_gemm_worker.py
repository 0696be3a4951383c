"""One rank of an ag_gemm GPU test scenario (see test_ag_gemm.py). Exits non-zero on failure.

interlace.ag_gemm(a_shard, b, out, group, gathered=...) computes out = A_full @ b, where A_full is
every rank's a_shard stacked in rank order (shards may be uneven, or empty) and b is this rank's own.
Every rank recomputes every shard from (case seed, rank), so the references need no communication:
out against torch's fp32 matmul of the stacked shards, the gathered A bit for bit."""
import functools
import math
import os
import sys

import torch

import interlace
from interlace.bench.launch import expect_error
import interlace.torch as itorch

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.backends.cuda.matmul.allow_tf32 = False  # the reference is true fp32
# A stuck wait becomes an error naming the flag after this long, rather than a hang.
TIMEOUT_S = 20.0
# Configurations each case runs with: automatic (ping-pong, the copy engines), cooperative tiles of
# each width, and CTAs set aside to push (the default count; a single pushing cluster).
PATHS = ({}, {"pingpong": False, "tile_n": 128, "transfer": "ctas"}, {"pingpong": False, "tile_n": 256, "band_m": 1},
         {"transfer": "ctas", "copy_ctas": 2})

# (rows, K, N[, tuning]). Rank q holds rows[q % len(rows)] rows, so every rank knows every shard's size
# at any world size. Together: whole 128-row tiles and tails; a shard much smaller than the other;
# shards of one row; ranks with none (first, last, all but one row); tile rows spanning shards; K from
# 8 (one 16-byte vector per row) to 8192 and N from 8 to 14336, most not multiples of 128.
CASES = [
    ((128, 128), 64, 256),
    ((256, 256), 8, 8),
    ((1000, 24), 72, 264),
    ((24, 1000), 4096, 520),
    ((1, 513), 64, 776),
    ((513, 1), 136, 1000),
    ((1, 1), 8, 24),
    ((0, 300), 72, 1024),
    ((257, 0), 64, 136),
    ((0, 1), 8, 8),
    ((1, 0), 72, 264),
    ((3001, 2999), 1032, 2056),
    ((4096, 4096), 4096, 2048),
    ((8192, 129), 512, 1288),
    ((129, 8192), 2048, 384),
    ((2048, 2048), 8192, 1024),
    ((77, 200), 4104, 8),
    ((640, 640), 328, 7168),
    ((127, 129), 200, 4104),
    ((300, 7), 8, 2056),
    ((5000, 3), 64, 136),
    ((3, 5000), 72, 1000),
    ((1023, 1025), 2056, 776),
    ((96, 160), 64, 14336),
    ((2500, 1), 8192, 264),
    ((1, 2500), 1032, 24),
    ((200, 56), 8, 520),
    ((1500, 1500), 72, 3000),
    ((4097, 4095), 256, 512),
    ((0, 4096), 4096, 1024),
    ((6000, 2000), 1024, 4096),
    ((64, 64), 8192, 8),
    # Tuning overrides: chunks of 1 and 3 rows, of one and two tile rows.
    ((1000, 24), 72, 264, {"chunk_rows": 128}),
    ((700, 5), 72, 264, {"chunk_rows": 3}),
    ((3001, 2999), 1032, 2056, {"chunk_rows": 256}),
    ((129, 8192), 2048, 384, {"chunk_rows": 128}),
    ((513, 1), 136, 1000, {"chunk_rows": 1}),
]


def rows_of(rows):
    return [rows[q % len(rows)] for q in range(WORLD)]


def shard(q, rows, k, dtype, seed):
    """Rank q's shard of case `seed`, recomputable by any rank."""
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + q)
    return torch.randn(rows, k, generator=g, device="cuda").to(dtype)


def weight(k, n, dtype, layout, seed):
    """This rank's b for case `seed` (different on every rank): [K, N] row-major ("kn"), or a Linear
    weight [N, K] passed as weight.t() ("nk")."""
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + 500 + RANK)
    if layout == "kn":
        return torch.randn(k, n, generator=g, device="cuda").to(dtype)
    return torch.randn(n, k, generator=g, device="cuda").to(dtype).t()


def poison(t):
    t.view(torch.int16).fill_(-1)  # 0xFFFF: NaN in bf16 and fp16


def heap_bytes(cases, extra=256 << 20):
    """Room for the largest gathered A three times (a symmetric gathered, op scratch), and flags."""
    need = max(sum(rows_of(c[0])) * c[1] * 2 for c in cases)
    return 3 * need + extra


def expect_bits(out, ref, what):
    a, b = out.contiguous().view(torch.int16), ref.contiguous().view(torch.int16)
    if a.shape != b.shape or not torch.equal(a, b):
        bad = (a != b).nonzero() if a.shape == b.shape else None
        detail = f"{bad.shape[0]} elements differ, first at {bad[0].tolist()}" if bad is not None else \
            f"shape {tuple(a.shape)} != {tuple(b.shape)}"
        raise AssertionError(f"rank {RANK}: {what}: {detail}")


# Bounds on |out - ref| per element: the output's one rounding (half an ulp, 2^-8 relative for bf16,
# 2^-11 for fp16) with a factor of 2 to spare, plus a small absolute term for fp32 summation order.
REL_BOUND = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


def expect_product(out, ref, what):
    """out (bf16/fp16) against ref = A_full @ b in fp32: relative Frobenius error < 1e-2 and every
    element within REL_BOUND * |ref| + 1e-3 * rms(ref). Poisoned (NaN) elements fail both. Returns the
    relative error."""
    if ref.numel() == 0:  # M = 0 (every shard empty: world size 1 with an empty shard)
        return 0.0
    diff = (out.float() - ref).abs()
    unwritten = int(out.isnan().sum())
    rel = (diff.norm() / ref.norm()).item()
    rms = (ref.norm() / math.sqrt(ref.numel())).item()
    bound = REL_BOUND[out.dtype] * ref.abs() + 1e-3 * rms
    over = ~(diff <= bound)
    if unwritten or not rel < 1e-2 or bool(over.any()):
        first = over.nonzero()[0].tolist() if bool(over.any()) else None
        worst = diff.nan_to_num(nan=float("inf")).max().item()
        raise AssertionError(f"rank {RANK}: {what}: {unwritten} elements unwritten (NaN), relative error {rel:.2e}, "
                             f"{int(over.sum())} elements past the bound, first at {first}, largest error {worst:.3g} "
                             f"(rms of the reference {rms:.3g})")
    return rel


class Case:
    """One ag_gemm problem on this rank: inputs, poisoned outputs, references."""

    def __init__(self, group, seed, rows, k, n, dtype, layout, gathered="ordinary", a_in_heap=False):
        self.counts, self.k, self.n, self.dtype, self.layout = rows_of(rows), k, n, dtype, layout
        self.m = sum(self.counts)
        self.shards = [shard(q, self.counts[q], k, dtype, seed) for q in range(WORLD)]
        self.full = torch.cat(self.shards)
        self.b = weight(k, n, dtype, layout, seed)
        self.ref = self.full.float() @ self.b.float()
        if a_in_heap:  # symmetric: only when every rank's shard has the same shape (allocation is collective)
            self.a = itorch.empty(group, (self.counts[RANK], k), dtype)
            self.a.copy_(self.shards[RANK])
        else:
            self.a = self.shards[RANK].clone()
        self.out = torch.empty(self.m, n, device="cuda", dtype=dtype)
        self.gathered_kind = gathered
        self.gathered = {"none": lambda: None,
                         "ordinary": lambda: torch.empty(self.m, k, device="cuda", dtype=dtype),
                         "symmetric": lambda: itorch.empty(group, (self.m, k), dtype)}[gathered]()
        self.poison()

    def poison(self):
        poison(self.out)
        if self.gathered is not None:
            poison(self.gathered)

    def call(self, group, path=None, **kwargs):
        """path: a tile configuration (PATHS); the first, automatic, passes nothing, as most callers will."""
        kwargs.update(path or {})
        even = len(set(self.counts)) == 1
        interlace.ag_gemm(self.a, self.b, self.out, group, gathered=self.gathered,
                          shard_rows=None if even else self.counts, **kwargs)

    def describe(self):
        return (f"rows {self.counts} K {self.k} N {self.n} {str(self.dtype)[6:]} b {self.layout} "
                f"gathered {self.gathered_kind}")

    def verify(self, what):
        rel = expect_product(self.out, self.ref, what)
        if self.gathered is not None:
            expect_bits(self.gathered, self.full, f"{what}: gathered A")
        return rel


def scenario_shapes():
    """Every case, every path, fresh random data, poisoned outputs."""
    group = interlace.init(heap_bytes=heap_bytes(CASES), timeout_s=TIMEOUT_S)
    worst, calls = 0.0, 0
    for i, (rows, k, n, *tuning) in enumerate(CASES):
        tuning = tuning[0] if tuning else {}
        even = len(set(rows_of(rows))) == 1
        c = Case(group, seed=i, rows=rows, k=k, n=n, dtype=(torch.bfloat16, torch.float16)[i % 2],
                 layout=("kn", "nk")[(i // 2) % 2], gathered=("ordinary", "none", "symmetric")[i % 3],
                 a_in_heap=even and i % 2 == 1)
        for path in PATHS:
            c.poison()
            c.call(group, path=path, **tuning)
            torch.cuda.synchronize()
            group.check()
            worst = max(worst, c.verify(f"case {i}: {c.describe()} path {path} {tuning}"))
            calls += 1
        expect_bits(c.a, c.shards[RANK], f"case {i}: a_shard was modified")
        del c  # symmetric tensors go back to the heap
    print(f"rank {RANK}: {len(CASES)} cases x {len(PATHS)} paths = {calls} calls correct, worst relative error "
          f"{worst:.2e}")


def scenario_streams():
    """Calls issued back to back on two streams, with no synchronization between them, and all_gathers
    among them: ops of a group run one after another whichever stream issues them. The last call
    writes the outputs of the call just before it, from the other stream: they must hold its product."""
    shapes = [((1000, 24), 72, 264), ((0, 300), 64, 776), ((513, 1), 1032, 136), ((256, 256), 512, 1024)]
    group = interlace.init(heap_bytes=heap_bytes([(s[0], s[1]) for s in shapes]), timeout_s=TIMEOUT_S)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    cases = [Case(group, seed=100 + j, rows=shapes[j % 4][0], k=shapes[j % 4][1], n=shapes[j % 4][2],
                  dtype=(torch.bfloat16, torch.float16)[(j // 4) % 2], layout=("kn", "nk")[j % 2],
                  gathered=("none", "ordinary")[(j // 2) % 2]) for j in range(20)]
    prev = cases[-1]  # (256, 256) rows, K 512, N 1024, bf16, an ordinary gathered
    assert prev.dtype == torch.bfloat16 and prev.gathered is not None
    last = Case(group, seed=200, rows=shapes[3][0], k=shapes[3][1], n=shapes[3][2], dtype=torch.bfloat16,
                layout="nk", gathered="none")
    last.out, last.gathered, last.gathered_kind = prev.out, prev.gathered, "ordinary"
    ag_n = 4099
    ag_in = [shard(RANK, ag_n, 1, torch.bfloat16, 300 + j).view(-1) for j in range(4)]
    ag_out = [torch.empty(WORLD * ag_n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    for x in ag_out:
        poison(x)
    torch.cuda.synchronize()  # inputs ready and outputs poisoned before the streams start
    for j, c in enumerate(cases):
        stream = (s1, s2)[j % 2]
        if j % 3 == 2:  # the stream as a handle
            c.call(group, path=PATHS[j % len(PATHS)], stream=stream.cuda_stream)
        else:
            with torch.cuda.stream(stream):
                c.call(group, path=PATHS[j % len(PATHS)])
        if j % 5 == 2:
            with torch.cuda.stream((s2, s1)[j % 2]):
                interlace.all_gather(ag_out[j // 5], ag_in[j // 5], group)
    with torch.cuda.stream(s1):  # the last case ran on s2
        last.call(group)
    torch.cuda.synchronize()
    group.check()
    for j, c in enumerate(cases[:-1]):
        c.verify(f"call {j}: {c.describe()} on stream {j % 2 + 1}")
    last.verify("the last call, into the outputs of the call before it (other stream)")
    for j in range(4):
        expect_bits(ag_out[j], torch.cat([shard(q, ag_n, 1, torch.bfloat16, 300 + j).view(-1) for q in range(WORLD)]),
                    f"all_gather {j} among the ag_gemm calls")
    print(f"rank {RANK}: {len(cases) + 1} ag_gemm calls and 4 all_gathers on two streams correct")


def scenario_graph():
    """A CUDA graph holding three ag_gemm calls (uneven, empty and symmetric cases, every path),
    replayed with fresh inputs each time; the first of them also ran before the capture, the others are
    first seen in it. Then an eager call right after a replay, unsynchronized."""
    specs = [  # rows, K, N, dtype, layout, gathered, path
        ((1000, 24), 1032, 776, torch.bfloat16, "nk", "ordinary", PATHS[1]),
        ((0, 513), 72, 264, torch.float16, "kn", "none", PATHS[0]),
        ((256, 256), 512, 1024, torch.bfloat16, "kn", "symmetric", PATHS[2]),
    ]
    group = interlace.init(heap_bytes=heap_bytes([(s[0], s[1]) for s in specs]), timeout_s=TIMEOUT_S)
    cases = [Case(group, seed=400 + i, rows=r, k=k, n=n, dtype=dt, layout=lay, gathered=gk)
             for i, (r, k, n, dt, lay, gk, _) in enumerate(specs)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        cases[0].call(group, path=specs[0][-1])
    torch.cuda.synchronize()
    cases[0].verify("eager call before the capture")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for c, spec in zip(cases, specs):
            c.call(group, path=spec[-1])
    replays = 20
    for step in range(replays):
        for i, c in enumerate(cases):  # new values in the same tensors: the graph reads them, not copies
            seed = 1000 + step * 10 + i
            c.shards = [shard(q, c.counts[q], c.k, c.dtype, seed) for q in range(WORLD)]
            c.full = torch.cat(c.shards)
            c.a.copy_(c.shards[RANK])
            c.b.copy_(weight(c.k, c.n, c.dtype, c.layout, seed))
            c.ref = c.full.float() @ c.b.float()
            c.poison()
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        for i, c in enumerate(cases):
            c.verify(f"replay {step}, call {i}: {c.describe()} path {specs[i][-1]}")
    cases[1].poison()
    graph.replay()
    cases[0].poison()  # on the current stream, which the eager call below follows
    cases[0].call(group)
    torch.cuda.synchronize()
    group.check()
    cases[0].verify("eager call after a replay")
    cases[1].verify("the last replay")
    print(f"rank {RANK}: {replays} replays of 3 captured calls correct, and eager calls around them")


def scenario_validation():
    """Bad arguments raise interlace.Error on every rank before any GPU work: outputs and inputs keep
    their bytes, and the group stays usable."""
    group = interlace.init(heap_bytes=64 << 20, timeout_s=TIMEOUT_S)
    bf16, fp16 = torch.bfloat16, torch.float16
    counts = rows_of((200, 56))
    m, m_r, k, n = sum(counts), counts[RANK], 64, 136
    ag_gemm = functools.partial(interlace.ag_gemm, shard_rows=counts)
    start = sum(counts[:RANK])  # this rank's first row in the gathered A

    def t(*shape, dtype=bf16):
        return torch.randn(*shape, device="cuda").to(dtype)

    a, b = t(m_r, k), t(k, n)
    out, gathered = t(m, n), t(m, k)
    poison(out)
    poison(gathered)
    flat = t(4 * m * (n + k))  # contiguous tensors carved out of one buffer, to overlap

    def view(offset, rows, cols):  # offsets keep rows 16-byte aligned (multiples of 8 elements)
        return flat[offset:offset + rows * cols].view(rows, cols)

    watched = [a, b, out, gathered, flat]
    before = [x.clone() for x in watched]
    overlap = ("overlap", "alias")
    shape = ("shape", "chain", "rows", "M", "K")
    aligned = ("16-byte", "16 bytes", "align", "multiple of 16", "multiple of 8")
    cases = [
        # dtypes
        (lambda: ag_gemm(a, b.half(), out, group), ["dtype"]),
        (lambda: ag_gemm(a, b, out.half(), group), ["dtype"]),
        (lambda: ag_gemm(a.float(), b.float(), out.float(), group), ["float32"]),
        (lambda: ag_gemm(a, b, out, group, gathered=gathered.half()), [("dtype", "gathered")]),
        # shapes: K, out's rows (too few, too many) and columns, gathered's shape, dimensions
        (lambda: ag_gemm(t(m_r, k + 8), b, out, group), [shape]),
        (lambda: ag_gemm(a, b, out[:-1], group), ["out", shape]),
        (lambda: ag_gemm(a, b, t(m + 8, n), group), ["out", shape]),
        (lambda: ag_gemm(a, b, out[:, :-8], group), ["out"]),
        (lambda: ag_gemm(a, b, out, group, gathered=gathered[:-1]), ["gathered"]),
        (lambda: ag_gemm(a, b, out, group, gathered=t(m, k + 8)), ["gathered"]),
        (lambda: ag_gemm(a.view(-1), b, out, group), [("2-D", "dim")]),
        # layout, and rows of a multiple of 16 bytes (K, then N, of 12 elements)
        (lambda: ag_gemm(t(k, m_r).t(), b, out, group), [("row-major", "contiguous", "stride")]),
        (lambda: ag_gemm(t(m_r, 12), t(12, n), out, group, gathered=t(m, 12)), [aligned]),
        (lambda: ag_gemm(a, t(k, 12), t(m, 12), group), [aligned]),
        # aliasing: out with a, out with b, gathered with out, a where its rows land in gathered
        (lambda: ag_gemm(view(0, m_r, k), b, view(m_r * k - n, m, n), group), [overlap]),
        (lambda: ag_gemm(a, view(0, k, n), view(k * n - n, m, n), group), [overlap]),
        (lambda: ag_gemm(a, b, view(0, m, n), group, gathered=view(m * n - k, m, k)), [overlap]),
        (lambda: ag_gemm(view(start * k, m_r, k), b, out, group, gathered=view(0, m, k)), [overlap]),
        # device
        (lambda: ag_gemm(a, b.cpu(), out, group), ["cpu"]),
        # tuning, and shard lists that do not fit
        (lambda: ag_gemm(a, b, out, group, chunk_rows=-1), ["chunk_rows"]),
        (lambda: ag_gemm(a, b, out, group, transfer="ctas", copy_ctas=3), ["copy_ctas"]),
        (lambda: ag_gemm(a, b, out, group, transfer="ctas", copy_ctas=100000), ["copy_ctas"]),
        (lambda: ag_gemm(a, b, out, group, copy_ctas=8), ["copy_ctas"]),
        (lambda: ag_gemm(a, b, out, group, transfer="warps"), ["transfer"]),
        (lambda: ag_gemm(a, b, out, group, tile_n=96), ["tile_n"]),
        (lambda: interlace.ag_gemm(a, b, out, group, shard_rows=counts[:-1]), ["shard_rows"]),
        (lambda: interlace.ag_gemm(a, b, out, group, shard_rows=[c + 1 for c in counts]), ["shard_rows"]),
        (lambda: interlace.ag_gemm(a, b, out, group), [("shard_rows", "rows")]),
        # out's rows wrong on rank 0 only: every rank raises, with rank 0's reason (its checks failed)
        # or with the calls that differ (out's M is part of the call)
        (lambda: ag_gemm(a, b, out[:-1] if RANK == 0 else out, group), [("out", "differ")]),
        # arguments that differ across ranks, each rank's own checks passing: N, K, dtype, tuning
        (lambda: ag_gemm(a, t(k, n + 8 * RANK), t(m, n + 8 * RANK), group), ["differ"]),
        (lambda: ag_gemm(t(m_r, k + 8 * RANK), t(k + 8 * RANK, n), out, group), ["differ"]),
        (lambda: ag_gemm(t(m_r, k, dtype=(bf16, fp16)[RANK % 2]), t(k, n, dtype=(bf16, fp16)[RANK % 2]),
                                   t(m, n, dtype=(bf16, fp16)[RANK % 2]), group), ["differ"]),
        (lambda: ag_gemm(a, b, out, group, pingpong=(True, False)[RANK % 2]), ["differ"]),
    ]
    for i, (fn, needles, *errors) in enumerate(cases):
        try:
            expect_error(fn, *needles, errors=errors[0] if errors else (interlace.Error,))
        except AssertionError as e:
            raise AssertionError(f"bad-argument case {i}: {e}") from None
    torch.cuda.synchronize()
    for name, x, y in zip(("a", "b", "out", "gathered", "the overlap buffer"), watched, before):
        expect_bits(x, y, f"{name} after the rejected calls")
    group.check()
    # The group is still usable: a good call gives the right product.
    c = Case(group, seed=77, rows=(200, 56), k=k, n=n, dtype=bf16, layout="nk")
    c.call(group)
    torch.cuda.synchronize()
    group.check()
    c.verify("a good call after the rejected ones")
    print(f"rank {RANK}: {len(cases)} kinds of bad arguments rejected before GPU work")


SCENARIOS = {
    "shapes": scenario_shapes,
    "streams": scenario_streams,
    "graph": scenario_graph,
    "validation": scenario_validation,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
