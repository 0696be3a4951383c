"""all_gather across nodes (issue 11) on one host: each rank is its own emulated node, so every shard
crosses through the proxy FIFO and the loopback backend (all_gather_nodes_worker.py). A host with more
GPUs than ranks per node would also run the relays over NVLink; with one GPU per emulated node, that
part is covered by the CPU tests (tests/cc/hier_all_gather_host_test.cc)."""
import os

import pytest

from interlace.bench.launch import run_ranks, expect_ranks_passed, run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "all_gather_nodes_worker.py")
pytestmark = pytest.mark.gpus(2)


def run(scenario, timeout_s=150):  # below pytest's timeout, so that a hang still shows every rank's output
    return run_scenario(WORKER, scenario, timeout_s=timeout_s)


def test_sizes_against_nccl():
    run("sizes")


def test_back_to_back_calls_on_two_streams():
    run("back_to_back")


def test_cuda_graph_replays_with_changing_inputs():
    run("graph")


def test_throttled_rate_is_honoured():
    run("throttled")


def test_bad_arguments_raise_before_gpu_work():
    run("validation")


def test_dead_peer_raises_within_seconds():
    results = run_ranks([WORKER, "dead_peer"], 2, timeout_s=120)
    expect_ranks_passed(results)
