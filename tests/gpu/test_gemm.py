"""interlace.gemm on one GPU against an fp32 reference, on fresh random data, at many shapes with
tails; poisoned outputs show unwritten elements. Bad input raises before any GPU work. A first call
of a new shape can be captured in a CUDA graph; calls leave the caller's current device alone."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import interlace  # noqa: E402

# M is free; N and K are multiples of 8 (16-byte rows). Tiles are 128 x 256 x 64, so these cover
# full tiles, one-row/one-column tails, K tails and single-tile and many-tile problems.
SHAPES = [
    (1, 8, 8), (1, 256, 64), (2, 16, 24), (7, 24, 40), (64, 64, 64), (127, 264, 72), (128, 256, 64),
    (129, 248, 136), (200, 512, 8), (255, 1000, 200), (256, 256, 4104), (300, 8, 520), (333, 776, 1032),
    (511, 2056, 64), (512, 512, 512), (513, 264, 4096), (640, 1280, 328), (777, 136, 2056), (1000, 1000, 1000),
    (1024, 24, 8192), (1031, 4104, 88), (1536, 2048, 1024), (2047, 520, 776), (2048, 4096, 8192),
    (2049, 7168, 512), (3000, 256, 2048), (4096, 4096, 4096), (4097, 8, 64), (5000, 1288, 384), (8191, 264, 128),
    (8192, 1024, 256), (1, 14336, 4096), (96, 7168, 8192), (16384, 256, 72),
    # M <= 64 with b = weight.t(): the swapped problem; N past one wave of 64-row tiles in the last.
    (17, 1032, 520), (48, 8200, 136), (5, 16448, 64),
]


def reference(a, b):
    return (a.float() @ b.float())


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_fp32_reference(m, n, k):
    g = torch.Generator(device="cuda").manual_seed(m * 1_000_003 + n * 1009 + k)
    dtype = torch.bfloat16 if (m + n + k) % 2 == 0 else torch.float16
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    for layout in ("kn", "nk"):
        # "nk": a Linear weight [N, K] passed as weight.t(), so b is column-major.
        b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g) if layout == "kn" else \
            torch.randn(n, k, device="cuda", dtype=dtype, generator=g).t()
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        interlace.gemm(a, b, out)
        torch.cuda.synchronize()
        assert not out.isnan().any(), f"{layout}: {out.isnan().sum().item()} elements never written"
        ref = reference(a, b)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err <= 1e-2, f"{layout} {dtype}: relative error {err:.2e}"


@pytest.mark.parametrize("m,n,k", [(1, 8, 8), (129, 264, 72), (300, 776, 1032), (385, 2056, 4096), (4096, 4096, 512)])
@pytest.mark.parametrize("tile_n,cluster_m,pingpong", [(128, 1, False), (256, 1, False), (256, 2, False),
                                                       (128, 2, False), (0, 1, True), (0, 2, True)])
def test_every_tile_and_cluster_variant(m, n, k, tile_n, cluster_m, pingpong):
    """Odd tile-row counts matter with clusters: the second CTA of the last pair has no rows."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    interlace.gemm(a, b, out, tile_n=tile_n, cluster_m=cluster_m, pingpong=pingpong)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    ref = reference(a, b)
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.parametrize("m", [1, 17, 100])
def test_swapped_decode_gemm_on_strided_views(m):
    # M <= 128 with a Linear weight takes the swapped problem, which trades a's and b's strides and
    # stores out transposed: views with lda > K, a weight's row stride > K and ldc > N.
    k, n = 520, 1032
    a = torch.randn(m, k + 72, device="cuda", dtype=torch.bfloat16)[:, :k]
    w = torch.randn(n, k + 8, device="cuda", dtype=torch.bfloat16)[:, :k]
    out_big = torch.full((m, n + 24), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = out_big[:, :n]
    interlace.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    ref = reference(a, w.t())
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    assert out_big[:, n:].isnan().all(), "wrote past N into the row padding"


def test_strided_rows_and_repeat_runs_agree():
    a_big = torch.randn(1000, 1024, device="cuda", dtype=torch.bfloat16)
    a = a_big[:, :512]  # lda 1024 > K
    b = torch.randn(512, 776, device="cuda", dtype=torch.bfloat16)
    out1 = torch.empty(1000, 776, device="cuda", dtype=torch.bfloat16)
    out2 = torch.empty_like(out1)
    interlace.gemm(a, b, out1)
    interlace.gemm(a, b, out2)
    torch.cuda.synchronize()
    assert torch.equal(out1, out2), "two runs on the same inputs differ: a race"
    ref = reference(a, b)
    assert ((out1.float() - ref).norm() / ref.norm()).item() <= 1e-2


def test_bad_input_raises_before_gpu_work():
    a = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.full((64, 64), 7.0, device="cuda", dtype=torch.bfloat16)
    cases = {
        "share a dtype": (a, b.half(), out),
        "supported are bfloat16": (a.float(), b.float(), out.float()),
        "shapes do not chain": (a, b[:64], out),
        "a must be row-major": (a.t().contiguous().t(), b, out),
        "16-byte aligned": (a[:, 1:121], b[1:121], out),
        "is on cpu": (a, b.cpu(), out),
    }
    for needle, (x, y, o) in cases.items():
        with pytest.raises(interlace.Error, match=needle):
            interlace.gemm(x, y, o)
    torch.cuda.synchronize()
    assert bool((out == 7.0).all()), "a rejected call wrote into out"


def test_empty_k_gives_zeros_and_empty_m_is_a_no_op():
    out = torch.full((5, 16), 3.0, device="cuda", dtype=torch.bfloat16)
    interlace.gemm(torch.empty(5, 0, device="cuda", dtype=torch.bfloat16),
                   torch.empty(0, 16, device="cuda", dtype=torch.bfloat16), out)
    torch.cuda.synchronize()
    assert bool((out == 0).all())
    interlace.gemm(torch.empty(0, 8, device="cuda", dtype=torch.bfloat16),
                   torch.empty(8, 16, device="cuda", dtype=torch.bfloat16), out[:0])


def test_k_zero_gives_zeros_after_the_same_checks_as_any_k():
    a = torch.empty(64, 0, device="cuda", dtype=torch.float16)
    b = torch.empty(0, 136, device="cuda", dtype=torch.float16)
    for kw in [{}, {"pingpong": False}, {"pingpong": False, "tile_n": 256, "cluster_m": 1}]:
        out = torch.full((64, 136), float("nan"), device="cuda", dtype=torch.float16)
        interlace.gemm(a, b, out, **kw)
        torch.cuda.synchronize()
        assert bool((out == 0).all()), kw
    out = torch.full((64, 136), 5.0, device="cuda", dtype=torch.float16)
    for kw, needle in [({"tile_n": 96, "pingpong": False}, "tile_n must be"), ({"cluster_m": 3}, "cluster_m must be"),
                       ({"band_m": -1}, "band_m must be"), ({"tile_n": 256}, "ping-pong tiles are 128 wide")]:
        with pytest.raises(interlace.Error, match=needle):
            interlace.gemm(a, b, out, **kw)
    with pytest.raises(interlace.Error, match="16-byte aligned"):
        interlace.gemm(a, b[:, 4:132], out[:, 4:132])
    torch.cuda.synchronize()
    assert bool((out == 5.0).all()), "a rejected call wrote into out"


def test_out_overlapping_an_input_raises_before_gpu_work():
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    x_before, w_before = x.clone(), w.clone()
    with pytest.raises(interlace.Error, match="out overlaps a"):
        interlace.gemm(x, w, x)  # in place
    with pytest.raises(interlace.Error, match="out overlaps b"):
        interlace.gemm(x, w.t(), w)
    buf = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    buf_before = buf.clone()
    with pytest.raises(interlace.Error, match="out overlaps a"):
        interlace.gemm(buf[:256], w, buf[128:])  # half the rows shared
    torch.cuda.synchronize()
    assert torch.equal(x, x_before) and torch.equal(w, w_before) and torch.equal(buf, buf_before)
    out = buf[256:]  # adjacent rows of the same buffer are fine
    interlace.gemm(buf[:128], w, out)
    torch.cuda.synchronize()
    ref = reference(buf[:128], w)
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2


# Runs in a fresh process, so that the capture holds the very first gemm call of the process (no
# kernel loaded, no shape seen): nothing in it may allocate, free or synchronize.
FIRST_CALL_IN_A_GRAPH = textwrap.dedent("""
    import torch, interlace
    torch.cuda.init()
    variants = [((1000, 776, 520), {}), ((333, 264, 1032), {"pingpong": False}),
                ((2049, 512, 264), {"pingpong": False, "tile_n": 256, "cluster_m": 1}), ((129, 136, 64), {"band_m": 3})]
    g = torch.Generator(device="cuda").manual_seed(1234)
    for (m, n, k), kw in variants:
        dtype = torch.bfloat16
        a = torch.empty(m, k, device="cuda", dtype=dtype)
        w = torch.empty(n, k, device="cuda", dtype=dtype)
        out = torch.empty(m, n, device="cuda", dtype=dtype)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            interlace.gemm(a, w.t(), out, **kw)
        for replay in range(2):  # fresh inputs each time: the graph reads them, not copies
            a.copy_(torch.randn(m, k, device="cuda", generator=g))
            w.copy_(torch.randn(n, k, device="cuda", generator=g))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert not out.isnan().any(), f"{m}x{n}x{k} {kw}: {out.isnan().sum().item()} elements never written"
            ref = a.double() @ w.double().t()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err <= 1e-2, f"{m}x{n}x{k} {kw}: relative error {err:.2e}"
    print("captured and replayed", len(variants), "first calls")
""")


def test_first_call_of_a_new_shape_is_captured_in_a_cuda_graph():
    r = subprocess.run([sys.executable, "-c", FIRST_CALL_IN_A_GRAPH], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "captured and replayed 4 first calls" in r.stdout


def test_new_shapes_captured_in_process():
    """The same in this process, where other shapes ran before: the capture sees a shape for the
    first time."""
    for m, n, k, pingpong in [(1237, 1048, 200, True), (1239, 1056, 208, False)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            interlace.gemm(a, b, out, pingpong=pingpong)
        a.copy_(torch.randn(m, k, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert not out.isnan().any()
        ref = reference(a, b)
        assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.gpus(2)
def test_a_call_on_another_device_leaves_the_current_device_alone():
    torch.cuda.set_device(0)
    try:
        a = torch.randn(300, 264, device="cuda:1", dtype=torch.bfloat16)
        b = torch.randn(264, 520, device="cuda:1", dtype=torch.bfloat16)
        out = torch.full((300, 520), float("nan"), device="cuda:1", dtype=torch.bfloat16)
        interlace.gemm(a, b, out)
        assert torch.cuda.current_device() == 0
        interlace.gemm(a[:, :0], b[:0], out)  # K = 0 writes zeros on cuda:1
        assert torch.cuda.current_device() == 0
        torch.cuda.synchronize(1)
        assert bool((out == 0).all())
        interlace.gemm(a, b, out)
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0
        ref = reference(a, b)
        assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
        torch.cuda.set_device(1)
        interlace.gemm(a, b, out)
        assert torch.cuda.current_device() == 1
    finally:
        torch.cuda.set_device(0)
