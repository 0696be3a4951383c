"""all_gather across nodes, one rank. Started by `python -m interlace.bench all_gather_nodes`.

Every rank is its own emulated node on this host (node_name per rank): shards cross between ranks
through each GPU's proxy FIFO and the loopback backend, unthrottled and throttled to a NIC's rate
(--rate, default 50 GB/s: 400 Gb/s). For each size: check interlace bitwise against NCCL, then time,
in the same run, interlace at both rates (ordinary out) and NCCL's all_gather_into_tensor, which on
one host runs over NVLink: a reference for scale, not a network baseline. Bus bandwidth = (world - 1)
* bytes_per_rank / time, as nccl-tests reports it."""
import os

import torch
import torch.distributed as dist
from absl import app, flags

import interlace
from interlace.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_list("sizes", [], "")
flags.DEFINE_integer("warmup", 3, "")
flags.DEFINE_integer("iters", 10, "")
flags.DEFINE_list("tunings", ["0:0"], "unused: the plan picks the chunks")
flags.DEFINE_string("command", "", "")
flags.DEFINE_float("rate", 50e9, "the throttled loopback's rate, bytes/s")

DEFAULT_SIZES = ["1M", "4M", "16M", "64M", "256M"]


def main(_):
    rank, world = common.init_rank()
    sizes = [common.parse_bytes(s) for s in (FLAGS.sizes or DEFAULT_SIZES)]
    heap = (world + 2) * max(sizes) + (64 << 20)  # landing area, staging, and room to spare
    port = int(os.environ["MASTER_PORT"])
    # Two groups at once, each with its own proxy: unthrottled, and at the NIC's rate.
    groups = {"interlace_loopback": interlace.init(node_name=f"emulated{rank}", cross_node="loopback",
                                                   heap_bytes=heap, master_port=port + 1, timeout_s=60.0),
              f"interlace_loopback_{FLAGS.rate / 1e9:g}GBps": interlace.init(
                  node_name=f"emulated{rank}", cross_node="loopback", loopback_rate=FLAGS.rate, heap_bytes=heap,
                  master_port=port + 2, timeout_s=60.0)}
    rows = []
    for size in sizes:
        rows.append(measure(groups, size, rank, world))
        if rank == 0:
            print(common.human_bytes(size), {k: round(v["busbw_gbs"], 1) for k, v in rows[-1].items()
                                             if k != "bytes_per_rank"}, flush=True)
    if rank == 0:
        report(rows, world)
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
    row = {"bytes_per_rank": size}
    for label, fn in methods.items():
        ms = common.time_op(fn, FLAGS.warmup, FLAGS.iters)
        row[label] = {"ms": ms, "busbw_gbs": (world - 1) * size / (ms * 1e-3) / 1e9}
    for group in groups.values():
        group.check()
    return row


def report(rows, world):
    env = common.environment(FLAGS.command)
    env["nodes"] = f"{world} emulated (one GPU each, loopback backend)"
    labels = [k for k in rows[0] if k != "bytes_per_rank"]
    name = f"all_gather_{world}nodes_loopback_{world}x{env['gpu'].replace(' ', '_')}"

    def plot(path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label in labels:
            ax.plot([r["bytes_per_rank"] for r in rows], [r[label]["busbw_gbs"] for r in rows], marker="o", label=label)
        ax.axhline(FLAGS.rate / 1e9, color="gray", linestyle=":", label=f"throttle {FLAGS.rate / 1e9:g} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"all_gather across {world} emulated nodes, {world} x {env['gpu']}, {env['date'][:10]}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    path = common.write_results(FLAGS.out_dir, name, {"op": "all_gather_nodes", "env": env, "rate": FLAGS.rate,
                                                      "rows": rows}, plot)
    print(f"wrote {path}")
    print("bus bandwidth GB/s (median ms)")
    print(f"{'bytes/rank':>10} " + " ".join(f"{l:>28}" for l in labels))
    for r in rows:
        print(f"{common.human_bytes(r['bytes_per_rank']):>10} " +
              " ".join(f"{r[l]['busbw_gbs']:16.1f} ({r[l]['ms']:8.3f})" for l in labels))


if __name__ == "__main__":
    app.run(main)
