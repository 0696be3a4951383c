"""One rank of test_cross_node_group.py: a Group whose every rank is its own emulated node on this
host (node_name per rank), so the cross-node path is the loopback backend. Each rank posts writes of
varied sizes from the host through the Group's proxy FIFO to the next rank, each adding 1 to a flag
there, and checks what the previous rank sent: the flag's count and every byte (and nothing past
them). argv: the loopback rate in bytes/s (0: unthrottled). Prints 'ok' when every check passed."""
import os
import sys
import time

import torch

import interlace
from interlace import _frameworks

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
RATE = float(sys.argv[1])
N = 48 << 20  # bytes of each rank's writes
SIZES = [0, 1, 7, 64, 4096, 65537, 1 << 20, (3 << 20) + 5]
torch.cuda.set_device(RANK)


def pattern(rank, n):
    return ((torch.arange(n, device="cuda", dtype=torch.int64) * 31 + 7 * rank + 1) % 251).to(torch.uint8)


def plan():
    """(offset, bytes) of each write, packed from 0, so most are unaligned."""
    writes, offset, i = [], 0, 0
    while offset + SIZES[i % len(SIZES)] <= N:
        writes.append((offset, SIZES[i % len(SIZES)]))
        offset += SIZES[i % len(SIZES)]
        i += 1
    return writes, offset


def main():
    group = interlace.init(device=RANK, node_name=f"emulated{RANK}", cross_node="loopback", loopback_rate=RATE,
                           heap_bytes=256 << 20)
    assert group.num_nodes == WORLD and group.local_size == 1, (group.num_nodes, group.local_size)
    assert group.cross_node == "loopback", group.cross_node
    assert group.node_names == [f"emulated{r}" for r in range(WORLD)], group.node_names
    src = torch.from_dlpack(group.empty(N, "uint8"))
    dst = torch.from_dlpack(group.empty(N, "uint8"))
    flags = torch.from_dlpack(group.empty(8, "int64"))
    native = group._native
    src_off, dst_off, flag_off = (native._heap_offset(_frameworks.as_dlpack(t)) for t in (src, dst, flags))
    src.copy_(pattern(RANK, N))
    dst.zero_()
    flags.zero_()
    torch.cuda.synchronize()
    group.barrier()  # every heap is ready before any write lands in it

    writes, extent = plan()
    to, sender = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    start = time.monotonic()
    for offset, size in writes:
        native._proxy_post(to, src_off + offset, dst_off + offset, size, flag_off, 1)
    posted = time.monotonic() - start
    while int(flags[0].item()) < len(writes):
        if time.monotonic() - start > 60:
            raise AssertionError(f"rank {RANK}: flag at {int(flags[0].item())} of {len(writes)} after 60 s")
        time.sleep(0.001)
    seconds = time.monotonic() - start
    assert int(flags[0].item()) == len(writes), f"rank {RANK}: flag overcounted: {int(flags[0].item())}"
    assert int(flags[1:].abs().sum().item()) == 0, f"rank {RANK}: a write raised the wrong flag"
    want = pattern(sender, extent)
    bad = (dst[:extent] != want).nonzero()
    assert bad.numel() == 0, f"rank {RANK}: {bad.numel()} bytes from rank {sender} wrong, first at {bad[0].item()}"
    assert int(dst[extent:].count_nonzero().item()) == 0, f"rank {RANK}: bytes landed past the writes"
    gbs = extent / seconds / 1e9
    print(f"rank {RANK}: {len(writes)} writes, {extent / 2**20:.1f} MiB from rank {sender} exact in {seconds * 1e3:.1f} ms "
          f"({gbs:.2f} GB/s; posting took {posted * 1e3:.1f} ms); rate limit {RATE / 1e9:g} GB/s", flush=True)
    if RATE > 0:
        # The token bucket admits at most a burst (256 KiB) or the largest write ahead of the rate.
        floor = (extent - max(256 << 10, max(SIZES))) / RATE
        assert seconds >= 0.9 * floor, f"rank {RANK}: {seconds:.3f} s is faster than the {RATE:g} B/s limit allows"
    group.barrier()
    group.check()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
