"""interlace.torch.rendezvous_options: a group's rendezvous set up through torch.distributed's store
(gloo on the CPU here), for the world and for a subgroup; the options start a working Bootstrap."""
import multiprocessing as mp
import socket

import pytest

pytest.importorskip("torch")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, queue):
    try:
        import os
        os.environ["MASTER_ADDR"] = "127.0.0.1"  # rank 0 publishes this host address (loopback only in tests)
        import torch.distributed as dist

        import interlace
        import interlace.torch as itorch
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        got = []
        for group in (None, dist.new_group([0, 2]), None):  # the world, a subgroup, the world again
            if group is not None and rank not in (0, 2):
                continue
            opts = itorch.rendezvous_options(group, timeout_s=30)
            b = interlace.Bootstrap(**opts, timeout_s=30)
            got.append((opts["rank"], opts["world_size"], opts["secret"] != "",
                        [x.decode() for x in b.all_gather(f"r{rank}".encode())]))
            del b
        dist.destroy_process_group()
        queue.put((rank, "ok", got))
    except Exception as e:  # noqa: BLE001 - reported to the test
        queue.put((rank, "error", repr(e)))


def test_rendezvous_through_torch_store_for_world_and_subgroup():
    ctx = mp.get_context("spawn")
    queue, world, port = ctx.Queue(), 3, free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict((r, (status, payload)) for r, status, payload in (queue.get(timeout=120) for _ in range(world)))
    for p in procs:
        p.join(timeout=60)
    for r in range(world):
        assert results[r][0] == "ok", results[r]
    everyone = ["r0", "r1", "r2"]
    assert results[0][1] == [(0, 3, True, everyone), (0, 2, True, ["r0", "r2"]), (0, 3, True, everyone)]
    assert results[1][1] == [(1, 3, True, everyone), (1, 3, True, everyone)]
    assert results[2][1] == [(2, 3, True, everyone), (1, 2, True, ["r0", "r2"]), (2, 3, True, everyone)]
