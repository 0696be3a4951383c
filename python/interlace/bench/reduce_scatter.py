"""reduce_scatter benchmark, one rank. Started by `python -m interlace.bench reduce_scatter`.

For each size (bytes of each rank's bf16 input; each rank's out is size / world): check interlace bit
for bit against the fp32 sum in rank order, then time, on the same GPUs in one run (interleaved, CUDA
events, the slower rank's medians):
  interlace                 ordinary torch tensors;
  nccl                      torch.distributed.reduce_scatter_tensor;
and up to 1 MiB, per-call latency under CUDA-graph replay (interlace_graph).
Bus bandwidth = (world - 1) / world * bytes / time, as nccl-tests reports it. Rows hold bytes and us
(and busbw_gbs) per method."""

import torch
import torch.distributed as dist
from absl import app, flags

import interlace
from interlace.bench import common
from interlace.bench import reduce_common as rc

FLAGS = flags.FLAGS
DEFAULT_SIZES, GRAPH_MAX_BYTES = rc.DEFAULT_SIZES, rc.GRAPH_MAX_BYTES


def main(_):
    rank, world = common.init_rank()
    sizes = [common.parse_bytes(s) for s in (FLAGS.sizes or DEFAULT_SIZES)]
    for size in sizes:
        if size % (16 * world):
            raise SystemExit(f"reduce_scatter: {size} bytes per rank is not {world} blocks of a 16-byte multiple")
    tunings = [tuple(int(x) for x in t.split(":")) for t in FLAGS.tunings]
    group = interlace.init(heap_bytes=2 * max(sizes) + (64 << 20), timeout_s=30.0)  # staging: (world - 1) / world x
    common.warm_up_gpu()
    rows = []
    for size in sizes:
        us = measure(group, size, rank, world, tunings)
        rows.append(rc.row(size, us, (world - 1) / world))
        if rank == 0:
            print(common.human_bytes(size), {k: round(v, 2) for k, v in us.items()}, flush=True)
    if rank == 0:
        rc.report("reduce_scatter", rows, {}, world, (world - 1) / world, FLAGS.out_dir, FLAGS.command)
    dist.destroy_process_group()


def measure(group, size, rank, world, tunings):
    n = size // 2 // world  # bf16 elements of each rank's out
    seed = size.bit_length()
    parts = [rc.inputs_of(q, world * n, torch.bfloat16, seed) for q in range(world)]
    want = rc.rank_order_sum([p[rank * n:(rank + 1) * n] for p in parts], torch.bfloat16)
    inp = parts[rank].clone()
    del parts
    out = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    methods = {}
    for blocks, chunk in tunings:
        label = "interlace" if (blocks, chunk) == (0, 0) else f"interlace[{blocks}x{chunk // 1024}K]"
        out.fill_(float("nan"))
        interlace.reduce_scatter(out, inp, group, num_blocks=blocks, chunk_bytes=chunk)
        torch.cuda.synchronize()
        group.check()
        rc.expect_exact(out, want, f"{label} at {size} bytes", rank)
        methods[label] = lambda b=blocks, c=chunk: interlace.reduce_scatter(out, inp, group, num_blocks=b, chunk_bytes=c)
    nccl_out = torch.empty_like(out)
    methods["nccl"] = lambda: dist.reduce_scatter_tensor(nccl_out, inp)
    graphed = set()
    if size <= GRAPH_MAX_BYTES:
        fn, reason = common.agreed(lambda: rc.graph_of(methods["interlace"]), "interlace_graph")
        if fn is None:
            raise SystemExit(f"rank {rank}: {reason}")
        methods["interlace_graph"] = fn
        graphed.add("interlace_graph")
    us = rc.time_methods(methods, graphed, FLAGS.warmup, FLAGS.iters)
    group.check()
    return us


if __name__ == "__main__":
    app.run(main)
