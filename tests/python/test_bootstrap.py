"""interlace.Bootstrap through the binding, with real processes on loopback."""
import multiprocessing as mp
import socket

import pytest

import interlace


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, secret, timeout_s, die_after_join, queue):
    try:
        b = interlace.Bootstrap(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                                secret=secret, timeout_s=timeout_s)
        if die_after_join:
            import os
            os._exit(0)
        got = b.all_gather(f"rank{rank}".encode() * (rank + 1))
        b.barrier()
        queue.put((rank, "ok", got))
    except interlace.Error as e:
        queue.put((rank, "error", str(e)))


def run(specs, port):
    """specs: [(rank, world, secret, timeout_s, die_after_join)]; returns {rank: (status, payload)}."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, w, port, s, t, d, queue)) for r, w, s, t, d in specs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert not p.is_alive(), "a rank hung"
    results = {}
    while not queue.empty():
        rank, status, payload = queue.get()
        results[rank] = (status, payload)
    return results


def test_all_gather_of_byte_blobs():
    results = run([(r, 3, "s", 10.0, False) for r in range(3)], free_port())
    expected = [b"rank0", b"rank1" * 2, b"rank2" * 3]
    assert results == {r: ("ok", expected) for r in range(3)}


def test_wrong_secret_raises_interlace_error():
    results = run([(0, 2, "good", 2.0, False), (1, 2, "bad", 2.0, False)], free_port())
    assert results[1][0] == "error" and "wrong secret" in results[1][1]
    assert results[0][0] == "error" and "never joined" in results[0][1]


def test_dead_peer_is_named_not_a_hang():
    results = run([(0, 3, "s", 10.0, False), (1, 3, "s", 10.0, True), (2, 3, "s", 10.0, False)], free_port())
    assert "rank 1" in results[0][1] and "closed the connection" in results[0][1]
    assert "aborted by rank 0" in results[2][1]


def test_keyword_only_arguments():
    with pytest.raises(TypeError):
        interlace.Bootstrap(0, 1, "127.0.0.1", 1)
    solo = interlace.Bootstrap(rank=0, world_size=1, master_addr="", master_port=0)
    assert solo.all_gather(b"x") == [b"x"]
