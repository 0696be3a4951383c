"""The benchmarks' shared timing loop on the CPU (its launches timed by a fake clock): every method
is timed in every round, each round starting one method later, and the medians are per method."""
import pytest

pytest.importorskip("torch", reason="the benchmarks use torch")

from interlace.bench import common  # noqa: E402


def test_time_interleaved_rotates_the_first_method(monkeypatch):
    blocks = []

    def fake_time_launches(fn, n):
        label = fn()
        blocks.append(label)
        return [{"a": 1.0, "b": 2.0, "c": 3.0}[label]] * n

    monkeypatch.setattr(common, "time_launches", fake_time_launches)
    fns = {label: (lambda label=label: label) for label in "abc"}
    medians = common.time_interleaved(fns, warmup=0, iters=8, rounds=4)
    assert blocks == list("abc" "bca" "cab" "abc")
    assert medians == {"a": 1.0, "b": 2.0, "c": 3.0}


def test_time_interleaved_calls_after_block_for_each_block(monkeypatch):
    monkeypatch.setattr(common, "time_launches", lambda fn, n: [float(n)])
    seen = []
    common.time_interleaved({"x": lambda: None, "y": lambda: None}, warmup=1, iters=6, rounds=3,
                            after_block=seen.append)
    assert seen == ["x", "y", "y", "x", "x", "y"]
