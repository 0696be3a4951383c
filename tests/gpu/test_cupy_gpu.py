"""interlace on CuPy arrays and streams, one process per GPU (cupy_worker.py): all_gather, gemm,
ag_gemm, reduce_scatter and all_reduce under a non-default cupy.cuda.Stream (taken as the current
stream), with stream= an explicit one, and captured into a CuPy CUDA graph; against CuPy references
(the data movers and reductions bit for bit). Skips, saying why, where CuPy is missing; on failure
prints every rank's output."""
import os

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "cupy_worker.py")
pytestmark = pytest.mark.gpus(2)


def cupy_or_skip():
    try:
        import cupy
    except ImportError as e:  # CuPy is optional: interlace works without it
        pytest.skip(f"cupy is not installed: {e}")
    return cupy


def run(scenario, timeout_s=300):
    return expect_ranks_passed(run_ranks([WORKER, scenario], 2, timeout_s))


def test_cupy_streams():
    cupy_or_skip()
    report = run("streams")
    assert report.count("ops with an explicit stream= correct") == 2, report


def test_cupy_graph_capture():
    cupy = cupy_or_skip()
    if not hasattr(cupy.cuda.Stream, "begin_capture"):
        pytest.skip(f"cupy {cupy.__version__} has no stream capture (cupy.cuda.Stream.begin_capture)")
    report = run("graph")
    assert report.count("replay correctly") == 2, report
