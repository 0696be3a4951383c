"""all_gather across nodes (issue 11) on one host, with the host's ranks split into emulated nodes
(all_gather_nodes_worker.py). With one GPU per node every shard crosses through the proxy FIFO and the
loopback backend; with 2 GPUs per node (4 GPUs or more) shards also cross inside a node over NVLink
and are relayed there from the rank that received them (the path of tests/cc/hier_all_gather_host_test.cc
on the CPU)."""
import os

import pytest

from interlace.bench.launch import run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "all_gather_nodes_worker.py")
pytestmark = pytest.mark.gpus(2)


def run(scenario, gpus_per_node, world_size=None, timeout_s=150):
    # 150 s: below pytest's timeout, so that a hang still shows every rank's output.
    return run_scenario(WORKER, scenario, world_size=world_size, timeout_s=timeout_s, args=[gpus_per_node])


def test_sizes_against_nccl(gpus_per_node):
    run("sizes", gpus_per_node)


def test_back_to_back_calls_on_two_streams(gpus_per_node):
    run("back_to_back", gpus_per_node)


def test_cuda_graph_replays_with_changing_inputs(gpus_per_node):
    run("graph", gpus_per_node)


def test_throttled_rate_is_honoured(gpus_per_node):
    run("throttled", gpus_per_node)


def test_bad_arguments_raise_before_gpu_work(gpus_per_node):
    run("validation", gpus_per_node)


def test_dead_peer_raises_within_seconds(gpus_per_node):
    # One node of survivors and one whose last rank dies.
    run("dead_peer", gpus_per_node, world_size=2 * gpus_per_node, timeout_s=120)
