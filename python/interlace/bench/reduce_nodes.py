"""reduce_scatter and all_reduce across nodes, one rank. Started by `python -m interlace.bench
reduce_nodes`.

Every rank is its own emulated node on this host (node_name per rank), as in all_gather_nodes: each
partial crosses between ranks through the proxy FIFO and the loopback backend, unthrottled and
throttled to a NIC's rate (--rate, default 50 GB/s). For each size: check both ops bit for bit
against the fp32 sum in rank order, then time, in the same run, interlace at both rates and NCCL's
reduce_scatter_tensor / all_reduce, which on one host run over NVLink: a reference for scale, not a
network baseline. Bus bandwidth as nccl-tests reports it: (world - 1) / world * message / time, the
message being reduce_scatter's input and all_reduce's input (times 2 for all_reduce)."""
import torch
import torch.distributed as dist
from absl import app, flags

import interlace
from interlace.bench import common, nodes
from interlace.bench.reduce_common import expect_exact, inputs_of, rank_order_sum

FLAGS = flags.FLAGS

DEFAULT_SIZES = ["1M", "16M", "64M", "256M"]  # each rank's input


def main(_):
    rank, world = common.init_rank()
    sizes = [common.parse_bytes(s) for s in (FLAGS.sizes or DEFAULT_SIZES)]
    groups = nodes.emulated_groups(rank, 4 * max(sizes) + (64 << 20))  # all_reduce's scratch: about 3 x its input
    results = {"reduce_scatter": [], "all_reduce": []}
    for size in sizes:
        for op, rows in results.items():
            rows.append(measure(op, groups, size, rank, world))
            if rank == 0:
                print(op, common.human_bytes(size), {k: round(v["busbw_gbs"], 1) for k, v in rows[-1].items()
                                                     if k != "bytes_per_rank"}, flush=True)
    if rank == 0:
        for op, rows in results.items():
            nodes.report(op, rows, world, FLAGS.out_dir, FLAGS.command)
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
    bus_bytes = (world - 1) / world * (2 if op == "all_reduce" else 1) * n * 2
    row = nodes.time_row(methods, n * 2, bus_bytes, FLAGS.warmup, FLAGS.iters)
    for group in groups.values():
        group.check()
    return row


if __name__ == "__main__":
    app.run(main)
