"""One rank of an all_gather-across-nodes scenario (test_all_gather_nodes.py): the ranks of this host
form emulated nodes of GPUS_PER_NODE ranks each (node_name by rank), so shards cross between nodes
through the proxy and the loopback backend, as they would over a NIC, and inside a node over NVLink.
Usage: `python all_gather_nodes_worker.py SCENARIO [GPUS_PER_NODE]` (default 1: every rank its own
node). Exits non-zero on failure."""
import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist

import interlace
import interlace.torch as itorch
from interlace.bench.launch import expect_error

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
GPUS_PER_NODE = int(sys.argv[2]) if len(sys.argv) > 2 else 1
NUM_NODES = WORLD // GPUS_PER_NODE

# Bytes per rank: empty, tiny, not a multiple of 16, around the 1 MiB default chunk, several chunks
# with a tail, and the most chunks (64) with chunks larger than the default.
SIZES = [0, 1, 17, 4097, (1 << 20) - 2, (1 << 20) + 7, (3 << 20) + 5, (64 << 20) + 3, 200 << 20]


def init(rate=0.0, heap_bytes=None):
    return interlace.init(node_name=f"emulated{RANK // GPUS_PER_NODE}", cross_node="loopback",
                          loopback_rate=rate,
                          heap_bytes=heap_bytes or (2 * WORLD + 2) * SIZES[-1] + (64 << 20), timeout_s=60.0)


def shard(rank, numel, dtype, seed):
    """Rank `rank`'s input for case `seed`, random bits any rank can recompute."""
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + rank)
    raw = torch.randint(-2**31, 2**31 - 1, ((numel * dtype.itemsize + 3) // 4,), generator=g, device="cuda",
                        dtype=torch.int32)
    return raw.view(torch.uint8)[: numel * dtype.itemsize].view(dtype)


def poison(t):
    t.view(torch.uint8).fill_(0xFF)


def expect_equal(out, ref, what):
    a, b = out.reshape(-1).view(torch.uint8), ref.reshape(-1).view(torch.uint8)
    if not torch.equal(a, b):
        bad = (a != b).nonzero()
        raise AssertionError(f"rank {RANK}: {what}: {bad.numel()} bytes differ, first at byte {bad[0].item()}")


def outputs(group, numel, dtype):
    """(label, inp, out): a symmetric out (peers' shards land in it) and an ordinary one (they land
    in heap scratch and are copied out)."""
    yield "symmetric", itorch.empty(group, (numel,), dtype), itorch.empty(group, (WORLD * numel,), dtype)
    yield "staged", torch.empty(numel, dtype=dtype, device="cuda"), torch.empty(WORLD * numel, dtype=dtype, device="cuda")


def scenario_sizes():
    """Every size and both kinds of out, against the shards recomputed here, and bitwise against
    NCCL at every size."""
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    group = init()
    assert group.num_nodes == NUM_NODES and group.cross_node == "loopback", (group.num_nodes, group.cross_node)
    case = 0
    for size in SIZES:
        for dtype in (torch.uint8, torch.bfloat16) if size < (64 << 20) else (torch.bfloat16,):
            numel = size // dtype.itemsize
            case += 1
            ref = torch.cat([shard(q, numel, dtype, case) for q in range(WORLD)])
            for label, inp, out in outputs(group, numel, dtype):
                inp.copy_(shard(RANK, numel, dtype, case))
                poison(out)
                interlace.all_gather(out, inp, group)
                torch.cuda.synchronize()
                group.check()
                expect_equal(out, ref, f"{numel} x {dtype} ({label})")
                if numel > 0:
                    nccl = torch.empty_like(out)
                    dist.all_gather_into_tensor(nccl, inp)
                    expect_equal(out, nccl, f"{numel} x {dtype} ({label}) against NCCL")
                del inp, out
    # Small chunks: many requests in flight, tails in every chunk's last vector.
    n = (3 << 20) + 5
    inp = shard(RANK, n, torch.uint8, 77)
    out = torch.empty(WORLD * n, dtype=torch.uint8, device="cuda")
    poison(out)
    interlace.all_gather(out, inp, group, chunk_bytes=64 << 10)
    torch.cuda.synchronize()
    group.check()
    expect_equal(out, torch.cat([shard(q, n, torch.uint8, 77) for q in range(WORLD)]), "64 KiB chunks")
    print(f"rank {RANK}: {case} size/dtype cases and 64 KiB chunks correct, equal to NCCL")
    dist.destroy_process_group()


def scenario_back_to_back():
    """Calls queued without synchronising, from two streams, each into its own out: every flag and
    buffer must be reused only once every rank is done with it."""
    group = init(heap_bytes=512 << 20)
    n = (5 << 20) + 3
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    calls = 12
    inps = [shard(RANK, n, torch.bfloat16, 300 + k) for k in range(calls)]
    outs = [torch.empty(WORLD * n, dtype=torch.bfloat16, device="cuda") for _ in range(calls // 2)]
    sym_outs = [itorch.empty(group, (WORLD * n,), torch.bfloat16) for _ in range(calls // 2)]
    for o in outs + sym_outs:
        poison(o)
    torch.cuda.synchronize()
    for k in range(calls):
        with torch.cuda.stream(streams[k % 2]):
            interlace.all_gather((outs if k % 2 == 0 else sym_outs)[k // 2], inps[k], group)
    torch.cuda.synchronize()
    group.check()
    for k in range(calls):
        expect_equal((outs if k % 2 == 0 else sym_outs)[k // 2],
                     torch.cat([shard(q, n, torch.bfloat16, 300 + k) for q in range(WORLD)]), f"call {k}")
    print(f"rank {RANK}: {calls} back-to-back calls from two streams correct")


def scenario_graph():
    """A captured call replayed with new inputs, into a symmetric and an ordinary out."""
    group = init(heap_bytes=256 << 20)
    n = (3 << 20) + 5
    inp = itorch.empty(group, (n,), torch.bfloat16)
    staged_inp = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    out = itorch.empty(group, (WORLD * n,), torch.bfloat16)
    out2 = torch.empty(WORLD * n, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        interlace.all_gather(out, inp, group)  # first calls outside capture: cross-rank checks, scratch
        interlace.all_gather(out2, staged_inp, group)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        interlace.all_gather(out, inp, group)
        interlace.all_gather(out2, staged_inp, group)
    for step in range(20):
        inp.copy_(shard(RANK, n, torch.bfloat16, 5000 + step))
        staged_inp.copy_(shard(RANK, n, torch.bfloat16, 7000 + step))
        poison(out)
        poison(out2)
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        expect_equal(out, torch.cat([shard(q, n, torch.bfloat16, 5000 + step) for q in range(WORLD)]), f"replay {step}")
        expect_equal(out2, torch.cat([shard(q, n, torch.bfloat16, 7000 + step) for q in range(WORLD)]),
                     f"replay {step} staged")
    print(f"rank {RANK}: 20 graph replays correct")


def scenario_throttled():
    """At 2 GB/s the shard's crossing takes as long as the rate says, and arrives intact."""
    rate = 2e9
    group = init(rate=rate, heap_bytes=256 << 20)
    n = 64 << 20
    inp = shard(RANK, n, torch.uint8, 11)
    out = torch.empty(WORLD * n, dtype=torch.uint8, device="cuda")
    interlace.all_gather(out, inp, group)  # the first call agrees on the signature and grows scratch
    torch.cuda.synchronize()
    poison(out)
    group.barrier()
    start = time.monotonic()
    interlace.all_gather(out, inp, group)
    torch.cuda.synchronize()
    seconds = time.monotonic() - start
    group.check()
    expect_equal(out, torch.cat([shard(q, n, torch.uint8, 11) for q in range(WORLD)]), "throttled")
    floor = (n - (1 << 20)) / rate  # the token bucket lets a burst through ahead of the rate
    assert seconds >= 0.9 * floor, f"rank {RANK}: {seconds:.3f} s, faster than {rate:g} B/s allows ({floor:.3f} s)"
    print(f"rank {RANK}: {n >> 20} MiB per rank at {rate / 1e9:g} GB/s took {seconds * 1e3:.0f} ms "
          f"(the rate allows {floor * 1e3:.0f} ms at least)")


def scenario_validation():
    """Bad arguments raise on every rank before any GPU work, and the group stays usable."""
    group = init(heap_bytes=16 << 20)
    n = 1 << 20
    inp = torch.ones(n, dtype=torch.uint8, device="cuda")
    out = torch.empty(WORLD * n, dtype=torch.uint8, device="cuda")
    poison(out)
    expect_error(lambda: interlace.all_gather(out, inp, group, chunk_bytes=8 << 10), "64")  # 128 chunks; 64 at most
    expect_error(lambda: interlace.all_gather(out, inp, group, chunk_bytes=1000), "multiple of 16")
    expect_error(lambda: interlace.all_gather(out, inp, group, num_blocks=8), "num_blocks")
    expect_error(lambda: interlace.all_gather(out[:-1], inp, group), "shape")
    m = 4096 + RANK  # sizes that differ across ranks
    expect_error(lambda: interlace.all_gather(torch.empty(WORLD * m, dtype=torch.uint8, device="cuda"),
                                              torch.ones(m, dtype=torch.uint8, device="cuda"), group),
                 "different op calls")
    big = torch.ones(8 << 20, dtype=torch.uint8, device="cuda")
    expect_error(lambda: interlace.all_gather(torch.empty(WORLD * (8 << 20), dtype=torch.uint8, device="cuda"), big,
                                              group), "heap is too small")
    torch.cuda.synchronize()
    assert bool((out == 0xFF).all()), "a failed call wrote into out"
    inp = shard(RANK, n, torch.uint8, 5)
    interlace.all_gather(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    expect_equal(out, torch.cat([shard(q, n, torch.uint8, 5) for q in range(WORLD)]), "after the refusals")
    print(f"rank {RANK}: bad arguments rejected before GPU work; the group still works")


def expect_dead_peer_reported(group, call):
    """The last rank dies before calling; `call` (an op call on group) raises on every other rank
    within seconds, naming it. For the reductions' worker too."""
    group.barrier()
    if RANK == WORLD - 1:
        os._exit(0)
    start = time.monotonic()
    text = expect_error(lambda: [call(), torch.cuda.synchronize(), group.check()], f"rank {WORLD - 1}")
    seconds = time.monotonic() - start
    assert seconds < 20, f"rank {RANK}: the dead peer was reported after {seconds:.1f} s"
    print(f"rank {RANK}: dead peer reported after {seconds:.1f} s: {text}")


def scenario_dead_peer():
    group = init(heap_bytes=64 << 20)
    n = 16 << 20
    inp = shard(RANK, n, torch.uint8, 1)
    out = torch.empty(WORLD * n, dtype=torch.uint8, device="cuda")
    interlace.all_gather(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    expect_dead_peer_reported(group, lambda: interlace.all_gather(out, inp, group))


SCENARIOS = {
    "sizes": scenario_sizes,
    "back_to_back": scenario_back_to_back,
    "graph": scenario_graph,
    "throttled": scenario_throttled,
    "validation": scenario_validation,
    "dead_peer": scenario_dead_peer,
}

if __name__ == "__main__":
    faulthandler.dump_traceback_later(100)  # a hang shows where, before the launcher's kill
    SCENARIOS[sys.argv[1]]()
