"""interlace's torch.library ops on real GPUs: eager, torch.compile(fullgraph=True) and
mode="reduce-overhead" (CUDA graphs), one process per GPU."""
import os

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "torch_ops_worker.py")
pytestmark = pytest.mark.gpus(2)


@pytest.mark.parametrize("mode", ["eager", "fullgraph", "reduce_overhead", "from_process_group"])
def test_torch_ops(mode):
    import torch
    results = run_ranks([WORKER, mode], torch.cuda.device_count(), 300)
    expect_ranks_passed(results)
