"""PyTorch adapter: symmetric tensors as torch.Tensor."""
import torch as _torch


def empty(group, shape, dtype=_torch.bfloat16) -> _torch.Tensor:
    """A symmetric torch tensor (see Group.empty)."""
    return _torch.from_dlpack(group.empty(shape, dtype))


def peer(group, tensor: _torch.Tensor, rank: int) -> _torch.Tensor:
    """`tensor` (symmetric) as it lies on `rank` of this node, mapped over NVLink."""
    return _torch.from_dlpack(group.peer(tensor, rank))
