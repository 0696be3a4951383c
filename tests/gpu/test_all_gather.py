"""all_gather on real GPUs: each test starts one process per GPU running a scenario of
all_gather_worker.py, and fails with every rank's output if any rank fails."""
import os

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "all_gather_worker.py")
pytestmark = pytest.mark.gpus(2)


def world_size():
    import torch
    return torch.cuda.device_count()


def run(scenario, timeout_s=600, world=None):
    results = run_ranks([WORKER, scenario], world or world_size(), timeout_s)
    expect_ranks_passed(results)
    return results


def test_sizes_and_dtypes():
    run("sizes")


def test_torch_cupy_jax_tensors():
    run("frameworks")


def test_cuda_graph_replays_with_changing_inputs():
    run("graph")


def test_bad_arguments_raise_before_gpu_work():
    run("validation")
