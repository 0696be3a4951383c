"""reduce_scatter and all_reduce on real GPUs: each test starts one process per GPU running a scenario
of reduce_worker.py, and fails with every rank's output if any rank fails (a failing rank names the
case, the element, the expected and the seen value). Skips, saying why, with fewer than 2 GPUs."""
import os

import pytest

from interlace.bench.launch import run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "reduce_worker.py")
pytestmark = pytest.mark.gpus(2)


def run(scenario, timeout_s=600):
    return run_scenario(WORKER, scenario, timeout_s=timeout_s)


def test_sizes_dtypes_algorithms_against_references():
    run("sizes")


def test_bitwise_deterministic_and_equal_on_every_rank():
    run("determinism")


def test_two_streams_back_to_back():
    run("streams")


def test_cuda_graph_replays_with_changing_inputs():
    run("graph")


def test_bad_arguments_raise_before_gpu_work():
    run("validation")
