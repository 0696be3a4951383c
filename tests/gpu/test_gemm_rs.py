"""gemm_rs (fused GEMM + ReduceScatter) on real GPUs: each test starts two processes (one per GPU)
running a scenario of gemm_rs_worker.py, and fails with every rank's output if any rank fails.

  shapes      34 cases x 5 calls (automatic twice, cooperative 128 and 256 wide, one reducing
              cluster): uneven row blocks (one much smaller, not a multiple of 128 rows, 1 row, a rank
              with none), K_r from 8 to 8192 and split unevenly, N from 3 to 14336 (N not a multiple of
              8 into a padded out), bf16 and fp16, b as [K, N] and as weight.t(); outputs poisoned with
              NaN; out against an fp32 reference of every rank's inputs, the two automatic runs bit
              for bit
  streams     21 calls back to back on two streams, with reduce_scatters among them
  graph       a CUDA graph of three calls replayed 20 times with fresh inputs, eager calls around it
  validation  bad arguments raise interlace.Error on every rank before any GPU work"""
import os

import pytest

from interlace.bench.launch import run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "gemm_rs_worker.py")
pytestmark = pytest.mark.gpus(2)  # runs on every visible GPU


def run(scenario, timeout_s=150):
    return run_scenario(WORKER, scenario, timeout_s=timeout_s)


def test_uneven_blocks_shapes_dtypes_layouts_and_tiles():
    run("shapes", timeout_s=300)


def test_back_to_back_calls_on_two_streams():
    run("streams")


def test_cuda_graph_replays_with_changing_inputs():
    run("graph")


def test_bad_arguments_raise_before_gpu_work():
    run("validation")
