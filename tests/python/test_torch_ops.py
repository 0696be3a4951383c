"""interlace's torch.library ops on the CPU: registration, fake (meta) shapes, and tracing by
torch.export and torch.compile(fullgraph=True) with no graph break. Running them needs GPUs
(tests/gpu); tracing does not: it uses the fake implementations."""
import pytest

torch = pytest.importorskip("torch")
import interlace.torch as itorch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


class FakeGroup:
    """Stands in for interlace.Group where only world_size is read (tracing never runs the op)."""
    world_size = 4


GROUP = FakeGroup()


def test_every_op_is_registered_with_its_schema():
    schemas = {name: str(getattr(torch.ops.interlace, name).default._schema)
               for name in ("all_gather", "all_gather_into", "gemm", "gemm_into")}
    assert "Tensor(a0!) out" in schemas["all_gather_into"], schemas
    assert "Tensor(a0!) out" in schemas["gemm_into"], schemas
    assert schemas["all_gather"].endswith("-> Tensor"), schemas
    assert schemas["gemm"].endswith("-> Tensor"), schemas


def test_fake_implementations_give_the_output_shapes():
    with FakeTensorMode():
        x = torch.empty(3, 5, dtype=torch.bfloat16)
        y = itorch.all_gather(x, GROUP)
        assert y.shape == (12, 5) and y.dtype == torch.bfloat16
        a, b = torch.empty(7, 16, dtype=torch.bfloat16), torch.empty(16, 24, dtype=torch.bfloat16)
        c = itorch.gemm(a, b)
        assert c.shape == (7, 24) and c.dtype == torch.bfloat16
        with pytest.raises(Exception, match="do not multiply"):
            itorch.gemm(a, torch.empty(15, 24, dtype=torch.bfloat16))


class TensorParallelBlock(torch.nn.Module):
    """What a column-parallel layer does: gather the sequence shards, then multiply."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(32, 16, dtype=torch.bfloat16))

    def forward(self, x):
        gathered = itorch.all_gather(x, GROUP)
        return itorch.gemm(gathered, self.weight.t()).relu()


def test_torch_export_traces_the_ops_into_one_graph():
    exported = torch.export.export(TensorParallelBlock(), (torch.empty(3, 16, dtype=torch.bfloat16),))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "interlace.all_gather.default" in targets, targets
    assert "interlace.gemm.default" in targets, targets
    out = [n for n in exported.graph.nodes if n.op == "output"][0]
    assert tuple(out.args[0][0].meta["val"].shape) == (12, 32)


def test_torch_compile_fullgraph_has_no_graph_break():
    graphs = []

    def capture(gm, example_inputs):  # records the graph; never runs the ops (no GPU here)
        graphs.append(gm)
        return lambda *args: (torch.empty(12, 32, dtype=torch.bfloat16),)

    compiled = torch.compile(TensorParallelBlock(), fullgraph=True, backend=capture)
    compiled(torch.empty(3, 16, dtype=torch.bfloat16))
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("interlace.all_gather" in t for t in targets), targets
    assert any("interlace.gemm" in t for t in targets), targets


def test_out_variants_trace_as_mutations():
    def f(x, buf):
        itorch.all_gather(x, GROUP, out=buf)
        return buf * 2

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: (args[-1],)

    compiled = torch.compile(f, fullgraph=True, backend=capture)
    compiled(torch.empty(3, 5), torch.empty(12, 5))
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("interlace.all_gather_into" in t for t in targets), targets
