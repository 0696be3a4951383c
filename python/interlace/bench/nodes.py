"""What the benchmarks across emulated nodes share (all_gather_nodes, reduce_nodes): every rank its
own node on this host (node_name per rank), so its data crosses through the proxy FIFO and the
loopback backend, in two groups at once, unthrottled and throttled to a NIC's rate; the timing of a
row; and the report (JSON, plot, table)."""
import os

from absl import flags

import interlace
from interlace.bench import common

flags.DEFINE_float("rate", 50e9, "the throttled loopback's rate, bytes/s (50e9: 400 Gb/s)")
FLAGS = flags.FLAGS


def emulated_groups(rank, heap_bytes):
    """{label: Group}: the same ranks as emulated nodes, unthrottled and at --rate. Each group has its
    own proxy, and its own rendezvous port after torch.distributed's."""
    port = int(os.environ["MASTER_PORT"])
    name = f"emulated{rank}"
    return {
        "interlace_loopback": interlace.init(node_name=name, cross_node="loopback", heap_bytes=heap_bytes,
                                             master_port=port + 1, timeout_s=60.0),
        f"interlace_loopback_{FLAGS.rate / 1e9:g}GBps": interlace.init(
            node_name=name, cross_node="loopback", loopback_rate=FLAGS.rate, heap_bytes=heap_bytes,
            master_port=port + 2, timeout_s=60.0),
    }


def time_row(methods, bytes_per_rank, bus_bytes, warmup, iters):
    """A result row: ms (the slower rank's median) and bus bandwidth (bus_bytes / time) per method."""
    row = {"bytes_per_rank": bytes_per_rank}
    for label, fn in methods.items():
        ms = common.time_op(fn, warmup, iters)
        row[label] = {"ms": ms, "busbw_gbs": bus_bytes / (ms * 1e-3) / 1e9}
    return row


def report(op, rows, world, out_dir, command):
    """Writes <op>_<world>nodes_loopback_<world>x<GPU>.{json,png} and prints the table."""
    env = common.environment(command)
    env["nodes"] = f"{world} emulated (one GPU each, loopback backend)"
    labels = [k for k in rows[0] if k != "bytes_per_rank"]
    name = f"{op}_{world}nodes_loopback_{world}x{env['gpu'].replace(' ', '_')}"

    def plot(path):
        title = f"{op} across {world} emulated nodes, {world} x {env['gpu']}, {env['date'][:10]}"
        common.plot_busbw(path, rows, labels, title, FLAGS.rate / 1e9, f"throttle {FLAGS.rate / 1e9:g} GB/s")

    payload = {"op": f"{op}_nodes", "env": env, "rate": FLAGS.rate, "rows": rows}
    print(f"wrote {common.write_results(out_dir, name, payload, plot)}")
    print(f"{op}: bus bandwidth GB/s (median ms)")
    print(f"{'bytes/rank':>10} " + " ".join(f"{l:>28}" for l in labels))
    for r in rows:
        print(f"{common.human_bytes(r['bytes_per_rank']):>10} " +
              " ".join(f"{r[l]['busbw_gbs']:16.1f} ({r[l]['ms']:8.3f})" for l in labels))
