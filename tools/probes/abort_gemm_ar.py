"""Probe, world size 1 on one GPU: gemm_ar calls queued behind a GPU sleep, then the group aborted. The
kernels (whose GEMM CTAs make the op handshake in a helper warp beside the mainloop) must store
nothing: out stays NaN. Run on the GPU machine: PYTHONPATH=<wheel dir> python3 tools/probes/abort_gemm_ar.py
(gemm_ar_worker.py's `abort` scenario is the same check at any world size)."""
import time
import torch
import interlace
group = interlace.init(rank=0, world_size=1, master_addr="127.0.0.1", master_port=29541, heap_bytes=256 << 20, timeout_s=60.0)
for m, k, n in ((1, 4096, 8192), (300, 512, 1000), (4096, 1024, 2048)):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    interlace.gemm_ar(a, b, out, group)  # a signature the group knows: later calls skip the vote wait
    torch.cuda.synchronize()
    group.check()
    assert torch.allclose(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)
a = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16).t()
outs = [torch.full((1, 8192), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(3)]
torch.cuda._sleep(int(2e9))  # about a second: the launches below queue behind it
for o in outs:
    interlace.gemm_ar(a, b, o, group)
group.abort("test: abort with gemm_ar queued")
start = time.monotonic()
torch.cuda.synchronize()
print(f"queue drained {time.monotonic() - start:.2f} s after the abort")
try:
    group.check()
    raise SystemExit("FAIL: no error after abort")
except interlace.Error as e:
    print("raised:", str(e)[:120])
for i, o in enumerate(outs):
    assert torch.isnan(o.float()).all(), f"FAIL: call {i} stored into out after the abort"
print("OK: nothing stored after the abort")
