"""interlace's torch.library ops on real GPUs: eager, torch.compile(fullgraph=True) and
mode="reduce-overhead" (CUDA graphs), one process per GPU."""
import os

import pytest

from interlace.bench.launch import run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "torch_ops_worker.py")
pytestmark = pytest.mark.gpus(2)


@pytest.mark.parametrize("mode", ["eager", "fullgraph", "reduce_overhead", "from_process_group"])
def test_torch_ops(mode):
    import torch
    results = run_ranks([WORKER, mode], torch.cuda.device_count(), 300)
    report = "\n".join(f"----- rank {r} exit {rc}\n{out}" for r, (rc, out) in enumerate(results))
    assert all(rc == 0 for rc, _ in results), report
