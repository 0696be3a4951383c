"""The moe benchmark's baseline on the CPU (one gloo rank): what it times must compute the MoE layer's
dispatch and combine, in both its host-driven and its padded (graph-capturable) form, or its speedups
mean nothing."""
import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture(scope="module")
def gloo():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("tokens,hidden,experts,topk", [(64, 16, 8, 2), (33, 8, 16, 4), (5, 24, 4, 4)])
def test_baseline_dispatch_and_combine_are_the_moe_layer(gloo, tokens, hidden, experts, topk):
    from interlace.bench.moe_baseline import Baseline, routing
    idx, weights = routing(0, tokens, experts, topk, seed=3, device="cpu")
    x = torch.randn(tokens, hidden).to(torch.bfloat16)
    capacity = int(torch.bincount(idx.view(-1).long(), minlength=experts).max())
    base = Baseline(idx, weights, experts, 1, capacity)
    rows = base.dispatch(x)
    # Per expert, its tokens in token order.
    want = torch.cat([x[(idx == e).any(1)] for e in range(experts)])
    assert torch.equal(rows, want)
    # Expert e scales its rows by e + 1; the combine is the weighted sum of each token's experts.
    scale = torch.cat([torch.full(((idx == e).any(1).sum(),), e + 1.0) for e in range(experts)])
    out = base.combine((rows.float() * scale[:, None]).to(torch.bfloat16))
    ref = sum(weights[:, j:j + 1] * ((idx[:, j:j + 1] + 1).float() * x.float()).to(torch.bfloat16).float()
              for j in range(topk))
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    # The padded form moves the same rows, each at (its expert, its place among the expert's rows).
    send = x.new_zeros(experts, capacity, hidden)
    recv, back = torch.empty_like(send), torch.empty_like(send)
    padded = base.padded_dispatch(x, send, recv)
    for e in range(experts):
        n = int((idx == e).any(1).sum())
        assert torch.equal(padded[e, :n], x[(idx == e).any(1)])
    padded_out = (padded.float() * torch.arange(1, experts + 1).float()[:, None, None]).to(torch.bfloat16)
    assert torch.equal(base.padded_combine(padded_out, back), out)
