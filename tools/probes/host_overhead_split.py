"""Probe: where an eager interlace call's host time goes (issue 9's bar: at most 10 us above a graph
replay). One rank per visible GPU; tiny tensors, so the GPU keeps up and host time is what shows.
Per op, host microseconds per call (medians of batches of 32 calls, stream not synchronized inside):
  api      interlace.<op>(...) on torch tensors
  native   the extension's function on DLPack capsules made beforehand (the Python layer left out)
  dlpack   torch.utils.dlpack.to_dlpack of the op's tensors
  stream   the current-stream lookup
  replay   a one-call CUDA graph's replay
Run on the GPU machine: PYTHONPATH=<wheel dir> python3 -c "from interlace.bench.launch import
run_scenario; run_scenario('tools/probes/host_overhead_split.py', 'all', timeout_s=200)\""""
import statistics
import time

import torch
import torch.distributed as dist
from torch.utils.dlpack import to_dlpack

import interlace
from interlace import _frameworks
from interlace import _interlace as _C
from interlace._group import native as native_of
from interlace.bench import common

BATCH, BATCHES = 32, 40


def host_us(fn, prepare=None):
    """Median host microseconds per call of fn(i) over batches of BATCH calls; prepare(n) makes
    per-call inputs beforehand (untimed)."""
    times = []
    for b in range(BATCHES + 5):
        args = prepare(BATCH) if prepare else [None] * BATCH
        torch.cuda.synchronize()
        if dist.is_initialized():
            dist.barrier()
        start = time.perf_counter_ns()
        for x in args:
            fn(x)
        stop = time.perf_counter_ns()
        if b >= 5:
            times.append((stop - start) / BATCH / 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main():
    rank, world = common.init_rank()
    group = interlace.init(heap_bytes=256 << 20, timeout_s=60.0)
    native = native_of(group)
    dev = torch.device("cuda", torch.cuda.current_device())
    a = torch.randn(128, 256, device=dev, dtype=torch.bfloat16)
    b = torch.randn(256, 128, device=dev, dtype=torch.bfloat16)
    c = torch.empty(128, 128, device=dev, dtype=torch.bfloat16)
    x = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    s = _frameworks.current_stream(x)
    ops = {
        "gemm": (lambda: interlace.gemm(a, b, c), [a, b, c],
                 lambda caps: _C.gemm(*caps, stream=s, band_m=0, tile_n=0, cluster_m=0, pingpong=True)),
        "all_reduce": (lambda: interlace.all_reduce(y, x, group), [y, x],
                       lambda caps: _C.all_reduce(*caps, native, stream=s, algorithm=0, num_blocks=0, chunk_bytes=0)),
        "gemm_ar": (lambda: interlace.gemm_ar(a, b, c, group), [a, b, c],
                    lambda caps: _C.gemm_ar(*caps, native, stream=s, band_m=0, tile_n=0, pingpong=True,
                                            reduce_ctas=0)),
    }
    for name, (api, tensors, call) in ops.items():
        api()
        torch.cuda.synchronize()
        row = {
            "api": host_us(lambda _: api()),
            "native": host_us(call, lambda n, t=tensors: [[to_dlpack(v) for v in t] for _ in range(n)]),
            "dlpack": host_us(lambda _, t=tensors: [to_dlpack(v) for v in t]),
            "stream": host_us(lambda _, t=tensors: _frameworks.current_stream(*t)),
            "replay": host_us(lambda _, g=common.graph_of(api, 1): g()),
        }
        if rank == 0:
            print(f"{name:10} world {world}: " + "  ".join(f"{k} {v:5.1f}" for k, v in row.items()), flush=True)
    group.check()


if __name__ == "__main__":
    main()
