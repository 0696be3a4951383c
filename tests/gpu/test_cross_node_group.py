"""The Group's cross-node path on one host (issue 11): 2 ranks, each its own emulated node
(node_name per rank), so the Group maps both heaps in each process and sets up the loopback backend,
FIFO and proxy. Each rank posts writes through its Group's FIFO from the host and checks what lands
in its heap from the other (cross_node_group_worker.py), unthrottled and throttled."""
import os

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "cross_node_group_worker.py")
pytestmark = pytest.mark.gpus(2)


@pytest.mark.parametrize("rate", [0.0, 1e9], ids=["unthrottled", "1GBps"])
def test_writes_posted_through_the_group_land_in_the_peer_heap(rate):
    results = run_ranks([WORKER, repr(rate)], 2, timeout_s=240)
    expect_ranks_passed(results)
    for rc, out in results:
        assert out.rstrip().endswith("ok"), out
