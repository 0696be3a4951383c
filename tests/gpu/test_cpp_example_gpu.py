"""The C++ example on real GPUs: one process per GPU, a Group from the launcher's environment,
all_gather and gemm on cudaMalloc buffers, checked on the host by the example itself."""
import os
import socket
import subprocess

import pytest

from interlace.bench.launch import SAFE_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.gpus(2)


def find_binary():
    for path in (os.environ.get("INTERLACE_CPP_EXAMPLE", ""), os.path.join(ROOT, "device_bundle", "all_gather_gemm"),
                 os.path.join(ROOT, "bazel-bin", "examples", "all_gather_gemm")):
        if path and os.path.exists(path):
            return path
    pytest.skip("the example is not built here (tools/device_bundle puts it in device_bundle/)")


def test_cpp_example_on_every_gpu():
    import torch
    binary, world = find_binary(), torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([binary], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, **SAFE_ENV, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(world)]
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outputs.append((p.returncode, out))
    report = "\n".join(f"rank {r} exit {rc}: {out}" for r, (rc, out) in enumerate(outputs))
    assert all(rc == 0 for rc, _ in outputs), report
    assert all("all_gather and gemm correct" in out for _, out in outputs), report
    print(report)
