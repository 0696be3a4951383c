"""Timing and reporting shared by the op benchmarks (run inside each rank, with torch)."""
import datetime
import json
import os
import random
import statistics
import warnings

import torch
import torch.distributed as dist


def init_rank():
    """(rank, world size) of this benchmark process, from the launcher's environment
    (launch.run_ranks), with its GPU made current and torch.distributed's NCCL group (the
    baselines') set up."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    return rank, world


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def warm_up_gpu(seconds=2.0):
    """An idle H200 sits at a low clock and takes a while to boost; a few launches of warm-up are not
    enough for millisecond-scale GEMMs, so keep the GPU busy for a couple of seconds first."""
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(20):
            torch.matmul(x, x)
        stop.record()
        stop.synchronize()
        if start.elapsed_time(stop) > seconds * 1e3:
            return


def time_launches(fn, n: int) -> list:
    """Milliseconds of each of n back-to-back launches of fn, from CUDA events recorded between them
    (on the current stream; synchronizes at the end)."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    events[0].record()
    for i in range(n):
        fn()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(n)]


def time_op(fn, warmup: int, iters: int, collective: bool = True) -> float:
    """Median milliseconds of one launch of fn over iters launches. For a collective, all ranks meet
    first and the slowest rank's median counts."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if collective:
        dist.barrier()
    median = statistics.median(time_launches(fn, iters))
    if not collective:
        return median
    t = torch.tensor([median], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_interleaved(fns: dict, warmup: int, iters: int, rounds: int = 5, after_block=None) -> dict:
    """Median milliseconds per launch of each fn (one process, one GPU), timed in alternating blocks so
    that every method sees the same clocks and temperature: GPU clocks drift over a run, and timing
    methods one after the other would fold that drift into their ratio. Each round takes the methods
    in a fresh order (seeded, so runs repeat), since under a power cap a block runs faster after a
    frugal one: on an H100 a launch timed right after cuBLAS read 1-5% faster than the same launch
    elsewhere, in a fixed order and in a rotated one alike. after_block(label), if given, runs after
    each block (a probe reading the clocks there)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {label: [] for label in fns}
    per_round = max(1, iters // rounds)
    items = list(fns.items())
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(items)
        for label, fn in items:
            times[label] += time_launches(fn, per_round)
            if after_block is not None:
                after_block(label)
    return {label: statistics.median(t) for label, t in times.items()}


def time_collective(methods, warmup, iters):
    """Median ms per launch of each method, the methods alternating in blocks (common.time_interleaved:
    the same clocks for all), every rank in step; for each method the slower rank's median."""
    torch.cuda.synchronize()
    dist.barrier()
    medians = time_interleaved(methods, warmup, iters)
    t = torch.tensor(list(medians.values()), device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(medians, t.tolist()))


def environment(command: str, distributed: bool = True) -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props.name,
        "gpus": dist.get_world_size() if distributed else 1,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "command": command,
    }


def write_results(out_dir: str, name: str, payload: dict, plot) -> str:
    """Writes <name>.json and, through plot(path), <name>.png; returns the JSON path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    try:
        plot(os.path.join(out_dir, f"{name}.png"))
    except ImportError as e:  # matplotlib missing: the JSON still holds every number
        print(f"no plot: {e}")
    return path


def plot_busbw(path, rows, labels, title, line_gbs=None, line_label=""):
    """Bus bandwidth against bytes per rank, one line per label (rows[i][label]["busbw_gbs"]); a
    dotted horizontal line at line_gbs if given (a throttle, say)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in labels:
        ax.plot([r["bytes_per_rank"] for r in rows], [r[label]["busbw_gbs"] for r in rows], marker="o", label=label)
    if line_gbs is not None:
        ax.axhline(line_gbs, color="gray", linestyle=":", label=line_label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in fp32."""
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def gemm_iters(flop: float, most: int) -> int:
    """Timed launches for a GEMM-sized call: at most `most`, fewer for big ones (about 0.3 s per
    method at ~700 TFLOP/s), never below 10."""
    est_ms = flop / 7e11
    return max(10, min(most, int(300 / max(est_ms, 1e-3))))


def shapes_from_sizes(sizes, sweeps) -> list:
    """The fused-GEMM benchmarks' --sizes: each entry MxKxN (one row) or M (one row per (K, N) of
    `sweeps`). Rows are (m, k, n, series), series "K=.., N=.." (the plot draws one line each)."""
    shapes = []
    for text in sizes:
        parts = [int(x) for x in text.lower().split("x")]
        if len(parts) == 1:
            shapes += [(parts[0], k, n, f"K={k}, N={n}") for k, n in sweeps]
        elif len(parts) == 3:
            shapes.append((*parts, f"K={parts[1]}, N={parts[2]}"))
        else:
            raise SystemExit(f"--sizes: {text!r} is neither M nor MxKxN")
    return shapes


def all_ranks(ok: bool) -> bool:
    """Whether ok holds on every rank (collective)."""
    flag = torch.tensor([0 if ok else 1], device="cuda", dtype=torch.int32)
    dist.all_reduce(flag)
    return flag.item() == 0


def agreed(make, what):
    """(make(), None), or (None, why) on every rank if make() failed on any: a method that fails on
    one rank is dropped on all, so that no rank waits alone in a collective. make() returns a
    zero-argument call, already run once. Failures are recorded, never raised."""
    fn, why = None, None
    try:
        fn = make()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 (any failure of a method's setup is recorded)
        why = f"{what}: {type(e).__name__}: {e}".strip()[:500]
    if not all_ranks(why is None):
        return None, why or f"{what}: failed on another rank"
    return fn, None


def graph_of(fn, calls):
    """fn's call `calls` times captured into one CUDA graph on a side stream, after one call outside
    capture (interlace's cross-rank checks and scratch); returns a call that replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()

    def replay():
        graph.replay()

    # The graph reads and writes the buffers fn holds: they must live as long as the replay does
    # (returning graph.replay alone let a baseline's symmetric buffer be freed under its graph).
    replay.captured = fn
    return replay


class SymmMemBaseline:
    """A baseline built on torch's symmetric memory (torch.ops.symm_mem) over the default process
    group. Setup failures are recorded in `reason`, never raised: a baseline that does not run
    must not stop the benchmark."""

    def __init__(self):
        self.reason = None
        try:
            import torch.distributed._symmetric_memory as symm_mem  # registers torch.ops.symm_mem
            self.symm_mem = symm_mem
            self.group_name = dist.group.WORLD.group_name
            with warnings.catch_warnings():  # deprecated (and unneeded) in newer torch, required in older
                warnings.simplefilter("ignore")
                symm_mem.enable_symm_mem_for_group(self.group_name)
        except Exception as e:  # noqa: BLE001 (any failure of a baseline is recorded)
            self.reason = f"setup: {type(e).__name__}: {e}"

    def symmetric_copy(self, t):
        """A symmetric tensor holding t's values (collective: every rank calls it alike)."""
        buf = self.symm_mem.empty(tuple(t.shape), dtype=t.dtype, device=t.device)
        self.symm_mem.rendezvous(buf, self.group_name)
        buf.copy_(t)
        return buf
