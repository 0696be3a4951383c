"""The ring_attention benchmark's baselines on the CPU: what it times must compute ring attention, or
its speedups mean nothing. Over 1, 2 and 3 gloo ranks, the serial and the overlapped ring (fp32 torch
math per block) gathered from every rank must be attention over the whole sequence, causal or not,
with grouped-query heads, for an S that 2W divides and ones that it does not (some chunks a row
longer, so shards differ by a row or two); compute_only must make the ring's attention calls.
Every rank builds the whole sequence, so the reference needs no communication. merge() must be the
softmax over both key sets, and reference() full attention's rows."""
import pytest

torch = pytest.importorskip("torch")

from interlace.bench.launch import run_scenario  # noqa: E402
from interlace.bench.ring_attention_baseline import attend_math, merge, reference  # noqa: E402

WORKER = """
import os
import torch
import torch.distributed as dist
import interlace
from interlace.bench.ring_attention_baseline import attend_math, compute_only, ring_overlapped, ring_serial

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)


def mine(x):
    return interlace.ring_attention_shard(x, rank, world, dim=1)


calls = []


def recording(q, k, v, causal, scale):
    calls.append((q.shape[1], k.shape[1], causal))
    return attend_math(q, k, v, causal, scale)


# S = 2W x 5 + 1: chunk 0 alone a row longer (its first half, which later ranks receive, outgrows
# theirs); + W + 1: rank W-1 holds two long chunks; 2W x 4: even chunks.
for seq in (2 * world * 5 + 1, 2 * world * 5 + world + 1, 2 * world * 4):
    for heads_q, heads_kv in ((4, 2), (2, 2)):
        for causal in (False, True):
            case = (seq, heads_q, heads_kv, causal)
            g = torch.Generator().manual_seed(seq * 10 + heads_kv * 2 + causal)
            q = torch.randn(2, seq, heads_q, 8, generator=g)  # B = 2: a row slice of a block is not contiguous
            k, v = (torch.randn(2, seq, heads_kv, 8, generator=g) for _ in range(2))
            want_out, want_lse = attend_math(q, k, v, causal, 8 ** -0.5)
            for ring in (ring_serial, ring_overlapped):
                calls.clear()
                out, lse = ring(mine(q), mine(k), mine(v), causal, recording, seq_len=seq)
                assert out.dtype == q.dtype and lse.dtype == torch.float32, (case, ring.__name__)
                every = [None] * world
                dist.all_gather_object(every, (out, lse))
                got_out = interlace.ring_attention_unshard(torch.cat([o for o, _ in every], 1), world, dim=1)
                got_lse = interlace.ring_attention_unshard(torch.cat([l for _, l in every], 2), world, dim=2)
                torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=1e-4,
                                           msg=lambda m: f"{case} {ring.__name__} out: {m}")
                torch.testing.assert_close(got_lse, want_lse, rtol=1e-4, atol=1e-4,
                                           msg=lambda m: f"{case} {ring.__name__} lse: {m}")
                # One call per step (causal: the diagonal only at step 0, on square blocks).
                assert len(calls) == world, (case, calls)
                assert [c for _, _, c in calls] == [causal] + [False] * (world - 1), (case, calls)
            ring_calls = list(calls)
            calls.clear()
            compute_only(mine(q), mine(k), mine(v), causal, recording, seq_len=seq)
            if seq % (2 * world) == 0:
                assert calls == ring_calls, (case, calls, ring_calls)
            else:  # a longer shard's block is cut to this rank's own rows
                assert [c for _, _, c in calls] == [c for _, _, c in ring_calls], (case, calls, ring_calls)
                assert all(a == b and 0 <= kb - ka <= 2 for (a, ka, _), (b, kb, _) in zip(calls, ring_calls)), case
dist.destroy_process_group()
print("rank", rank, "of", world, "ring baselines correct")
"""


@pytest.mark.parametrize("world", [1, 2, 3])
def test_baseline_rings_are_attention_over_the_whole_sequence(tmp_path, world):
    worker = tmp_path / "ring_attention_baseline_rank.py"
    worker.write_text(WORKER)
    results = run_scenario(str(worker), "", world, timeout_s=180)
    assert all(f"of {world} ring baselines correct" in out for _, out in results)


def test_merge_is_the_softmax_over_both_key_sets():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 7, 4, 8, generator=g)
    k, v = (torch.randn(2, 11, 2, 8, generator=g) for _ in range(2))
    for scale in (8 ** -0.5, 40.0):  # 40: scores in the hundreds, whose bare exp overflows fp32
        want_out, want_lse = attend_math(q, k, v, False, scale)
        block = attend_math(q, k[:, 5:], v[:, 5:], False, scale)
        out, lse = attend_math(q, k[:, :5], v[:, :5], False, scale)
        merge(out, lse, *block)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(lse, want_lse, rtol=1e-4, atol=1e-4)
        # A block's out in bf16, as cuDNN gives it: accumulated in fp32 all the same.
        out, lse = attend_math(q, k[:, :5], v[:, :5], False, scale)
        merge(out, lse, block[0].to(torch.bfloat16), block[1])
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, want_out, rtol=0, atol=1e-2)
        # Into some rows only (as the ring merges into a shard's second half), through views.
        out, lse = attend_math(q, k[:, :5], v[:, :5], False, scale)
        before = out[:, :3].clone()
        merge(out[:, 3:], lse[:, :, 3:], *attend_math(q[:, 3:], k[:, 5:], v[:, 5:], False, scale))
        torch.testing.assert_close(out[:, 3:], want_out[:, 3:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(lse[:, :, 3:], want_lse[:, :, 3:], rtol=1e-4, atol=1e-4)
        assert torch.equal(out[:, :3], before)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_attention_on_the_given_rows(causal):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 13, 4, 8, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 13, 2, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    want_out, want_lse = attend_math(q, k, v, causal, 0.3)
    rows = torch.tensor([12, 0, 5, 6, 1])
    out, lse = reference(q, k, v, rows, [0, 3], causal, 0.3, block_rows=2)  # blocks of 2: a ragged last one
    torch.testing.assert_close(out, want_out[:, rows][:, :, [0, 3]], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lse, want_lse[:, [0, 3]][:, :, rows], rtol=1e-4, atol=1e-4)
