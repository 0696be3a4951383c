"""interlace.Bootstrap through the binding, with real processes on loopback."""
import multiprocessing as mp
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

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


def collect(procs, queue):
    """Waits for the processes (a hung one fails the test); returns {rank: (status, payload)}."""
    for p in procs:
        p.join(timeout=60)
        assert not p.is_alive(), "a rank hung"
    results = {}
    while not queue.empty():
        rank, status, payload = queue.get()
        results[rank] = (status, payload)
    return results


def run(specs, port):
    """specs: [(rank, world, secret, timeout_s, die_after_join)]; returns {rank: (status, payload)}."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, w, port, s, t, d, queue)) for r, w, s, t, d in specs]
    for p in procs:
        p.start()
    return collect(procs, queue)


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


def test_empty_secret_is_refused_off_loopback():
    # 192.0.2.1 (TEST-NET-1) is never this host; the check comes before any networking.
    with pytest.raises(interlace.Error, match="not a loopback address.*INTERLACE_SECRET"):
        interlace.Bootstrap(rank=1, world_size=2, master_addr="192.0.2.1", master_port=29500, secret="")


def timed_rank(rank, world, port, queue):
    try:
        start = time.monotonic()
        b = interlace.Bootstrap(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                                secret="s", timeout_s=30.0)
        joined_s = time.monotonic() - start
        b.barrier()
        queue.put((rank, "ok", joined_s))
    except interlace.Error as e:
        queue.put((rank, "error", str(e)))


def connect_when_listening(port, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_strangers_do_not_hold_up_the_rendezvous():
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    root = ctx.Process(target=timed_rank, args=(0, 3, port, queue))
    root.start()
    strangers = [connect_when_listening(port) for _ in range(4)]  # idle: they never say a word
    oversized = connect_when_listening(port)
    oversized.sendall(struct.pack("<IIQ", 0x494C4253, 1, 4 << 30))  # a hello header announcing 4 GiB
    strangers.append(oversized)
    peers = [ctx.Process(target=timed_rank, args=(r, 3, port, queue)) for r in (1, 2)]
    for p in peers:
        p.start()
    results = collect([root] + peers, queue)
    assert {r: status for r, (status, _) in results.items()} == {0: "ok", 1: "ok", 2: "ok"}, results
    # Each stranger may hold a connection for 5 s; a rendezvous that waited on them in turn would take 20.
    assert max(results[1][1], results[2][1]) < 5.0, results
    for s in strangers:
        s.close()


def threaded_rank(rank, world, port, queue):
    try:
        b = interlace.Bootstrap(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                                secret="s", timeout_s=30.0)

        def work(thread):
            # The binding releases the GIL, so these calls overlap; each blob must still arrive whole.
            for i in range(10):
                got = b.all_gather(bytes([65 + 8 * rank + thread]) * (100000 + i))
                for q, blob in enumerate(got):
                    assert 65 + 8 * q <= blob[0] < 65 + 8 * q + 4, f"blob from rank {q} is garbled"
                    assert blob == blob[:1] * len(blob), f"blob from rank {q} is garbled"

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(work, range(4)))
        queue.put((rank, "ok", None))
    except (interlace.Error, AssertionError) as e:
        queue.put((rank, "error", str(e)))


def test_collectives_from_several_threads():
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=threaded_rank, args=(r, 3, port, queue)) for r in range(3)]
    for p in procs:
        p.start()
    assert collect(procs, queue) == {r: ("ok", None) for r in range(3)}
