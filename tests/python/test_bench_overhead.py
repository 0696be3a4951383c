"""The host-overhead benchmark's CPU-side parts (python -m interlace.bench overhead runs on GPUs):
the batch timing with a fake clock, the table, and its registration in the bench's command line."""
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the benchmarks use torch")
pytest.importorskip("absl", reason="the benchmarks use absl")

from interlace.bench import overhead  # noqa: E402


class FakeClock:
    """Nanoseconds that advance by `per_call` on every fn() call and by `sync` on every finish()."""

    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def test_time_batches_reports_host_and_wall_per_call():
    clock = FakeClock()
    costs = iter([1000] * 40 + [9000] * 8 + [3000] * 1000)  # ns per call: two warm-up batches cost more
    events = []

    def fn():
        clock.now += next(costs)
        return "result"

    def finish(r):
        assert r == "result"
        events.append("finish")
        clock.now += 20_000  # the GPU catching up: in wall, not in host

    host, wall = overhead.time_batches(fn, calls=8, batches=11, warmup=2, finish=finish,
                                       barrier=lambda: events.append("barrier"), clock=clock)
    # Warm-up batches (first 16 calls at 1 µs) are not counted; the timed ones are 3 µs per call
    # except the first timed batch, partly 1 and 9 µs; the median ignores it.
    assert host == pytest.approx(3.0)
    assert wall == pytest.approx(3.0 + 20.0 / 8)
    assert events == ["barrier", "finish"] * 13


def test_format_table():
    rows = [{"op": "matmul", "path": "torch", "host_us": 6.04}, {"op": "gemm", "path": "api", "host_us": 12.345},
            {"op": "gemm", "path": "jax_jit", "host_us": 30.0}, {"op": "all_reduce", "path": "api", "host_us": 15.0}]
    text = overhead.format_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["host", "us/call", "torch", "api", "jax_jit"]  # only the paths measured, in order
    assert [line.split()[0] for line in lines[1:]] == ["matmul", "gemm", "all_reduce"]  # ops in OPS order
    assert lines[1].split() == ["matmul", "6.0", "-", "-"]
    assert lines[2].split() == ["gemm", "-", "12.3", "30.0"]
    assert len({len(line) for line in lines}) == 1  # aligned columns


def test_registered_with_the_bench_command():
    # In a child process: the command's absl flags and the worker's share names (each runs alone).
    probe = "from interlace.bench import __main__ as m; print(m.OPS['overhead'])"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "('interlace.bench.overhead', True)"
    assert set(overhead.PATHS) >= {"torch", "api", "torch_op", "cupy", "jax_jit", "graph_1", "graph_16"}
