"""The runtime on real GPUs: faults (slow, dead and aborting peers, timeouts, mismatched and failed
calls), concurrency (streams, graph replays beside eager calls, threads, a GEMM alongside) and exit.
Each test starts one process per GPU running a scenario of runtime_worker.py. Fault scenarios print
FAULT lines; they are collected into faults_<gpus>.json in $INTERLACE_RESULTS_DIR when it is set."""
import json
import os
import re
import time

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "runtime_worker.py")
pytestmark = pytest.mark.gpus(2)


def world_size():
    import torch
    return torch.cuda.device_count()


def record_faults(results):
    out_dir = os.environ.get("INTERLACE_RESULTS_DIR")
    rows = [json.loads(line[len("FAULT "):]) for _, out in results for line in out.splitlines()
            if line.startswith("FAULT ")]
    if not out_dir or not rows:
        return
    import torch
    path = os.path.join(out_dir, f"faults_{world_size()}x{torch.cuda.get_device_name(0).replace(' ', '_')}.json")
    existing = json.load(open(path)) if os.path.exists(path) else []
    with open(path, "w") as f:
        json.dump(existing + rows, f, indent=1)


def run(scenario, ranks_that_must_pass=None, timeout_s=300):
    results = run_ranks([WORKER, scenario], world_size(), timeout_s)
    record_faults(results)
    expect_ranks_passed(results, ranks_that_must_pass)
    return results


@pytest.mark.parametrize("where", ["gpu", "host"])
def test_slow_peer_is_not_an_error(where):
    run(f"slow_peer_{where}")


@pytest.mark.parametrize("when", ["before", "mid_op"])
def test_dead_peer_raises_within_seconds(when):
    run(f"dead_peer_{when}", ranks_that_must_pass=[0], timeout_s=120)


def test_abort_stops_running_and_queued_kernels():
    run("abort")


def test_device_timeout_is_the_last_resort():
    run("timeout")


def test_mismatched_calls_raise():
    run("mismatch")


def test_check_failing_on_one_rank_raises_everywhere():
    run("one_rank_fails")


def test_failures_without_check_keep_calls_paired():
    run("failures_without_check")


def test_streams_graphs_threads_and_a_gemm_alongside():
    run("concurrency")


def test_scratch_growth_after_capture_and_first_calls_inside_capture():
    run("scratch_growth")


def test_process_with_captured_graphs_exits_promptly():
    results = run("graph_exit", timeout_s=120)
    done = time.time()
    stamps = [float(m.group(1)) for _, out in results for m in re.finditer(r"EXITING (\d+\.\d+)", out)]
    assert len(stamps) == len(results)
    assert done - max(stamps) < 15, f"the ranks took {done - max(stamps):.1f} s to exit"
