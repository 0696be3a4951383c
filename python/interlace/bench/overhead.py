"""Host overhead of an eager call from Python, one rank. Started by `python -m interlace.bench overhead`
(one process per GPU; 2 on our machine).

For each op on tiny shapes (the GPU work is microseconds, so the host's share is what shows), the
host's microseconds per call, by path:
  torch, torch_out   torch.matmul(a, b) and torch.matmul(a, b, out=c): the baseline;
  nccl               torch.distributed's all_gather_into_tensor / reduce_scatter_tensor / all_reduce;
  api                interlace.<op>(...) on torch tensors (the plain API, DLPack through to_dlpack);
  torch_op           interlace.torch.<op>(...), the torch.library op returning a new tensor;
  torch_op_out       interlace.torch.<op>(..., out=...), the torch.library _into op;
  cupy               interlace.<op>(...) on cupy arrays (float16: CuPy has no bfloat16), on a
                     non-blocking CuPy stream; for matmul, cupy.matmul;
  jax_jit            a jax.jit function calling interlace.jax.<op> (jnp.matmul for matmul): JAX's
                     dispatch of a compiled executable, the custom call inside it;
  graph_1, graph_16  torch.cuda.CUDAGraph replay of the api call, per call: a graph holding one call,
                     and one holding 16 (the replay's host time divided by 16).

How: per (op, path), `calls` back-to-back calls between two time.perf_counter_ns() readings, the
stream not synchronized inside the loop, then a synchronization; the per-call mean of a batch;
the median over `batches` batches after `warmup` untimed ones. The ranks meet (host barrier) before
each batch so that collectives pair up. A batch is short (32 calls by default) so that the GPU's
launch queue never fills: then the host time is the host's own, not the GPU's pace. wall_us is the
batch including the final synchronization, per call: where it is close to host_us, the GPU kept up
with the host. Reported: the slower rank's median (host_us, wall_us) and rank 0's (host_us_rank0).
A path that fails to set up (a framework missing) is skipped on every rank, with the reason in the
JSON. Writes overhead_<world>x<gpu>.json and prints a table (host µs per call)."""
import os
import statistics
import time

import torch
import torch.distributed as dist
from absl import app, flags

import interlace
import interlace.torch as itorch
from interlace.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_integer("warmup", 3, "untimed batches per (op, path)")
flags.DEFINE_integer("iters", 32, "back-to-back calls per batch")
flags.DEFINE_integer("batches", 40, "timed batches per (op, path); the median batch is reported")
flags.DEFINE_list("sizes", [], "unused by overhead")
flags.DEFINE_list("tunings", [], "unused by overhead")
flags.DEFINE_string("command", "", "")

OPS = ("matmul", "gemm", "all_gather", "ag_gemm", "reduce_scatter", "all_reduce")
PATHS = ("torch", "torch_out", "nccl", "api", "torch_op", "torch_op_out", "cupy", "jax_jit", "graph_1", "graph_16")
ROWS, K, N = 128, 128, 128  # matmul / gemm [ROWS, K] @ [K, N]; ag_gemm shards of ROWS // 2 rows
SMALL = (64, 64)            # all_gather's shard, all_reduce's input, reduce_scatter's output (8 KiB bf16)


def time_batches(fn, calls, batches, warmup, finish=None, barrier=None, clock=time.perf_counter_ns):
    """(median host µs per call, median wall µs per call) over `batches` batches of `calls` back-to-back
    calls of fn, after `warmup` untimed batches. finish(last result) waits for the GPU after each batch
    (outside the host time); barrier() runs before each batch."""
    host, wall = [], []
    for b in range(warmup + batches):
        if barrier is not None:
            barrier()
        t0 = clock()
        for _ in range(calls):
            r = fn()
        t1 = clock()
        if finish is not None:
            finish(r)
        t2 = clock()
        if b >= warmup:
            host.append((t1 - t0) / calls / 1e3)
            wall.append((t2 - t0) / calls / 1e3)
    return statistics.median(host), statistics.median(wall)


def format_table(rows, ops=OPS, paths=PATHS) -> str:
    """rows: [{"op", "path", "host_us", ...}] -> a text table, ops down and paths across, host µs per
    call ('-' where a path does not apply or was skipped)."""
    value = {(r["op"], r["path"]): r["host_us"] for r in rows}
    used = [p for p in paths if any((o, p) in value for o in ops)]
    width = max([len(p) for p in used] + [7])
    lines = [f"{'host us/call':<14}" + "".join(f"{p:>{width + 2}}" for p in used)]
    for o in ops:
        if any((o, p) in value for p in used):
            lines.append(f"{o:<14}" + "".join(f"{value[(o, p)]:>{width + 2}.1f}" if (o, p) in value
                                              else f"{'-':>{width + 2}}" for p in used))
    return "\n".join(lines)


def torch_methods(group, world):
    """{(op, path): make} for torch tensors; make() returns a zero-argument call, already run once."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    a, b, c = torch.randn(ROWS, K, **bf16), torch.randn(K, N, **bf16), torch.empty(ROWS, N, **bf16)
    x = torch.randn(*SMALL, **bf16)
    gathered = torch.empty(world * SMALL[0], SMALL[1], **bf16)
    scatter_in, scattered = torch.randn(world * SMALL[0], SMALL[1], **bf16), torch.empty(*SMALL, **bf16)
    reduced = torch.empty(*SMALL, **bf16)
    shard = torch.randn(ROWS // 2, K, **bf16)
    ag_out = torch.empty(world * (ROWS // 2), N, **bf16)
    api = {
        "gemm": lambda: interlace.gemm(a, b, c),
        "all_gather": lambda: interlace.all_gather(gathered, x, group),
        "ag_gemm": lambda: interlace.ag_gemm(shard, b, ag_out, group),
        "reduce_scatter": lambda: interlace.reduce_scatter(scattered, scatter_in, group),
        "all_reduce": lambda: interlace.all_reduce(reduced, x, group),
    }
    calls = {
        ("matmul", "torch"): lambda: torch.matmul(a, b),
        ("matmul", "torch_out"): lambda: torch.matmul(a, b, out=c),
        ("all_gather", "nccl"): lambda: dist.all_gather_into_tensor(gathered, x),
        ("reduce_scatter", "nccl"): lambda: dist.reduce_scatter_tensor(scattered, scatter_in),
        ("all_reduce", "nccl"): lambda: dist.all_reduce(reduced),
        ("gemm", "torch_op"): lambda: itorch.gemm(a, b),
        ("gemm", "torch_op_out"): lambda: itorch.gemm(a, b, out=c),
        ("all_gather", "torch_op"): lambda: itorch.all_gather(x, group),
        ("all_gather", "torch_op_out"): lambda: itorch.all_gather(x, group, out=gathered),
        ("ag_gemm", "torch_op"): lambda: itorch.ag_gemm(shard, b, group),
        ("ag_gemm", "torch_op_out"): lambda: itorch.ag_gemm(shard, b, group, out=ag_out),
        ("reduce_scatter", "torch_op"): lambda: itorch.reduce_scatter(scatter_in, group),
        ("reduce_scatter", "torch_op_out"): lambda: itorch.reduce_scatter(scatter_in, group, out=scattered),
        ("all_reduce", "torch_op"): lambda: itorch.all_reduce(x, group),
        ("all_reduce", "torch_op_out"): lambda: itorch.all_reduce(x, group, out=reduced),
    }
    calls.update({(op, "api"): fn for op, fn in api.items()})
    makes = {key: (lambda fn=fn: (fn(), fn)[1]) for key, fn in calls.items()}
    graphed = dict(api, matmul=calls[("matmul", "torch_out")])
    for op, fn in graphed.items():
        makes[(op, "graph_1")] = lambda fn=fn: common.graph_of(fn, 1)
        makes[(op, "graph_16")] = lambda fn=fn: common.graph_of(fn, 16)
    return makes


def cupy_methods(group, world):
    """({(op, path): make} for cupy arrays on this rank's GPU, the non-blocking CuPy stream to run
    them on)."""
    import cupy

    cupy.cuda.Device(group.device).use()
    f16 = cupy.float16

    def randn(*shape):
        return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(f16)

    a, b, c = randn(ROWS, K), randn(K, N), cupy.empty((ROWS, N), f16)
    x, gathered = randn(*SMALL), cupy.empty((world * SMALL[0], SMALL[1]), f16)
    scatter_in, scattered, reduced = randn(world * SMALL[0], SMALL[1]), cupy.empty(SMALL, f16), cupy.empty(SMALL, f16)
    shard, ag_out = randn(ROWS // 2, K), cupy.empty((world * (ROWS // 2), N), f16)
    calls = {
        "matmul": lambda: cupy.matmul(a, b),
        "gemm": lambda: interlace.gemm(a, b, c),
        "all_gather": lambda: interlace.all_gather(gathered, x, group),
        "ag_gemm": lambda: interlace.ag_gemm(shard, b, ag_out, group),
        "reduce_scatter": lambda: interlace.reduce_scatter(scattered, scatter_in, group),
        "all_reduce": lambda: interlace.all_reduce(reduced, x, group),
    }
    cupy.cuda.Device(group.device).synchronize()  # the inputs, made on the null stream
    return {(op, "cupy"): (lambda fn=fn: (fn(), fn)[1]) for op, fn in calls.items()}, cupy.cuda.Stream(non_blocking=True)


def jax_methods(group, world):
    """{(op, path): make} of jax.jit functions on this rank's GPU."""
    import jax
    import jax.numpy as jnp

    import interlace.jax as ij

    dev = jax.devices("gpu")[group.device]

    def randn(seed, *shape):
        # Committed to dev (device_put): a jitted call on uncommitted arrays runs on JAX's default
        # device, GPU 0, whichever GPU this rank's group is on.
        with jax.default_device(dev):
            return jax.device_put(jax.random.normal(jax.random.key(seed), shape, jnp.bfloat16), dev)

    a, b, x = randn(1, ROWS, K), randn(2, K, N), randn(3, *SMALL)
    scatter_in, shard = randn(4, world * SMALL[0], SMALL[1]), randn(5, ROWS // 2, K)
    jitted = {
        "matmul": (jax.jit(jnp.matmul), (a, b)),
        "gemm": (jax.jit(ij.gemm), (a, b)),
        "all_gather": (jax.jit(lambda v: ij.all_gather(v, group)), (x,)),
        "ag_gemm": (jax.jit(lambda s, w: ij.ag_gemm(s, w, group)), (shard, b)),
        "reduce_scatter": (jax.jit(lambda v: ij.reduce_scatter(v, group)), (scatter_in,)),
        "all_reduce": (jax.jit(lambda v: ij.all_reduce(v, group)), (x,)),
    }

    def make(f, args):
        jax.block_until_ready(f(*args))  # compiles
        return lambda: f(*args)

    return {(op, "jax_jit"): (lambda f=f, args=args: make(f, args)) for op, (f, args) in jitted.items()}, None


def finish_jax(result):
    import jax
    jax.block_until_ready(result)
    torch.cuda.synchronize()


def finish_torch(_):
    torch.cuda.synchronize()


def main(_):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch and CuPy
    rank, world = common.init_rank()
    group = interlace.init(heap_bytes=64 << 20, timeout_s=60.0)
    common.warm_up_gpu(1.0)
    measured, skipped = {}, {}

    def run(methods, finish):
        for key, make in methods.items():
            fn, reason = common.agreed(make, f"{key[0]} via {key[1]}")
            if fn is None:
                skipped[f"{key[0]}/{key[1]}"] = reason
                continue
            measured[key] = time_batches(fn, FLAGS.iters, FLAGS.batches, FLAGS.warmup, finish, group.barrier)
            if rank == 0:
                print(f"{key[0]:>14} {key[1]:<13} host {measured[key][0]:7.2f} us/call, wall {measured[key][1]:7.2f}",
                      flush=True)

    run(torch_methods(group, world), finish_torch)
    for name, methods_of, finish in (("cupy", cupy_methods, finish_torch), ("jax", jax_methods, finish_jax)):
        try:
            methods, stream = methods_of(group, world)
            why = None
        except Exception as e:  # noqa: BLE001 (a framework missing or broken: skip its path, say why)
            methods, stream, why = {}, None, f"{type(e).__name__}: {e}"[:300]
        if not common.all_ranks(why is None):
            skipped[name] = why or "failed on another rank"
            continue
        if stream is None:
            run(methods, finish)
        else:
            with stream:  # CuPy's current stream: interlace launches on it
                run(methods, finish)
    group.check()

    keys = sorted(measured)
    t = torch.tensor([v for k in keys for v in measured[k]], device="cuda", dtype=torch.float64)
    slowest = t.clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        rows = [{"op": op, "path": path, "host_us": slowest[2 * i].item(), "wall_us": slowest[2 * i + 1].item(),
                 "host_us_rank0": t[2 * i].item()} for i, (op, path) in enumerate(keys)]
        env = common.environment(FLAGS.command)
        payload = {"env": env, "world_size": world, "calls_per_batch": FLAGS.iters,
                   "batches": FLAGS.batches, "warmup_batches": FLAGS.warmup,
                   "shapes": {"matmul_gemm": [ROWS, K, N], "ag_gemm": [ROWS // 2, K, N], "small": list(SMALL),
                              "dtype": "bfloat16 (cupy: float16)"},
                   "rows": rows, "skipped": skipped}
        print(format_table(rows))
        for what, why in skipped.items():
            print(f"skipped {what}: {why}")
        name = f"overhead_{world}x{env['gpu'].replace(' ', '_')}"
        print("wrote", common.write_results(FLAGS.out_dir, name, payload, plot=lambda path: None))
    dist.destroy_process_group()


if __name__ == "__main__":
    app.run(main)
