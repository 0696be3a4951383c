"""moe_dispatch and moe_combine on real GPUs: each test starts one process per GPU running a scenario
of moe_worker.py, and fails with every rank's output if any rank fails (a failing rank names the
case and what differed: counts, an expert's rows, a slot's metadata, a combined element). Skips,
saying why, with fewer than 2 GPUs."""
import os

import pytest

from interlace.bench.launch import run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "moe_worker.py")
pytestmark = pytest.mark.gpus(2)


def run(scenario, timeout_s=600):
    return run_scenario(WORKER, scenario, timeout_s=timeout_s)


def test_routing_patterns_against_the_fp32_reference():
    run("patterns")


def test_capacity_overflow_raises_and_drops_add_nothing():
    run("overflow")


def test_two_streams_back_to_back():
    run("streams")


def test_cuda_graph_replays_with_new_routing():
    run("graph")


def test_bad_arguments_raise_before_gpu_work():
    run("validation")


def test_moe_gemm_combine_matches_grouped_gemm_then_combine():
    run("gemm_combine")


def test_moe_dispatch_gemm_matches_dispatch_then_grouped_gemm():
    run("dispatch_gemm")
