"""python -m interlace.bench {all_gather,all_gather_nodes,gemm,grouped_gemm,ag_gemm,gemm_rs,gemm_ar,reduce_scatter,
    all_reduce,reduce_nodes,overhead,moe,attention,ring_attention}
    [--world_size N] [--out_dir bench/results] ...

Starts one process per local GPU, checks each op against its baselines, times everything in the
same run, prints a table and writes JSON plus a PNG plot. overhead: the host's microseconds per eager
call of every op from each framework (torch, the torch.library ops, CuPy, jax.jit, CUDA-graph
replay) against torch.matmul, on tiny shapes (--iters: calls per timed batch); JSON and a table.
all_gather_nodes, reduce_nodes: all_gather, and reduce_scatter and all_reduce, with every rank its own emulated
node (the proxy and the loopback backend)."""
import sys

from absl import app, flags

from interlace.bench import launch

FLAGS = flags.FLAGS
flags.DEFINE_integer("world_size", 0, "processes (GPUs); 0 = every visible GPU")
flags.DEFINE_string("out_dir", "bench/results", "where the JSON and the plot go")
flags.DEFINE_list("sizes", [], "all_gather, reduce_scatter, all_reduce: bytes per rank (suffixes K, M, G allowed); "
                  "ag_gemm, gemm_rs, gemm_ar: global MxKxN, or M (its sweeps' K and N); moe, grouped_gemm: config "
                  "names; attention: sequence lengths; ring_attention: global sequence lengths; default: the op's "
                  "sweep")
flags.DEFINE_integer("warmup", 0, "untimed launches before timing (0: the op's default)")
flags.DEFINE_integer("iters", 0, "timed launches; the median is reported (0: the op's default)")
flags.DEFINE_list("tunings", [], "interlace settings to time besides the automatic ones; all_gather, "
                  "reduce_scatter, all_reduce: num_blocks:chunk_bytes, gemm: band_m:tile_n:cluster_m, ag_gemm: "
                  "copy_blocks:chunk_rows[:path], gemm_rs and gemm_ar: reduce_ctas:tile_n:band_m:pingpong[:round_m], "
                  "grouped_gemm: cluster_m")
flags.DEFINE_integer("timeout_s", 900, "give up on the run after this long")

# op -> (worker module, whether it runs one process per GPU or a single one)
OPS = {
    "all_gather": ("interlace.bench.all_gather", True),
    "all_gather_nodes": ("interlace.bench.all_gather_nodes", True),
    "gemm": ("interlace.bench.gemm", False),
    "grouped_gemm": ("interlace.bench.grouped_gemm", False),
    "ag_gemm": ("interlace.bench.ag_gemm", True),
    "gemm_rs": ("interlace.bench.gemm_rs", True),
    "gemm_ar": ("interlace.bench.gemm_ar", True),
    "reduce_scatter": ("interlace.bench.reduce_scatter", True),
    "all_reduce": ("interlace.bench.all_reduce", True),
    "reduce_nodes": ("interlace.bench.reduce_nodes", True),
    "overhead": ("interlace.bench.overhead", True),
    "moe": ("interlace.bench.moe", True),
    "attention": ("interlace.bench.attention", False),
    "ring_attention": ("interlace.bench.ring_attention", True),
}


def main(argv):
    if len(argv) != 2 or argv[1] not in OPS:
        raise app.UsageError(f"usage: python -m interlace.bench {{{','.join(OPS)}}} [flags]")
    op = argv[1]
    import torch  # benchmarks use torch for the baselines (NCCL, cuBLAS); the library does not

    module, per_gpu = OPS[op]
    world = (FLAGS.world_size or torch.cuda.device_count()) if per_gpu else 1
    if world < 1:
        sys.exit("no GPU visible")
    worker_args = ["-m", module, f"--out_dir={FLAGS.out_dir}", f"--tunings={','.join(['0:0'] + FLAGS.tunings)}",
                   f"--command={' '.join(sys.argv)}"]
    worker_args += [f"--warmup={FLAGS.warmup}"] if FLAGS.warmup else []
    worker_args += [f"--iters={FLAGS.iters}"] if FLAGS.iters else []
    if FLAGS.sizes:
        worker_args.append(f"--sizes={','.join(FLAGS.sizes)}")
    results = launch.run_ranks(worker_args, world, FLAGS.timeout_s)
    failed = False
    for rank, (rc, out) in enumerate(results):
        if rc != 0 or rank == 0:
            print(f"----- rank {rank} (exit {rc}) -----\n{out}")
        failed |= rc != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    app.run(main)
