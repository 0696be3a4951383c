"""all_gather benchmark, one rank. Started by `python -m interlace.bench all_gather`.

For each size: check interlace against NCCL (bitwise), then time, on the same GPUs in one run:
  interlace (ordinary torch tensors), interlace with a symmetric out (peers store straight into it),
  NCCL all_gather_into_tensor,
  and the copy engine pulling each peer's shard (cudaMemcpy over NVLink with no synchronisation
  between ranks: a raw transfer, not a usable collective, shown as the hardware's reference).
Bus bandwidth = (world - 1) * bytes_per_rank / time, as nccl-tests reports it."""

import torch
import torch.distributed as dist
from absl import app, flags

import interlace
import interlace.torch as itorch
from interlace.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_list("sizes", [], "")
flags.DEFINE_integer("warmup", 5, "")
flags.DEFINE_integer("iters", 20, "")
flags.DEFINE_list("tunings", ["0:0"], "")
flags.DEFINE_string("command", "", "")

DEFAULT_SIZES = ["64K", "256K", "1M", "4M", "16M", "64M", "256M", "1G"]


def main(_):
    rank, world = common.init_rank()
    sizes = [common.parse_bytes(s) for s in (FLAGS.sizes or DEFAULT_SIZES)]
    tunings = [tuple(int(x) for x in t.split(":")) for t in FLAGS.tunings]
    # Room for the largest size's symmetric input and out, and the receive buffer.
    group = interlace.init(heap_bytes=(2 * world + 1) * max(sizes) + (64 << 20), timeout_s=20.0)
    rows = []
    for size in sizes:
        rows.append(measure(group, size, rank, world, tunings))
        if rank == 0:
            print(common.human_bytes(size), {k: round(v["busbw_gbs"], 1) for k, v in rows[-1].items()
                                             if k != "bytes_per_rank"}, flush=True)
    if rank == 0:
        report(rows, world)
    dist.destroy_process_group()


def measure(group, size, rank, world, tunings):
    """Checks and times every method at one size; all tensors are freed on return, so the
    symmetric heap is whole again for the next size."""
    n = size // 2  # bf16 elements
    inp_sym = itorch.empty(group, (n,), torch.bfloat16)  # the copy engine reads peers' inputs
    inp_sym.copy_(torch.randn(n, device="cuda", dtype=torch.bfloat16))
    inp = inp_sym.clone()
    out = torch.empty(world * n, device="cuda", dtype=torch.bfloat16)
    out_sym = itorch.empty(group, (world * n,), torch.bfloat16)
    ref = torch.empty_like(out)
    dist.all_gather_into_tensor(ref, inp)
    peers = [itorch.peer(group, inp_sym, q) if q != rank else inp_sym for q in range(world)]
    outs = out.view(world, n)

    def copy_engine():
        for k in range(1, world + 1):
            q = (rank + k) % world
            outs[q].copy_(peers[q], non_blocking=True)

    methods = {"nccl": lambda: dist.all_gather_into_tensor(out, inp), "copy_engine": copy_engine}
    for blocks, chunk in tunings:
        suffix = "" if (blocks, chunk) == (0, 0) else f"[{blocks}x{chunk // 1024}K]"
        for label, dst in (("interlace" + suffix, out), ("interlace_symmetric_out" + suffix, out_sym)):
            dst.fill_(float("nan"))
            interlace.all_gather(dst, inp, group, num_blocks=blocks, chunk_bytes=chunk)
            torch.cuda.synchronize()
            group.check()
            if not torch.equal(dst, ref):
                bad = (dst != ref).nonzero()
                raise SystemExit(f"rank {rank}: {label} wrong at {size} bytes: {bad.numel()} elements differ, "
                                 f"first at {bad[0].item()}")
            methods[label] = (lambda d=dst, b=blocks, c=chunk:
                              interlace.all_gather(d, inp, group, num_blocks=b, chunk_bytes=c))
    row = {"bytes_per_rank": size}
    for label, fn in methods.items():
        ms = common.time_op(fn, FLAGS.warmup, FLAGS.iters)
        row[label] = {"ms": ms, "busbw_gbs": (world - 1) * size / (ms * 1e-3) / 1e9}
    group.check()
    return row


def report(rows, world):
    env = common.environment(FLAGS.command)
    labels = [k for k in rows[0] if k != "bytes_per_rank"]
    name = f"all_gather_{world}x{env['gpu'].replace(' ', '_')}"

    def plot(path):
        common.plot_busbw(path, rows, labels, f"all_gather, {world} x {env['gpu']}, {env['date'][:10]}")

    path = common.write_results(FLAGS.out_dir, name, {"op": "all_gather", "env": env, "rows": rows}, plot)
    print(f"wrote {path}")
    head = f"{'bytes/rank':>10} " + " ".join(f"{l:>22}" for l in labels) + f" {'ours/nccl':>9}"
    print("bus bandwidth GB/s (median ms)")
    print(head)
    for r in rows:
        cells = " ".join(f"{r[l]['busbw_gbs']:10.1f} ({r[l]['ms']:8.4f})" for l in labels)
        print(f"{common.human_bytes(r['bytes_per_rank']):>10} {cells} {r['nccl']['ms'] / r['interlace']['ms']:9.2f}")


if __name__ == "__main__":
    app.run(main)
