"""gemm_ar (fused GEMM + AllReduce) on real GPUs: each test starts two processes (one per GPU) running
a scenario of gemm_ar_worker.py, and fails with every rank's output if any rank fails.

  shapes      gemm_rs_worker's 36 cases (M the sum of their rows) x 5 calls: out against an fp32
              reference of every rank's inputs, bit for bit between two runs and between ranks
  graph       two calls on two streams, then a CUDA graph of both replayed 10 times with fresh inputs
  validation  bad arguments raise interlace.Error on every rank before any GPU work
  abort       calls queued behind a GPU sleep store nothing once rank 0 aborts, and every rank raises"""
import os

import pytest

from interlace.bench.launch import run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "gemm_ar_worker.py")
pytestmark = pytest.mark.gpus(2)  # runs on every visible GPU


def run(scenario, timeout_s=150):
    return run_scenario(WORKER, scenario, timeout_s=timeout_s)


def test_shapes_dtypes_layouts_tiles_and_equal_ranks():
    run("shapes", timeout_s=300)


def test_streams_and_cuda_graph_replays():
    run("graph")


def test_bad_arguments_raise_before_gpu_work():
    run("validation")


def test_abort_stops_queued_calls():
    run("abort")
