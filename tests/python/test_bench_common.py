"""The benchmarks' shared timing loop on the CPU (its launches timed by a fake clock): every method
is timed once in every round, the rounds in orders that vary, and the medians are per method."""
import pytest

pytest.importorskip("torch", reason="the benchmarks use torch")

from interlace.bench import common  # noqa: E402


def test_time_interleaved_times_each_method_once_a_round_in_varied_orders(monkeypatch):
    blocks = []

    def fake_time_launches(fn, n):
        label = fn()
        blocks.append(label)
        return [{"a": 1.0, "b": 2.0, "c": 3.0}[label]] * n

    monkeypatch.setattr(common, "time_launches", fake_time_launches)
    fns = {label: (lambda label=label: label) for label in "abc"}
    medians = common.time_interleaved(fns, warmup=0, iters=16, rounds=8)
    rounds = ["".join(blocks[i:i + 3]) for i in range(0, 24, 3)]
    assert all(sorted(r) == list("abc") for r in rounds)
    assert len(set(rounds)) > 2, rounds  # not one order, nor one order's rotations only
    assert {r[0] for r in rounds} == set("abc")
    assert medians == {"a": 1.0, "b": 2.0, "c": 3.0}


def test_time_interleaved_calls_after_block_for_each_block(monkeypatch):
    monkeypatch.setattr(common, "time_launches", lambda fn, n: [float(n)])
    seen = []
    common.time_interleaved({"x": lambda: None, "y": lambda: None}, warmup=1, iters=6, rounds=3,
                            after_block=seen.append)
    assert sorted(seen) == ["x", "x", "x", "y", "y", "y"]
    assert all(sorted(seen[i:i + 2]) == ["x", "y"] for i in (0, 2, 4))
