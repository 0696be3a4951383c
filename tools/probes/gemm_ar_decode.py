"""Probe: where gemm_ar's time goes at decode sizes. One rank per visible GPU; for M = 1 to 256 at
K = 8192 (split over the ranks) and N = 8192, and at a tiny K (the fixed costs alone), the GPU time
of gemm_ar's kernel and of interlace.gemm's on the same inputs, from torch.profiler's kernel records
(medians), beside the host-timed replay of a graph of one call. Run on the GPU machine:
PYTHONPATH=<wheel dir> python3 -c "from interlace.bench.launch import run_scenario; \\
    run_scenario('tools/probes/gemm_ar_decode.py', 'all', timeout_s=300)\""""
import statistics

import torch
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
        ms = common.time_collective({"ar_graph": common.graph_of(ar, 1), "gemm_graph": common.graph_of(alone, 1)}, 5,
                                    50)
        ar_k, alone_k = kernel_us(ar), kernel_us(alone)
        if rank == 0:
            print(f"M={m} K={k} N={n} (K_r {k_local}): graph us: gemm_ar {ms['ar_graph'] * 1e3:.1f} "
                  f"gemm {ms['gemm_graph'] * 1e3:.1f}; kernel us: gemm_ar {ar_k} gemm {alone_k}", flush=True)
    group.check()


if __name__ == "__main__":
    main()
