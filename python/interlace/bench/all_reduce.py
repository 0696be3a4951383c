"""all_reduce benchmark, one rank. Started by `python -m interlace.bench all_reduce`.

For each size (bytes of each rank's bf16 input, which is also the output's size): check interlace bit
for bit against the fp32 sum in rank order (every algorithm), then time, on the same GPUs in one run
(interleaved, CUDA events, the slower rank's medians):
  interlace                 automatic algorithm, ordinary torch tensors;
  interlace_one_shot/_two_shot  each algorithm forced (data for the automatic switch);
  interlace_symmetric_out   automatic, into a symmetric out (two-shot owners store straight into it);
  nccl                      torch.distributed.all_reduce (in place);
  torch_one_shot, torch_two_shot  torch.ops.symm_mem one_shot_all_reduce_out / two_shot_all_reduce_
                            (multicast off), where they run;
and up to 1 MiB, per-call latency under CUDA-graph replay: interlace_graph, torch_one_shot_graph.
Bus bandwidth = 2 (world - 1) / world * bytes / time, as nccl-tests reports it. Rows hold bytes and us
(and busbw_gbs) per method."""

import torch
import torch.distributed as dist
from absl import app, flags

import interlace
import interlace.torch as itorch
from interlace.bench import common
from interlace.bench import reduce_common as rc

FLAGS = flags.FLAGS
DEFAULT_SIZES, GRAPH_MAX_BYTES = rc.DEFAULT_SIZES, rc.GRAPH_MAX_BYTES


class TorchSymmMem(common.SymmMemBaseline):
    """torch.ops.symm_mem's one-shot and two-shot all_reduce on a symmetric buffer, or why not."""

    def one_shot(self, inp, out):
        buf = self.symmetric_copy(inp)
        fn = lambda: torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", self.group_name, out)  # noqa: E731
        fn()
        return fn

    def two_shot(self, inp):
        buf = self.symmetric_copy(torch.zeros_like(inp))  # in place: zeros stay zeros however often it runs
        fn = lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", self.group_name)  # noqa: E731
        fn()
        return fn


def main(_):
    rank, world = common.init_rank()
    sizes = [common.parse_bytes(s) for s in (FLAGS.sizes or DEFAULT_SIZES)]
    tunings = [tuple(int(x) for x in t.split(":")) for t in FLAGS.tunings]
    # Room for the symmetric out and the largest scratch (one-shot forced: world - 1 inputs).
    group = interlace.init(heap_bytes=(world + 2) * max(sizes) + (64 << 20), timeout_s=30.0)
    symm = TorchSymmMem()
    common.warm_up_gpu()
    rows, skipped = [], {}
    for size in sizes:
        us = measure(group, symm, size, rank, world, tunings, skipped)
        rows.append(rc.row(size, us, 2 * (world - 1) / world))
        if rank == 0:
            print(common.human_bytes(size), {k: round(v, 2) for k, v in us.items()}, flush=True)
    if rank == 0:
        rc.report("all_reduce", rows, skipped, world, 2 * (world - 1) / world, FLAGS.out_dir, FLAGS.command)
    dist.destroy_process_group()


def measure(group, symm, size, rank, world, tunings, skipped):
    """Checks and times every method at one size; all tensors are freed on return, so the symmetric
    heap is whole again for the next size."""
    n = size // 2  # bf16 elements
    seed = size.bit_length()
    parts = [rc.inputs_of(q, n, torch.bfloat16, seed) for q in range(world)]
    want = rc.rank_order_sum(parts, torch.bfloat16)
    inp = parts[rank].clone()
    del parts
    out = torch.empty_like(inp)
    out_sym = itorch.empty(group, (n,), torch.bfloat16)
    methods = {}
    for label, dst, algorithm in (("interlace", out, "auto"), ("interlace_one_shot", out, "one_shot"),
                                  ("interlace_two_shot", out, "two_shot"), ("interlace_symmetric_out", out_sym, "auto")):
        dst.fill_(float("nan"))
        interlace.all_reduce(dst, inp, group, algorithm=algorithm)
        torch.cuda.synchronize()
        group.check()
        rc.expect_exact(dst, want, f"{label} at {size} bytes", rank)
        methods[label] = lambda d=dst, a=algorithm: interlace.all_reduce(d, inp, group, algorithm=a)
    for blocks, chunk in tunings:
        if (blocks, chunk) != (0, 0):
            label = f"interlace[{blocks}x{chunk // 1024}K]"
            interlace.all_reduce(out, inp, group, num_blocks=blocks, chunk_bytes=chunk)
            torch.cuda.synchronize()
            rc.expect_exact(out, want, f"{label} at {size} bytes", rank)
            methods[label] = lambda b=blocks, c=chunk: interlace.all_reduce(out, inp, group, num_blocks=b, chunk_bytes=c)
    nccl_buf = torch.zeros_like(inp)  # in place: zeros stay zeros
    methods["nccl"] = lambda: dist.all_reduce(nccl_buf)
    graphed = set()
    baselines = {}
    if symm.reason is None:
        baselines["torch_one_shot"] = lambda: symm.one_shot(inp, torch.empty_like(inp))
        baselines["torch_two_shot"] = lambda: symm.two_shot(inp)
    else:
        skipped["torch_one_shot"] = skipped["torch_two_shot"] = symm.reason
    if size <= GRAPH_MAX_BYTES:
        baselines["interlace_graph"] = lambda: rc.graph_of(methods["interlace"])
        if "torch_one_shot" in baselines:
            baselines["torch_one_shot_graph"] = lambda: rc.graph_of(symm.one_shot(inp, torch.empty_like(inp)))
    for label, make in baselines.items():
        fn, reason = common.agreed(make, label)
        if fn is None:
            skipped[label] = f"at {size} bytes: {reason}"
            continue
        methods[label] = fn
        if label.endswith("_graph"):
            graphed.add(label)
    us = rc.time_methods(methods, graphed, FLAGS.warmup, FLAGS.iters)
    group.check()
    return us


if __name__ == "__main__":
    app.run(main)
