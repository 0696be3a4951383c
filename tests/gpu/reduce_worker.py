"""One rank of a reduce_scatter / all_reduce GPU test scenario (see test_reduce_scatter_all_reduce.py).
Exits non-zero on failure, saying which rank, case, element, expected and got.

Every rank can recompute every rank's input (seeded by case and rank), so references need no
communication. Two references: the exact one, the fp32 sum in rank order rounded once (what
interlace promises, so the output must equal it bit for bit), and a float64 sum, which the output
must be within rounding of (it guards the exact reference itself)."""
import os
import sys

import torch

import interlace
from interlace.bench.launch import expect_error
import interlace.torch as itorch

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
MIB = 1 << 20
# all_reduce: elements of the whole message (any count); one-shot ends at 256 KiB.
AR_ELEMENTS = [0, 1, 2, 3, 7, 8, 9, 17, 255, 4097, 65536 + 3, 128 * 1024 - 1, 128 * 1024 + 5, (1 << 20) + 5,
               (3 << 20) + 11]
# reduce_scatter: elements of one rank's block (its bytes a multiple of 16: 8 x 16-bit elements).
RS_BLOCK_ELEMENTS = [0, 8, 16, 24, 8 * 1001, 65536 + 8, 128 * 1024 + 8, (1 << 20) + 8, (3 << 20) + 8]
BIG_BYTES = 64 * MIB  # per rank, bf16 and fp16 only


def inputs_of(rank, numel, dtype, seed):
    """Rank `rank`'s input for case `seed`: normal values scaled by powers of two from 2^-8 to 2^8, so
    that the order of the sum changes its bits (a wrong order shows), and no inf."""
    g = torch.Generator(device="cuda").manual_seed(seed * 1009 + rank)
    x = torch.randn(numel, generator=g, device="cuda", dtype=torch.float32)
    scale = torch.randint(-8, 9, (numel,), generator=g, device="cuda").float().exp2()
    return (x * scale).to(dtype)


def exact_sum(parts, dtype):
    """fp32 sum in rank order, rounded once: bit for bit what interlace computes."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(dtype)


def wide_sum(parts):
    acc = parts[0].double()
    for p in parts[1:]:
        acc = acc + p.double()
    return acc


# One rounding to the dtype: half an ulp, relative for normal results, absolute (half the smallest
# subnormal) near zero.
ROUNDING = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}
SUBNORMAL = {torch.bfloat16: 2.0 ** -134, torch.float16: 2.0 ** -25, torch.float32: 2.0 ** -150}


def describe(i, got, want, parts, wide):
    cells = ", ".join(f"rank {q}: {p[i].item()!r}" for q, p in enumerate(parts))
    return (f"element {i}: got {got[i].item()!r}, expected {want[i].item()!r} (float64 sum {wide[i].item()!r}); "
            f"inputs {cells}")


def expect_sum(out, parts, what):
    """out (flat) must equal the rank-order fp32 sum of parts bit for bit and be within rounding of the
    float64 sum."""
    got = out.reshape(-1)
    want = exact_sum(parts, out.dtype)
    wide = wide_sum(parts)
    a, b = got.view(torch.int16 if got.element_size() == 2 else torch.int32), want.view(
        torch.int16 if want.element_size() == 2 else torch.int32)
    if not torch.equal(a, b):
        bad = (a != b).nonzero().flatten()
        nans = int(got.isnan().sum().item())
        raise AssertionError(f"rank {RANK}: {what}: {bad.numel()} of {got.numel()} elements differ from the rank-order "
                             f"fp32 sum ({nans} NaN: never written?); first {describe(bad[0].item(), got, want, parts, wide)}; "
                             f"last {describe(bad[-1].item(), got, want, parts, wide)}")
    # Within rounding of the float64 sum: half an ulp of the result, plus fp32 error on every partial.
    bound = (wide.abs() * ROUNDING[out.dtype] + sum(p.double().abs() for p in parts) * (len(parts) * 2.0 ** -24)
             + SUBNORMAL[out.dtype])
    err = (got.double() - wide).abs()
    if bool((err > bound).any()):
        i = int((err - bound).argmax().item())
        raise AssertionError(f"rank {RANK}: {what}: further from the float64 sum than rounding allows at "
                             f"{describe(i, got, want, parts, wide)}")


def make_out(group, shape, dtype, symmetric):
    out = itorch.empty(group, shape, dtype) if symmetric else torch.empty(shape, dtype=dtype, device="cuda")
    out.fill_(float("nan"))
    return out


def check_reduce_scatter(group, n, dtype, case, symmetric=False, shape2d=False):
    parts = [inputs_of(q, WORLD * n, dtype, case) for q in range(WORLD)]
    inp = parts[RANK].clone()
    if shape2d and n % 8 == 0 and n > 0:
        inp, out_shape = inp.view(WORLD, n // 8, 8), (n // 8, 8)  # [world, rows, 8] -> [rows, 8]
    else:
        out_shape = (n,)
    out = make_out(group, out_shape, dtype, symmetric)
    interlace.reduce_scatter(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    expect_sum(out, [p[RANK * n:(RANK + 1) * n] for p in parts],
               f"reduce_scatter case {case}: {n} elements per rank, {dtype}, {'symmetric' if symmetric else 'ordinary'} out")
    return out


def check_all_reduce(group, numel, dtype, case, algorithm="auto", mode="ordinary"):
    parts = [inputs_of(q, numel, dtype, case) for q in range(WORLD)]
    if mode == "in_place":
        out = inp = parts[RANK].clone()
    else:
        inp = parts[RANK].clone()
        out = make_out(group, (numel,), dtype, mode == "symmetric")
    interlace.all_reduce(out, inp, group, algorithm=algorithm)
    torch.cuda.synchronize()
    group.check()
    expect_sum(out, parts, f"all_reduce case {case}: {numel} elements, {dtype}, {algorithm}, {mode} out")
    if mode != "in_place":
        assert torch.equal(inp, parts[RANK]), f"rank {RANK}: all_reduce case {case} changed its input"
    return out


def scenario_sizes():
    group = interlace.init(heap_bytes=(4 * WORLD + 4) * BIG_BYTES)
    case = 0
    for dtype in DTYPES:
        for n in RS_BLOCK_ELEMENTS:
            if (n * dtype.itemsize) % 16:
                continue
            for symmetric in (False, True) if n else (False,):  # group.empty of nothing: not a case
                case += 1
                check_reduce_scatter(group, n, dtype, case, symmetric, shape2d=symmetric)
        for numel in AR_ELEMENTS:
            for algorithm in ("auto", "one_shot", "two_shot"):
                for mode in ("ordinary", "symmetric", "in_place") if numel else ("ordinary", "in_place"):
                    case += 1
                    check_all_reduce(group, numel, dtype, case, algorithm, mode)
    for dtype in (torch.bfloat16, torch.float16):  # 64 MiB per rank
        n = BIG_BYTES // dtype.itemsize
        case += 1
        check_reduce_scatter(group, n, dtype, case)
        for algorithm, mode in (("auto", "ordinary"), ("two_shot", "symmetric"), ("one_shot", "in_place")):
            case += 1
            check_all_reduce(group, n, dtype, case, algorithm, mode)
    # A reduce_scatter from a stacked 3-D input, and small tuned splits (many rounds, odd tails).
    for blocks, chunk in ((1, 16), (3, 48), (7, 4096)):
        n = 8 * 1001
        parts = [inputs_of(q, WORLD * n, torch.bfloat16, 900 + blocks) for q in range(WORLD)]
        out = make_out(group, (n,), torch.bfloat16, False)
        interlace.reduce_scatter(out, parts[RANK].clone(), group, num_blocks=blocks, chunk_bytes=chunk)
        ar_out = make_out(group, (WORLD * n + 3,), torch.bfloat16, False)
        ar_parts = [inputs_of(q, WORLD * n + 3, torch.bfloat16, 950 + blocks) for q in range(WORLD)]
        interlace.all_reduce(ar_out, ar_parts[RANK].clone(), group, algorithm="two_shot", num_blocks=blocks,
                             chunk_bytes=chunk)
        torch.cuda.synchronize()
        group.check()
        expect_sum(out, [p[RANK * n:(RANK + 1) * n] for p in parts], f"reduce_scatter {blocks} x {chunk} B")
        expect_sum(ar_out, ar_parts, f"all_reduce two-shot {blocks} x {chunk} B")
    print(f"rank {RANK}: {case} size/dtype/algorithm cases correct")


def gather_bytes(group, t):
    """Every rank's t, as bytes, stacked: [world, nbytes] (through interlace.all_gather)."""
    flat = t.reshape(-1).view(torch.uint8)
    out = torch.empty(WORLD, flat.numel(), dtype=torch.uint8, device="cuda")
    interlace.all_gather(out, flat, group)
    torch.cuda.synchronize()
    return out


def scenario_determinism():
    """Repeated calls give the same bits; all_reduce gives every rank the same bits."""
    group = interlace.init(heap_bytes=512 * MIB)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for numel in (4099, 100_003, (5 << 20) + 1):
            inp = inputs_of(RANK, numel, dtype, 7000 + numel)
            for algorithm in ("one_shot", "two_shot"):
                first = None
                for run in range(5):
                    out = torch.full_like(inp, float("nan"))
                    interlace.all_reduce(out, inp, group, algorithm=algorithm)
                    torch.cuda.synchronize()
                    if first is None:
                        first = out
                    elif not torch.equal(out.view(torch.uint8), first.view(torch.uint8)):
                        raise AssertionError(f"rank {RANK}: all_reduce {algorithm} {numel} x {dtype}: run {run} differs "
                                             "from run 0")
                everyone = gather_bytes(group, first)
                for q in range(WORLD):
                    if not torch.equal(everyone[q], everyone[RANK]):
                        bad = (everyone[q] != everyone[RANK]).nonzero()[0].item()
                        raise AssertionError(f"rank {RANK}: all_reduce {algorithm} {numel} x {dtype}: rank {q}'s "
                                             f"result differs from this rank's, first at byte {bad}")
                if algorithm == "one_shot":
                    one_shot = first
                elif not torch.equal(first.view(torch.uint8), one_shot.view(torch.uint8)):
                    raise AssertionError(f"rank {RANK}: all_reduce {numel} x {dtype}: one-shot and two-shot differ")
            n = numel // 8 * 8
            rs_inp = inputs_of(RANK, WORLD * n, dtype, 8000 + n)
            outs = []
            for run in range(5):
                outs.append(torch.full((n,), float("nan"), dtype=dtype, device="cuda"))
                interlace.reduce_scatter(outs[-1], rs_inp, group)
            torch.cuda.synchronize()
            for run in range(1, 5):
                if not torch.equal(outs[run].view(torch.uint8), outs[0].view(torch.uint8)):
                    raise AssertionError(f"rank {RANK}: reduce_scatter {n} x {dtype}: run {run} differs from run 0")
    group.check()
    print(f"rank {RANK}: repeated runs bitwise equal, all_reduce equal on every rank and for both algorithms")


def scenario_streams():
    """Calls on two streams back to back, nothing synchronizing them but interlace's own ordering."""
    group = interlace.init(heap_bytes=512 * MIB)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    sizes = [(1 << 20) + 3, 5000, (8 << 20) + 1, 77]
    cases = []
    for i, numel in enumerate(sizes * 2):
        parts = [inputs_of(q, numel, torch.bfloat16, 3000 + i) for q in range(WORLD)]
        n = numel // 8 * 8
        rs_parts = [inputs_of(q, WORLD * n, torch.float16, 3500 + i) for q in range(WORLD)]
        cases.append((parts, rs_parts, n))
    torch.cuda.synchronize()
    results = []
    for i, (parts, rs_parts, n) in enumerate(cases):
        s = streams[i % 2]
        with torch.cuda.stream(s):
            inp, rs_inp = parts[RANK].clone(), rs_parts[RANK].clone()
            out = torch.full_like(inp, float("nan"))
            rs_out = torch.full((n,), float("nan"), dtype=torch.float16, device="cuda")
            interlace.all_reduce(out, inp, group)
            interlace.reduce_scatter(rs_out, rs_inp, group)
            interlace.all_reduce(inp, inp, group)  # in place, right after, on the same stream
        results.append((out, rs_out, inp))
    torch.cuda.synchronize()
    group.check()
    for i, ((parts, rs_parts, n), (out, rs_out, in_place)) in enumerate(zip(cases, results)):
        expect_sum(out, parts, f"stream {i % 2} call {i}: all_reduce")
        expect_sum(in_place, parts, f"stream {i % 2} call {i}: all_reduce in place")
        expect_sum(rs_out, [p[RANK * n:(RANK + 1) * n] for p in rs_parts], f"stream {i % 2} call {i}: reduce_scatter")
    print(f"rank {RANK}: {len(cases)} rounds of calls on two streams correct")


def scenario_graph():
    """CUDA graph capture and replay with changing inputs: one-shot, two-shot into an ordinary and a
    symmetric out, in place, and reduce_scatter."""
    group = interlace.init(heap_bytes=512 * MIB)
    small, large, n = 3001, (3 << 20) + 5, (1 << 20) + 8
    inp_small = torch.empty(small, dtype=torch.bfloat16, device="cuda")
    inp_large = torch.empty(large, dtype=torch.float16, device="cuda")
    in_place = torch.empty(large, dtype=torch.bfloat16, device="cuda")
    rs_inp = torch.empty(WORLD * n, dtype=torch.bfloat16, device="cuda")
    out_small = torch.empty_like(inp_small)
    out_large = torch.empty_like(inp_large)
    out_sym = itorch.empty(group, (large,), torch.float16)
    rs_out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()

    def calls():
        interlace.all_reduce(out_small, inp_small, group)              # one-shot
        interlace.all_reduce(out_large, inp_large, group)              # two-shot, landing slots
        interlace.all_reduce(out_sym, inp_large, group)                # two-shot into a symmetric out
        interlace.all_reduce(in_place, in_place, group)                # in place
        interlace.reduce_scatter(rs_out, rs_inp, group)

    with torch.cuda.stream(stream):
        calls()  # first calls outside capture: cross-rank checks, scratch
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        calls()
    for step in range(50):
        seed = 10_000 + 10 * step
        p_small = [inputs_of(q, small, torch.bfloat16, seed) for q in range(WORLD)]
        p_large = [inputs_of(q, large, torch.float16, seed + 1) for q in range(WORLD)]
        p_in_place = [inputs_of(q, large, torch.bfloat16, seed + 2) for q in range(WORLD)]
        p_rs = [inputs_of(q, WORLD * n, torch.bfloat16, seed + 3) for q in range(WORLD)]
        inp_small.copy_(p_small[RANK])
        inp_large.copy_(p_large[RANK])
        in_place.copy_(p_in_place[RANK])
        rs_inp.copy_(p_rs[RANK])
        for t in (out_small, out_large, out_sym, rs_out):
            t.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        expect_sum(out_small, p_small, f"replay {step}: one-shot")
        expect_sum(out_large, p_large, f"replay {step}: two-shot")
        expect_sum(out_sym, p_large, f"replay {step}: two-shot, symmetric out")
        expect_sum(in_place, p_in_place, f"replay {step}: in place")
        expect_sum(rs_out, [p[RANK * n:(RANK + 1) * n] for p in p_rs], f"replay {step}: reduce_scatter")
    print(f"rank {RANK}: 50 graph replays correct")


def scenario_validation():
    group = interlace.init(heap_bytes=16 * MIB)
    n = 1024
    inp = torch.ones(WORLD * n, dtype=torch.bfloat16, device="cuda")
    out = torch.full((n,), float("nan"), dtype=torch.bfloat16, device="cuda")
    ar_out = torch.full((WORLD * n,), float("nan"), dtype=torch.bfloat16, device="cuda")
    rs, ar = interlace.reduce_scatter, interlace.all_reduce
    expect_error(lambda: rs(out, inp.float(), group), "dtype")
    expect_error(lambda: ar(ar_out, inp.half(), group), "dtype")
    expect_error(lambda: rs(out.double(), inp.double(), group), "float16, bfloat16 or float32")
    expect_error(lambda: ar(ar_out.int(), inp.int(), group), "float16, bfloat16 or float32")
    expect_error(lambda: rs(out[:-8], inp, group), "shape")
    expect_error(lambda: ar(ar_out[:-1], inp, group), "shape")
    expect_error(lambda: rs(out, inp.view(n, WORLD).t(), group), "inp must be contiguous")
    expect_error(lambda: ar(ar_out.view(n, WORLD).t(), inp.view(n, WORLD).t().contiguous(), group),
                 "out must be contiguous")
    expect_error(lambda: ar(ar_out, inp.cpu(), group), "cpu")
    if torch.cuda.device_count() > 1:
        other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
        expect_error(lambda: ar(ar_out, inp.to(f"cuda:{other}"), group), f"cuda:{other}")
    expect_error(lambda: ar(ar_out[1:], inp[1:], group), "16-byte aligned")
    expect_error(lambda: rs(torch.empty(3, dtype=torch.bfloat16, device="cuda"),
                            torch.ones(3 * WORLD, dtype=torch.bfloat16, device="cuda"), group), "multiple of 16 bytes")
    expect_error(lambda: rs(inp[:n], inp, group), "overlap")
    expect_error(lambda: ar(inp[8:], inp[:-8], group), "overlap without being the same memory")
    expect_error(lambda: ar(ar_out, inp, group, algorithm="ring"), "algorithm must be one of")
    big = torch.ones(32 << 20, dtype=torch.bfloat16, device="cuda")  # 64 MiB: staging past the heap
    expect_error(lambda: ar(torch.empty_like(big), big, group), "heap is too small")
    expect_error(lambda: rs(torch.empty((32 << 20) // WORLD, dtype=torch.bfloat16, device="cuda"), big, group),
                 "heap is too small")
    # Sizes that differ across ranks: each rank learns of it before any GPU work.
    m = 256 + 8 * RANK
    expect_error(lambda: ar(torch.empty(m, device="cuda"), torch.ones(m, device="cuda"), group), "different op calls")
    expect_error(lambda: rs(torch.empty(m, device="cuda"), torch.ones(WORLD * m, device="cuda"), group),
                 "different op calls")
    torch.cuda.synchronize()
    assert bool(out.isnan().all()) and bool(ar_out.isnan().all()), f"rank {RANK}: a failed call wrote into out"
    group.check()
    # The group is still usable.
    ar(ar_out, inp, group)
    rs(out, inp, group)
    torch.cuda.synchronize()
    group.check()
    assert bool((ar_out == WORLD).all()) and bool((out == WORLD).all()), f"rank {RANK}: calls after errors wrong"
    print(f"rank {RANK}: bad arguments rejected before GPU work; the group still works")


SCENARIOS = {
    "sizes": scenario_sizes,
    "determinism": scenario_determinism,
    "streams": scenario_streams,
    "graph": scenario_graph,
    "validation": scenario_validation,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
