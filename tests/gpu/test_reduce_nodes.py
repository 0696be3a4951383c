"""reduce_scatter and all_reduce across nodes (issue 11) on one host, with the host's ranks split into
emulated nodes of 1 GPU (every rank's contribution crosses through the proxy FIFO and the loopback
backend) or of 2 GPUs on 4 GPUs or more (NVLink inside a node, the proxy between nodes)
(reduce_nodes_worker.py). The results must be what the single-node ops promise: bit for bit the fp32
sum in rank order rounded once (reduce_worker.exact_sum), the same on every rank. Covered: sizes from
empty to several chunks per share in bf16, fp16 and fp32, into ordinary and symmetric outs, all_reduce
in place; calls queued back to back on two streams; CUDA graph replays with new inputs; repeated runs
and ranks giving the same bits; bad arguments refused before any GPU work; a dead peer reported
within seconds. Each test fails with every rank's output if any rank fails."""
import os

import pytest

from interlace.bench.launch import run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "reduce_nodes_worker.py")
pytestmark = pytest.mark.gpus(2)


# 150 s: below pytest's timeout, so that a hang still shows every rank's output.
def run(scenario, gpus_per_node, world_size=None, timeout_s=150):
    return run_scenario(WORKER, scenario, world_size=world_size, timeout_s=timeout_s, args=[gpus_per_node])


def test_sizes_dtypes_and_outs_against_the_exact_sum(gpus_per_node):
    run("sizes", gpus_per_node)


def test_back_to_back_calls_on_two_streams(gpus_per_node):
    run("back_to_back", gpus_per_node)


def test_cuda_graph_replays_with_changing_inputs(gpus_per_node):
    run("graph", gpus_per_node)


def test_bitwise_deterministic_and_equal_on_every_rank(tmp_path, monkeypatch, gpus_per_node):
    # The ranks compare their results through files here (run_ranks passes the environment on).
    monkeypatch.setenv("INTERLACE_TEST_TMP", str(tmp_path))
    run("determinism", gpus_per_node)


def test_bad_arguments_raise_before_gpu_work(gpus_per_node):
    run("validation", gpus_per_node)


def test_dead_peer_raises_within_seconds(gpus_per_node):
    run("dead_peer", gpus_per_node, world_size=2 * gpus_per_node)  # as all_gather's: two nodes, the last rank dies
