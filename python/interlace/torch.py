"""PyTorch adapter: symmetric tensors as torch.Tensor, and every op as a torch.library custom op
with a fake (meta) implementation, so that torch.compile(fullgraph=True) and torch.export trace
models that call them, and CUDA graphs (mode="reduce-overhead") replay them.

    import interlace.torch as itorch
    y = itorch.all_gather(x, group)          # functional: a new tensor
    itorch.all_gather(x, group, out=buf)     # into buf
    c = itorch.gemm(a, b)                    # a @ b on interlace's engine

Custom ops take tensors and scalars, not Python objects: a group crosses torch.library as an
integer handle (its registration below), which torch.compile treats as a constant.
"""
import torch as _torch

import interlace as _interlace

# The ops' library: torch.ops.interlace.<name>. Ops added later register here the same way.
_groups = {}


@_torch.compiler.assume_constant_result
def _handle(group) -> int:
    """The group's integer handle for the custom ops (registered on first use; kept for the life
    of the process, like the group's own resources)."""
    key = id(group)
    _groups.setdefault(key, group)
    return key


def _gathered_shape(inp, world_size):
    return (world_size * inp.shape[0], *inp.shape[1:]) if inp.dim() else (world_size,)


@_torch.library.custom_op("interlace::all_gather_into", mutates_args=("out",), device_types="cuda")
def _all_gather_into(out: _torch.Tensor, inp: _torch.Tensor, group: int) -> None:
    _interlace.all_gather(out, inp, _groups[group])


@_all_gather_into.register_fake
def _(out, inp, group):
    return None


@_torch.library.custom_op("interlace::all_gather", mutates_args=(), device_types="cuda")
def _all_gather(inp: _torch.Tensor, group: int, world_size: int) -> _torch.Tensor:
    out = inp.new_empty(_gathered_shape(inp, world_size))
    _interlace.all_gather(out, inp, _groups[group])
    return out


@_all_gather.register_fake
def _(inp, group, world_size):
    return inp.new_empty(_gathered_shape(inp, world_size))


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


def all_gather(inp: _torch.Tensor, group, *, out: _torch.Tensor = None) -> _torch.Tensor:
    """Every rank's inp concatenated along dim 0, as torch.ops.interlace.all_gather (a new tensor)
    or, with out=, torch.ops.interlace.all_gather_into (returns out). See interlace.all_gather."""
    if out is None:
        return _torch.ops.interlace.all_gather(inp, _handle(group), group.world_size)
    _torch.ops.interlace.all_gather_into(out, inp, _handle(group))
    return out


def gemm(a: _torch.Tensor, b: _torch.Tensor, *, out: _torch.Tensor = None) -> _torch.Tensor:
    """a @ b on interlace's Hopper engine, as torch.ops.interlace.gemm (a new tensor) or, with out=,
    torch.ops.interlace.gemm_into (returns out). See interlace.gemm."""
    if out is None:
        return _torch.ops.interlace.gemm(a, b)
    _torch.ops.interlace.gemm_into(out, a, b)
    return out


def empty(group, shape, dtype=_torch.bfloat16) -> _torch.Tensor:
    """A symmetric torch tensor (see Group.empty)."""
    return _torch.from_dlpack(group.empty(shape, dtype))


def peer(group, tensor: _torch.Tensor, rank: int) -> _torch.Tensor:
    """`tensor` (symmetric) as it lies on `rank` of this node, mapped over NVLink."""
    return _torch.from_dlpack(group.peer(tensor, rank))
