"""all_gather on real GPUs: each test starts one process per GPU running a scenario of
all_gather_worker.py, and fails with every rank's output if any rank fails."""
import os

import pytest

from interlace.bench.launch import run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "all_gather_worker.py")
pytestmark = pytest.mark.gpus(2)


def run(scenario, timeout_s=600):
    return run_scenario(WORKER, scenario, timeout_s=timeout_s)


def test_sizes_and_dtypes():
    run("sizes")


def test_torch_cupy_jax_tensors():
    run("frameworks")


def test_cuda_graph_replays_with_changing_inputs():
    run("graph")


def test_bad_arguments_raise_before_gpu_work():
    run("validation")
