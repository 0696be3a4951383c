"""One rank of a runtime GPU scenario (see test_runtime.py): faults, skew, concurrency, graphs.
Exits non-zero on failure. A scenario that measures a fault prints one line
'FAULT {json}' with the case, what was expected, what happened and the seconds it took."""
import json
import os
import signal
import sys
import threading
import time

import torch

import interlace
import interlace.torch as itorch

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
N = (1 << 20) + 3  # bf16 elements per rank: not a multiple of 16 bytes


def shard(rank, n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + rank)
    return torch.randn(n, generator=g, device="cuda").to(torch.bfloat16)


def gathered(n, seed):
    return torch.cat([shard(q, n, seed) for q in range(WORLD)])


def poisoned(n):
    return torch.full((WORLD * n,), float("nan"), device="cuda", dtype=torch.bfloat16)


def expect(out, ref, what):
    if not torch.equal(out.view(torch.int16), ref.view(torch.int16)):
        bad = (out.view(torch.int16) != ref.view(torch.int16)).nonzero()
        raise AssertionError(f"rank {RANK}: {what}: {bad.numel()} elements wrong, first at {bad[0].item()}")


def report(case, expected, happened, seconds):
    print("FAULT " + json.dumps({"case": case, "rank": RANK, "expected": expected, "happened": happened,
                                 "seconds": round(seconds, 3)}), flush=True)


def gpu_sleep(seconds):
    rate_khz = torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate
    torch.cuda._sleep(int(seconds * rate_khz * 1000))


def raises(fn):
    try:
        fn()
    except interlace.Error as e:
        return str(e)
    return None


def good_call(group, seed=1, n=N):
    inp, out = shard(RANK, n, seed), poisoned(n)
    interlace.all_gather(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    expect(out, gathered(n, seed), f"all_gather seed {seed}")


def scenario_slow_peer(where):
    group = interlace.init(heap_bytes=64 << 20)
    good_call(group)  # agreed once: the slow call below is a cached signature, waited for on the GPU
    start = time.monotonic()
    inp, out = shard(RANK, N, 2), poisoned(N)
    if RANK == 1:
        if where == "gpu":
            gpu_sleep(30)
        else:
            time.sleep(30)
    interlace.all_gather(out, inp, group)
    torch.cuda.synchronize()
    error = raises(group.check)
    took = time.monotonic() - start
    expect(out, gathered(N, 2), "slow peer")
    report(f"slow peer ({where}, rank 1 sleeps 30 s)", "completes correctly, no error",
           "completed correctly" if error is None else f"error: {error}", took)
    assert error is None, error
    group.barrier()


def scenario_dead_peer(when):
    group = interlace.init(heap_bytes=1 << 30)
    good_call(group)
    big = 64 << 20  # bf16 elements per rank: 128 MiB, about 0.4 ms per call
    inp = shard(RANK, big, 3)
    outs = [itorch.empty(group, (WORLD * big,), torch.bfloat16) for _ in range(2)]
    interlace.all_gather(outs[0], inp, group)  # the call's signature is known on every rank now
    torch.cuda.synchronize()
    group.barrier()
    if RANK == 1 and when == "before":
        os._exit(0)  # no clean-up, like a crash
    start = time.monotonic()
    error = None
    for i in range(400):  # ~160 ms of transfers queued back to back: rank 1 dies in the middle of them
        error = raises(lambda: interlace.all_gather(outs[i % 2], inp, group))
        if error:
            break
    if RANK == 1:
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    if RANK != 0:
        time.sleep(60)
        return
    if error is None:
        torch.cuda.synchronize()
        error = raises(group.check)
    took = time.monotonic() - start
    ok = torch.ones(1000, device="cuda").sum().item() == 1000.0  # the GPU is still usable
    report(f"dead peer ({'exits before the op' if when == 'before' else 'killed while data moves'})",
           "every other rank raises within 10 s naming rank 1 and the op; its GPU stays usable",
           f"{'GPU usable' if ok else 'GPU NOT usable'}; error: {error}", took)
    assert error and "rank 1" in error and ("all_gather" in error or when == "before"), error
    assert took < 10, took
    assert ok
    assert raises(lambda: interlace.all_gather(outs[0], inp, group)), "a later call must raise too"


def scenario_abort():
    group = interlace.init(heap_bytes=64 << 20)
    sym_out = itorch.empty(group, (WORLD * N,), torch.bfloat16)
    inp = shard(RANK, N, 4)
    interlace.all_gather(sym_out, inp, group)
    graph_out = itorch.empty(group, (WORLD * N,), torch.bfloat16)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        interlace.all_gather(graph_out, inp, group)
    torch.cuda.synchronize()
    sym_out.view(torch.int16).fill_(-1)
    graph_out.view(torch.int16).fill_(-1)  # capture ran nothing
    torch.cuda.synchronize()
    group.barrier()
    # Both ranks queue matching launches behind a GPU sleep: without the abort they would pair up and
    # store into each other; the abort comes while they wait.
    gpu_sleep(3)
    for _ in range(3):
        interlace.all_gather(sym_out, inp, group)
    group.barrier()
    start = time.monotonic()
    if RANK == 0:
        group.abort("test: rank 0 aborts")
    group.barrier()
    graph.replay()  # a replay after the abort, on every rank
    torch.cuda.synchronize()
    error = raises(group.check)
    took = time.monotonic() - start
    group.barrier()
    untouched = bool((sym_out.view(torch.int16) == -1).all()) and bool((graph_out.view(torch.int16) == -1).all())
    report("group.abort() on rank 0 while matching launches are queued on every rank, then a graph replay",
           "every rank raises naming the abort; queued launches and the graph store nothing",
           f"{'nothing stored' if untouched else 'STORES HAPPENED'}; error: {error}", took)
    assert error and "rank 0 aborts" in error, error
    assert untouched, "a kernel stored after the abort"
    assert raises(lambda: interlace.all_gather(sym_out, inp, group)), "later calls raise"


def scenario_timeout():
    group = interlace.init(heap_bytes=64 << 20, timeout_s=2.0)
    good_call(group)
    if RANK == 1:
        group.barrier()  # alive, but never calls all_gather again
        return
    start = time.monotonic()
    inp, out = shard(RANK, N, 5), poisoned(N)
    interlace.all_gather(out, inp, group)
    torch.cuda.synchronize()
    error = raises(group.check)
    took = time.monotonic() - start
    report("peer alive but never calls (device timeout 2 s)", "raises after about 2 s naming the op and flag",
           f"error: {error}", took)
    assert error and "all_gather" in error and "timed out" in error and "'hello'" in error, error
    assert took < 2.0 + 5.0, took
    assert raises(lambda: interlace.all_gather(out, inp, group))
    group.barrier()


def scenario_mismatch():
    group = interlace.init(heap_bytes=64 << 20)
    good_call(group)
    # New signatures that differ: every rank raises before GPU work and the group stays usable.
    n = 1000 + RANK
    start = time.monotonic()
    error = raises(lambda: interlace.all_gather(poisoned(n), shard(RANK, n, 6), group))
    took = time.monotonic() - start
    report("arguments differ across ranks (first call)", "every rank raises at once; the group stays usable",
           f"error: {error}", took)
    assert error and "different op calls" in error, error
    good_call(group, seed=7)
    # Known signatures in a different order: the group aborts, no garbage.
    a, b = 2000, 3000
    good_call(group, 8, a)
    good_call(group, 9, b)
    order = (a, b) if RANK == 0 else (b, a)
    start = time.monotonic()
    outs = [poisoned(n) for n in order]
    error = None
    for n, out in zip(order, outs):
        error = error or raises(lambda: interlace.all_gather(out, shard(RANK, n, 10), group))
    torch.cuda.synchronize()
    error = error or raises(group.check)
    took = time.monotonic() - start
    report("ranks call known ops in a different order", "every rank raises within seconds, no garbage",
           f"error: {error}", took)
    assert error and ("different" in error or "another op" in error), error
    for n, out in zip(order, outs):
        assert not bool((out.view(torch.int16) != poisoned(n).view(torch.int16)).any()) or \
            torch.equal(out.view(torch.int16), gathered(n, 10).view(torch.int16)), "garbage written"
    group.barrier()


def scenario_one_rank_fails():
    group = interlace.init(heap_bytes=64 << 20)
    good_call(group)
    for cached in (True, False):
        n = N if cached else 4321
        inp, out = shard(RANK, n, 11), poisoned(n)
        bad = inp.float() if RANK == 1 else inp  # rank 1's call fails its dtype check
        start = time.monotonic()
        error = raises(lambda: interlace.all_gather(out, bad, group))
        if error is None:
            torch.cuda.synchronize()
            error = raises(group.check)
        took = time.monotonic() - start
        report(f"argument check fails on rank 1 only ({'known' if cached else 'new'} signature)",
               "every rank raises within seconds; the group stays usable", f"error: {error}", took)
        assert error and "dtype" in error, error
        assert took < 10, took
        assert bool(out.isnan().all()), "a skipped call wrote into out"
        good_call(group, seed=12)  # still usable
    group.barrier()


def scenario_failures_without_check():
    """The review's paths: a failed call followed at once by another call (no check() in between),
    a rank that never makes a first-time call, and a stream of another GPU on one rank."""
    group = interlace.init(heap_bytes=64 << 20, timeout_s=3.0)
    good_call(group)
    # 1. Rank 1's checks fail; both ranks go straight on. The calls stay paired: the third is right.
    inp = shard(RANK, N, 40)
    out = poisoned(N)
    bad = inp.float() if RANK == 1 else inp
    errors = [raises(lambda: interlace.all_gather(out, bad, group))]
    out2 = poisoned(N)
    errors.append(raises(lambda: interlace.all_gather(out2, shard(RANK, N, 41), group)))
    torch.cuda.synchronize()
    errors.append(raises(group.check))
    assert any(e and "dtype" in e for e in errors), errors
    good_call(group, seed=42)
    expect(out2, gathered(N, 41), "the call after a failed one")  # issued on every rank, paired right
    # 2. A stream of the other GPU on rank 1: it fails its checks there; the group stays usable.
    other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
    stream = torch.cuda.Stream(device=other) if RANK == 1 else torch.cuda.current_stream()
    out = poisoned(N)
    error = raises(lambda: interlace.all_gather(out, shard(RANK, N, 43), group, stream=stream.cuda_stream))
    torch.cuda.synchronize()
    error = error or raises(group.check)
    assert error and "stream" in error, error
    good_call(group, seed=44)
    # 3. Rank 1 never makes a first-time call: rank 0 raises within the timeout, naming rank 1.
    start = time.monotonic()
    if RANK == 0:
        error = raises(lambda: interlace.all_gather(poisoned(777), shard(RANK, 777, 45), group))
        took = time.monotonic() - start
        report("a peer never makes a first-time call (timeout 3 s)", "raises within the timeout naming the rank",
               f"error: {error}", took)
        assert error and "never made by rank(s) 1" in error, error
        assert took < 3 + 5, took
    else:
        time.sleep(6)
    group.barrier()
    print(f"rank {RANK}: failures without check() handled")


def scenario_concurrency():
    group = interlace.init(heap_bytes=256 << 20)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    inputs = [shard(RANK, N, 100 + i) for i in range(40)]
    sym_outs = [itorch.empty(group, (WORLD * N,), torch.bfloat16) for _ in range(2)]
    outs = [poisoned(N) for _ in range(40)]
    torch.cuda.synchronize()
    # Back to back, alternating streams, no synchronization in between; skew on rank 1.
    for i in range(40):
        if RANK == 1 and i % 10 == 0:
            time.sleep(0.05)
        with torch.cuda.stream(s1 if i % 2 == 0 else s2):
            if i == 0:  # the inputs were made on the default stream
                torch.cuda.current_stream().wait_stream(torch.cuda.default_stream())
            interlace.all_gather(outs[i], inputs[i], group)
    torch.cuda.synchronize()
    group.check()
    for i in range(40):
        expect(outs[i], gathered(N, 100 + i), f"two streams, call {i}")
    # A graph replay on one stream beside eager calls on another.
    g_inp = shard(RANK, N, 200)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s1):
        interlace.all_gather(sym_outs[0], g_inp, group)
    for i in range(20):
        sym_outs[0].view(torch.int16).fill_(-1)
        outs[i].fill_(float("nan"))
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            graph.replay()
        with torch.cuda.stream(s2):
            interlace.all_gather(outs[i], inputs[i], group)
        torch.cuda.synchronize()
        group.check()
        expect(sym_outs[0], gathered(N, 200), f"graph replay {i}")
        expect(outs[i], gathered(N, 100 + i), f"eager beside replay {i}")
    # Two host threads issuing on one group (same inputs, so any pairing of calls across ranks is right).
    errors = []

    def work(k):
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                for j in range(10):
                    interlace.all_gather(outs[k * 10 + j], inputs[0], group)
                torch.cuda.current_stream().synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    group.check()
    for i in range(20):
        expect(outs[i], gathered(N, 100), f"thread call {i}")
    # all_gather beside a long GEMM on another stream of this GPU (which holds most SMs for a while).
    a = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    out = poisoned(N)
    with torch.cuda.stream(s2):
        for _ in range(4):
            a @ a
    with torch.cuda.stream(s1):
        interlace.all_gather(out, inputs[1], group)
    torch.cuda.synchronize()
    group.check()
    expect(out, gathered(N, 101), "beside a GEMM")
    # Called while another GPU is current: the call runs on the group's GPU and leaves the caller's current.
    mine = torch.cuda.current_device()
    other = (mine + 1) % torch.cuda.device_count()
    out = poisoned(N)
    torch.cuda.set_device(other)
    interlace.all_gather(out, inputs[2], group)
    assert torch.cuda.current_device() == other, "all_gather changed the current device"
    torch.cuda.set_device(mine)
    torch.cuda.synchronize()
    expect(out, gathered(N, 102), "called with another GPU current")
    print(f"rank {RANK}: concurrency cases correct")
    group.barrier()


def scenario_scratch_growth():
    """A graph captured with a staged all_gather keeps its receive buffer when a larger eager call
    grows the scratch; a gemm's first call for a new shape is captured too."""
    group = interlace.init(heap_bytes=256 << 20)
    small, big = 4099, (8 << 20) + 1
    g_inp, g_out = shard(RANK, small, 20), poisoned(small)
    stream = torch.cuda.Stream()
    a = torch.randn(333, 264, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(264, 520, device="cuda", dtype=torch.bfloat16)
    c = torch.full((333, 520), float("nan"), device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # first calls of both, inside the capture
        interlace.all_gather(g_out, g_inp, group)
        interlace.gemm(a, b, c)
    e_inp, e_out = shard(RANK, big, 21), poisoned(big)
    interlace.all_gather(e_out, e_inp, group)  # grows the scratch past the captured block
    torch.cuda.synchronize()
    for step in range(3):
        g_inp.copy_(shard(RANK, small, 30 + step))
        a.copy_(torch.randn_like(a))
        g_out.fill_(float("nan"))
        c.fill_(float("nan"))
        graph.replay()
        interlace.all_gather(e_out, e_inp, group)
        torch.cuda.synchronize()
        group.check()
        expect(g_out, gathered(small, 30 + step), f"replay {step} after growth")
        expect(e_out, gathered(big, 21), f"eager {step} after growth")
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"captured gemm: relative error {err}"
    print(f"rank {RANK}: scratch growth after capture correct")
    group.barrier()


def scenario_graph_exit():
    """Captures graphs of interlace and NCCL ops, replays them, and exits: the test times the exit."""
    import torch.distributed as dist
    group = interlace.init(heap_bytes=64 << 20)
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    inp, out = shard(RANK, N, 13), poisoned(N)
    t = torch.ones(1024, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        interlace.all_gather(out, inp, group)
        dist.all_reduce(t)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        interlace.all_gather(out, inp, group)
        dist.all_reduce(t)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    group.check()
    expect(out, gathered(N, 13), "graph with NCCL")
    print(f"rank {RANK}: EXITING {time.time():.3f}", flush=True)


SCENARIOS = {
    "slow_peer_gpu": lambda: scenario_slow_peer("gpu"),
    "slow_peer_host": lambda: scenario_slow_peer("host"),
    "dead_peer_before": lambda: scenario_dead_peer("before"),
    "dead_peer_mid_op": lambda: scenario_dead_peer("mid"),
    "abort": scenario_abort,
    "timeout": scenario_timeout,
    "mismatch": scenario_mismatch,
    "one_rank_fails": scenario_one_rank_fails,
    "failures_without_check": scenario_failures_without_check,
    "concurrency": scenario_concurrency,
    "scratch_growth": scenario_scratch_growth,
    "graph_exit": scenario_graph_exit,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
