"""The moe benchmark's baseline on the CPU, over 2 and 3 gloo ranks: what it times must compute the
MoE layer's dispatch and combine, in both its host-driven and its padded (graph-capturable) form, or
its speedups mean nothing. Every rank rebuilds every rank's inputs, so its reference needs no
communication; with more than one rank the all_to_alls and the [source][expert] -> [expert][source]
permutation are not identities, so a swapped split list or permutation fails."""
import pytest

pytest.importorskip("torch")

from interlace.bench.launch import run_scenario  # noqa: E402

WORKER = """
import os, sys
import torch
import torch.distributed as dist
from interlace.bench.moe_baseline import Baseline, routing

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
for T, H, E, k in [(64, 16, 4 * world, 2), (33, 8, 8 * world, 4), (5, 24, 2 * world, 2), (0, 8, 2 * world, 2)]:
    L = E // world

    def inputs(q):
        idx, w = routing(q, T, E, k, seed=5, device="cpu")
        x = torch.randn(T, H, generator=torch.Generator().manual_seed(100 + q)).to(torch.bfloat16)
        return x, idx, w

    every = [inputs(q) for q in range(world)]
    x, idx, w = every[rank]
    pad = max([int(torch.bincount(i.view(-1).long(), minlength=E).max()) for _, i, _ in every if i.numel()] + [1])
    base = Baseline(idx, w, E, world, pad)
    mine = [rank * L + l for l in range(L)]
    # Per local expert, every source's tokens routed to it, source by source, in token order.
    want = torch.cat([xq[(iq == e).any(1)] for e in mine for xq, iq, _ in every])
    rows = base.dispatch(x)
    assert torch.equal(rows, want), (T, H, E, k, "dispatch")
    # Expert e scales its rows by e + 1; each token gets the weighted sum of its experts' outputs.
    scale = torch.cat([torch.full((int((iq == e).any(1).sum()),), e + 1.0) for e in mine for _, iq, _ in every])
    out = base.combine((rows.float() * scale[:, None]).to(torch.bfloat16))
    ref = sum(w[:, j:j + 1] * ((idx[:, j:j + 1] + 1).float() * x.float()).to(torch.bfloat16).float()
              for j in range(k)) if T else torch.zeros(0, H)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    # The padded form: source q's rows for local expert l at [q, l, :n], then the same combine.
    send = x.new_zeros(E, pad, H)
    recv, back = torch.empty_like(send), torch.empty_like(send)
    padded = base.padded_dispatch(x, send, recv).view(world, L, pad, H)
    for l, e in enumerate(mine):
        for q, (xq, iq, _) in enumerate(every):
            sel = xq[(iq == e).any(1)]
            assert torch.equal(padded[q, l, :sel.shape[0]], sel), (T, H, E, k, "padded", q, e)
    factor = torch.tensor([e + 1.0 for e in mine])[None, :, None, None]
    padded_out = (padded.float() * factor).to(torch.bfloat16).view(E, pad, H)
    assert torch.equal(base.padded_combine(padded_out, back), out), (T, H, E, k, "padded combine")
    # The de-duplicated transport: each of this rank's tokens once to each rank holding any of its experts.
    tokens, send, recv = base.unique_transport()
    want_tokens = [t for d in range(world) for t in range(T) if any(int(e) // L == d for e in idx[t])]
    assert tokens.tolist() == want_tokens and sum(send) == len(want_tokens), (T, H, E, k, "unique")
    assert recv == [sum(1 for t in range(T) if any(int(e) // L == rank for e in iq[t])) for _, iq, _ in every]
dist.destroy_process_group()
print("rank", rank, "of", world, "baseline correct")
"""


@pytest.mark.parametrize("world", [2, 3])
def test_baseline_dispatch_and_combine_are_the_moe_layer(tmp_path, world):
    worker = tmp_path / "moe_baseline_rank.py"
    worker.write_text(WORKER)
    results = run_scenario(str(worker), "", world, timeout_s=120)
    assert all(f"of {world} baseline correct" in out for _, out in results)
