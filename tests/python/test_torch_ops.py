"""interlace's torch.library ops on the CPU: registration, fake (meta) shapes, and tracing by
torch.export and torch.compile(fullgraph=True) with no graph break. Running them needs GPUs
(tests/gpu); tracing does not: it uses the fake implementations, which also serve meta tensors.

The group is a real interlace.Group. The native group inside it needs a GPU, so a nanobind object
stands in for it (NativeStandIn): were tracing to reach through the Group into nanobind (a method
call, a property), dynamo would break the graph, as it did when interlace.Group was the nanobind class."""
import gc
import shutil
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")
import interlace  # noqa: E402
import interlace.torch as itorch  # noqa: E402
from interlace import _group  # noqa: E402
import torch._dynamo.testing  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

WORLD = 4


class NativeStandIn(interlace.Bootstrap):
    """Stands in for interlace._interlace.Group: a nanobind object whose rank, world_size and
    barrier() are nanobind's, as the native group's are; its topology is one node."""
    node = 0
    num_nodes = 1
    device = 0
    heap_bytes = 1 << 20
    cross_node = ""

    @property
    def node_names(self):
        return ["node"] * self.world_size

    @property
    def local_rank(self):
        return self.rank

    @property
    def local_size(self):
        return self.world_size


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def natives():
    """WORLD ranks' stand-ins, rendezvoused on loopback from threads (the rendezvous releases the GIL)."""
    port = free_port()

    def join(rank):
        return NativeStandIn(rank=rank, world_size=WORLD, master_addr="127.0.0.1", master_port=port,
                             secret="test", timeout_s=30.0)

    with ThreadPoolExecutor(WORLD) as pool:
        return list(pool.map(join, range(WORLD)))


@pytest.fixture(scope="module")
def group(natives):
    return interlace.Group(natives[0])


def test_every_op_is_registered_with_its_schema():
    schemas = {name: str(getattr(torch.ops.interlace, name).default._schema)
               for name in ("all_gather", "all_gather_into", "gemm", "gemm_into", "ag_gemm", "ag_gemm_into")}
    assert "Tensor(a0!) out" in schemas["all_gather_into"], schemas
    assert "Tensor(a0!) out" in schemas["gemm_into"], schemas
    assert "Tensor(a0!) out, Tensor(a1!)? gathered" in schemas["ag_gemm_into"], schemas
    assert schemas["all_gather"].endswith("-> Tensor"), schemas
    assert schemas["gemm"].endswith("-> Tensor"), schemas
    assert schemas["ag_gemm"].endswith("-> (Tensor, Tensor)"), schemas


def test_group_is_plain_python_around_the_native_group(natives, group):
    assert isinstance(group, interlace.Group) and group._native is natives[0]
    # Plain instance attributes, no attribute hooks: what torch.compile reads as constants.
    assert "__getattr__" not in vars(interlace.Group)
    assert interlace.Group.__getattribute__ is object.__getattribute__
    expected = dict(rank=0, world_size=WORLD, local_rank=0, local_size=WORLD, node=0, num_nodes=1, device=0,
                    heap_bytes=1 << 20)
    assert {name: vars(group)[name] for name in expected} == expected
    assert type(vars(group)["handle"]) is int
    # Methods forward to the native group: a barrier of all WORLD ranks through their Groups.
    with ThreadPoolExecutor(WORLD) as pool:
        assert list(pool.map(lambda n: interlace.Group(n).barrier(), natives)) == [None] * WORLD


def test_handles_name_live_groups(natives, group):
    other = interlace.Group(natives[1])
    assert other.handle != group.handle
    assert _group.by_handle(group.handle) is group and _group.by_handle(other.handle) is other
    freed = interlace.Group(natives[2]).handle  # nobody holds it: it is freed, and so is its handle
    gc.collect()
    with pytest.raises(interlace.Error, match=f"no live interlace.Group has handle {freed}"):
        _group.by_handle(freed)


def test_init_returns_a_group(natives, monkeypatch):
    monkeypatch.setattr(interlace._C, "_init", lambda **options: natives[0])
    group = interlace.init(rank=0, world_size=WORLD)
    assert isinstance(group, interlace.Group) and group._native is natives[0]


def test_ops_refuse_what_is_not_a_group(natives):
    x = torch.empty(3, 5)
    with pytest.raises(TypeError, match="expected an interlace.Group"):
        interlace.all_gather(torch.empty(12, 5), x, natives[0])


def test_fake_implementations_give_the_output_shapes(group):
    with FakeTensorMode():
        x = torch.empty(3, 5, dtype=torch.bfloat16)
        y = itorch.all_gather(x, group)
        assert y.shape == (12, 5) and y.dtype == torch.bfloat16
        a, b = torch.empty(7, 16, dtype=torch.bfloat16), torch.empty(16, 24, dtype=torch.bfloat16)
        c = itorch.gemm(a, b)
        assert c.shape == (7, 24) and c.dtype == torch.bfloat16
        with pytest.raises(Exception, match="do not multiply"):
            itorch.gemm(a, torch.empty(15, 24, dtype=torch.bfloat16))
        # ag_gemm: even shards, uneven ones (shard_rows), and the gathered A on request.
        shard, w = torch.empty(3, 16, dtype=torch.bfloat16), torch.empty(24, 16, dtype=torch.bfloat16)
        assert itorch.ag_gemm(shard, w.t(), group).shape == (12, 24)
        y, full = itorch.ag_gemm(shard, w.t(), group, shard_rows=[3, 0, 1, 9], return_gathered=True)
        assert y.shape == (13, 24) and full.shape == (13, 16) and full.dtype == torch.bfloat16
        with pytest.raises(Exception, match="do not multiply"):
            itorch.ag_gemm(shard, torch.empty(15, 24, dtype=torch.bfloat16), group)


def test_gemm_rs_and_gemm_ar_fakes_give_the_output_shapes(group):
    schemas = {name: str(getattr(torch.ops.interlace, name).default._schema)
               for name in ("gemm_rs", "gemm_rs_into", "gemm_ar", "gemm_ar_into")}
    assert "Tensor(a0!) out" in schemas["gemm_rs_into"] and "Tensor(a0!) out" in schemas["gemm_ar_into"], schemas
    assert schemas["gemm_rs"].endswith("-> Tensor") and schemas["gemm_ar"].endswith("-> Tensor"), schemas
    with FakeTensorMode():
        a, w = torch.empty(12, 16, dtype=torch.bfloat16), torch.empty(24, 16, dtype=torch.bfloat16)
        y = itorch.gemm_rs(a, w.t(), group)  # rank 0 of WORLD, even blocks
        assert y.shape == (12 // WORLD, 24) and y.dtype == torch.bfloat16
        assert itorch.gemm_rs(a, w.t(), group, shard_rows=[5, 0, 7, 0]).shape == (5, 24)
        assert itorch.gemm_ar(a, w.t(), group).shape == (12, 24)
        with pytest.raises(Exception, match="do not multiply"):
            itorch.gemm_rs(a, torch.empty(15, 24, dtype=torch.bfloat16), group)
        with pytest.raises(Exception, match="do not multiply"):
            itorch.gemm_ar(a, torch.empty(15, 24, dtype=torch.bfloat16), group)


def test_gemm_rs_and_gemm_ar_trace_without_graph_breaks(group):
    graphs = []

    def capture(gm, example_inputs):  # records the graph; never runs the ops (no GPU here)
        graphs.append(gm)
        return lambda *args: (torch.empty(8 // WORLD, 16, dtype=torch.bfloat16),)

    def f(x, w):  # a row-parallel layer, then one whose sum every rank needs
        return itorch.gemm_ar(torch.relu(itorch.gemm_rs(x, w.t(), group)), w.t(), group)

    torch.compile(f, fullgraph=True, backend=capture)(torch.empty(8, 16, dtype=torch.bfloat16),
                                                      torch.empty(16, 16, dtype=torch.bfloat16))
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("interlace.gemm_rs" in t for t in targets), targets
    assert any("interlace.gemm_ar" in t for t in targets), targets


class TensorParallelBlock(torch.nn.Module):
    """What a column-parallel layer does: gather the sequence shards, then multiply."""

    def __init__(self, group, device="cpu"):
        super().__init__()
        self.group = group
        self.weight = torch.nn.Parameter(torch.empty(32, 16, dtype=torch.bfloat16, device=device))

    def forward(self, x):
        gathered = itorch.all_gather(x, self.group)
        return itorch.gemm(gathered, self.weight.t()).relu()


def test_torch_export_traces_the_ops_into_one_graph(group):
    exported = torch.export.export(TensorParallelBlock(group), (torch.empty(3, 16, dtype=torch.bfloat16),))
    calls = [n for n in exported.graph.nodes if n.op == "call_function"]
    targets = [str(n.target) for n in calls]
    assert "interlace.all_gather.default" in targets, targets
    assert "interlace.gemm.default" in targets, targets
    gather = calls[targets.index("interlace.all_gather.default")]
    assert gather.args[1:] == (group.handle, WORLD), gather.args
    out = [n for n in exported.graph.nodes if n.op == "output"][0]
    assert tuple(out.args[0][0].meta["val"].shape) == (12, 32)


def test_torch_compile_fullgraph_has_no_graph_break(group):
    graphs = []

    def capture(gm, example_inputs):  # records the graph; never runs the ops (no GPU here)
        graphs.append(gm)
        return lambda *args: (torch.empty(12, 32, dtype=torch.bfloat16),)

    compiled = torch.compile(TensorParallelBlock(group), fullgraph=True, backend=capture)
    compiled(torch.empty(3, 16, dtype=torch.bfloat16))
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("interlace.all_gather" in t for t in targets), targets
    assert any("interlace.gemm" in t for t in targets), targets


def test_aot_eager_fullgraph_with_the_group_as_argument(natives, group):
    """aot_eager traces through AOTAutograd and runs the graph; on meta tensors the ops run their
    fake implementations. The handle is guarded on: another group recompiles."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    weight = torch.empty(32, 16, dtype=torch.bfloat16, device="meta")

    @torch.compile(fullgraph=True, backend=counter)
    def block(x, g):
        return itorch.gemm(itorch.all_gather(x, g), weight.t()).relu()

    for rows in (3, 3):
        out = block(torch.empty(rows, 16, dtype=torch.bfloat16, device="meta"), group)
        assert out.shape == (WORLD * rows, 32) and out.device.type == "meta"
    assert counter.frame_count == 1  # the second call reused the graph
    other = interlace.Group(natives[1])
    block(torch.empty(3, 16, dtype=torch.bfloat16, device="meta"), other)
    assert counter.frame_count == 2  # another handle: the guard on it failed, and dynamo recompiled
    for graph in counter.graphs:
        targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
        assert any("interlace.all_gather" in t for t in targets), targets


def test_out_variants_trace_as_mutations(group):
    def f(x, buf):
        itorch.all_gather(x, group, out=buf)
        return buf * 2

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: (args[-1],)

    compiled = torch.compile(f, fullgraph=True, backend=capture)
    compiled(torch.empty(3, 5), torch.empty(12, 5))
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("interlace.all_gather_into" in t for t in targets), targets


def test_ag_gemm_compiles_in_both_forms_without_a_graph_break(group):
    """Functional with the gathered A returned (what a column-parallel layer's backward needs), and
    into given outputs; one graph each, the group's handle and the shard rows baked in."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def functional(x, w):
        y, full = itorch.ag_gemm(x, w.t(), group, shard_rows=[3, 3, 3, 4], return_gathered=True)
        return y.relu(), full

    def into(x, w, y, full):
        itorch.ag_gemm(x, w.t(), group, out=y, gathered=full)
        return y * 2

    meta = dict(dtype=torch.bfloat16, device="meta")
    y, full = torch.compile(functional, fullgraph=True, backend=capture)(torch.empty(3, 16, **meta),
                                                                          torch.empty(24, 16, **meta))
    assert y.shape == (13, 24) and full.shape == (13, 16)
    z = torch.compile(into, fullgraph=True, backend=capture)(torch.empty(3, 16, **meta), torch.empty(24, 16, **meta),
                                                             torch.empty(12, 24, **meta), torch.empty(12, 16, **meta))
    assert z.shape == (12, 24)
    assert len(graphs) == 2
    calls = [[n for n in g.graph.nodes if n.op == "call_function"] for g in graphs]
    ag = [n for n in calls[0] if "interlace.ag_gemm" in str(n.target)]
    assert len(ag) == 1 and ag[0].args[2:] == (group.handle, [3, 3, 3, 4], WORLD, True), ag[0].args if ag else calls[0]
    assert any("interlace.ag_gemm_into" in str(n.target) for n in calls[1]), calls[1]


class MoeBuffersStandIn:
    """What the MoE ops read of an interlace.torch.MoeBuffers (making one needs a GPU): the receive
    buffer, the group and the integer handle."""

    def __init__(self, group, recv_rows, hidden, device="cpu"):
        self.group = group
        self.expert_x = torch.empty(recv_rows, hidden, dtype=torch.bfloat16, device=device)
        self.handle = 12345


def test_moe_ops_are_registered_and_fakes_give_the_shapes(group):
    schemas = {name: str(getattr(torch.ops.interlace, name).default._schema)
               for name in ("moe_dispatch_into", "moe_combine")}
    assert "Tensor(a0!) expert_x" in schemas["moe_dispatch_into"], schemas
    assert schemas["moe_combine"].endswith("-> Tensor"), schemas
    with FakeTensorMode():
        moe = MoeBuffersStandIn(group, recv_rows=40, hidden=64)
        x = torch.empty(9, 64, dtype=torch.bfloat16)
        idx, w = torch.empty(9, 2, dtype=torch.int32), torch.empty(9, 2)
        assert itorch.moe_dispatch(x, idx, w, moe) is moe.expert_x
        y = itorch.moe_combine(torch.empty(40, 64, dtype=torch.bfloat16), moe, tokens=9)
        assert y.shape == (9, 64) and y.dtype == torch.bfloat16


def test_moe_layer_traces_without_graph_breaks(group):
    graphs = []
    moe = MoeBuffersStandIn(group, recv_rows=40, hidden=64)

    def capture(gm, example_inputs):  # records the graph; never runs the ops (no GPU here)
        graphs.append(gm)
        return lambda *args: (torch.empty(9, 64, dtype=torch.bfloat16),)

    def layer(x, idx, w):  # dispatch, a stand-in expert, combine
        ex = itorch.moe_dispatch(x, idx, w, moe)
        return itorch.moe_combine(torch.relu(ex), moe, tokens=x.shape[0])

    torch.compile(layer, fullgraph=True, backend=capture)(torch.empty(9, 64, dtype=torch.bfloat16),
                                                          torch.empty(9, 2, dtype=torch.int32), torch.empty(9, 2))
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("moe_dispatch_into" in t for t in targets), targets
    assert any("interlace.moe_combine" in t for t in targets), targets


L, F = 4, 48  # the fused combine's local experts and FFN width (recv_rows 40 = L x C, C = 10)


def fused_weights(device="cpu"):
    """Linear weights [L, hidden = 64, F] and w = their transpose (a strided view), as the op takes them."""
    linear = torch.empty(L, 64, F, dtype=torch.bfloat16, device=device)
    return linear, linear.transpose(1, 2)


def test_moe_gemm_combine_is_registered_and_its_fake_gives_the_shape(group):
    schema = str(torch.ops.interlace.moe_gemm_combine.default._schema)
    assert schema == ("interlace::moe_gemm_combine(Tensor act, Tensor w, SymInt group, SymInt handle, SymInt tokens, "
                      "SymInt cluster_m) -> Tensor"), schema
    with FakeTensorMode():
        moe = MoeBuffersStandIn(group, recv_rows=40, hidden=64)
        act = torch.empty(40, F, dtype=torch.bfloat16)
        linear, w = fused_weights()
        for weights in (w, w.contiguous()):  # [L, F, H] with F contiguous (Linear's), or H
            y = itorch.moe_gemm_combine(act, weights, moe, tokens=9, cluster_m=2)
            assert y.shape == (9, 64) and y.dtype == torch.bfloat16 and y.is_contiguous()
        assert itorch.moe_gemm_combine(act, w, moe, tokens=0).shape == (0, 64)
        bad = {
            "act 1-D": ((act[0], w), "are not \\[recv_rows, F\\] and \\[L, F, H\\]"),
            "w 2-D": ((act, w[0]), "are not \\[recv_rows, F\\]"),
            "F differs": ((act[:, :F - 8], w), "are not \\[recv_rows, F\\]"),
            "w untransposed": ((act, linear), "are not \\[recv_rows, F\\]"),
            "act float32": ((act.float(), w), "must be bfloat16"),
            "w float16": ((act, w.half()), "must be bfloat16"),
        }
        for what, ((a, b), match) in bad.items():
            with pytest.raises(Exception, match=match):
                itorch.moe_gemm_combine(a, b, moe, tokens=9)
                pytest.fail(f"{what}: no error")


def test_moe_gemm_combine_kernel_passes_w_as_it_is(group, monkeypatch):
    """What the op's CUDA kernel (its Python body, run here on CPU tensors) hands
    interlace.moe_gemm_combine: the native handle and group its integers name, w itself (the strided
    view, not a copy), a new out [tokens, H] bf16 and cluster_m."""
    moe = MoeBuffersStandIn(group, recv_rows=40, hidden=64)
    moe.native = "native handle stand-in"
    monkeypatch.setitem(itorch._moe_buffers, moe.handle, moe)
    calls = []

    def stand_in(act, w, handle, group, *, out, stream=None, cluster_m=0):
        calls.append((act, w, handle, group, out, cluster_m))
        out.fill_(1)
        return out

    monkeypatch.setattr(interlace, "moe_gemm_combine", stand_in)
    act = torch.zeros(40, F, dtype=torch.bfloat16)
    _, w = fused_weights()
    y = itorch._moe_gemm_combine._init_fn(act, w, group.handle, moe.handle, 9, 2)
    [(a, b, handle, g, out, cluster_m)] = calls
    assert a is act and b is w and not b.is_contiguous()
    assert handle == "native handle stand-in" and g is group and cluster_m == 2
    assert out is y and y.shape == (9, 64) and y.dtype == torch.bfloat16 and bool((y == 1).all())
    with pytest.raises(interlace.Error, match="no live interlace.torch.MoeBuffers has handle 54321"):
        itorch._moe_gemm_combine._init_fn(act, w, group.handle, 54321, 9, 0)


def test_moe_dispatch_gemm_is_registered_and_its_fake_gives_the_shape(group):
    schema = str(torch.ops.interlace.moe_dispatch_gemm.default._schema)
    assert "Tensor(a0!) expert_x" in schema and schema.endswith("-> Tensor"), schema
    with FakeTensorMode():
        moe = MoeBuffersStandIn(group, recv_rows=40, hidden=64)
        x = torch.empty(9, 64, dtype=torch.bfloat16)
        idx, wts = torch.empty(9, 2, dtype=torch.int32), torch.empty(9, 2)
        linear = torch.empty(L, 96, 64, dtype=torch.bfloat16)  # Linear weights [L, N, hidden]
        for w in (linear.transpose(1, 2), linear.transpose(1, 2).contiguous()):
            h = itorch.moe_dispatch_gemm(x, idx, wts, w, moe)
            assert h.shape == (40, 96) and h.dtype == torch.bfloat16 and h.is_contiguous()
        for what, w, match in (("untransposed", linear, "is not \\[L, hidden, N\\]"),
                               ("2-D", linear[0], "is not \\[L, hidden, N\\]"),
                               ("float32", linear.transpose(1, 2).float(), "must be bfloat16")):
            with pytest.raises(Exception, match=match):
                itorch.moe_dispatch_gemm(x, idx, wts, w, moe)
                pytest.fail(f"{what}: no error")


def test_moe_dispatch_gemm_kernel_passes_its_arguments_as_they_are(group, monkeypatch):
    """What the op's CUDA kernel (its Python body, run on CPU tensors) hands interlace.moe_dispatch_gemm:
    x, the routing and w itself (the strided view), the group and native handle its integers name,
    and a new out [recv_rows, N] bf16."""
    moe = MoeBuffersStandIn(group, recv_rows=40, hidden=64)
    moe.native = "native handle stand-in"
    monkeypatch.setitem(itorch._moe_buffers, moe.handle, moe)
    calls = []

    def stand_in(x, idx, wts, w, group, *, out, handle, stream=None):
        calls.append((x, idx, wts, w, group, out, handle))
        out.fill_(1)
        return out, handle

    monkeypatch.setattr(interlace, "moe_dispatch_gemm", stand_in)
    x = torch.zeros(9, 64, dtype=torch.bfloat16)
    idx, wts = torch.zeros(9, 2, dtype=torch.int32), torch.zeros(9, 2)
    w = torch.zeros(L, 96, 64, dtype=torch.bfloat16).transpose(1, 2)
    h = itorch._moe_dispatch_gemm._init_fn(moe.expert_x, x, idx, wts, w, group.handle, moe.handle)
    [(x_, idx_, wts_, w_, g, out, handle)] = calls
    assert x_ is x and idx_ is idx and wts_ is wts and w_ is w and g is group
    assert handle == "native handle stand-in"
    assert out is h and h.shape == (40, 96) and h.dtype == torch.bfloat16 and bool((h == 1).all())


def fused_layer(moe):
    """dispatch, an activation (relu of the received rows' first F columns), then the fused second
    matmul and combine, with Linear weights passed transposed."""
    def layer(x, idx, weights, linear):
        act = torch.relu(itorch.moe_dispatch(x, idx, weights, moe)[:, :F])
        return itorch.moe_gemm_combine(act, linear.transpose(1, 2), moe, tokens=x.shape[0])
    return layer


def fused_layer_inputs(tokens=9, device="cpu"):
    """x, topk_idx, topk_weights (k = 2) and the Linear weights [L, H, F]."""
    return (torch.empty(tokens, 64, dtype=torch.bfloat16, device=device),
            torch.empty(tokens, 2, dtype=torch.int32, device=device), torch.empty(tokens, 2, device=device),
            fused_weights(device)[0])


def test_moe_gemm_combine_layer_traces_without_graph_breaks_and_keeps_w_strided(group):
    graphs = []
    moe = MoeBuffersStandIn(group, recv_rows=40, hidden=64)

    def capture(gm, example_inputs):  # records the graph; never runs the ops (no GPU here)
        graphs.append(gm)
        return lambda *args: (torch.empty(9, 64, dtype=torch.bfloat16),)

    torch.compile(fused_layer(moe), fullgraph=True, backend=capture)(*fused_layer_inputs())
    assert len(graphs) == 1
    calls = [n for n in graphs[0].graph.nodes if n.op == "call_function"]
    targets = [str(n.target) for n in calls]
    assert any("moe_dispatch_into" in t for t in targets), targets
    [fused] = [n for n in calls if "interlace.moe_gemm_combine" in str(n.target)]
    assert fused.args[2:] == (group.handle, moe.handle, 9, 0), fused.args
    w = fused.args[1].meta["example_value"]
    assert w.shape == (L, F, 64) and w.stride() == (64 * F, 1, F), w.stride()  # the transpose, not a copy
    assert tuple(fused.meta["example_value"].shape) == (9, 64)


def test_moe_gemm_combine_layer_under_aot_eager(group):
    """aot_eager on meta tensors (functionalized; the fakes run): one graph for every token count, out
    [tokens, H] following it."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    moe = MoeBuffersStandIn(group, recv_rows=40, hidden=64, device="meta")
    layer = torch.compile(fused_layer(moe), fullgraph=True, backend=counter, dynamic=True)
    for tokens in (9, 12, 20):
        y = layer(*fused_layer_inputs(tokens, "meta"))
        assert y.shape == (tokens, 64) and y.dtype == torch.bfloat16 and y.device.type == "meta"
    assert counter.frame_count == 1


# Inductor on the CPU, in a child process (the CPU kernel it registers for the op would outlive a
# test): compiled code must hand the kernel w as the transposed view it traced, not a contiguous copy.
INDUCTOR_W_STRIDES = textwrap.dedent("""
    from types import SimpleNamespace
    import torch
    import interlace.torch as itorch
    strides = []

    @torch.library.register_kernel("interlace::moe_gemm_combine", "cpu")
    def _(act, w, group, handle, tokens, cluster_m):
        strides.append(w.stride())
        return act.new_zeros((tokens, w.shape[2]))

    moe = SimpleNamespace(group=SimpleNamespace(handle=1), handle=2)  # what the wrapper reads of MoeBuffers
    layer = torch.compile(lambda act, linear: itorch.moe_gemm_combine(torch.relu(act), linear.transpose(1, 2), moe,
                                                                      tokens=9) + 1, fullgraph=True)
    y = layer(torch.randn(40, 48).bfloat16(), torch.randn(4, 64, 48).bfloat16())
    assert y.shape == (9, 64) and bool((y == 1).all()), y
    print(strides)
""")


@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU backend needs a C++ compiler")
def test_moe_gemm_combine_under_inductor_gets_w_strided():
    r = subprocess.run([sys.executable, "-c", INDUCTOR_W_STRIDES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"[{(64 * F, 1, F)}]", r.stdout


def test_attention_and_ring_attention_fakes_give_out_and_lse(group):
    schemas = {name: str(getattr(torch.ops.interlace, name).default._schema)
               for name in ("attention", "attention_into", "ring_attention", "ring_attention_into")}
    assert "Tensor(a0!) out, Tensor(a1!)? lse" in schemas["attention_into"], schemas
    assert "Tensor(a0!) out, Tensor(a1!)? lse" in schemas["ring_attention_into"], schemas
    assert schemas["attention"].endswith("-> (Tensor, Tensor)"), schemas
    assert schemas["ring_attention"].endswith("-> (Tensor, Tensor)"), schemas
    with FakeTensorMode():
        q = torch.empty(2, 40, 8, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 40, 2, 128, dtype=torch.bfloat16)
        for out, lse in (itorch.attention(q, k, k, causal=True), itorch.ring_attention(q, k, k, group, causal=True)):
            assert out.shape == q.shape and out.dtype == torch.bfloat16
            assert lse.shape == (2, 8, 40) and lse.dtype == torch.float32
        with pytest.raises(Exception, match="not \\[B, S"):
            itorch.attention(q, k, torch.empty(2, 39, 2, 128, dtype=torch.bfloat16))
