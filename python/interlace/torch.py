"""PyTorch adapter: symmetric tensors as torch.Tensor, and every op as a torch.library custom op
with a fake (meta) implementation, so that torch.compile(fullgraph=True) and torch.export trace
models that call them, and CUDA graphs (mode="reduce-overhead") replay them.

    import interlace.torch as itorch
    y = itorch.all_gather(x, group)          # functional: a new tensor
    itorch.all_gather(x, group, out=buf)     # into buf
    c = itorch.gemm(a, b)                    # a @ b on interlace's engine
    h = itorch.grouped_gemm(x, w.transpose(1, 2), rows)  # h[g, :rows[g]] = x[g, :rows[g]] @ w[g].t(), rest 0
    y = itorch.ag_gemm(x, w.t(), group)      # all_gather(x) @ w.t() in one launch
    s = itorch.all_reduce(x, group)          # also itorch.reduce_scatter(x, group)
    y = itorch.gemm_rs(x, w.t(), group)      # this rank's rows of sum(x @ w.t()); gemm_ar: all rows
    o, lse = itorch.attention(q, k, v, causal=True)            # [B, S, H, D] on one GPU
    o, lse = itorch.ring_attention(q, k, v, group, causal=True)  # this rank's zigzag shard of a sequence
    moe = itorch.MoeBuffers(group, num_experts=64, topk=2, hidden=4096, max_tokens=512, capacity=1024)
    ex = itorch.moe_dispatch(x, topk_idx, topk_weights, moe)   # the experts' rows (moe.native's layout)
    h = itorch.moe_dispatch_gemm(x, topk_idx, topk_weights, w1.transpose(1, 2), moe)  # ex[l] @ w1[l].t(), one launch
    y = itorch.moe_combine(expert_out, moe, tokens=x.shape[0])  # back home, weighted sum
    y = itorch.moe_gemm_combine(act, w2.transpose(1, 2), moe, tokens=x.shape[0])  # act @ w2[l].t(), then as moe_combine
    col = itorch.ColumnParallelLinear(4096, 14336, group)  # tensor-parallel layers (torch_layers.py)

Custom ops take tensors and scalars, not Python objects: a group crosses torch.library as its
integer handle (group.handle), and the op finds the group again by it. group.handle is a plain int
attribute: torch.compile bakes it into the graph as a constant with a guard (or, once another group
reaches the same code, may pass it in as an int input; CUDA graphs are recorded per value).
"""
import itertools as _itertools
import weakref as _weakref

import torch as _torch

import interlace as _interlace
from interlace import _group

_rendezvous_calls = {}  # per process group (its global ranks): how many rendezvous it has made


def _gathered_shape(inp, world_size):
    return (world_size * inp.shape[0], *inp.shape[1:]) if inp.dim() else (world_size,)


@_torch.library.custom_op("interlace::all_gather_into", mutates_args=("out",), device_types="cuda")
def _all_gather_into(out: _torch.Tensor, inp: _torch.Tensor, group: int) -> None:
    _interlace.all_gather(out, inp, _group.by_handle(group))


@_all_gather_into.register_fake
def _(out, inp, group):
    return None


@_torch.library.custom_op("interlace::all_gather", mutates_args=(), device_types="cuda")
def _all_gather(inp: _torch.Tensor, group: int, world_size: int) -> _torch.Tensor:
    out = inp.new_empty(_gathered_shape(inp, world_size))
    _interlace.all_gather(out, inp, _group.by_handle(group))
    return out


@_all_gather.register_fake
def _(inp, group, world_size):
    return inp.new_empty(_gathered_shape(inp, world_size))


def _scattered_shape(inp, world_size):
    _torch._check(inp.dim() >= 1 and inp.shape[0] % world_size == 0,
                  lambda: f"interlace.reduce_scatter: inp {tuple(inp.shape)} is not {world_size} blocks along dim 0")
    return (inp.shape[0] // world_size, *inp.shape[1:])


@_torch.library.custom_op("interlace::reduce_scatter_into", mutates_args=("out",), device_types="cuda")
def _reduce_scatter_into(out: _torch.Tensor, inp: _torch.Tensor, group: int) -> None:
    _interlace.reduce_scatter(out, inp, _group.by_handle(group))


@_reduce_scatter_into.register_fake
def _(out, inp, group):
    return None


@_torch.library.custom_op("interlace::reduce_scatter", mutates_args=(), device_types="cuda")
def _reduce_scatter(inp: _torch.Tensor, group: int, world_size: int) -> _torch.Tensor:
    out = inp.new_empty(_scattered_shape(inp, world_size))
    _interlace.reduce_scatter(out, inp, _group.by_handle(group))
    return out


@_reduce_scatter.register_fake
def _(inp, group, world_size):
    return inp.new_empty(_scattered_shape(inp, world_size))


# all_reduce_into takes separate tensors (a custom op's mutated argument may not alias another
# input); interlace.all_reduce(x, x, group) runs in place outside torch.library.
@_torch.library.custom_op("interlace::all_reduce_into", mutates_args=("out",), device_types="cuda")
def _all_reduce_into(out: _torch.Tensor, inp: _torch.Tensor, group: int) -> None:
    _interlace.all_reduce(out, inp, _group.by_handle(group))


@_all_reduce_into.register_fake
def _(out, inp, group):
    return None


@_torch.library.custom_op("interlace::all_reduce", mutates_args=(), device_types="cuda")
def _all_reduce(inp: _torch.Tensor, group: int) -> _torch.Tensor:
    out = _torch.empty_like(inp, memory_format=_torch.contiguous_format)
    _interlace.all_reduce(out, inp, _group.by_handle(group))
    return out


@_all_reduce.register_fake
def _(inp, group):
    return _torch.empty_like(inp, memory_format=_torch.contiguous_format)


@_torch.library.custom_op("interlace::gemm_into", mutates_args=("out",), device_types="cuda")
def _gemm_into(out: _torch.Tensor, a: _torch.Tensor, b: _torch.Tensor) -> None:
    _interlace.gemm(a, b, out)


@_gemm_into.register_fake
def _(out, a, b):
    return None


@_torch.library.custom_op("interlace::gemm", mutates_args=(), device_types="cuda")
def _gemm(a: _torch.Tensor, b: _torch.Tensor) -> _torch.Tensor:
    out = a.new_empty((a.shape[0], b.shape[1]))
    _interlace.gemm(a, b, out)
    return out


@_gemm.register_fake
def _(a, b):
    _torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                  lambda: f"interlace.gemm: a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
    return a.new_empty((a.shape[0], b.shape[1]))


def _grouped_gemm_shape(a, b, rows):
    """out's shape [G, C, N] for a [G, C, K], b [G, K, N] and rows int32 [G]."""
    _torch._check(a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1],
                  lambda: f"interlace.grouped_gemm: a {tuple(a.shape)} and b {tuple(b.shape)} are not [G, C, K] and "
                          "[G, K, N]")
    _torch._check(rows.dim() == 1 and rows.shape[0] == a.shape[0] and rows.dtype == _torch.int32,
                  lambda: f"interlace.grouped_gemm: rows ({tuple(rows.shape)}, {rows.dtype}) is not int32 "
                          f"[{a.shape[0]}], a row count per group")
    return (a.shape[0], a.shape[1], b.shape[2])


@_torch.library.custom_op("interlace::grouped_gemm_into", mutates_args=("out",), device_types="cuda")
def _grouped_gemm_into(out: _torch.Tensor, a: _torch.Tensor, b: _torch.Tensor, rows: _torch.Tensor,
                       cluster_m: int) -> None:
    _interlace.grouped_gemm(a, b, out, rows, cluster_m=cluster_m)


@_grouped_gemm_into.register_fake
def _(out, a, b, rows, cluster_m):
    shape = _grouped_gemm_shape(a, b, rows)
    _torch._check(out.dim() == 3 and tuple(out.shape) == shape,
                  lambda: f"interlace.grouped_gemm: out {tuple(out.shape)} is not [G, C, N] = {shape}")
    return None


# The functional form's out starts as zeros: rows at or past rows[g] (which the kernel never writes)
# are zeros, not whatever the allocator left there. That costs a memset of out before the kernel.
@_torch.library.custom_op("interlace::grouped_gemm", mutates_args=(), device_types="cuda")
def _grouped_gemm(a: _torch.Tensor, b: _torch.Tensor, rows: _torch.Tensor, cluster_m: int) -> _torch.Tensor:
    out = a.new_zeros(_grouped_gemm_shape(a, b, rows))
    _interlace.grouped_gemm(a, b, out, rows, cluster_m=cluster_m)
    return out


@_grouped_gemm.register_fake
def _(a, b, rows, cluster_m):
    return a.new_empty(_grouped_gemm_shape(a, b, rows))


def _ag_gemm_rows(a_shard, shard_rows, world_size):
    return sum(shard_rows) if shard_rows else world_size * a_shard.shape[0]


@_torch.library.custom_op("interlace::ag_gemm_into", mutates_args=("out", "gathered"), device_types="cuda")
def _ag_gemm_into(out: _torch.Tensor, gathered: _torch.Tensor | None, a_shard: _torch.Tensor, b: _torch.Tensor,
                  group: int, shard_rows: list[int] | None) -> None:
    _interlace.ag_gemm(a_shard, b, out, _group.by_handle(group), gathered=gathered, shard_rows=shard_rows)


@_ag_gemm_into.register_fake
def _(out, gathered, a_shard, b, group, shard_rows):
    return None


@_torch.library.custom_op("interlace::ag_gemm", mutates_args=(), device_types="cuda")
def _ag_gemm(a_shard: _torch.Tensor, b: _torch.Tensor, group: int, shard_rows: list[int] | None, world_size: int,
             with_gathered: bool) -> tuple[_torch.Tensor, _torch.Tensor]:
    m = _ag_gemm_rows(a_shard, shard_rows, world_size)
    out = a_shard.new_empty((m, b.shape[1]))
    gathered = a_shard.new_empty((m if with_gathered else 0, a_shard.shape[1]))
    _interlace.ag_gemm(a_shard, b, out, _group.by_handle(group), gathered=gathered if with_gathered else None,
                       shard_rows=shard_rows)
    return out, gathered


@_ag_gemm.register_fake
def _(a_shard, b, group, shard_rows, world_size, with_gathered):
    _torch._check(a_shard.dim() == 2 and b.dim() == 2 and a_shard.shape[1] == b.shape[0],
                  lambda: f"interlace.ag_gemm: a_shard {tuple(a_shard.shape)} and b {tuple(b.shape)} do not multiply")
    m = _ag_gemm_rows(a_shard, shard_rows, world_size)
    return a_shard.new_empty((m, b.shape[1])), a_shard.new_empty((m if with_gathered else 0, a_shard.shape[1]))


def ag_gemm(a_shard: _torch.Tensor, b: _torch.Tensor, group, *, shard_rows=None, out: _torch.Tensor = None,
            gathered: _torch.Tensor = None, return_gathered: bool = False):
    """A @ b where A is every rank's a_shard stacked in rank order, in one launch (see
    interlace.ag_gemm), as torch.ops.interlace.ag_gemm (new tensors: out, and with
    return_gathered=True the gathered A too, as (out, gathered)) or, with out= (and optionally
    gathered=), torch.ops.interlace.ag_gemm_into (returns out, or (out, gathered)).
    shard_rows: every rank's rows, for uneven shards."""
    rows = None if shard_rows is None else [int(r) for r in shard_rows]
    if out is None:
        if gathered is not None:
            raise ValueError("interlace.torch.ag_gemm: gathered= goes with out=; or pass return_gathered=True")
        out, full = _torch.ops.interlace.ag_gemm(a_shard, b, group.handle, rows, group.world_size, return_gathered)
        return (out, full) if return_gathered else out
    _torch.ops.interlace.ag_gemm_into(out, gathered, a_shard, b, group.handle, rows)
    return (out, gathered) if gathered is not None else out


def _gemm_rs_rows(a, shard_rows, rank, world_size):
    return shard_rows[rank] if shard_rows else a.shape[0] // world_size


@_torch.library.custom_op("interlace::gemm_rs_into", mutates_args=("out",), device_types="cuda")
def _gemm_rs_into(out: _torch.Tensor, a: _torch.Tensor, b: _torch.Tensor, group: int,
                  shard_rows: list[int] | None) -> None:
    _interlace.gemm_rs(a, b, out, _group.by_handle(group), shard_rows=shard_rows)


@_gemm_rs_into.register_fake
def _(out, a, b, group, shard_rows):
    return None


@_torch.library.custom_op("interlace::gemm_rs", mutates_args=(), device_types="cuda")
def _gemm_rs(a: _torch.Tensor, b: _torch.Tensor, group: int, shard_rows: list[int] | None, rank: int,
             world_size: int) -> _torch.Tensor:
    out = a.new_empty((_gemm_rs_rows(a, shard_rows, rank, world_size), b.shape[1]))
    _interlace.gemm_rs(a, b, out, _group.by_handle(group), shard_rows=shard_rows)
    return out


@_gemm_rs.register_fake
def _(a, b, group, shard_rows, rank, world_size):
    _torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                  lambda: f"interlace.gemm_rs: a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
    return a.new_empty((_gemm_rs_rows(a, shard_rows, rank, world_size), b.shape[1]))


@_torch.library.custom_op("interlace::gemm_ar_into", mutates_args=("out",), device_types="cuda")
def _gemm_ar_into(out: _torch.Tensor, a: _torch.Tensor, b: _torch.Tensor, group: int) -> None:
    _interlace.gemm_ar(a, b, out, _group.by_handle(group))


@_gemm_ar_into.register_fake
def _(out, a, b, group):
    return None


@_torch.library.custom_op("interlace::gemm_ar", mutates_args=(), device_types="cuda")
def _gemm_ar(a: _torch.Tensor, b: _torch.Tensor, group: int) -> _torch.Tensor:
    out = a.new_empty((a.shape[0], b.shape[1]))
    _interlace.gemm_ar(a, b, out, _group.by_handle(group))
    return out


@_gemm_ar.register_fake
def _(a, b, group):
    _torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                  lambda: f"interlace.gemm_ar: a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
    return a.new_empty((a.shape[0], b.shape[1]))


_next_moe_handle = _itertools.count(1)
_moe_buffers = _weakref.WeakValueDictionary()  # live MoeBuffers by handle, as groups by group.handle


def _moe_by_handle(handle: int):
    buffers = _moe_buffers.get(handle)
    if buffers is None:
        raise _interlace.Error(f"no live interlace.torch.MoeBuffers has handle {handle}")
    return buffers


class MoeBuffers:
    """A MoE layer's interlace.MoeHandle for the torch ops (collective to make, as the handle): the
    custom ops take its integer handle, as they take group.handle. expert_x is the receive buffer
    as a torch tensor (in the heap), which moe_dispatch fills; native is the interlace.MoeHandle
    (counts, slots, expert_starts, expert_rows)."""

    def __init__(self, group, *, num_experts, topk, hidden, max_tokens, capacity, capacity_kind="per_expert"):
        self.native = _interlace.MoeHandle(group, num_experts=num_experts, topk=topk, hidden=hidden,
                                           max_tokens=max_tokens, capacity=capacity, capacity_kind=capacity_kind)
        self.group = group
        self.expert_x = _torch.from_dlpack(self.native.expert_x)
        self.handle = next(_next_moe_handle)
        _moe_buffers[self.handle] = self


@_torch.library.custom_op("interlace::moe_dispatch_into", mutates_args=("expert_x",), device_types="cuda")
def _moe_dispatch_into(expert_x: _torch.Tensor, x: _torch.Tensor, topk_idx: _torch.Tensor,
                       topk_weights: _torch.Tensor, group: int, handle: int) -> None:
    _interlace.moe_dispatch(x, topk_idx, topk_weights, _group.by_handle(group), handle=_moe_by_handle(handle).native)


@_moe_dispatch_into.register_fake
def _(expert_x, x, topk_idx, topk_weights, group, handle):
    return None


@_torch.library.custom_op("interlace::moe_combine", mutates_args=(), device_types="cuda")
def _moe_combine(expert_out: _torch.Tensor, group: int, handle: int, tokens: int) -> _torch.Tensor:
    out = expert_out.new_empty((tokens, expert_out.shape[1]))
    _interlace.moe_combine(expert_out, _moe_by_handle(handle).native, _group.by_handle(group), out=out)
    return out


@_moe_combine.register_fake
def _(expert_out, group, handle, tokens):
    _torch._check(expert_out.dim() == 2, lambda: f"interlace.moe_combine: expert_out must be 2-D, got "
                                                 f"{tuple(expert_out.shape)}")
    return expert_out.new_empty((tokens, expert_out.shape[1]))


def _moe_gemm_combine_shape(act, w, tokens):
    """out's shape [tokens, H] for act [recv_rows, F] and w [L, F, H], both bfloat16 (interlace checks
    the rest against the handle: recv_rows, L, H, layouts)."""
    _torch._check(act.dim() == 2 and w.dim() == 3 and w.shape[1] == act.shape[1],
                  lambda: f"interlace.moe_gemm_combine: act {tuple(act.shape)} and w {tuple(w.shape)} are not "
                          "[recv_rows, F] and [L, F, H]")
    _torch._check(act.dtype == _torch.bfloat16 and w.dtype == _torch.bfloat16,
                  lambda: f"interlace.moe_gemm_combine: act and w must be bfloat16, got {act.dtype} and {w.dtype}")
    return (tokens, w.shape[2])


# w is usually Linear weights' transpose, a strided view: it goes to the kernel as it is, never
# copied, since the GEMM reads either layout of w. The fake's out depends on no input's strides, and
# torch.compile hands a custom op its inputs in the layout they had when traced (Inductor's default
# for custom ops: exact strides in torch 2.13, stride order before), so compiled code passes the same
# view.
@_torch.library.custom_op("interlace::moe_gemm_combine", mutates_args=(), device_types="cuda")
def _moe_gemm_combine(act: _torch.Tensor, w: _torch.Tensor, group: int, handle: int, tokens: int,
                      cluster_m: int) -> _torch.Tensor:
    out = act.new_empty(_moe_gemm_combine_shape(act, w, tokens))
    _interlace.moe_gemm_combine(act, w, _moe_by_handle(handle).native, _group.by_handle(group), out=out,
                                cluster_m=cluster_m)
    return out


@_moe_gemm_combine.register_fake
def _(act, w, group, handle, tokens, cluster_m):
    return act.new_empty(_moe_gemm_combine_shape(act, w, tokens))


def _moe_dispatch_gemm_shape(expert_x, w):
    """out's shape [recv_rows, N] for w [L, H, N] bfloat16 (interlace checks the rest against the handle)."""
    _torch._check(w.dim() == 3 and w.shape[1] == expert_x.shape[1],
                  lambda: f"interlace.moe_dispatch_gemm: w {tuple(w.shape)} is not [L, hidden, N] with hidden "
                          f"{expert_x.shape[1]}")
    _torch._check(w.dtype == _torch.bfloat16, lambda: f"interlace.moe_dispatch_gemm: w must be bfloat16, got {w.dtype}")
    return (expert_x.shape[0], w.shape[2])


# As moe_gemm_combine, w goes to the kernel as the (strided) view it is.
@_torch.library.custom_op("interlace::moe_dispatch_gemm", mutates_args=("expert_x",), device_types="cuda")
def _moe_dispatch_gemm(expert_x: _torch.Tensor, x: _torch.Tensor, topk_idx: _torch.Tensor,
                       topk_weights: _torch.Tensor, w: _torch.Tensor, group: int, handle: int) -> _torch.Tensor:
    out = x.new_empty(_moe_dispatch_gemm_shape(expert_x, w))
    _interlace.moe_dispatch_gemm(x, topk_idx, topk_weights, w, _group.by_handle(group), out=out,
                                 handle=_moe_by_handle(handle).native)
    return out


@_moe_dispatch_gemm.register_fake
def _(expert_x, x, topk_idx, topk_weights, w, group, handle):
    return x.new_empty(_moe_dispatch_gemm_shape(expert_x, w))


def moe_dispatch(x: _torch.Tensor, topk_idx: _torch.Tensor, topk_weights: _torch.Tensor, buffers: MoeBuffers):
    """interlace.moe_dispatch into buffers.expert_x, as torch.ops.interlace.moe_dispatch_into (which
    mutates it); returns buffers.expert_x."""
    _torch.ops.interlace.moe_dispatch_into(buffers.expert_x, x, topk_idx, topk_weights, buffers.group.handle,
                                           buffers.handle)
    return buffers.expert_x


def moe_combine(expert_out: _torch.Tensor, buffers: MoeBuffers, *, tokens: int) -> _torch.Tensor:
    """interlace.moe_combine as torch.ops.interlace.moe_combine: a new [tokens, hidden] tensor, tokens
    being this rank's in the dispatch (x.shape[0])."""
    return _torch.ops.interlace.moe_combine(expert_out, buffers.group.handle, buffers.handle, tokens)


def moe_dispatch_gemm(x: _torch.Tensor, topk_idx: _torch.Tensor, topk_weights: _torch.Tensor, w: _torch.Tensor,
                      buffers: MoeBuffers) -> _torch.Tensor:
    """interlace.moe_dispatch_gemm as torch.ops.interlace.moe_dispatch_gemm: the dispatch into
    buffers.expert_x (which it mutates) and the experts' first matmul in one launch; returns a new
    [recv_rows, N] bf16 tensor in expert_x's layout (rows past an expert's kept rows unset). w [L,
    hidden, N] bf16 (Linear weights [L, N, hidden] as w.transpose(1, 2), not copied); buffers'
    capacity_kind "per_expert". No autograd (as moe_dispatch)."""
    return _torch.ops.interlace.moe_dispatch_gemm(buffers.expert_x, x, topk_idx, topk_weights, w,
                                                  buffers.group.handle, buffers.handle)


def moe_gemm_combine(act: _torch.Tensor, w: _torch.Tensor, buffers: MoeBuffers, *, tokens: int,
                     cluster_m: int = 0) -> _torch.Tensor:
    """interlace.moe_gemm_combine as torch.ops.interlace.moe_gemm_combine: the experts' second matmul
    and moe_combine in one launch, a new [tokens, H] bf16 tensor (tokens as in moe_combine). act
    [recv_rows, F] bf16 in expert_x's layout; w [L, F, H] bf16 (Linear weights [L, H, F] as
    w.transpose(1, 2), not copied); buffers' capacity_kind "per_expert". cluster_m as in
    interlace.grouped_gemm. No autograd (as moe_combine)."""
    return _torch.ops.interlace.moe_gemm_combine(act, w, buffers.group.handle, buffers.handle, tokens, cluster_m)


def _attention_lse(q):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_torch.float32)


@_torch.library.custom_op("interlace::attention_into", mutates_args=("out", "lse"), device_types="cuda")
def _attention_into(out: _torch.Tensor, lse: _torch.Tensor | None, q: _torch.Tensor, k: _torch.Tensor,
                    v: _torch.Tensor, causal: bool, softmax_scale: float | None) -> None:
    _interlace.attention(q, k, v, out, causal=causal, softmax_scale=softmax_scale, lse=lse)


@_attention_into.register_fake
def _(out, lse, q, k, v, causal, softmax_scale):
    return None


@_torch.library.custom_op("interlace::attention", mutates_args=(), device_types="cuda")
def _attention(q: _torch.Tensor, k: _torch.Tensor, v: _torch.Tensor, causal: bool,
               softmax_scale: float | None) -> tuple[_torch.Tensor, _torch.Tensor]:
    out, lse = _torch.empty_like(q), _attention_lse(q)
    _interlace.attention(q, k, v, out, causal=causal, softmax_scale=softmax_scale, lse=lse)
    return out, lse


@_attention.register_fake
def _(q, k, v, causal, softmax_scale):
    _torch._check(q.dim() == 4 and k.dim() == 4 and k.shape == v.shape and q.shape[3] == k.shape[3],
                  lambda: f"interlace.attention: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
                          "are not [B, S, H, D] alike")
    return _torch.empty_like(q), _attention_lse(q)


@_torch.library.custom_op("interlace::ring_attention_into", mutates_args=("out", "lse"), device_types="cuda")
def _ring_attention_into(out: _torch.Tensor, lse: _torch.Tensor | None, q: _torch.Tensor, k: _torch.Tensor,
                         v: _torch.Tensor, group: int, causal: bool, softmax_scale: float | None,
                         seq_len: int | None) -> None:
    _interlace.ring_attention(q, k, v, out, _group.by_handle(group), causal=causal, softmax_scale=softmax_scale,
                              lse=lse, seq_len=seq_len)


@_ring_attention_into.register_fake
def _(out, lse, q, k, v, group, causal, softmax_scale, seq_len):
    return None


@_torch.library.custom_op("interlace::ring_attention", mutates_args=(), device_types="cuda")
def _ring_attention(q: _torch.Tensor, k: _torch.Tensor, v: _torch.Tensor, group: int, causal: bool,
                    softmax_scale: float | None, seq_len: int | None) -> tuple[_torch.Tensor, _torch.Tensor]:
    out, lse = _torch.empty_like(q), _attention_lse(q)
    _interlace.ring_attention(q, k, v, out, _group.by_handle(group), causal=causal, softmax_scale=softmax_scale,
                              lse=lse, seq_len=seq_len)
    return out, lse


@_ring_attention.register_fake
def _(q, k, v, group, causal, softmax_scale, seq_len):
    _torch._check(q.dim() == 4 and k.dim() == 4 and k.shape == v.shape and q.shape[3] == k.shape[3],
                  lambda: f"interlace.ring_attention: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
                          "are not [B, S_local, H, D] alike")
    return _torch.empty_like(q), _attention_lse(q)


def attention(q: _torch.Tensor, k: _torch.Tensor, v: _torch.Tensor, *, causal=False, softmax_scale=None,
              out: _torch.Tensor = None, lse: _torch.Tensor = None):
    """(out, lse) of attention on one GPU (see interlace.attention), as torch.ops.interlace.attention
    (new tensors) or, with out= (and optionally lse=), torch.ops.interlace.attention_into."""
    if out is None:
        return _torch.ops.interlace.attention(q, k, v, causal, softmax_scale)
    _torch.ops.interlace.attention_into(out, lse, q, k, v, causal, softmax_scale)
    return out, lse


def ring_attention(q: _torch.Tensor, k: _torch.Tensor, v: _torch.Tensor, group, *, causal=False, softmax_scale=None,
                   seq_len=None, out: _torch.Tensor = None, lse: _torch.Tensor = None):
    """(out, lse) of attention over the sequence sharded across the group (see
    interlace.ring_attention), as torch.ops.interlace.ring_attention (new tensors) or, with out= (and
    optionally lse=), torch.ops.interlace.ring_attention_into."""
    if out is None:
        return _torch.ops.interlace.ring_attention(q, k, v, group.handle, causal, softmax_scale, seq_len)
    _torch.ops.interlace.ring_attention_into(out, lse, q, k, v, group.handle, causal, softmax_scale, seq_len)
    return out, lse


def gemm_rs(a: _torch.Tensor, b: _torch.Tensor, group, *, shard_rows=None, out: _torch.Tensor = None):
    """This rank's rows of the sum over ranks of a @ b (K split across ranks) in one launch (see
    interlace.gemm_rs), as torch.ops.interlace.gemm_rs (a new tensor)
    or, with out=, torch.ops.interlace.gemm_rs_into (returns out). shard_rows: every rank's output
    rows, for uneven blocks."""
    rows = None if shard_rows is None else [int(r) for r in shard_rows]
    if out is None:
        return _torch.ops.interlace.gemm_rs(a, b, group.handle, rows, group.rank, group.world_size)
    _torch.ops.interlace.gemm_rs_into(out, a, b, group.handle, rows)
    return out


def gemm_ar(a: _torch.Tensor, b: _torch.Tensor, group, *, out: _torch.Tensor = None):
    """The sum over ranks of a @ b (K split across ranks) on every rank, in one launch (see
    interlace.gemm_ar), as torch.ops.interlace.gemm_ar (a new tensor)
    or, with out=, torch.ops.interlace.gemm_ar_into (returns out)."""
    if out is None:
        return _torch.ops.interlace.gemm_ar(a, b, group.handle)
    _torch.ops.interlace.gemm_ar_into(out, a, b, group.handle)
    return out


def all_gather(inp: _torch.Tensor, group, *, out: _torch.Tensor = None) -> _torch.Tensor:
    """Every rank's inp concatenated along dim 0, as torch.ops.interlace.all_gather (a new tensor)
    or, with out=, torch.ops.interlace.all_gather_into (returns out). See interlace.all_gather."""
    if out is None:
        return _torch.ops.interlace.all_gather(inp, group.handle, group.world_size)
    _torch.ops.interlace.all_gather_into(out, inp, group.handle)
    return out


def reduce_scatter(inp: _torch.Tensor, group, *, out: _torch.Tensor = None) -> _torch.Tensor:
    """This rank's block (along dim 0) of the sum over ranks of inp, as
    torch.ops.interlace.reduce_scatter (a new tensor) or, with out=,
    torch.ops.interlace.reduce_scatter_into (returns out). See interlace.reduce_scatter."""
    if out is None:
        return _torch.ops.interlace.reduce_scatter(inp, group.handle, group.world_size)
    _torch.ops.interlace.reduce_scatter_into(out, inp, group.handle)
    return out


def all_reduce(inp: _torch.Tensor, group, *, out: _torch.Tensor = None) -> _torch.Tensor:
    """The sum over ranks of inp, as torch.ops.interlace.all_reduce (a new tensor) or, with out= (not
    inp), torch.ops.interlace.all_reduce_into (returns out). See interlace.all_reduce."""
    if out is None:
        return _torch.ops.interlace.all_reduce(inp, group.handle)
    _torch.ops.interlace.all_reduce_into(out, inp, group.handle)
    return out


def gemm(a: _torch.Tensor, b: _torch.Tensor, *, out: _torch.Tensor = None) -> _torch.Tensor:
    """a @ b on interlace's Hopper engine, as torch.ops.interlace.gemm (a new tensor) or, with out=,
    torch.ops.interlace.gemm_into (returns out). See interlace.gemm."""
    if out is None:
        return _torch.ops.interlace.gemm(a, b)
    _torch.ops.interlace.gemm_into(out, a, b)
    return out


def grouped_gemm(a: _torch.Tensor, b: _torch.Tensor, rows: _torch.Tensor, *, cluster_m: int = 0,
                 out: _torch.Tensor = None) -> _torch.Tensor:
    """G GEMMs in one launch, out[g, :r_g] = a[g, :r_g] @ b[g] with r_g = min(rows[g], C) read on the
    GPU (see interlace.grouped_gemm): a [G, C, K], b [G, K, N] (Linear weights w [G, N, K] as
    w.transpose(1, 2)), rows int32 [G] on the GPU. As torch.ops.interlace.grouped_gemm, a new
    [G, C, N] tensor whose rows at or past r_g are zeros (it is zero-filled before the kernel runs, a
    memset of out's bytes); or, with out=, torch.ops.interlace.grouped_gemm_into (returns out), which
    leaves those rows of out as they were. cluster_m as in interlace.grouped_gemm. No autograd (as gemm)."""
    if out is None:
        return _torch.ops.interlace.grouped_gemm(a, b, rows, cluster_m)
    _torch.ops.interlace.grouped_gemm_into(out, a, b, rows, cluster_m)
    return out


def init(process_group=None, *, heap_bytes=1 << 30, timeout_s=300.0, heartbeat_timeout_s=30.0,
         bootstrap_timeout_s=60.0, device=None, node_name=None, cross_node="auto", loopback_rate=0.0):
    """An interlace Group over the ranks of a torch.distributed process group (default: the world),
    set up through torch's own store: no MASTER_PORT + 1 to keep free, no INTERLACE_SECRET to share.
    Collective over the process group. Rank 0 of the group publishes a fresh port and a random
    secret for interlace's rendezvous in the store; the others read them there. node_name, cross_node
    and loopback_rate are interlace.init's."""
    _interlace._C._check_cross_node_options(cross_node, float(loopback_rate))
    options = rendezvous_options(process_group, timeout_s=bootstrap_timeout_s)
    if device is None:
        device = _torch.cuda.current_device()
    return _interlace.init(**options, heap_bytes=heap_bytes, timeout_s=timeout_s,
                           heartbeat_timeout_s=heartbeat_timeout_s, bootstrap_timeout_s=bootstrap_timeout_s,
                           device=device, node_name=node_name, cross_node=cross_node,
                           loopback_rate=loopback_rate)


def rendezvous_options(process_group=None, *, timeout_s=60.0) -> dict:
    """rank, world_size, master_addr, master_port and secret for interlace's rendezvous among the
    ranks of `process_group`, exchanged through torch.distributed's store (collective)."""
    import datetime
    import os
    import secrets
    import socket

    import torch.distributed as dist

    group = process_group or dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    # Calls on one group are numbered alike on every rank; the group's global ranks tell groups apart.
    members = dist.get_process_group_ranks(group)
    _rendezvous_calls[tuple(members)] = call = _rendezvous_calls.get(tuple(members), 0) + 1
    # The default store is private API, but the one every process group was made from.
    store = dist.PrefixStore(f"interlace/{'-'.join(map(str, members))}/{call}/",
                             dist.distributed_c10d._get_default_store())
    if rank == 0:
        address = os.environ.get("MASTER_ADDR") if world > 1 else "127.0.0.1"
        if not address or members[0] != 0:
            address = socket.gethostbyname(socket.gethostname())
        with socket.socket() as s:  # a port free now; the rendezvous listens on it next
            s.bind((address, 0))
            port = s.getsockname()[1]
        store.set("rendezvous", f"{address} {port} {secrets.token_hex(16)}")
    store.wait(["rendezvous"], datetime.timedelta(seconds=timeout_s))
    address, port, secret = store.get("rendezvous").decode().split()
    return dict(rank=rank, world_size=world, master_addr=address, master_port=int(port), secret=secret)


def empty(group, shape, dtype=_torch.bfloat16) -> _torch.Tensor:
    """A symmetric torch tensor (see Group.empty)."""
    return _torch.from_dlpack(group.empty(shape, dtype))


def peer(group, tensor: _torch.Tensor, rank: int) -> _torch.Tensor:
    """`tensor` (symmetric) as it lies on `rank` of this node, mapped over NVLink."""
    return _torch.from_dlpack(group.peer(tensor, rank))


from interlace.torch_layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402,F401 (after the ops they use)
