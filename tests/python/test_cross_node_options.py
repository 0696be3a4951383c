"""interlace.init's cross_node and loopback_rate are checked before anything is made: no rendezvous
(no rank, port or GPU is needed to see the error), and the native _init checks them again first."""
import math
import time

import pytest

import interlace
from interlace import _C


@pytest.mark.parametrize("cross_node", ["auto", "loopback", "rc", "srd", "ibverbs", "efa"])
def test_every_backend_name_is_accepted(cross_node):
    _C._check_cross_node_options(cross_node, 0.0)


@pytest.mark.parametrize("bad", ["", "memory", "nccl", "Loopback"])
def test_an_unknown_backend_raises_before_any_rendezvous(bad):
    start = time.monotonic()
    with pytest.raises(interlace.Error, match=f"cross_node must be 'auto', 'loopback'.*got '{bad}'"):
        interlace.init(rank=0, world_size=2, master_addr="127.0.0.1", master_port=1, cross_node=bad)
    assert time.monotonic() - start < 1.0  # rank 1 was never waited for


@pytest.mark.parametrize("rate", [-1.0, math.nan, math.inf])
def test_a_bad_rate_raises(rate):
    with pytest.raises(interlace.Error, match="loopback_rate must be a number of bytes per second >= 0"):
        interlace.init(rank=0, world_size=2, master_addr="127.0.0.1", master_port=1, cross_node="loopback",
                       loopback_rate=rate)


def test_a_rate_for_a_backend_that_cannot_be_throttled_raises():
    with pytest.raises(interlace.Error, match="throttles only the loopback backend, but cross_node is 'rc'"):
        interlace.init(rank=0, world_size=2, master_addr="127.0.0.1", master_port=1, cross_node="rc",
                       loopback_rate=50e9)


def test_the_native_init_checks_first_too():
    with pytest.raises(interlace.Error, match="got 'bogus'"):
        _C._init(rank=0, world_size=2, master_addr="127.0.0.1", master_port=1, secret="", device=-1,
                 heap_bytes=1 << 20, timeout_s=1.0, heartbeat_timeout_s=1.0, bootstrap_timeout_s=1.0, node_name="",
                 cross_node="bogus", loopback_rate=0.0)
