"""bench.launch.run_ranks with plain Python ranks (no torch, no GPU): every rank's pipe is drained
while the others run, and a timeout kills every rank still running and says so."""
import os
import sys
import time

import pytest

from interlace.bench.launch import run_ranks, run_scenario

# Rank 1 prints ~10 MB, far more than a pipe holds, then creates `flag`; rank 0 waits for the flag.
CHATTY = """
import os, sys, time
flag = sys.argv[1]
if os.environ["RANK"] == "1":
    line = "x" * 1023 + "\\n"
    for _ in range(10 * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    open(flag, "w").close()
else:
    while not os.path.exists(flag):
        time.sleep(0.01)
    print("rank 0 saw the flag")
"""

HANG = """
import os, sys, time
print("rank", os.environ["RANK"], "started", flush=True)
if os.environ["RANK"] == "0" or sys.argv[1] == "all":
    time.sleep(600)
"""


def script(tmp_path, text):
    path = tmp_path / "rank.py"
    path.write_text(text)
    return str(path)


def test_a_rank_that_prints_a_lot_does_not_deadlock_one_that_waits_for_it(tmp_path):
    start = time.monotonic()
    results = run_ranks([script(tmp_path, CHATTY), str(tmp_path / "flag")], 2, timeout_s=60)
    assert time.monotonic() - start < 30
    assert [rc for rc, _ in results] == [0, 0], results[0][1]
    assert "rank 0 saw the flag" in results[0][1]
    assert len(results[1][1]) == 10 << 20


def test_timeout_kills_every_rank_still_running_and_says_so(tmp_path):
    start = time.monotonic()
    results = run_ranks([script(tmp_path, HANG), "all"], 2, timeout_s=2)
    assert time.monotonic() - start < 20
    for rank, (rc, out) in enumerate(results):
        assert rc != 0
        assert f"rank {rank} started" in out
        assert out.endswith("[launcher] killed after 2 s")


def test_a_rank_that_finished_in_time_is_not_reported_killed(tmp_path):
    results = run_ranks([script(tmp_path, HANG), "rank0"], 2, timeout_s=2)
    assert results[0][0] != 0 and "[launcher] killed" in results[0][1]
    assert results[1] == (0, "rank 1 started\n")


def test_ranks_see_the_launcher_environment(tmp_path):
    show = "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['NCCL_NVLS_ENABLE'], os.environ['EXTRA'])"
    results = run_ranks([script(tmp_path, show)], 3, timeout_s=60, extra_env={"EXTRA": "yes"})
    assert results == [(0, f"{r} 3 0 yes\n") for r in range(3)]


SCENARIO = """
import os, sys
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "ran", sys.argv[1], flush=True)
sys.exit(1 if sys.argv[1] == "fail_on_1" and os.environ["RANK"] == "1" else 0)
"""


def test_run_scenario_returns_every_rank_or_raises_with_every_rank_output(tmp_path):
    worker = script(tmp_path, SCENARIO)
    results = run_scenario(worker, "fine", 3, timeout_s=60)
    assert [rc for rc, _ in results] == [0, 0, 0]
    assert "rank 2 of 3 ran fine" in results[2][1]
    with pytest.raises(AssertionError) as failed:
        run_scenario(worker, "fail_on_1", 2, timeout_s=60)
    assert "rank 0 of 2 ran fail_on_1" in str(failed.value) and "rank 1 exit 1" in str(failed.value)
