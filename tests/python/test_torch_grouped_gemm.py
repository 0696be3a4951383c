"""interlace.torch.grouped_gemm on the CPU: the torch.library ops interlace::grouped_gemm (a new
tensor, rows at or past min(rows[g], C) zeros) and interlace::grouped_gemm_into (mutates out),
their schemas, their fake (meta) implementations' shapes and checks, tracing by torch.export and
torch.compile(fullgraph=True) with no graph break, and what their CUDA kernels pass to
interlace.grouped_gemm (called here on CPU tensors, interlace.grouped_gemm replaced by a recorder).
Running the kernel needs a Hopper GPU (tests/gpu/test_torch_ops_gpu.py)."""
import pytest

torch = pytest.importorskip("torch")
import interlace  # noqa: E402
import interlace.torch as itorch  # noqa: E402
import torch._dynamo.testing  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

BF16 = torch.bfloat16
G, C, K, N = 4, 40, 64, 24


def operands(device="cpu", dtype=BF16, g=G, c=C, k=K, n=N):
    """a [G, C, K], Linear weights w [G, N, K] (b = w.transpose(1, 2)) and rows int32 [G]."""
    return (torch.empty(g, c, k, dtype=dtype, device=device), torch.empty(g, n, k, dtype=dtype, device=device),
            torch.empty(g, dtype=torch.int32, device=device))


def test_ops_are_registered_with_their_schemas():
    schemas = {name: str(getattr(torch.ops.interlace, name).default._schema)
               for name in ("grouped_gemm", "grouped_gemm_into")}
    assert schemas["grouped_gemm_into"] == ("interlace::grouped_gemm_into(Tensor(a0!) out, Tensor a, Tensor b, "
                                            "Tensor rows, SymInt cluster_m) -> ()"), schemas
    assert schemas["grouped_gemm"] == ("interlace::grouped_gemm(Tensor a, Tensor b, Tensor rows, SymInt cluster_m) "
                                       "-> Tensor"), schemas


def test_no_autograd_as_for_gemm():
    """gemm registers no autograd formula, and neither does grouped_gemm: both ops have the same
    autograd kernel (torch.library's default, which raises in backward through them)."""
    for name in ("gemm", "grouped_gemm"):
        custom = getattr(itorch, f"_{name}")
        assert custom._backward_fn is None and custom._setup_context_fn is None, name


def test_fakes_give_the_output_shape_for_both_layouts_of_b():
    with FakeTensorMode():
        a, w, rows = operands()
        for b in (w.transpose(1, 2), w.transpose(1, 2).contiguous()):
            out = itorch.grouped_gemm(a, b, rows)
            assert out.shape == (G, C, N) and out.dtype == BF16
        out = itorch.grouped_gemm(*operands(dtype=torch.float16, g=1, c=1, k=8, n=8)[:1],
                                  torch.empty(1, 8, 8, dtype=torch.float16), torch.empty(1, dtype=torch.int32),
                                  cluster_m=2)
        assert out.shape == (1, 1, 8) and out.dtype == torch.float16
        buf = torch.empty(G, C, N, dtype=BF16)
        assert itorch.grouped_gemm(a, w.transpose(1, 2), rows, out=buf) is buf


def test_meta_tensors_run_the_fakes():
    a, w, rows = operands("meta")
    out = itorch.grouped_gemm(a, w.transpose(1, 2), rows)
    assert out.shape == (G, C, N) and out.device.type == "meta"
    buf = torch.empty(G, C, N, dtype=BF16, device="meta")
    assert itorch.grouped_gemm(a, w.transpose(1, 2), rows, out=buf, cluster_m=1) is buf


@pytest.mark.parametrize("into", [False, True], ids=["functional", "into"])
def test_fakes_refuse_what_does_not_multiply(into):
    def call(a, b, rows, out=None):
        if into:
            out = torch.empty(a.shape[0], a.shape[1], b.shape[-1], dtype=a.dtype) if out is None else out
        return itorch.grouped_gemm(a, b, rows, out=out)

    with FakeTensorMode():
        a, w, rows = operands()
        b = w.transpose(1, 2)
        bad = {
            "K differs": ((a, torch.empty(G, K - 8, N, dtype=BF16), rows), "not \\[G, C, K\\] and \\[G, K, N\\]"),
            "G differs": ((a, b[:G - 1], rows), "not \\[G, C, K\\] and \\[G, K, N\\]"),
            "a is 2-D": ((a[0], b, rows), "not \\[G, C, K\\] and \\[G, K, N\\]"),
            "b is 2-D": ((a, b[0], rows), "not \\[G, C, K\\] and \\[G, K, N\\]"),
            "rows int64": ((a, b, rows.long()), "is not int32 \\[4\\]"),
            "rows too short": ((a, b, rows[:G - 1]), "is not int32 \\[4\\]"),
            "rows 2-D": ((a, b, rows[None]), "is not int32 \\[4\\]"),
        }
        for what, (args, match) in bad.items():
            with pytest.raises(Exception, match=match):
                call(*args)
                pytest.fail(f"{what}: no error")
        if into:
            with pytest.raises(Exception, match="is not \\[G, C, N\\]"):
                call(a, b, rows, out=torch.empty(G, C + 1, N, dtype=BF16))


def test_the_functional_kernel_zero_fills_out_and_passes_its_arguments(monkeypatch):
    """What the ops' CUDA kernels (their Python bodies) hand interlace.grouped_gemm, run on CPU tensors
    with interlace.grouped_gemm replaced by a CPU stand-in that writes only the first min(rows[g], C)
    rows, as the kernel does: the functional op's out is zeros past them, the into op's keeps what
    was there."""
    calls = []

    def stand_in(a, b, out, rows, *, stream=None, cluster_m=0):
        calls.append(cluster_m)
        for g, r in enumerate(rows.tolist()):
            r = min(r, a.shape[1])
            out[g, :r] = (a[g, :r].float() @ b[g].float()).to(out.dtype)

    monkeypatch.setattr(interlace, "grouped_gemm", stand_in)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(G, C, K, generator=gen).to(BF16)
    w = torch.randn(G, N, K, generator=gen).to(BF16)
    rows = torch.tensor([0, 7, C, 10 * C], dtype=torch.int32)
    ref = torch.bmm(a.float(), w.transpose(1, 2).float()).to(BF16)
    out = itorch._grouped_gemm._init_fn(a, w.transpose(1, 2), rows, 2)
    buf = torch.full((G, C, N), 7.0, dtype=BF16)
    itorch._grouped_gemm_into._init_fn(buf, a, w.transpose(1, 2), rows, 1)
    assert calls == [2, 1]
    for g, r in enumerate(min(int(x), C) for x in rows):
        assert torch.equal(out[g, :r], ref[g, :r]) and torch.equal(buf[g, :r], ref[g, :r]), g
        assert bool((out[g, r:] == 0).all()), f"functional: group {g} rows past {r} are not zeros"
        assert bool((buf[g, r:] == 7).all()), f"into: group {g} rows past {r} were written"


def moe_ffn(x, w1, w2, rows):
    """An expert FFN on the tokens each expert received: relu(x @ w1[g].t()) @ w2[g].t()."""
    return itorch.grouped_gemm(torch.relu(itorch.grouped_gemm(x, w1.transpose(1, 2), rows)), w2.transpose(1, 2), rows)


def test_torch_export_traces_an_expert_ffn():
    x, w1, rows = operands()
    w2 = torch.empty(G, K, N, dtype=BF16)  # [G, N_out = K, K_in = N]

    class Ffn(torch.nn.Module):
        def forward(self, x, w1, w2, rows):
            return moe_ffn(x, w1, w2, rows)

    exported = torch.export.export(Ffn(), (x, w1, w2, rows))
    calls = [n for n in exported.graph.nodes if n.op == "call_function"]
    targets = [str(n.target) for n in calls]
    assert targets.count("interlace.grouped_gemm.default") == 2, targets
    first = calls[targets.index("interlace.grouped_gemm.default")]
    assert first.args[3] == 0, first.args  # cluster_m
    assert tuple(first.meta["val"].shape) == (G, C, N)
    out = [n for n in exported.graph.nodes if n.op == "output"][0]
    assert tuple(out.args[0][0].meta["val"].shape) == (G, C, K)


def test_torch_compile_fullgraph_has_no_graph_break():
    graphs = []

    def capture(gm, example_inputs):  # records the graph; never runs the ops (no GPU here)
        graphs.append(gm)
        return lambda *args: (torch.empty(G, C, K, dtype=BF16),)

    x, w1, rows = operands()
    torch.compile(moe_ffn, fullgraph=True, backend=capture)(x, w1, torch.empty(G, K, N, dtype=BF16), rows)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("interlace.grouped_gemm" in t for t in targets) == 2, targets


def test_out_variant_traces_as_a_mutation():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, w, rows, buf):
        itorch.grouped_gemm(x, w.transpose(1, 2), rows, out=buf, cluster_m=2)
        return buf * 2

    meta = dict(dtype=BF16, device="meta")
    x, w, rows = operands("meta")
    y = torch.compile(f, fullgraph=True, backend=capture)(x, w, rows, torch.empty(G, C, N, **meta))
    assert y.shape == (G, C, N)
    calls = [n for n in graphs[0].graph.nodes if n.op == "call_function"]
    into = [n for n in calls if "interlace.grouped_gemm_into" in str(n.target)]
    assert len(into) == 1 and into[0].args[4] == 2, [str(n.target) for n in calls]


def test_aot_eager_with_dynamic_capacity():
    """aot_eager on meta tensors runs the fakes; with C (the capacity) dynamic, one graph serves
    every C, and the output's shape follows it."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    w1 = torch.empty(G, N, K, dtype=BF16, device="meta")
    w2 = torch.empty(G, K, N, dtype=BF16, device="meta")

    @torch.compile(fullgraph=True, backend=counter, dynamic=True)
    def ffn(x, rows):
        return moe_ffn(x, w1, w2, rows)

    for c in (40, 48, 56):
        out = ffn(torch.empty(G, c, K, dtype=BF16, device="meta"), torch.empty(G, dtype=torch.int32, device="meta"))
        assert out.shape == (G, c, K) and out.device.type == "meta"
    assert counter.frame_count == 1
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("interlace.grouped_gemm" in t for t in targets) == 2, targets
