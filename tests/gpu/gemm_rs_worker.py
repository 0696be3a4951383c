"""One rank of a gemm_rs GPU test scenario (see test_gemm_rs.py). Exits non-zero on failure.

interlace.gemm_rs(a, b, out, group) computes out = this rank's rows of sum over ranks q of a_q @ b_q,
where a_q is [M, K_q] and b_q [K_q, N] (K split across ranks, possibly unevenly) and rank q owns a
contiguous block of output rows (uneven, or none). Every rank recomputes every rank's inputs from
(case seed, rank), so the reference needs no communication: torch's fp32 matmuls of all ranks'
inputs, summed, and this rank's rows of that."""
import functools
import math
import os
import sys

import torch

import interlace
from interlace.bench.launch import expect_error

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.backends.cuda.matmul.allow_tf32 = False  # the reference is true fp32
# A stuck wait becomes an error naming the flag after this long, rather than a hang.
TIMEOUT_S = 20.0
# Configurations each case runs with: automatic (ping-pong), cooperative tiles of each width, and a
# single reducing cluster.
PATHS = ({}, {"pingpong": False, "tile_n": 128}, {"pingpong": False, "tile_n": 256, "band_m": 1},
         {"reduce_ctas": 2})

# (rows, K, N[, tuning]). Rank q owns rows[q % len(rows)] output rows and holds K[q % len(K)] of the
# K dimension (K an int: the same on every rank), so every rank knows every rank's shapes at any
# world size. Together: whole 128-row tiles and tails; tile rows spanning owners; a rank with no rows
# (first, last); 1-row blocks; M not a multiple of 128; K_r from 8 to 8192, uneven splits of K; N
# from 8 to 14336, most not multiples of 128, and N not a multiple of 8 (out then a padded view, b a
# weight.t(), whose rows are K-contiguous) so that the reducers' last column groups are short.
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
    ((3001, 2999), 1032, 2056),
    ((4096, 4096), 4096, 2048),
    ((127, 129), 200, 4104),
    ((300, 7), 8, 2056),
    ((96, 160), 64, 14336),
    ((2048, 2048), 8192, 1024),
    ((640, 640), (328, 64), 7168),
    ((77, 200), (8, 4104), 8),
    ((1500, 1500), 72, 3000),
    ((4097, 4095), 256, 512),
    ((6000, 2000), 1024, 4096),
    ((64, 64), 8192, 8),
    ((200, 56), (8, 8), 520),
    ((1023, 1025), (2056, 16), 776),
    ((500, 500), 64, 12),
    ((129, 127), 72, 100),
    ((256, 1), 8, 3),
    ((1, 0), 4096, 8192),          # gemm_ar decode: A's box of 8 rows, 2 runs of K
    ((3, 2), (4096, 1000), 8192),  # uneven K: rank 1's runs reach past its K
    ((16, 16), 2048, 4104),        # 33 tile columns: 4 runs of K
    ((16, 16), (64, 2048), 4104),  # rank 0's K is one k-tile: 3 of its 4 runs lie wholly past K
    ((50, 50), 512, 1000),         # 100 rows: A's box stays whole
    ((1000, 24), 72, 264, {"reduce_ctas": 16}),
    ((3001, 2999), 1032, 2056, {"band_m": 1}),
    ((64, 0), 1024, 4096),         # b "nk" from here: gemm_ar's swapped decode GEMM, 64 tiles of 64 x 64
    ((1, 1), (8, 4096), 136),      # 3 tiles of out^T, the last of 8 rows; K_r of one k-tile against 64
]


def per_rank(x):
    x = x if isinstance(x, tuple) else (x,)
    return [x[q % len(x)] for q in range(WORLD)]


def inputs(q, m, k, n, dtype, layout, seed):
    """Rank q's a [M, K_q] and b [K_q, N] of case `seed`, recomputable by any rank. layout "kn": b
    row-major; "nk": a Linear weight [N, K_q] passed as weight.t()."""
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + q)
    a = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + 500 + q)
    b = torch.randn(k, n, generator=g, device="cuda").to(dtype) if layout == "kn" else \
        torch.randn(n, k, generator=g, device="cuda").to(dtype).t()
    return a, b


def poison(t):
    t.view(torch.int16).fill_(-1)  # 0xFFFF: NaN in bf16 and fp16


def staging_bytes(counts, n):
    """gemm_rs's heap scratch, as GemmRsPlan sizes it: world partials of every tile the busiest rank
    owns (tiles 128 rows high, 128 or 256 wide, fp32), at the larger of the two widths."""
    most = 0
    start = 0
    for r in counts:
        if r:
            most = max(most, (start + r - 1) // 128 - start // 128 + 1)
        start += r
    return max(most * -(-n // w) * w for w in (128, 256)) * 128 * 4 * WORLD


def heap_bytes(cases, extra=256 << 20):
    return max(staging_bytes(per_rank(c[0]), c[2]) for c in cases) + extra


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


def expect_sum(out, ref, what):
    """out (bf16/fp16) against ref in fp32: relative Frobenius error < 1e-2 and every element within
    REL_BOUND * |ref| + 1e-3 * rms(ref). Poisoned (NaN) elements fail both. Returns the relative error."""
    if ref.numel() == 0:
        return 0.0
    diff = (out.float() - ref).abs()
    unwritten = int(out.isnan().sum())
    norm = ref.norm().item()
    rel = (diff.norm() / norm).item() if norm > 0 else diff.max().item()
    rms = norm / math.sqrt(ref.numel())
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
    """One gemm_rs problem on this rank: inputs, a poisoned out, the reference."""

    def __init__(self, seed, rows, k, n, dtype, layout):
        self.counts, self.ks, self.n, self.dtype = per_rank(rows), per_rank(k), n, dtype
        self.layout = "nk" if n % 8 else layout  # b row-major needs N a multiple of 8
        self.m = sum(self.counts)
        self.start = sum(self.counts[:RANK])
        self.seed = seed
        self.a, self.b = inputs(RANK, self.m, self.ks[RANK], n, dtype, self.layout, seed)
        self.ref = self.reference()
        mine = self.counts[RANK]
        if n % 8:  # out's rows must start 16-byte aligned: a view of a wider tensor
            self.out = torch.empty(mine, n + 8 - n % 8 + 8, device="cuda", dtype=dtype)[:, :n]
        else:
            self.out = torch.empty(mine, n, device="cuda", dtype=dtype)
        self.poison()

    def reference(self):
        total = torch.zeros(self.m, self.n, device="cuda")
        for q in range(WORLD):
            a, b = inputs(q, self.m, self.ks[q], self.n, self.dtype, self.layout, self.seed)
            total += a.float() @ b.float()
        return total[self.start:self.start + self.counts[RANK]]

    def refresh(self, seed):
        """New values in the same tensors (a captured graph reads them in place)."""
        self.seed = seed
        a, b = inputs(RANK, self.m, self.ks[RANK], self.n, self.dtype, self.layout, seed)
        self.a.copy_(a)
        self.b.copy_(b)
        self.ref = self.reference()
        self.poison()

    def poison(self):
        poison(self.out)

    def call(self, group, path=None, **kwargs):
        kwargs.update(path or {})
        even = len(set(self.counts)) == 1
        interlace.gemm_rs(self.a, self.b, self.out, group, shard_rows=None if even else self.counts, **kwargs)

    def describe(self):
        return f"rows {self.counts} K {self.ks} N {self.n} {str(self.dtype)[6:]} b {self.layout}"

    def verify(self, what):
        return expect_sum(self.out, self.ref, what)


def scenario_shapes():
    """Every case, every path, fresh random data, poisoned outputs; the automatic path twice, bit for bit."""
    group = interlace.init(heap_bytes=heap_bytes(CASES), timeout_s=TIMEOUT_S)
    worst, calls = 0.0, 0
    for i, (rows, k, n, *tuning) in enumerate(CASES):
        tuning = tuning[0] if tuning else {}
        c = Case(seed=i, rows=rows, k=k, n=n, dtype=(torch.bfloat16, torch.float16)[i % 2],
                 layout=("kn", "nk")[(i // 2) % 2])
        a_before, b_before = c.a.clone(), c.b.clone()
        first = None
        for path in PATHS + (PATHS[0],):
            c.poison()
            c.call(group, path=path, **tuning)
            torch.cuda.synchronize()
            group.check()
            worst = max(worst, c.verify(f"case {i}: {c.describe()} path {path} {tuning}"))
            calls += 1
            if path is PATHS[0]:
                if first is None:
                    first = c.out.clone()
                else:  # partials summed in rank order: the same bits on every run
                    expect_bits(c.out, first, f"case {i}: {c.describe()}: a second run")
        expect_bits(c.a, a_before, f"case {i}: a was modified")
        expect_bits(c.b, b_before, f"case {i}: b was modified")
    print(f"rank {RANK}: {len(CASES)} cases x {len(PATHS) + 1} calls = {calls} calls correct, worst relative error "
          f"{worst:.2e}")


def scenario_streams():
    """Calls issued back to back on two streams, with no synchronization between them, and
    reduce_scatters among them: ops of a group run one after another whichever stream issues them. The
    last call writes the out of the call just before it, from the other stream."""
    shapes = [((1000, 24), 72, 264), ((0, 300), 64, 776), ((513, 1), 1032, 136), ((256, 256), 512, 1024)]
    group = interlace.init(heap_bytes=heap_bytes(shapes), timeout_s=TIMEOUT_S)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    cases = [Case(seed=100 + j, rows=shapes[j % 4][0], k=shapes[j % 4][1], n=shapes[j % 4][2],
                  dtype=(torch.bfloat16, torch.float16)[(j // 4) % 2], layout=("kn", "nk")[j % 2]) for j in range(20)]
    prev = cases[-1]  # (256, 256) rows, K 512, N 1024, bf16
    assert prev.dtype == torch.bfloat16
    last = Case(seed=200, rows=shapes[3][0], k=shapes[3][1], n=shapes[3][2], dtype=torch.bfloat16, layout="nk")
    last.out = prev.out
    rs_n = 4096
    rs_in = [torch.randn(WORLD * rs_n, generator=torch.Generator(device="cuda").manual_seed(300 + j), device="cuda")
             .to(torch.bfloat16) for j in range(4)]
    rs_out = [torch.empty(rs_n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    for x in rs_out:
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
                interlace.reduce_scatter(rs_out[j // 5], rs_in[j // 5], group)
    with torch.cuda.stream(s1):  # the last case ran on s2
        last.call(group)
    torch.cuda.synchronize()
    group.check()
    for j, c in enumerate(cases[:-1]):
        c.verify(f"call {j}: {c.describe()} on stream {j % 2 + 1}")
    last.verify("the last call, into the out of the call before it (other stream)")
    for j in range(4):  # every rank's input of reduce_scatter j is the same here, so the sum is WORLD x it
        mine = rs_in[j][RANK * rs_n:(RANK + 1) * rs_n].float() * WORLD
        expect_sum(rs_out[j], mine, f"reduce_scatter {j} among the gemm_rs calls")
    print(f"rank {RANK}: {len(cases) + 1} gemm_rs calls and 4 reduce_scatters on two streams correct")


def scenario_graph():
    """A CUDA graph holding three gemm_rs calls (uneven, a rank with no rows, even; several paths),
    replayed with fresh inputs each time; the first also ran before the capture, the others are first
    seen in it. Then an eager call right after a replay, unsynchronized."""
    specs = [  # rows, K, N, dtype, layout, path
        ((1000, 24), 1032, 776, torch.bfloat16, "nk", PATHS[1]),
        ((0, 513), 72, 264, torch.float16, "kn", PATHS[0]),
        ((256, 256), 512, 1024, torch.bfloat16, "kn", PATHS[2]),
    ]
    group = interlace.init(heap_bytes=heap_bytes(specs), timeout_s=TIMEOUT_S)
    cases = [Case(seed=400 + i, rows=r, k=k, n=n, dtype=dt, layout=lay)
             for i, (r, k, n, dt, lay, _) in enumerate(specs)]
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
        for i, c in enumerate(cases):
            c.refresh(1000 + step * 10 + i)
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
    counts = per_rank((200, 56))
    m, mine, k, n = sum(counts), counts[RANK], 64, 136
    gemm_rs = functools.partial(interlace.gemm_rs, shard_rows=counts)

    def t(*shape, dtype=bf16):
        return torch.randn(*shape, device="cuda").to(dtype)

    a, b = t(m, k), t(k, n)
    out = t(mine, n)
    poison(out)
    flat = t(4 * m * (n + k))  # contiguous tensors carved out of one buffer, to overlap

    def view(offset, rows, cols):  # offsets keep rows 16-byte aligned (multiples of 8 elements)
        return flat[offset:offset + rows * cols].view(rows, cols)

    watched = [a, b, out, flat]
    before = [x.clone() for x in watched]
    overlap = ("overlap", "alias")
    shape = ("shape", "chain", "rows", "columns", "M", "K")
    aligned = ("16-byte", "16 bytes", "align", "multiple of 16", "multiple of 8")
    cases = [
        # dtypes
        (lambda: gemm_rs(a, b.half(), out, group), ["dtype"]),
        (lambda: gemm_rs(a, b, out.half(), group), ["dtype"]),
        (lambda: gemm_rs(a.float(), b.float(), out.float(), group), ["float32"]),
        # shapes: K, out's rows (too few, too many) and columns, dimensions
        (lambda: gemm_rs(t(m, k + 8), b, out, group), [shape]),
        (lambda: gemm_rs(a, b, out[:-1], group), ["out", shape]),
        (lambda: gemm_rs(a, b, t(mine + 8, n), group), ["out", shape]),
        (lambda: gemm_rs(a, b, out[:, :-8], group), [shape]),
        (lambda: gemm_rs(a[:-1], b, out, group), ["shard_rows"]),
        (lambda: gemm_rs(a.view(-1), b, out, group), [("2-D", "dim")]),
        # layout, and rows of a multiple of 16 bytes (K, then N, of 12 elements)
        (lambda: gemm_rs(t(k, m).t(), b, out, group), [("row-major", "contiguous", "stride")]),
        (lambda: gemm_rs(t(m, 12), t(12, n), out, group), [aligned]),
        (lambda: gemm_rs(a, t(k, 12), t(mine, 12), group), [aligned]),
        # aliasing: out with a, out with b
        (lambda: gemm_rs(view(0, m, k), b, view(m * k - n, mine, n), group), [overlap]),
        (lambda: gemm_rs(a, view(0, k, n), view(k * n - n, mine, n), group), [overlap]),
        # device
        (lambda: gemm_rs(a, b.cpu(), out, group), ["cpu"]),
        # tuning, and row lists that do not fit
        (lambda: gemm_rs(a, b, out, group, reduce_ctas=3), ["reduce_ctas"]),
        (lambda: gemm_rs(a, b, out, group, reduce_ctas=100000), ["reduce_ctas"]),
        (lambda: gemm_rs(a, b, out, group, reduce_ctas=-2), ["reduce_ctas"]),
        (lambda: gemm_rs(a, b, out, group, tile_n=96), ["tile_n"]),
        (lambda: gemm_rs(a, b, out, group, pingpong=True, tile_n=256), ["tile_n"]),
        (lambda: gemm_rs(a, b, out, group, band_m=-1), ["band_m"]),
        (lambda: interlace.gemm_rs(a, b, out, group, shard_rows=counts[:-1]), ["shard_rows"]),
        (lambda: interlace.gemm_rs(a, b, out, group, shard_rows=[c + 1 for c in counts]), ["shard_rows"]),
        (lambda: interlace.gemm_rs(a, b, out, group), [("shard_rows", "rows")]),
        # out's rows wrong on rank 0 only: every rank raises, with rank 0's reason
        (lambda: gemm_rs(a, b, out[:-1] if RANK == 0 else out, group), [("out", "differ")]),
        # arguments that differ across ranks, each rank's own checks passing: N, M's split, dtype,
        # tuning, K_r = 0 on some ranks only
        (lambda: gemm_rs(a, t(k, n + 8 * RANK), t(mine, n + 8 * RANK), group), ["differ"]),
        (lambda: interlace.gemm_rs(a, b, t(m, n), group, shard_rows=[m if q == RANK else 0 for q in range(WORLD)]),
         ["differ"]),
        (lambda: gemm_rs(t(m, k, dtype=(bf16, fp16)[RANK % 2]), t(k, n, dtype=(bf16, fp16)[RANK % 2]),
                         t(mine, n, dtype=(bf16, fp16)[RANK % 2]), group), ["differ"]),
        (lambda: gemm_rs(a, b, out, group, pingpong=(True, False)[RANK % 2]), ["differ"]),
        (lambda: gemm_rs(t(m, k * (RANK % 2)), t(k * (RANK % 2), n), out, group), ["differ"]),
    ]
    for i, (fn, needles, *errors) in enumerate(cases):
        try:
            expect_error(fn, *needles, errors=errors[0] if errors else (interlace.Error,))
        except AssertionError as e:
            raise AssertionError(f"bad-argument case {i}: {e}") from None
    torch.cuda.synchronize()
    for name, x, y in zip(("a", "b", "out", "the overlap buffer"), watched, before):
        expect_bits(x, y, f"{name} after the rejected calls")
    group.check()
    # The group is still usable: a good call gives the right sum.
    c = Case(seed=77, rows=(200, 56), k=k, n=n, dtype=bf16, layout="nk")
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
