"""Probe, world size 1 on one GPU: interlace.ring_attention against interlace.attention (the plain
kernel) on the same q, k, v, the pair whose time ratio is the ring's floor (bench ring_attention's
ratio_to_compute_only at world size 1). Each runs twice, ring first, so that under ncu
`--launch-skip 2 --launch-count 2 -k regex:'ring_attention_kernel|sm90_attention_kernel'` profiles
the second (warm) launch of each; without ncu it also prints their CUDA-event medians. On the GPU
machine:
  PYTHONPATH=<wheel dir> ncu --section SpeedOfLight --metrics sm__cycles_active.avg,sm__cycles_active.max,\\
    sm__cycles_active.min,smsp__inst_executed.sum --launch-skip 2 --launch-count 2 \\
    -k regex:'ring_attention_kernel|sm90_attention_kernel' python3 tools/probes/ring_vs_plain.py 8192 32 1
sm__cycles_active.max over .avg is the launch's tail (SMs idle while others finish). Arguments:
S heads causal [timed iterations, 0 under ncu] [head size D, 128 or 64]."""
import sys

import torch

import interlace


def main(s, heads, causal, timed_iters=20, d=128):
    group = interlace.init(rank=0, world_size=1, master_addr="127.0.0.1", master_port=29517, heap_bytes=1 << 30)
    q, k, v = (torch.randn(1, s, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out_ring, out_plain = torch.empty_like(q), torch.empty_like(q)
    lse = torch.empty(1, heads, s, device="cuda", dtype=torch.float32)
    calls = {
        "ring": lambda: interlace.ring_attention(q, k, v, out_ring, group, causal=causal, lse=lse),
        "plain": lambda: interlace.attention(q, k, v, out_plain, causal=causal, lse=lse),
    }
    for _ in range(2):
        for call in calls.values():
            call()
    torch.cuda.synchronize()
    group.check()
    err = ((out_ring.float() - out_plain.float()).norm() / out_plain.float().norm()).item()
    print(f"S={s} heads={heads} D={d} causal={causal}: ring against plain, relative difference {err:.2e}")
    if timed_iters:
        times = {}
        for name, call in calls.items():
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(timed_iters)]
            for begin, end in events:
                begin.record()
                call()
                end.record()
            torch.cuda.synchronize()
            times[name] = sorted(b.elapsed_time(e) for b, e in events)[timed_iters // 2]
        print(f"  ring {times['ring']:.3f} ms, plain {times['plain']:.3f} ms, ratio {times['ring'] / times['plain']:.3f}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    args = sys.argv[1:] or ["8192", "32", "1"]
    sys.exit(main(int(args[0]), int(args[1]), bool(int(args[2])), timed_iters=int(args[3]) if len(args) > 3 else 20,
                  d=int(args[4]) if len(args) > 4 else 128))
