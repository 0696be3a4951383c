"""ColumnParallelLinear and RowParallelLinear (interlace.torch_layers) against full nn.Linear layers,
forward and every gradient, on the CPU: two threads play two ranks, and the fused ops they call are
replaced by exact references that exchange through the threads (the same math; the GPU test
tests/gpu/test_torch_layers_gpu.py runs the real ops)."""
import threading

import pytest

torch = pytest.importorskip("torch")
import interlace.torch as itorch  # noqa: E402
from interlace import torch_layers  # noqa: E402


class ThreadRank:
    """A rank of a group whose ranks are threads of this process: gather and sum by exchange."""

    def __init__(self, rank, world, shared):
        self.rank, self.world_size, self.shared = rank, world, shared

    def _exchange(self, t):
        slots, barrier = self.shared
        barrier.wait()
        slots[self.rank] = t
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    def gather(self, t):
        return torch.cat(self._exchange(t))

    def sum(self, t):
        return torch.stack(self._exchange(t)).sum(0)


def fake_ag_gemm(a_shard, b, group, *, return_gathered=False):
    full = group.gather(a_shard)
    out = full @ b
    return (out, full) if return_gathered else out


def fake_gemm_rs(a, b, group):
    total = group.sum(a @ b)
    rows = total.shape[0] // group.world_size
    return total[group.rank * rows:(group.rank + 1) * rows]


@pytest.fixture
def thread_ops(monkeypatch):
    monkeypatch.setattr(itorch, "ag_gemm", fake_ag_gemm)
    monkeypatch.setattr(itorch, "gemm_rs", fake_gemm_rs)
    monkeypatch.setattr(itorch, "gemm", lambda a, b: a @ b)
    monkeypatch.setattr(itorch, "all_reduce", lambda x, group: group.sum(x))


@pytest.mark.parametrize("bias", [True, False])
def test_mlp_matches_full_linears_with_gradients(thread_ops, bias):
    world, tokens, d_in, d_hidden, d_out = 2, 12, 16, 24, 8
    gen = torch.Generator().manual_seed(7)
    lin1 = torch.nn.Linear(d_in, d_hidden, bias=bias, dtype=torch.float64)
    lin2 = torch.nn.Linear(d_hidden, d_out, bias=bias, dtype=torch.float64)
    x = torch.randn(tokens, d_in, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(tokens, d_out, generator=gen, dtype=torch.float64)
    y = lin2(torch.relu(lin1(x)))
    (y * g).sum().backward()

    shared = ([None] * world, threading.Barrier(world))
    results, errors = [None] * world, []

    def rank_main(r):
        try:
            group = ThreadRank(r, world, shared)
            col = itorch.ColumnParallelLinear.from_linear(lin1, group)
            row = itorch.RowParallelLinear.from_linear(lin2, group)
            rows = slice(r * tokens // world, (r + 1) * tokens // world)
            x_r = x.detach()[rows].clone().requires_grad_()
            y_r = row(torch.relu(col(x_r)))
            (y_r * g[rows]).sum().backward()
            results[r] = (rows, x_r, y_r, col, row)
        except Exception as e:  # noqa: BLE001 (reported below, with the rank)
            errors.append((r, e))
            shared[1].abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for r, (rows, x_r, y_r, col, row) in enumerate(results):
        hidden = slice(r * d_hidden // world, (r + 1) * d_hidden // world)
        torch.testing.assert_close(y_r, y[rows])
        torch.testing.assert_close(x_r.grad, x.grad[rows])
        torch.testing.assert_close(col.weight.grad, lin1.weight.grad[hidden])
        torch.testing.assert_close(row.weight.grad, lin2.weight.grad[:, hidden])
        if bias:
            torch.testing.assert_close(col.bias.grad, lin1.bias.grad[hidden])
            torch.testing.assert_close(row.bias.grad, lin2.bias.grad)
        else:
            assert col.bias is None and row.bias is None


def test_sizes_not_divisible_by_the_ranks_raise():
    group = ThreadRank(0, 3, None)
    with pytest.raises(ValueError, match="out_features = 8 must be a multiple"):
        torch_layers.ColumnParallelLinear(4, 8, group, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="in_features = 4 must be a multiple"):
        torch_layers.RowParallelLinear(4, 9, group, device="cpu", dtype=torch.float32)
