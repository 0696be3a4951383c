"""One rank of an all_gather GPU test scenario (see test_all_gather.py). Exits non-zero on failure."""
import os
import sys

import torch

import interlace
from interlace.bench.launch import expect_error
import interlace.torch as itorch

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

SIZES = [1, 2, 3, 15, 16, 17, 255, 4097, 65536 + 3, 1 << 20, (1 << 20) + 7, (16 << 20) + 5, 256 << 20, 1 << 30]
DTYPES = [torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.float64]


def shard(rank, numel, dtype, seed):
    """Rank `rank`'s input for case `seed`: any rank can recompute it, so the reference needs no
    communication. Random bits, so every element differs from the poison and from its neighbours."""
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + rank)
    raw = torch.randint(-2**31, 2**31 - 1, ((numel * dtype.itemsize + 3) // 4,), generator=g, device="cuda",
                        dtype=torch.int32)
    return raw.view(torch.uint8)[: numel * dtype.itemsize].view(dtype)


def poison(t):
    t.view(torch.uint8).fill_(0xFF)


def expect_equal(out, ref, what):
    a, b = out.view(torch.uint8), ref.view(torch.uint8)
    if not torch.equal(a, b):
        bad = (a != b).nonzero()
        raise AssertionError(f"rank {RANK}: {what}: {bad.numel()} bytes differ, first at byte {bad[0].item()}")


def scenario_sizes():
    group = interlace.init(heap_bytes=(2 * WORLD + 1) * SIZES[-1] + (64 << 20))
    case = 0
    for size in SIZES:
        for dtype in DTYPES if size <= (16 << 20) + 5 else [torch.uint8, torch.bfloat16]:
            numel = max(1, size // dtype.itemsize)
            case += 1
            ref = torch.cat([shard(q, numel, dtype, case) for q in range(WORLD)])
            for symmetric in (True, False):  # symmetric: peers store into out itself, else into the heap
                if symmetric:
                    inp, out = itorch.empty(group, (numel,), dtype), itorch.empty(group, (WORLD * numel,), dtype)
                else:
                    inp = torch.empty(numel, dtype=dtype, device="cuda")
                    out = torch.empty(WORLD * numel, dtype=dtype, device="cuda")
                inp.copy_(shard(RANK, numel, dtype, case))
                poison(out)
                interlace.all_gather(out, inp, group)
                torch.cuda.synchronize()
                group.check()
                expect_equal(out, ref, f"{numel} x {dtype} ({'symmetric' if symmetric else 'staged'})")
                del inp, out
    # A 2-D input into a stacked [world, rows, cols] output, and an out that is not 16-byte aligned.
    x = shard(RANK, 7 * 33, torch.bfloat16, 999).view(7, 33)
    out = torch.empty(WORLD, 7, 33, dtype=torch.bfloat16, device="cuda")
    interlace.all_gather(out, x, group)
    big = torch.empty(WORLD * 1001 + 1, dtype=torch.uint8, device="cuda")
    odd_out = big[1:]
    y = shard(RANK, 1001, torch.uint8, 998)
    interlace.all_gather(odd_out, y, group)
    torch.cuda.synchronize()
    group.check()
    expect_equal(out, torch.stack([shard(q, 7 * 33, torch.bfloat16, 999).view(7, 33) for q in range(WORLD)]), "2-D")
    expect_equal(odd_out, torch.cat([shard(q, 1001, torch.uint8, 998) for q in range(WORLD)]), "unaligned out")
    print(f"rank {RANK}: {case} size/dtype cases correct")


def scenario_frameworks():
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # two processes share the GPUs
    import cupy
    import jax
    import jax.numpy as jnp

    import interlace.cupy as icupy
    import interlace.jax as ijax

    group = interlace.init(heap_bytes=64 << 20)
    n = 12345
    cupy.cuda.Device(group.device).use()
    expected = cupy.arange(WORLD * n, dtype=cupy.float32)
    x = cupy.arange(n, dtype=cupy.float32) + RANK * n
    sym = icupy.empty(group, (n,), "float32")
    sym[:] = x
    for inp in (x, sym):
        out = cupy.full(WORLD * n, cupy.nan, dtype=cupy.float32)
        interlace.all_gather(out, inp, group)
        cupy.cuda.get_current_stream().synchronize()
        assert bool((out == expected).all()), "cupy result wrong"
    del sym

    dev = jax.devices("gpu")[group.device]
    xj = jax.device_put(jnp.full((n, 3), RANK + 1, dtype=jnp.bfloat16), dev)
    yj = ijax.all_gather(xj, group)
    want = jnp.concatenate([jnp.full((n, 3), q + 1, dtype=jnp.bfloat16) for q in range(WORLD)])
    assert yj.shape == (WORLD * n, 3), yj.shape
    assert bool((jax.device_put(yj, dev) == jax.device_put(want, dev)).all()), "jax result wrong"
    group.check()
    print(f"rank {RANK}: cupy and jax arrays correct")


def scenario_graph():
    group = interlace.init(heap_bytes=128 << 20)
    n = (3 << 20) + 5
    # One call storing into a symmetric out, one through the receive buffer into an ordinary out.
    inp = itorch.empty(group, (n,), torch.bfloat16)
    staged_inp = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    out = itorch.empty(group, (WORLD * n,), torch.bfloat16)
    out2 = torch.empty(WORLD * n, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        interlace.all_gather(out, inp, group)  # first call outside capture: cross-rank checks, scratch
        interlace.all_gather(out2, staged_inp, group)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        interlace.all_gather(out, inp, group)
        interlace.all_gather(out2, staged_inp, group)
    for step in range(100):
        inp.copy_(shard(RANK, n, torch.bfloat16, 5000 + step))
        staged_inp.copy_(shard(RANK, n, torch.bfloat16, 7000 + step))
        poison(out)
        poison(out2)
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        expect_equal(out, torch.cat([shard(q, n, torch.bfloat16, 5000 + step) for q in range(WORLD)]), f"replay {step}")
        expect_equal(out2, torch.cat([shard(q, n, torch.bfloat16, 7000 + step) for q in range(WORLD)]), f"replay {step} staged")
    print(f"rank {RANK}: 100 graph replays correct")


def scenario_validation():
    group = interlace.init(heap_bytes=4 << 20)
    n = 1024
    inp = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(WORLD * n, dtype=torch.bfloat16, device="cuda")
    poison(out)
    expect_error(lambda: interlace.all_gather(out, inp.float(), group), "dtype")
    expect_error(lambda: interlace.all_gather(out[:-1], inp, group), "shape")
    expect_error(lambda: interlace.all_gather(out.view(n, WORLD).t(), inp, group), "out must be contiguous")
    strided = torch.ones(n, 2, dtype=torch.bfloat16, device="cuda")[:, 0]
    expect_error(lambda: interlace.all_gather(out, strided, group), "inp must be contiguous")
    expect_error(lambda: interlace.all_gather(out, inp.cpu(), group), "cpu")
    if torch.cuda.device_count() > 1:
        other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
        expect_error(lambda: interlace.all_gather(out, inp.to(f"cuda:{other}"), group), f"cuda:{other}")
    # Heap too small to stage an ordinary input.
    big = torch.ones(8 << 20, dtype=torch.uint8, device="cuda")
    expect_error(lambda: interlace.all_gather(torch.empty(WORLD * (8 << 20), dtype=torch.uint8, device="cuda"), big,
                                              group), "heap is too small")
    # Sizes that differ across ranks: each rank learns of it before any GPU work.
    m = 256 + RANK
    expect_error(lambda: interlace.all_gather(torch.empty(WORLD * m, device="cuda"), torch.ones(m, device="cuda"), group),
                 "different op calls")
    expect_error(lambda: interlace.all_gather(out, out[:n], group), "overlap")
    expect_error(lambda: group.empty((1 << 40,), "float32"), "heap is too small")
    expect_error(lambda: interlace.init(heap_bytes=(4 << 20) + RANK * (2 << 20)), "heap sizes differ across ranks")
    torch.cuda.synchronize()
    assert bool((out.view(torch.int16) == -1).all()), "a failed call wrote into out"
    group.check()
    print(f"rank {RANK}: bad arguments rejected before GPU work")


SCENARIOS = {
    "sizes": scenario_sizes,
    "frameworks": scenario_frameworks,
    "graph": scenario_graph,
    "validation": scenario_validation,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
