"""One rank of a reduce_scatter / all_reduce-across-nodes scenario (test_reduce_nodes.py): the ranks of
this host form emulated nodes of GPUS_PER_NODE ranks each (all_gather_nodes_worker's), so every
rank's contribution reaches the other nodes through the proxy and the loopback backend, as it would
over a NIC, and its own node's ranks over NVLink. Usage: `python reduce_nodes_worker.py SCENARIO
[GPUS_PER_NODE]`. Exits non-zero on failure, saying which rank, case, element, expected and got.

The inputs and references are reduce_worker's (the single-node ops' test): every rank recomputes
every rank's input from (case, rank), and the output must equal exact_sum, the fp32 sum in rank order
rounded once, bit for bit (and be within rounding of the float64 sum). The promise across nodes is
the same as on one node, so the same references hold."""
import faulthandler
import hashlib
import os
import sys

import torch

import interlace
import interlace.torch as itorch
from interlace.bench.launch import expect_error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from all_gather_nodes_worker import GPUS_PER_NODE, NUM_NODES, expect_dead_peer_reported  # noqa: E402
from reduce_worker import RANK, WORLD, expect_sum, inputs_of  # noqa: E402

MIB = 1 << 20
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# A share (reduce_scatter: this rank's block; all_reduce: about 1 / world of the message) goes in
# chunks of 1 MiB or more, at most 64 of them.
# reduce_scatter: elements of one rank's block (its bytes a multiple of 16 in every dtype): empty,
# one vector, three, a thousand and one, less than a chunk, and 2 or 6 whole bf16 chunks followed by
# a last chunk of one vector.
RS_BLOCK_ELEMENTS = [0, 8, 24, 8 * 1001, 65536 + 8, (1 << 20) + 8, (3 << 20) + 8]
# all_reduce: elements of the whole message, any count: fewer elements than ranks, shares of unequal
# length, tails that are not whole vectors, several chunks per share (on 2 ranks); 16 Mi elements
# (32 MiB of bf16) is bf16 only.
AR_ELEMENTS = [0, 1, 7, 9, 4097, 65536 + 3, (1 << 20) + 5, (3 << 20) + 11, 16 << 20]
LARGE = 1 << 20  # element counts from here on run in bf16 only (the other dtypes take the same path)
AR_IN_PLACE = [4097, (3 << 20) + 11]  # one chunk; several chunks (on 2 ranks)


def init(rate=0.0, heap_bytes=None):
    # Scratch across nodes is about 2 x inp for reduce_scatter and 3 x inp for all_reduce; the default
    # covers the sizes scenario's largest calls (a (3 << 20) + 8-element bf16 block from every rank,
    # and 32 MiB of all_reduce) with symmetric outs beside them and room for the holes that scratch
    # growth leaves between them.
    return interlace.init(node_name=f"emulated{RANK // GPUS_PER_NODE}", cross_node="loopback",
                          loopback_rate=rate,
                          heap_bytes=heap_bytes or (32 * WORLD + 512) * MIB, timeout_s=60.0)


def poison(t):
    """NaN in every element (all bits set), so that an element never written shows."""
    t.view(torch.uint8).fill_(0xFF)


def poisoned(t):
    return bool((t.view(torch.uint8) == 0xFF).all())


def make_out(group, shape, dtype, symmetric):
    """A poisoned out: symmetric (in the heap, owners may store straight into it) or ordinary."""
    out = itorch.empty(group, shape, dtype) if symmetric else torch.empty(shape, dtype=dtype, device="cuda")
    poison(out)
    return out


def label(symmetric):
    return "symmetric out" if symmetric else "ordinary out"


def rs_parts(n, dtype, case):
    """Every rank's reduce_scatter input for blocks of n elements."""
    return [inputs_of(q, WORLD * n, dtype, case) for q in range(WORLD)]


def rs_expected(parts, n):
    """What this rank's block of the sum is made of: block RANK of every rank's input."""
    return [p[RANK * n:(RANK + 1) * n] for p in parts]


def check_reduce_scatter(group, n, dtype, case, symmetric):
    parts = rs_parts(n, dtype, case)
    inp = parts[RANK].clone()
    out = make_out(group, (n,), dtype, symmetric)
    interlace.reduce_scatter(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    what = f"reduce_scatter case {case}: {n} elements per rank, {dtype}, {label(symmetric)}"
    expect_sum(out, rs_expected(parts, n), what)
    # The input goes out from a staging copy or straight from inp; either way it must stay as it was.
    assert torch.equal(inp.view(torch.uint8), parts[RANK].view(torch.uint8)), f"rank {RANK}: {what}: changed inp"


def check_all_reduce(group, numel, dtype, case, mode):
    parts = [inputs_of(q, numel, dtype, case) for q in range(WORLD)]
    inp = parts[RANK].clone()
    out = inp if mode == "in place" else make_out(group, (numel,), dtype, mode == "symmetric")
    interlace.all_reduce(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    what = f"all_reduce case {case}: {numel} elements, {dtype}, {mode}"
    expect_sum(out, parts, what)
    if mode != "in place":
        assert torch.equal(inp.view(torch.uint8), parts[RANK].view(torch.uint8)), f"rank {RANK}: {what}: changed inp"


def scenario_sizes():
    """Every size, dtype and kind of out against the exact reference, and all_reduce in place."""
    group = init()
    assert group.num_nodes == NUM_NODES and group.cross_node == "loopback", (group.num_nodes, group.cross_node)
    case = 0
    for dtype in DTYPES:
        for n in RS_BLOCK_ELEMENTS:
            if n >= LARGE and dtype != torch.bfloat16:
                continue
            assert (n * dtype.itemsize) % 16 == 0, n  # the list holds valid blocks only
            for symmetric in (False, True) if n else (False,):  # a symmetric tensor of nothing: not a case
                case += 1
                check_reduce_scatter(group, n, dtype, case, symmetric)
        for numel in AR_ELEMENTS:
            if numel >= LARGE and dtype != torch.bfloat16:
                continue
            for symmetric in (False, True) if numel else (False,):
                case += 1
                check_all_reduce(group, numel, dtype, case, "symmetric" if symmetric else "ordinary")
    # In place, out is inp: a rank's share must be summed from every rank's input before any
    # rank's sum overwrites it.
    for numel in AR_IN_PLACE:
        case += 1
        check_all_reduce(group, numel, torch.bfloat16, case, "in place")
    print(f"rank {RANK}: {case} size/dtype/out cases bitwise equal to the rank-order fp32 sum")


def scenario_back_to_back():
    """Calls queued without synchronising, alternating reduce_scatter and all_reduce, from two streams,
    each into its own out: every flag, chunk and scratch buffer must be reused only once every rank
    is done with it."""
    group = init()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    calls, n, numel = 10, (1 << 20) + 8, (3 << 20) + 11
    cases = []
    for k in range(calls):
        reduce_scatter = k % 2 == 0
        dtype = DTYPES[k % 3]  # changing dtype too: each call's kernel differs from the last
        symmetric = (k // 4) % 2 == 1  # calls 4 to 7: both ops on both streams into symmetric outs
        if reduce_scatter:
            parts = rs_parts(n, dtype, 300 + k)
            out = make_out(group, (n,), dtype, symmetric)
        else:
            parts = [inputs_of(q, numel, dtype, 300 + k) for q in range(WORLD)]
            out = make_out(group, (numel,), dtype, symmetric)
        cases.append((reduce_scatter, parts, parts[RANK].clone(), out, symmetric))
    torch.cuda.synchronize()
    for k, (reduce_scatter, _, inp, out, _) in enumerate(cases):
        # The op alternates every call and the stream every two, so that each op runs on both
        # streams, right after the other op on the same stream and right after a call on the other.
        with torch.cuda.stream(streams[(k // 2) % 2]):
            (interlace.reduce_scatter if reduce_scatter else interlace.all_reduce)(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    for k, (reduce_scatter, parts, _, out, symmetric) in enumerate(cases):
        what = f"call {k} on stream {(k // 2) % 2}: {'reduce_scatter' if reduce_scatter else 'all_reduce'}, " \
               f"{out.dtype}, {label(symmetric)}"
        expect_sum(out, rs_expected(parts, n) if reduce_scatter else parts, what)
    print(f"rank {RANK}: {calls} back-to-back calls from two streams correct")


def scenario_graph():
    """One reduce_scatter and one all_reduce captured in a CUDA graph, replayed with new inputs."""
    group = init()
    n, numel = (1 << 20) + 8, (3 << 20) + 5
    rs_inp = torch.zeros(WORLD * n, dtype=torch.bfloat16, device="cuda")
    ar_inp = torch.zeros(numel, dtype=torch.float16, device="cuda")
    rs_out = itorch.empty(group, (n,), torch.bfloat16)  # one symmetric out, one ordinary
    ar_out = torch.empty(numel, dtype=torch.float16, device="cuda")
    stream = torch.cuda.Stream()

    def calls():
        interlace.reduce_scatter(rs_out, rs_inp, group)
        interlace.all_reduce(ar_out, ar_inp, group)

    with torch.cuda.stream(stream):
        calls()  # first calls outside capture: cross-rank checks, scratch
    torch.cuda.synchronize()
    group.check()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        calls()
    replays = 10
    for step in range(replays):
        seed = 10_000 + 10 * step
        p_rs = rs_parts(n, torch.bfloat16, seed)
        p_ar = [inputs_of(q, numel, torch.float16, seed + 1) for q in range(WORLD)]
        rs_inp.copy_(p_rs[RANK])
        ar_inp.copy_(p_ar[RANK])
        poison(rs_out)
        poison(ar_out)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        expect_sum(rs_out, rs_expected(p_rs, n), f"replay {step}: reduce_scatter (symmetric out)")
        expect_sum(ar_out, p_ar, f"replay {step}: all_reduce (ordinary out)")
    print(f"rank {RANK}: {replays} graph replays correct")


def digest(t):
    return hashlib.sha256(t.reshape(-1).view(torch.uint8).cpu().numpy()).hexdigest()


def read(path):
    with open(path) as f:
        return f.read()


def scenario_determinism():
    """The same all_reduce five times gives the same bits, and every rank gets the same bits. There is
    no torch.distributed here to compare results through: each rank writes a sha256 of its result
    to a file in INTERLACE_TEST_TMP (a directory every rank sees) and reads the others' after a
    barrier."""
    directory = os.environ.get("INTERLACE_TEST_TMP")
    assert directory and os.path.isdir(directory), f"rank {RANK}: INTERLACE_TEST_TMP must name a directory"
    group = init()
    runs, names = 5, []
    for dtype in DTYPES:
        for numel in (4099, (5 << 20) + 1):  # one chunk per share; several with a tail (on 2 ranks)
            name = f"{str(dtype).removeprefix('torch.')}_{numel}"
            inp = inputs_of(RANK, numel, dtype, 7000 + numel)
            first = None
            for run in range(runs):
                out = make_out(group, (numel,), dtype, False)
                interlace.all_reduce(out, inp, group)
                torch.cuda.synchronize()
                group.check()
                if first is None:
                    first = out
                    expect_sum(first, [inputs_of(q, numel, dtype, 7000 + numel) for q in range(WORLD)], name)
                elif not torch.equal(out.view(torch.uint8), first.view(torch.uint8)):
                    bad = (out.view(torch.uint8) != first.view(torch.uint8)).nonzero()[0].item()
                    raise AssertionError(f"rank {RANK}: all_reduce {name}: run {run} differs from run 0, first at "
                                         f"byte {bad}")
            with open(os.path.join(directory, f"{name}.rank{RANK}"), "w") as f:
                f.write(digest(first))
            names.append(name)
    group.barrier()  # every rank's files are written
    for name in names:
        mine = read(os.path.join(directory, f"{name}.rank{RANK}"))
        for q in range(WORLD):
            theirs = read(os.path.join(directory, f"{name}.rank{q}"))
            assert theirs == mine, f"rank {RANK}: all_reduce {name}: rank {q}'s result differs from this rank's"
    print(f"rank {RANK}: {len(names)} all_reduce cases: {runs} runs bitwise equal, the same bits on every rank")


def scenario_validation():
    """Bad arguments raise on every rank before any GPU work (out stays poisoned), and the group stays
    usable."""
    group = init(heap_bytes=16 * MIB)
    n = 1024
    rs_inp = torch.ones(WORLD * n, dtype=torch.bfloat16, device="cuda")
    rs_out = make_out(group, (n,), torch.bfloat16, False)
    ar_inp = torch.ones(WORLD * n, dtype=torch.bfloat16, device="cuda")
    ar_out = make_out(group, (WORLD * n,), torch.bfloat16, False)
    rs, ar = interlace.reduce_scatter, interlace.all_reduce
    expect_error(lambda: rs(rs_out, rs_inp.float(), group), "dtype")
    expect_error(lambda: ar(ar_out, ar_inp.half(), group), "dtype")
    expect_error(lambda: rs(rs_out[:-8], rs_inp, group), "shape")
    expect_error(lambda: ar(ar_out[:-1], ar_inp, group), "shape")
    # 3 bf16 elements per block: 6 bytes.
    expect_error(lambda: rs(torch.empty(3, dtype=torch.bfloat16, device="cuda"),
                            torch.ones(3 * WORLD, dtype=torch.bfloat16, device="cuda"), group), "multiple of 16")
    # Settings the kernel across nodes picks itself.
    expect_error(lambda: rs(rs_out, rs_inp, group, num_blocks=4), "leave them 0")
    expect_error(lambda: ar(ar_out, ar_inp, group, chunk_bytes=1 << 16), "leave them 0")
    expect_error(lambda: ar(ar_out, ar_inp, group, algorithm="one_shot"), "two-shot")
    # Sizes that differ across ranks: each rank learns of it before any GPU work.
    m = 256 + 8 * RANK
    expect_error(lambda: ar(torch.empty(m, device="cuda"), torch.ones(m, device="cuda"), group), "different op calls")
    expect_error(lambda: rs(torch.empty(m, device="cuda"), torch.ones(WORLD * m, device="cuda"), group),
                 "different op calls")
    # Inputs whose scratch (2 or 3 times their bytes) is past the 16 MiB heap: 64 MiB for all_reduce,
    # 32 MiB blocks (a valid block on any number of ranks) for reduce_scatter.
    big = torch.ones(32 << 20, dtype=torch.bfloat16, device="cuda")
    expect_error(lambda: ar(torch.empty_like(big), big, group), "heap is too small")
    block = 16 << 20
    big = torch.ones(WORLD * block, dtype=torch.bfloat16, device="cuda")
    expect_error(lambda: rs(torch.empty(block, dtype=torch.bfloat16, device="cuda"), big, group), "heap is too small")
    del big
    torch.cuda.synchronize()
    assert poisoned(rs_out) and poisoned(ar_out), f"rank {RANK}: a refused call wrote into out"
    group.check()
    # The group is still usable.
    p_rs = rs_parts(n, torch.bfloat16, 50)
    p_ar = [inputs_of(q, WORLD * n, torch.bfloat16, 51) for q in range(WORLD)]
    rs(rs_out, p_rs[RANK].clone(), group)
    ar(ar_out, p_ar[RANK].clone(), group)
    torch.cuda.synchronize()
    group.check()
    expect_sum(rs_out, rs_expected(p_rs, n), "reduce_scatter after the refusals")
    expect_sum(ar_out, p_ar, "all_reduce after the refusals")
    print(f"rank {RANK}: bad arguments rejected before GPU work; the group still works")


def scenario_dead_peer():
    group = init(heap_bytes=128 * MIB)
    numel = 8 << 20  # 16 MiB of bf16: several chunks per share
    parts = [inputs_of(q, numel, torch.bfloat16, 1) for q in range(WORLD)]
    inp = parts[RANK].clone()
    out = torch.empty_like(inp)
    interlace.all_reduce(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    expect_sum(out, parts, "all_reduce before the peer dies")
    expect_dead_peer_reported(group, lambda: interlace.all_reduce(out, inp, group))


SCENARIOS = {
    "sizes": scenario_sizes,
    "back_to_back": scenario_back_to_back,
    "graph": scenario_graph,
    "determinism": scenario_determinism,
    "validation": scenario_validation,
    "dead_peer": scenario_dead_peer,
}

if __name__ == "__main__":
    faulthandler.dump_traceback_later(100)  # a hang shows where, before the launcher's kill
    SCENARIOS[sys.argv[1]]()
