"""Tensor-parallel Linear layers on interlace's fused ops (sequence parallel: activations between
layers are split by rows, tokens, across the group's ranks).

    col = ColumnParallelLinear(4096, 14336, group)   # y = all_gather(x) @ W_col.t(): ag_gemm
    row = RowParallelLinear(14336, 4096, group)      # y = reduce_scatter(x @ W_row.t()): gemm_rs
    y = row(torch.relu(col(x_shard)))                # x_shard, y: this rank's rows [S / W, 4096]

Each layer's backward pairs the other op: ColumnParallelLinear's input gradient is gemm_rs (the
partial dX of this rank's output columns, reduced to this rank's rows), RowParallelLinear's is
ag_gemm (every rank's rows of dY, gathered, times this rank's weight columns). The weight
gradients are local GEMMs on the gathered activations, which the forward (column) or the backward
(row) ag_gemm writes anyway.

Weights are this rank's shard of the full nn.Linear weight [out, in]: rows out_features / W * r ..
(column layer), columns in_features / W * r .. (row layer); `from_linear` cuts them from a full
layer. The row layer's bias is whole on every rank; its gradient is summed over ranks
(all_reduce), as every rank's tokens use it.
"""
import torch as _torch

import interlace.torch as _itorch


def _shard(n, world, what):
    if n % world:
        raise ValueError(f"interlace.torch: {what} = {n} must be a multiple of the group's {world} ranks")
    return n // world


class _ColumnParallel(_torch.autograd.Function):
    """y = all_gather(x) @ w.t() (+ b); saves the gathered x for the weight gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        y, gathered = _itorch.ag_gemm(x, weight.t(), group, return_gathered=True)
        if bias is not None:
            y = y + bias
        ctx.group = group
        ctx.has_bias = bias is not None
        ctx.save_for_backward(gathered, weight)
        return y

    @staticmethod
    def backward(ctx, dy):
        gathered, weight = ctx.saved_tensors
        dy = dy.contiguous()
        # dX = dY @ W: K (this rank's output columns) is split across ranks, and each rank keeps its
        # own rows of the sum.
        dx = _itorch.gemm_rs(dy, weight, ctx.group) if ctx.needs_input_grad[0] else None
        dw = _itorch.gemm(dy.t().contiguous(), gathered) if ctx.needs_input_grad[1] else None
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None


class _RowParallel(_torch.autograd.Function):
    """y = reduce_scatter(x @ w.t()) (+ b); the backward's ag_gemm gathers dY for the weight gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        y = _itorch.gemm_rs(x, weight.t(), group)
        if bias is not None:
            y = y + bias
        ctx.group = group
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        # dX = all_gather(dY) @ W, and the gathered dY serves the weight gradient.
        dx, gathered = _itorch.ag_gemm(dy, weight, ctx.group, return_gathered=True)
        dw = _itorch.gemm(gathered.t().contiguous(), x) if ctx.needs_input_grad[1] else None
        db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # Summed in at least fp32 (all_reduce takes fp32, bf16 and fp16).
            db = _itorch.all_reduce(dy.sum(0, dtype=_torch.promote_types(dy.dtype, _torch.float32)), ctx.group).to(dy.dtype)
        return (dx if ctx.needs_input_grad[0] else None), dw, db, None


def _init_parameters(layer, weight_shape, bias_features, bias, device, dtype):
    """layer.weight, initialised as nn.Linear's, and layer.bias (zeros, or None)."""
    factory = dict(device=device if device is not None else _torch.cuda.current_device(), dtype=dtype)
    layer.weight = _torch.nn.Parameter(_torch.empty(*weight_shape, **factory))
    layer.bias = _torch.nn.Parameter(_torch.zeros(bias_features, **factory)) if bias else None
    _torch.nn.init.kaiming_uniform_(layer.weight, a=5 ** 0.5)


class ColumnParallelLinear(_torch.nn.Module):
    """nn.Linear(in_features, out_features) with its output features split across the group's ranks:
    input this rank's rows [S / W, in_features], output every row of this rank's features
    [S, out_features / W]."""

    def __init__(self, in_features, out_features, group, *, bias=True, device=None, dtype=_torch.bfloat16):
        super().__init__()
        self.group = group
        self.in_features, self.out_features = in_features, out_features
        local = _shard(out_features, group.world_size, "out_features")
        _init_parameters(self, (local, in_features), local, bias, device, dtype)

    @classmethod
    def from_linear(cls, linear, group):
        """This rank's shard of a full nn.Linear (its rows of the weight and bias), same dtype and device."""
        layer = cls(linear.in_features, linear.out_features, group, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
        local = layer.weight.shape[0]
        rows = slice(group.rank * local, (group.rank + 1) * local)
        with _torch.no_grad():
            layer.weight.copy_(linear.weight[rows])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias[rows])
        return layer

    def forward(self, x):
        return _ColumnParallel.apply(x, self.weight, self.bias, self.group)


class RowParallelLinear(_torch.nn.Module):
    """nn.Linear(in_features, out_features) with its input features split across the group's ranks:
    input every row of this rank's features [S, in_features / W], output this rank's rows
    [S / W, out_features], summed over ranks."""

    def __init__(self, in_features, out_features, group, *, bias=True, device=None, dtype=_torch.bfloat16):
        super().__init__()
        self.group = group
        self.in_features, self.out_features = in_features, out_features
        local = _shard(in_features, group.world_size, "in_features")
        _init_parameters(self, (out_features, local), out_features, bias, device, dtype)

    @classmethod
    def from_linear(cls, linear, group):
        """This rank's shard of a full nn.Linear (its columns of the weight; the bias whole)."""
        layer = cls(linear.in_features, linear.out_features, group, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
        local = layer.weight.shape[1]
        with _torch.no_grad():
            layer.weight.copy_(linear.weight[:, group.rank * local:(group.rank + 1) * local])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x):
        return _RowParallel.apply(x, self.weight, self.bias, self.group)
