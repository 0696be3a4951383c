"""Where does a small all_reduce's time go under CUDA-graph replay? Per-call microseconds (graphs of 20
calls, median of 30 replays, the slower rank's) of interlace.all_reduce by algorithm and CTA count,
against torch's symmetric-memory one_shot_all_reduce and a graph of 20 tiny torch kernels (the
launch floor). Run on the GPU machine: `python3 tools/probes/all_reduce_latency.py [--auto_only]`
(starts one rank per GPU; --auto_only: the automatic settings only)."""
import os
import sys

import torch

CALLS = 20


def per_call_us(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(35):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.distributed.barrier()
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / CALLS)
    mine = torch.tensor(sorted(times[5:])[len(times[5:]) // 2], device="cuda")
    torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)
    return mine.item()


def rank_main():
    import torch.distributed as dist

    import interlace
    from interlace.bench.common import SymmMemBaseline

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    group = interlace.init(heap_bytes=256 << 20, timeout_s=60.0)
    symm = SymmMemBaseline()
    assert symm.reason is None, symm.reason
    tiny = torch.zeros(16, device="cuda")
    rows = [("launch floor (tiny torch kernel)", per_call_us(lambda: tiny.add_(1)))]
    for size in (16 << 10, 64 << 10, 256 << 10, 1 << 20):
        inp = torch.randn(size // 2, device="cuda").to(torch.bfloat16)
        out = torch.empty_like(inp)
        sym, torch_out = symm.symmetric_copy(inp), torch.empty_like(inp)
        rows.append((f"{size >> 10} KiB torch one_shot",
                     per_call_us(lambda: torch.ops.symm_mem.one_shot_all_reduce_out(sym, "sum", symm.group_name,
                                                                                    torch_out))))
        for algorithm in ("auto",) if "--auto_only" in sys.argv else ("auto", "one_shot", "two_shot"):
            for blocks in (0, 1, 2, 4, 8, 16, 32):
                if algorithm == "auto" and blocks:
                    continue
                try:
                    us = per_call_us(lambda: interlace.all_reduce(out, inp, group, algorithm=algorithm,
                                                                  num_blocks=blocks))
                except Exception as e:  # noqa: BLE001 (a setting the plan refuses)
                    us = float("nan")
                    if rank == 0:
                        print(f"{size} {algorithm} {blocks}: {str(e)[:100]}", flush=True)
                rows.append((f"{size >> 10} KiB interlace {algorithm} blocks={blocks or 'auto'}", us))
    if rank == 0:
        for label, us in rows:
            print(f"{label:48s} {us:8.2f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        rank_main()
    else:
        from interlace.bench.launch import expect_ranks_passed, run_ranks

        expect_ranks_passed(run_ranks([os.path.abspath(__file__), *sys.argv[1:]], torch.cuda.device_count(), 240))
