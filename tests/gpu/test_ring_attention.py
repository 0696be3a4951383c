"""ring_attention on real GPUs: each test starts two processes (one per GPU) running a scenario of
ring_attention_worker.py, and fails with every rank's output if any rank fails.

  shapes      21 cases x 2 calls: global S from 0 to 8192 (empty, shorter than 2W, not a multiple of 2W,
              chunks not a multiple of the tile), batch 1, 2 and 3, GQA 1, 2, 4 and 8, D 64 and 128,
              causal and not, bf16 and fp16; out and lse poisoned, against fp32 attention over the
              whole sequence; the second call bit for bit the first
  stale_scratch  the heap scratch filled with NaN by an all_reduce before calls whose shards differ in
              length: slot rows no block fills are never read
  streams     calls back to back on two streams, all_reduces among them
  graph       a CUDA graph of two calls replayed with fresh inputs, eager calls around it
  validation  bad arguments, and arguments that differ across ranks, raise on every rank before any
              GPU work; the group stays usable"""
import os

import pytest

from interlace.bench.launch import run_scenario

WORKER = os.path.join(os.path.dirname(__file__), "ring_attention_worker.py")
pytestmark = pytest.mark.gpus(2)  # runs on every visible GPU


def run(scenario, timeout_s=150):
    return run_scenario(WORKER, scenario, timeout_s=timeout_s)


def test_shapes_against_fp32_attention_over_the_whole_sequence():
    run("shapes", timeout_s=300)


def test_sender_cta_counts_give_the_same_bits():
    run("senders")


def test_slot_rows_no_block_fills_are_never_read():
    run("stale_scratch")


def test_back_to_back_calls_on_two_streams():
    run("streams")


def test_cuda_graph_replays_with_changing_inputs():
    run("graph")


def test_bad_arguments_raise_before_gpu_work():
    run("validation")
