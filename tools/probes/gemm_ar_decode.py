"""Probe: where gemm_ar's time goes at decode sizes. One rank per visible GPU; for M = 1 to 256 at
K = 8192 (split over the ranks) and N = 8192, and at a tiny K (the fixed costs alone), per call of
gemm_ar and of interlace.gemm on the same inputs: the GPU time of back-to-back replays of a one-call
graph (CUDA events between them, so launch gaps included), and the kernel's own time in those
replays, from torch.profiler's kernel records (medians). Replays rather than eager calls: at world
size 2 an eager call's host time (about 15 us) exceeds a small kernel's, so each kernel would wait
for its peer's late launch, and its time would measure that. Run on the GPU machine:
PYTHONPATH=<wheel dir> python3 -c "from interlace.bench.launch import run_scenario; \\
    run_scenario('tools/probes/gemm_ar_decode.py', 'all', timeout_s=300)\""""
import statistics

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import interlace
from interlace.bench import common

SHAPES = [(m, 8192, 8192) for m in (1, 16, 64, 128, 256)] + [(1, 64 * 4, 8192), (128, 64 * 4, 8192)]
CALLS = 30


def kernel_us(fn):
    """Median GPU microseconds of the kernels fn launches, by kernel name."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(e.name[:40], []).append(e.device_time)
    return {name: statistics.median(t) for name, t in times.items() if len(t) >= CALLS}


def main():
    rank, world = common.init_rank()
    group = interlace.init(heap_bytes=512 << 20, timeout_s=60.0)
    common.warm_up_gpu()
    for m, k, n in SHAPES:
        k_local = k // world
        g = torch.Generator(device="cuda").manual_seed(rank)
        a = torch.randn(m, k_local, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, k_local, device="cuda", dtype=torch.bfloat16, generator=g).t()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        partial = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ar = lambda: interlace.gemm_ar(a, b, out, group)  # noqa: E731
        alone = lambda: interlace.gemm(a, b, partial)  # noqa: E731
        ar()
        alone()
        torch.cuda.synchronize()
        ar_graph, alone_graph = common.graph_of(ar, 1), common.graph_of(alone, 1)
        ms = common.time_collective({"ar_graph": ar_graph, "gemm_graph": alone_graph}, 5, 50)
        kernels = {}
        for label, fn in (("gemm_ar", ar_graph), ("gemm", alone_graph)):
            torch.cuda.synchronize()
            dist.barrier()  # the ranks replay together, as a serving loop does
            kernels[label] = kernel_us(fn)
        if rank == 0:
            print(f"M={m} K={k} N={n} (K_r {k_local}): per replay us: gemm_ar {ms['ar_graph'] * 1e3:.1f} "
                  f"gemm {ms['gemm_graph'] * 1e3:.1f}; kernel us in replays: gemm_ar {kernels['gemm_ar']} "
                  f"gemm {kernels['gemm']}", flush=True)
    group.check()


if __name__ == "__main__":
    main()
