"""reduce_scatter and all_reduce across nodes, one rank. Started by `python -m interlace.bench
reduce_nodes`.

Every rank is its own emulated node on this host (node_name per rank), as in all_gather_nodes: each
partial crosses between ranks through the proxy FIFO and the loopback backend, unthrottled and
throttled to a NIC's rate (--rate, default 50 GB/s). For each size: check both ops bit for bit
against the fp32 sum in rank order, then time, in the same run, interlace at both rates and NCCL's
reduce_scatter_tensor / all_reduce, which on one host run over NVLink: a reference for scale, not a
network baseline. Bus bandwidth as nccl-tests reports it: (world - 1) / world * message / time, the
message being reduce_scatter's input and all_reduce's input (times 2 for all_reduce)."""
import os

import torch
import torch.distributed as dist
from absl import app, flags

import interlace
from interlace.bench import common
from interlace.bench.reduce_common import expect_exact, inputs_of, rank_order_sum

FLAGS = flags.FLAGS
flags.DEFINE_float("rate", 50e9, "the throttled loopback's rate, bytes/s")

DEFAULT_SIZES = ["1M", "16M", "64M", "256M"]  # each rank's input


def main(_):
    rank, world = common.init_rank()
    sizes = [common.parse_bytes(s) for s in (FLAGS.sizes or DEFAULT_SIZES)]
    heap = 4 * max(sizes) + (64 << 20)  # all_reduce's scratch is about 3 x its input
    port = int(os.environ["MASTER_PORT"])
    groups = {"interlace_loopback": interlace.init(node_name=f"emulated{rank}", cross_node="loopback",
                                                   heap_bytes=heap, master_port=port + 1, timeout_s=60.0),
              f"interlace_loopback_{FLAGS.rate / 1e9:g}GBps": interlace.init(
                  node_name=f"emulated{rank}", cross_node="loopback", loopback_rate=FLAGS.rate, heap_bytes=heap,
                  master_port=port + 2, timeout_s=60.0)}
    results = {"reduce_scatter": [], "all_reduce": []}
    for size in sizes:
        for op, rows in results.items():
            rows.append(measure(op, groups, size, rank, world))
            if rank == 0:
                print(op, common.human_bytes(size), {k: round(v["busbw_gbs"], 1) for k, v in rows[-1].items()
                                                     if k != "bytes_per_rank"}, flush=True)
    if rank == 0:
        for op, rows in results.items():
            report(op, rows, world)
    dist.destroy_process_group()


def measure(op, groups, size, rank, world):
    n = size // 2  # bf16 elements of this rank's input
    n -= n % (8 * world)  # reduce_scatter: world blocks of whole 16-byte vectors
    parts = [inputs_of(q, n, torch.bfloat16, 7) for q in range(world)]
    inp = parts[rank]
    want = rank_order_sum(parts, torch.bfloat16)
    if op == "reduce_scatter":
        block = n // world
        out = torch.empty(block, device="cuda", dtype=torch.bfloat16)
        want = want[rank * block:(rank + 1) * block]
        methods = {"nccl": lambda: dist.reduce_scatter_tensor(out, inp)}
        call = interlace.reduce_scatter
    else:
        out = torch.empty_like(inp)
        scratch = inp.clone()  # NCCL's runs in place; its values only matter for the check above
        methods = {"nccl": lambda: dist.all_reduce(scratch)}
        call = interlace.all_reduce
    del parts
    for label, group in groups.items():
        out.fill_(float("nan"))
        call(out, inp, group)
        torch.cuda.synchronize()
        group.check()
        expect_exact(out, want, f"{op} {label} at {size} bytes", rank)
        methods[label] = lambda g=group: call(out, inp, g)
    factor = (world - 1) / world * (2 if op == "all_reduce" else 1)
    row = {"bytes_per_rank": n * 2}
    for label, fn in methods.items():
        ms = common.time_op(fn, FLAGS.warmup, FLAGS.iters)
        row[label] = {"ms": ms, "busbw_gbs": factor * n * 2 / (ms * 1e-3) / 1e9}
    for group in groups.values():
        group.check()
    return row


def report(op, rows, world):
    env = common.environment(FLAGS.command)
    env["nodes"] = f"{world} emulated (one GPU each, loopback backend)"
    labels = [k for k in rows[0] if k != "bytes_per_rank"]
    name = f"{op}_{world}nodes_loopback_{world}x{env['gpu'].replace(' ', '_')}"

    def plot(path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label in labels:
            ax.plot([r["bytes_per_rank"] for r in rows], [r[label]["busbw_gbs"] for r in rows], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("input bytes per rank")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{op} across {world} emulated nodes, {world} x {env['gpu']}, {env['date'][:10]}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    path = common.write_results(FLAGS.out_dir, name, {"op": f"{op}_nodes", "env": env, "rate": FLAGS.rate,
                                                      "rows": rows}, plot)
    print(f"wrote {path}")
    print(f"{op}: bus bandwidth GB/s (median ms)")
    print(f"{'bytes/rank':>10} " + " ".join(f"{l:>28}" for l in labels))
    for r in rows:
        print(f"{common.human_bytes(r['bytes_per_rank']):>10} " +
              " ".join(f"{r[l]['busbw_gbs']:16.1f} ({r[l]['ms']:8.3f})" for l in labels))


if __name__ == "__main__":
    app.run(main)
