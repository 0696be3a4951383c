"""reduce_scatter's and all_reduce's torch.library ops on the CPU: schemas, fake shapes, and tracing
by torch.compile(fullgraph=True) with no graph break (running them needs GPUs: tests/gpu). The fake
implementations never look the group up, so a plain object with a handle and a world size stands in
for it (test_torch_ops.py covers the real interlace.Group crossing into ops)."""
import types

import pytest

torch = pytest.importorskip("torch")
import interlace.torch as itorch  # noqa: E402
import torch._dynamo.testing  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

GROUP = types.SimpleNamespace(handle=7, world_size=4)


def test_ops_are_registered_with_their_schemas():
    schemas = {name: str(getattr(torch.ops.interlace, name).default._schema)
               for name in ("reduce_scatter", "reduce_scatter_into", "all_reduce", "all_reduce_into")}
    assert "Tensor(a0!) out" in schemas["reduce_scatter_into"], schemas
    assert "Tensor(a0!) out" in schemas["all_reduce_into"], schemas
    assert schemas["reduce_scatter"].endswith("-> Tensor"), schemas
    assert schemas["all_reduce"].endswith("-> Tensor"), schemas


def test_fake_implementations_give_the_output_shapes():
    with FakeTensorMode():
        x = torch.empty(12, 5, dtype=torch.bfloat16)
        y = itorch.reduce_scatter(x, GROUP)
        assert y.shape == (3, 5) and y.dtype == torch.bfloat16
        z = itorch.all_reduce(x, GROUP)
        assert z.shape == (12, 5) and z.dtype == torch.bfloat16
        with pytest.raises(Exception, match="is not 4 blocks along dim 0"):
            itorch.reduce_scatter(torch.empty(10, 5), GROUP)


def test_compile_traces_both_without_graph_breaks():
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    def f(x):
        return itorch.all_reduce(itorch.reduce_scatter(x, GROUP) * 2, GROUP).relu()

    compiled = torch.compile(f, backend=counter, fullgraph=True)
    out = compiled(torch.empty(16, 8, dtype=torch.float16, device="meta"))  # meta: the fake implementations run
    assert out.shape == (4, 8) and out.device.type == "meta"
    assert counter.frame_count == 1
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert any("interlace.reduce_scatter" in t for t in targets) and any("interlace.all_reduce" in t for t in targets)
