"""interlace.grouped_gemm on one GPU against an fp32 reference, on fresh random data: G GEMMs in one
launch, group g computing out[g, :r_g] = a[g, :r_g] @ b[g] with r_g = min(rows[g], C) read on the GPU
(a mixture of experts' FFN matmul on the tokens each expert received). Every output is poisoned (all
bits set: NaN) before the call: rows below r_g must match the reference, rows at or past r_g must keep
the poison bit for bit. Shapes with tails in C, K and N, b as [G, K, N] and as Linear weights
[G, N, K] passed as w.transpose(1, 2), row counts random, all 0, all C, past C (clamped) and all in
one group. Also: back-to-back calls on two streams, CUDA graphs replayed with new row counts (which
the replay must honour: the counts are read on the GPU), and bad input raising before any GPU work."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import interlace  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16

# (G, C, K, N, dtype). C (rows per group) off and on the 128-row tile; K from one 16-byte row (8) to
# 7168 (only with few groups), 1000 a multiple of 8 but not of the 64-deep K tile; N from one 16-byte
# row to several 256-wide tiles, 136 a tile plus a tail.
SHAPES = [
    (1, 1, 8, 8, BF16), (1, 100, 64, 136, FP16), (1, 129, 7168, 2048, BF16), (1, 300, 1000, 8, FP16),
    (1, 256, 1000, 2048, BF16), (2, 1, 1000, 2048, FP16), (2, 128, 64, 2048, BF16), (2, 129, 8, 136, FP16),
    (2, 256, 7168, 136, BF16), (2, 300, 7168, 2048, FP16), (8, 1, 64, 8, BF16), (8, 100, 1000, 136, BF16),
    (8, 128, 8, 2048, FP16), (8, 129, 64, 2048, BF16), (8, 192, 1000, 8, FP16), (8, 256, 64, 136, FP16),
    (8, 300, 7168, 136, BF16), (128, 1, 64, 136, FP16), (128, 100, 1000, 8, BF16), (128, 128, 8, 136, BF16),
    (128, 129, 64, 2048, FP16), (128, 256, 1000, 136, FP16), (128, 300, 64, 8, BF16),
    (128, 129, 1000, 2048, BF16),
]
ROW_PATTERNS = ["random", "zero", "full", "past_capacity", "one_group"]
INT32_MAX = 2**31 - 1


@pytest.fixture(autouse=True)
def hopper():
    """The kernel is built for sm_90a (TMA, wgmma): other GPUs skip, saying which GPU this is."""
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"needs a Hopper GPU (sm_90a); this machine's is {torch.cuda.get_device_name()} "
                    f"(sm_{major}{minor})")


def row_counts(pattern, g, c, gen):
    """A list of G row counts (host ints) for the pattern; counts past C are clamped by the kernel."""
    if pattern == "random":
        return torch.randint(0, c + 1, (g,), generator=gen).tolist()
    if pattern == "zero":
        return [0] * g
    if pattern == "full":
        return [c] * g
    if pattern == "past_capacity":  # mostly past C, one at INT32_MAX, every third one within [0, C]
        counts = torch.randint(c + 1, 2 * c + 2, (g,), generator=gen).tolist()
        counts[0] = INT32_MAX
        for i in range(1, g, 3):
            counts[i] = int(torch.randint(0, c + 1, (1,), generator=gen))
        return counts
    if pattern == "one_group":  # every token routed to one expert
        counts = [0] * g
        counts[int(torch.randint(0, g, (1,), generator=gen))] = c
        return counts
    raise ValueError(pattern)


def make(g, c, k, n, dtype, seed):
    """a [G, C, K], Linear weights w [G, N, K] and their fp32 product [G, C, N] (all C rows)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(g, c, k, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(g, n, k, device="cuda", dtype=dtype, generator=gen)
    return a, w, reference(a, w.transpose(1, 2))


def reference(a, b):
    return torch.bmm(a.float(), b.float())


def layouts(w):
    """b in both layouts, the same values: Linear weights passed as w.transpose(1, 2) (K contiguous),
    and [G, K, N] row-major (N contiguous)."""
    return {"nk": w.transpose(1, 2), "kn": w.transpose(1, 2).contiguous()}


def poisoned(shape, dtype):
    out = torch.empty(shape, device="cuda", dtype=dtype)
    out.view(torch.int16).fill_(-1)  # all bits set: a NaN in bf16 and fp16
    return out


def check(out, ref, counts, what, tol=1e-2):
    """Rows below min(counts[g], C) are written and match ref (relative error per group; ref None:
    not compared), rows at or past it still hold the poison, bit for bit. Synchronizes first."""
    torch.cuda.synchronize()
    g, c, n = out.shape
    r = torch.tensor(counts, dtype=torch.int64).clamp(max=c).to("cuda")
    valid = torch.arange(c, device="cuda")[None, :] < r[:, None]  # [G, C]
    bits = out.view(torch.int16)
    touched = ~(bits == -1).all(dim=2) & ~valid
    if touched.any():
        gi, ri = (int(x) for x in touched.nonzero()[0])
        raise AssertionError(f"{what}: {int(touched.sum())} rows at or past the row count were written, "
                             f"first group {gi} row {ri} (count {counts[gi]}, C {c})")
    nan = out.isnan() & valid[:, :, None]
    assert not nan.any(), f"{what}: {int(nan.sum())} elements of the first r_g rows never written"
    if ref is None or not valid.any():
        return
    mask = valid[:, :, None]
    diff = torch.where(mask, out.float() - ref, 0.0).norm(dim=(1, 2))
    scale = torch.where(mask, ref, 0.0).norm(dim=(1, 2))
    has = r > 0
    err = diff[has] / scale[has]
    worst = int(err.argmax())
    assert err.max().item() <= tol, (f"{what}: relative error {err.max().item():.2e} in group "
                                     f"{int(has.nonzero()[worst])} (count {counts[int(has.nonzero()[worst])]})")


def check_every_layout_and_row_pattern(g, c, k, n, dtype, seed, **tuning):
    a, w, ref = make(g, c, k, n, dtype, seed)
    gen = torch.Generator().manual_seed(seed)
    for layout, b in layouts(w).items():
        for pattern in ROW_PATTERNS:
            counts = row_counts(pattern, g, c, gen)
            rows = torch.tensor(counts, dtype=torch.int32, device="cuda")
            out = poisoned((g, c, n), dtype)
            interlace.grouped_gemm(a, b, out, rows, **tuning)
            check(out, ref, counts,
                  f"{tuning} G={g} C={c} K={k} N={n} {dtype} b {layout}, rows {pattern} {counts[:8]}")


@pytest.mark.parametrize("g,c,k,n,dtype", SHAPES)
def test_matches_fp32_reference_on_the_first_rows_of_each_group(g, c, k, n, dtype):
    check_every_layout_and_row_pattern(g, c, k, n, dtype, seed=g * 1_000_003 + c * 10_007 + k * 101 + n)


# Both compiled variants (one- and two-CTA clusters) on shapes where a cluster's second tile row lies
# past a group's rows, past C, or both.
TUNINGS = [dict(cluster_m=c, tile_n=t) for c in (1, 2) for t in (128, 256)]


@pytest.mark.parametrize("tuning", TUNINGS, ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()))
@pytest.mark.parametrize("g,c,k,n,dtype", [(3, 129, 1000, 136, BF16), (5, 300, 64, 520, FP16), (2, 640, 7168, 8, BF16)])
def test_every_cluster_variant(tuning, g, c, k, n, dtype):
    check_every_layout_and_row_pattern(g, c, k, n, dtype, seed=g * 7919 + c * 31 + k + n, **tuning)


# The swapped problem (swap=True: b K-major, a group's rows across 160-wide tiles), which runs
# automatically where 128 < C <= 320 (here (2, 129, ...), (8, 256, ...), (5, 300, ...), (4, 320, ...),
# (128, 320, ...) and (128, 257, ...); the other automatic cases check the rule's other side): C from
# one row to past three tiles, N and K with tails, many groups.
SWAPPED_SHAPES = [(1, 1, 8, 8, BF16), (3, 100, 1000, 136, FP16), (2, 129, 7168, 520, BF16), (8, 256, 64, 2048, FP16),
                  (5, 300, 1000, 136, BF16), (4, 320, 7168, 2048, BF16), (128, 320, 64, 8, FP16),
                  (128, 257, 1000, 136, BF16), (2, 500, 200, 264, BF16)]


@pytest.mark.parametrize("g,c,k,n,dtype", SWAPPED_SHAPES)
@pytest.mark.parametrize("swap", [True, None], ids=["swap", "automatic"])
def test_swapped_problem(g, c, k, n, dtype, swap):
    seed = g * 7907 + c * 37 + k * 3 + n
    a, w, ref = make(g, c, k, n, dtype, seed)
    gen = torch.Generator().manual_seed(seed)
    for pattern in ROW_PATTERNS:
        counts = row_counts(pattern, g, c, gen)
        rows = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = poisoned((g, c, n), dtype)
        interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, swap=swap)
        check(out, ref, counts, f"swap={swap} G={g} C={c} K={k} N={n} {dtype}, rows {pattern} {counts[:8]}")


def test_bad_tuning_raises():
    a, w, _ = make(2, 64, 64, 64, BF16, 1)
    rows = torch.full((2,), 64, dtype=torch.int32, device="cuda")
    out = poisoned((2, 64, 64), BF16)
    with pytest.raises(interlace.Error, match="cluster_m must be 0 .automatic., 1 or 2, got 3"):
        interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, cluster_m=3)
    with pytest.raises(interlace.Error, match="tile_n must be 0 .automatic., 128 or 256, got 64"):
        interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, tile_n=64)
    with pytest.raises(interlace.Error, match="the swapped problem takes b K-major"):
        interlace.grouped_gemm(a, w.transpose(1, 2).contiguous(), out, rows, swap=True)
    with pytest.raises(interlace.Error, match="cluster_m and tile_n must stay 0"):
        interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, swap=True, cluster_m=2)
    with pytest.raises(TypeError, match="swap must be None .automatic., True or False; got 0"):
        interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, swap=0)
    torch.cuda.synchronize()
    assert bool((out.view(torch.int16) == -1).all()), "a refused call wrote into out"


def test_one_group_of_views_whose_group_stride_is_unused():
    """G = 1 from unsqueeze(0) of 2-D tensors: torch gives w.t().unsqueeze(0) the group stride K (not
    C * K), which a single group never uses."""
    c, k, n = 200, 264, 136
    x = torch.randn(c, k, device="cuda", dtype=BF16)
    w = torch.randn(n, k, device="cuda", dtype=BF16)
    a, b = x.unsqueeze(0), w.t().unsqueeze(0)
    counts = [150]
    out = poisoned((1, c, n), BF16)
    interlace.grouped_gemm(a, b, out, torch.tensor(counts, dtype=torch.int32, device="cuda"))
    check(out, reference(a, b), counts, "one group of unsqueezed views")


@pytest.mark.parametrize("swap", [None, True], ids=["automatic", "swap"])
def test_strided_views(swap):
    """a and out as views into bigger buffers: row strides past K and N, group strides past C rows;
    what lies outside the views is left alone. Also on the swapped problem, where a and b trade roles."""
    g, c, k, n = 6, 150, 264, 136
    a_big = torch.randn(g, c + 20, k + 40, device="cuda", dtype=BF16)
    a = a_big[:, 10:10 + c, :k]
    w_big = torch.randn(g, n + 8, k + 16, device="cuda", dtype=BF16)
    w = w_big[:, :n, 8:8 + k]
    out_big = poisoned((g, c + 3, n + 24), BF16)
    out = out_big[:, 1:1 + c, 8:8 + n]
    counts = [0, 1, 77, 150, 149, 1000]
    rows = torch.tensor(counts, dtype=torch.int32, device="cuda")
    interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, swap=swap)
    check(out, reference(a, w.transpose(1, 2)), counts, f"strided views, swap={swap}")
    outside = torch.ones(out_big.shape, dtype=torch.bool, device="cuda")
    outside[:, 1:1 + c, 8:8 + n] = False
    assert bool((out_big.view(torch.int16)[outside] == -1).all()), "wrote outside out's view"


def test_repeat_runs_agree_bitwise():
    g, c, k, n = 16, 300, 1000, 2048
    a, w, ref = make(g, c, k, n, BF16, seed=5)
    counts = row_counts("random", g, c, torch.Generator().manual_seed(5))
    rows = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out1 = poisoned((g, c, n), BF16)
    interlace.grouped_gemm(a, w.transpose(1, 2), out1, rows)
    check(out1, ref, counts, "first run")
    for _ in range(3):
        out2 = poisoned((g, c, n), BF16)
        interlace.grouped_gemm(a, w.transpose(1, 2), out2, rows)
        torch.cuda.synchronize()
        assert torch.equal(out1.view(torch.int16), out2.view(torch.int16)), "two runs on the same inputs differ: a race"


def test_empty_k_gives_zeros_and_empty_groups_or_capacity_are_no_ops():
    """K = 0: the first r_g rows of each group are zeros, the rest untouched; G = 0 or C = 0: nothing."""
    g, c, n = 5, 100, 136
    counts = [0, 1, 50, 100, 1000]
    out = poisoned((g, c, n), FP16)
    interlace.grouped_gemm(torch.empty(g, c, 0, device="cuda", dtype=FP16),
                           torch.empty(g, 0, n, device="cuda", dtype=FP16), out,
                           torch.tensor(counts, dtype=torch.int32, device="cuda"))
    check(out, None, counts, "K = 0")
    for r in range(g):
        assert bool((out[r, :min(counts[r], c)] == 0).all()), f"K = 0: group {r} not zeros"
    interlace.grouped_gemm(torch.empty(0, c, 64, device="cuda", dtype=BF16),
                           torch.empty(0, 64, n, device="cuda", dtype=BF16),
                           torch.empty(0, c, n, device="cuda", dtype=BF16),
                           torch.empty(0, dtype=torch.int32, device="cuda"))
    interlace.grouped_gemm(torch.empty(g, 0, 64, device="cuda", dtype=BF16),
                           torch.empty(g, 64, n, device="cuda", dtype=BF16),
                           torch.empty(g, 0, n, device="cuda", dtype=BF16),
                           torch.tensor(counts, dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()


def test_back_to_back_calls_on_two_streams():
    """Each stream runs an expert FFN's two GEMMs (h = a @ b1, y = h @ b2, the second reading what the
    first wrote) several times over, into outputs of its own, interleaved with the other stream's
    calls: one stream passed as stream=, the other taken as torch's current stream."""
    g, c, k, f = 8, 300, 1000, 520
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    gen = torch.Generator().manual_seed(11)
    cases = []
    for i, dtype in enumerate((BF16, FP16)):
        a = torch.randn(g, c, k, device="cuda", dtype=dtype)
        w1 = torch.randn(g, f, k, device="cuda", dtype=dtype)  # Linear weights [G, N, K]
        b2 = torch.randn(g, f, k, device="cuda", dtype=dtype)  # [G, K, N]
        counts = row_counts(("random", "past_capacity")[i], g, c, gen)
        rows = torch.tensor(counts, dtype=torch.int32, device="cuda")
        h = torch.zeros(g, c, f, device="cuda", dtype=dtype)
        y = poisoned((g, c, k), dtype)
        h_ref = reference(a, w1.transpose(1, 2)).to(dtype)
        cases.append((a, w1.transpose(1, 2), b2, rows, counts, h, y, reference(h_ref, b2)))
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    (a1, b11, b21, rows1, _, h1, y1, _), (a2, b12, b22, rows2, _, h2, y2, _) = cases
    for _ in range(6):
        interlace.grouped_gemm(a1, b11, h1, rows1, stream=s1.cuda_stream)
        with torch.cuda.stream(s2):
            interlace.grouped_gemm(a2, b12, h2, rows2)
        interlace.grouped_gemm(h1, b21, y1, rows1, stream=s1.cuda_stream)
        with torch.cuda.stream(s2):
            interlace.grouped_gemm(h2, b22, y2, rows2)
    for i, (*_, counts, h, y, ref) in enumerate(cases):
        check(y, ref, counts, f"stream {i + 1}")


def test_cuda_graph_replays_read_new_row_counts():
    """One capture, replays with the row counts changed in place between them: each replay computes
    the counts that rows holds at that time, and leaves the rows past them alone."""
    g, c, k, n = 16, 300, 1000, 136
    a, w, ref = make(g, c, k, n, FP16, seed=21)
    rows = torch.full((g,), c, dtype=torch.int32, device="cuda")
    out = poisoned((g, c, n), FP16)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        interlace.grouped_gemm(a, w.transpose(1, 2), out, rows)
    gen = torch.Generator().manual_seed(21)
    for pattern in ["random", "zero", "full", "one_group", "past_capacity", "random", "random"]:
        counts = row_counts(pattern, g, c, gen)
        rows.copy_(torch.tensor(counts, dtype=torch.int32))
        out.view(torch.int16).fill_(-1)
        graph.replay()
        check(out, ref, counts, f"replay with rows {pattern} {counts}")


# Runs in a fresh process, so that the capture holds the very first grouped_gemm call of the process
# (no kernel loaded, no shape seen): nothing in it may allocate, free or synchronize. The replays
# bring new inputs and new row counts.
FIRST_CALL_IN_A_GRAPH = textwrap.dedent("""
    import torch, interlace
    torch.cuda.init()
    g, c, k, n = 8, 200, 264, 520
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for dtype, layout in [(torch.bfloat16, "nk"), (torch.float16, "kn")]:
        a = torch.empty(g, c, k, device="cuda", dtype=dtype)
        w = torch.empty(g, n, k, device="cuda", dtype=dtype)
        b_kn = torch.empty(g, k, n, device="cuda", dtype=dtype)
        b = w.transpose(1, 2) if layout == "nk" else b_kn
        out = torch.empty(g, c, n, device="cuda", dtype=dtype)
        rows = torch.zeros(g, device="cuda", dtype=torch.int32)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            interlace.grouped_gemm(a, b, out, rows)
        for counts in ([200, 0, 17, 128, 129, 1, 199, 5000], [0] * 8, [3, 200, 0, 64, 2**31 - 1, 100, 150, 7]):
            a.copy_(torch.randn(g, c, k, device="cuda", generator=gen))
            w.copy_(torch.randn(g, n, k, device="cuda", generator=gen))
            b_kn.copy_(torch.randn(g, k, n, device="cuda", generator=gen))
            rows.copy_(torch.tensor(counts, dtype=torch.int32))
            out.view(torch.int16).fill_(-1)
            graph.replay()
            torch.cuda.synchronize()
            ref = torch.bmm(a.double(), b.double())
            for i, count in enumerate(counts):
                r = min(count, c)
                untouched = bool((out[i, r:].view(torch.int16) == -1).all())
                assert untouched, f"{layout} {counts}: group {i} written past row {r}"
                if r:
                    o, e = out[i, :r].double(), ref[i, :r]
                    assert not o.isnan().any(), f"{layout} {counts}: group {i} has unwritten elements"
                    err = ((o - e).norm() / e.norm()).item()
                    assert err <= 1e-2, f"{layout} {counts}: group {i} relative error {err:.2e}"
    print("captured and replayed 2 first calls")
""")


def test_first_call_of_a_new_shape_is_captured_in_a_cuda_graph():
    r = subprocess.run([sys.executable, "-c", FIRST_CALL_IN_A_GRAPH], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "captured and replayed 2 first calls" in r.stdout


def test_bad_input_raises_before_gpu_work():
    g, c, k, n = 4, 64, 128, 64
    a = torch.randn(g, c, k, device="cuda", dtype=BF16)
    b = torch.randn(g, k, n, device="cuda", dtype=BF16)
    rows = torch.full((g,), 32, dtype=torch.int32, device="cuda")
    out = torch.full((g, c, n), 7.0, device="cuda", dtype=BF16)
    # The messages follow interlace.gemm's; the patterns allow for rewording.
    cases = {
        "rows int64": ((a, b, out, rows.long()), r"rows"),
        "rows float": ((a, b, out, rows.float()), r"rows"),
        "rows of the wrong length": ((a, b, out, rows[:g - 1]), r"rows"),
        "rows on the host": ((a, b, out, rows.cpu()), r"cpu|GPU|CUDA|device"),
        "K differs between a and b": ((a, b[:, :k - 8], out), r"chain|shape"),
        "G differs between a and b": ((a, b[:g - 1], out), r"chain|shape|group"),
        "out has more rows than a": ((a[:, :c - 1], b, out), r"chain|shape"),
        "out has the wrong N": ((a, b[:, :, :n - 8], out), r"chain|shape"),
        "a is 2-D": ((a[0], b, out), r"3-D|dim|shape"),
        "dtypes differ": ((a, b.half(), out), r"share a dtype|dtype"),
        "float32": ((a.float(), b.float(), out.float()), r"bfloat16|float16|dtype"),
        "K not a multiple of 8": ((torch.randn(g, c, 12, device="cuda", dtype=BF16),
                                   torch.randn(g, 12, n, device="cuda", dtype=BF16), out), r"16-byte"),
        "N not a multiple of 8": ((a, torch.randn(g, k, 12, device="cuda", dtype=BF16),
                                   torch.full((g, c, 12), 7.0, device="cuda", dtype=BF16)), r"16-byte"),
        "a K-strided": ((a.transpose(1, 2).contiguous().transpose(1, 2), b, out), r"contiguous|major"),
        "b on the host": ((a, b.cpu(), out), r"cpu|GPU|CUDA|device"),
    }
    for what, (args, needle) in cases.items():
        args = args + (rows,) if len(args) == 3 else args
        try:
            interlace.grouped_gemm(*args)
        except interlace.Error as e:
            assert re.search(needle, str(e)), f"{what}: the message {str(e)!r} does not match {needle!r}"
        else:
            pytest.fail(f"{what}: no interlace.Error")
    with pytest.raises(interlace.Error, match=r"overlap"):
        interlace.grouped_gemm(a[:, :, :n], b[:, :n], a[:, :, :n], rows)  # in place (a's first N columns)
    torch.cuda.synchronize()
    assert bool((out == 7.0).all()), "a rejected call wrote into out"
    assert bool((rows == 32).all()), "a rejected call wrote into rows"
