"""interlace from JAX, one process per GPU, every op under jax.jit.

Each process joins a jax.distributed job and an interlace group, then runs all_gather, gemm,
ag_gemm, reduce_scatter and all_reduce (XLA FFI custom calls on XLA's stream, no copies) in one
jitted step, and checks every result against a jax.lax / jnp reference. Every rank's inputs come
from seeds, so each rank computes the references for the whole group by itself, with no collective.

Start one process per GPU of a host, for example on 2 GPUs:

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/jax_distributed.py &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/jax_distributed.py

or with --rank, --world_size, --local_rank, --master_addr, --master_port (torchrun, mpirun and srun
set the variables too). JAX's coordinator listens on MASTER_PORT, interlace's rendezvous on
MASTER_PORT + 1; off loopback, set INTERLACE_SECRET to the same random string on every rank.

Every process sees every GPU of its host (interlace maps its peers' memory over NVLink, so it must
not be fenced off with CUDA_VISIBLE_DEVICES); JAX is given only this rank's GPU
(jax.distributed.initialize(local_device_ids=[local_rank])), and interlace uses the same one.
Exits non-zero, saying which op and how, if any result is wrong.
"""
import argparse
import os

# interlace's heap and XLA share the GPU; XLA would otherwise take 75% of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import interlace  # noqa: E402
import interlace.jax as ij  # noqa: E402

ROWS, K, N = 256, 512, 768  # each rank's rows of A; A is [world * ROWS, K], the weight [K, N]
REDUCE_ROWS = 512           # rows of each rank's block of the reductions' input, 1024 wide


def parse_args():
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, default=int(env("RANK", "0")))
    p.add_argument("--world_size", type=int, default=int(env("WORLD_SIZE", "1")))
    p.add_argument("--local_rank", type=int, default=None, help="this rank's GPU (default: LOCAL_RANK, else rank)")
    p.add_argument("--master_addr", default=env("MASTER_ADDR", "127.0.0.1"))
    p.add_argument("--master_port", type=int, default=int(env("MASTER_PORT", "29500")))
    p.add_argument("--steps", type=int, default=3, help="jitted steps, each with fresh inputs")
    args = p.parse_args()
    if args.local_rank is None:
        args.local_rank = int(env("LOCAL_RANK", str(args.rank)))
    return args


def inputs(rank, step, world):
    """Rank `rank`'s inputs at `step`, as numpy: the same on whichever rank computes them."""
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((ROWS, K), dtype=np.float32).astype(jnp.bfloat16)
    r = rng.standard_normal((world * REDUCE_ROWS, 1024), dtype=np.float32).astype(jnp.bfloat16)
    return x, r


def weight(step):
    """The weight, the same on every rank (ag_gemm's B; each rank could hold its own columns)."""
    return np.random.default_rng(7 + step).standard_normal((K, N), dtype=np.float32).astype(jnp.bfloat16)


def make_step(group):
    @jax.jit
    def step(x, w, r):
        return {
            "all_gather": ij.all_gather(x, group),
            "gemm": ij.gemm(x, w),
            "ag_gemm": ij.ag_gemm(x, w, group),
            "reduce_scatter": ij.reduce_scatter(r, group),
            "all_reduce": ij.all_reduce(r, group),            # 2 MiB per rank on 2 GPUs: two-shot
            "all_reduce_small": ij.all_reduce(x, group),      # 256 KiB: one-shot
        }
    return step


@jax.jit
def reference_step(xs, w, rs, rank):
    """The same results from every rank's inputs (xs [world, ROWS, K], rs [world, ...]) with jax.lax
    and jnp on this GPU. The reductions are what interlace promises bit for bit: the fp32 sum in rank
    order, rounded once."""
    world = xs.shape[0]
    a = jax.lax.concatenate([xs[q] for q in range(world)], 0)

    def matmul(a, b):  # fp32 accumulation, rounded to bf16 once, as interlace's engine does
        out = jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST,
                                  preferred_element_type=jnp.float32)
        return out.astype(a.dtype)

    def rank_order_sum(parts):
        acc = parts[0].astype(jnp.float32)
        for q in range(1, world):
            acc = acc + parts[q].astype(jnp.float32)
        return acc.astype(parts.dtype)

    total = rank_order_sum(rs)
    block = rs.shape[1] // world
    return {
        "all_gather": a,
        "gemm": matmul(xs[rank], w),
        "ag_gemm": matmul(a, w),
        "reduce_scatter": jax.lax.dynamic_slice_in_dim(total, rank * block, block, 0),
        "all_reduce": total,
        "all_reduce_small": rank_order_sum(xs),
    }


EXACT = ("all_gather", "reduce_scatter", "all_reduce", "all_reduce_small")  # the rest: fp32-accumulated GEMMs


def compare(name, got, want, rank, step):
    """'' if got matches want (bit for bit for the data movers and reductions, else within bf16
    rounding), otherwise what differs."""
    got = np.asarray(jax.device_get(got), dtype=np.float32)
    want = np.asarray(jax.device_get(want), dtype=np.float32)
    if got.shape != want.shape:
        return f"rank {rank} step {step}: {name}: shape {got.shape}, expected {want.shape}"
    if name in EXACT:
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
        if bad.size:
            i = int(bad[0])
            return (f"rank {rank} step {step}: {name}: {bad.size} of {want.size} elements differ, first at flat index "
                    f"{i}: {got.reshape(-1)[i]!r} instead of {want.reshape(-1)[i]!r}")
        return ""
    err = float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30))
    return f"rank {rank} step {step}: {name}: relative error {err:.3g} > 1e-2" if err > 1e-2 else ""


def main():
    args = parse_args()
    jax.distributed.initialize(coordinator_address=f"{args.master_addr}:{args.master_port}",
                               num_processes=args.world_size, process_id=args.rank,
                               local_device_ids=[args.local_rank])
    group = interlace.init(rank=args.rank, world_size=args.world_size, master_addr=args.master_addr,
                           master_port=args.master_port + 1, device=args.local_rank, heap_bytes=256 << 20)
    [device] = jax.local_devices()
    print(f"rank {args.rank}: jax {jax.__version__} on {device} (GPU {device.local_hardware_id}), "
          f"interlace on GPU {group.device}, {jax.process_count()} processes, {len(jax.devices())} devices", flush=True)

    step_fn = make_step(group)
    world, rank = args.world_size, args.rank
    failures = []
    for step in range(args.steps):  # fresh inputs each step, the same compiled executables
        mine = inputs(rank, step, world)
        everyone = [inputs(q, step, world) for q in range(world)]
        w = jax.device_put(weight(step), device)
        out = step_fn(jax.device_put(mine[0], device), w, jax.device_put(mine[1], device))
        xs = jax.device_put(np.stack([e[0] for e in everyone]), device)
        rs = jax.device_put(np.stack([e[1] for e in everyone]), device)
        ref = reference_step(xs, w, rs, rank)
        failures += [f for f in (compare(name, out[name], ref[name], rank, step) for name in ref) if f]
        group.check()  # raises if the group was aborted (a dead rank, mismatched calls, a timeout)
    for f in failures:
        print(f, flush=True)
    if failures:
        raise SystemExit(f"rank {rank}: {len(failures)} wrong results")
    print(f"rank {rank}: all_gather, gemm, ag_gemm, reduce_scatter, all_reduce under jax.jit match the jax.lax "
          f"references ({args.steps} steps)", flush=True)
    del out, ref
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
