"""all_gather across nodes, one rank. Started by `python -m interlace.bench all_gather_nodes`.

Every rank is its own emulated node on this host (node_name per rank): shards cross between ranks
through each GPU's proxy FIFO and the loopback backend, unthrottled and throttled to a NIC's rate
(--rate, default 50 GB/s: 400 Gb/s). For each size: check interlace bitwise against NCCL, then time,
in the same run, interlace at both rates (ordinary out) and NCCL's all_gather_into_tensor, which on
one host runs over NVLink: a reference for scale, not a network baseline. Bus bandwidth = (world - 1)
* bytes_per_rank / time, as nccl-tests reports it."""
import torch
import torch.distributed as dist
from absl import app, flags

import interlace
from interlace.bench import common, nodes

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_list("sizes", [], "")
flags.DEFINE_integer("warmup", 3, "")
flags.DEFINE_integer("iters", 10, "")
flags.DEFINE_list("tunings", ["0:0"], "unused: the plan picks the chunks")
flags.DEFINE_string("command", "", "")

DEFAULT_SIZES = ["1M", "4M", "16M", "64M", "256M"]


def main(_):
    rank, world = common.init_rank()
    sizes = [common.parse_bytes(s) for s in (FLAGS.sizes or DEFAULT_SIZES)]
    groups = nodes.emulated_groups(rank, (world + 2) * max(sizes) + (64 << 20))  # landing, staging, spare
    rows = []
    for size in sizes:
        rows.append(measure(groups, size, rank, world))
        if rank == 0:
            print(common.human_bytes(size), {k: round(v["busbw_gbs"], 1) for k, v in rows[-1].items()
                                             if k != "bytes_per_rank"}, flush=True)
    if rank == 0:
        nodes.report("all_gather", rows, world, FLAGS.out_dir, FLAGS.command)
    dist.destroy_process_group()


def measure(groups, size, rank, world):
    n = size // 2  # bf16 elements
    inp = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(world * n, device="cuda", dtype=torch.bfloat16)
    ref = torch.empty_like(out)
    dist.all_gather_into_tensor(ref, inp)
    methods = {"nccl": lambda: dist.all_gather_into_tensor(out, inp)}
    for label, group in groups.items():
        out.fill_(float("nan"))
        interlace.all_gather(out, inp, group)
        torch.cuda.synchronize()
        group.check()
        if not torch.equal(out.view(torch.int16), ref.view(torch.int16)):
            bad = (out.view(torch.int16) != ref.view(torch.int16)).nonzero()
            raise SystemExit(f"rank {rank}: {label} differs from NCCL at {size} bytes: {bad.numel()} elements, "
                             f"first at {bad[0].item()}")
        methods[label] = lambda g=group: interlace.all_gather(out, inp, g)
    row = nodes.time_row(methods, size, (world - 1) * size, FLAGS.warmup, FLAGS.iters)
    for group in groups.values():
        group.check()
    return row


if __name__ == "__main__":
    app.run(main)
